"""Acceleration techniques, one package each: they hand the session data (a plan, a
decoder), the session does not branch on them.

- specprefill/: a draft scores prompt tokens and the target prefills the important ones.
- uniprefill/: no draft; the target drops unimportant blocks at some of its own layers.
- speculative/: a draft proposes tokens and the target verifies them exactly.
- router.py: which prefill a turn runs (dense, SpecPrefill, UniPrefill), and why.
- positions.py: RoPE positions past dropped tokens (per model, per layer, per token).
- coverage.py: what a sparse prefill read, for the app's coverage map.
- attention_capture.py: the queries and keys attention layers see (both prefills score with them).
- translate.py: text spans shared by both when draft and target tokenize differently.
"""
