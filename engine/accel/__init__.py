"""Acceleration techniques, one package each: they hand the session data (a plan, a
decoder), the session does not branch on them.

- specprefill/: a draft scores prompt tokens and the target prefills the important ones.
- speculative/: a draft proposes tokens and the target verifies them exactly.
- translate.py: text spans shared by both when draft and target tokenize differently.
"""
