"""Speculative decoding with exact sampling (Leviathan et al., 2023): drafters.py (a draft
model, same or cross tokenizer), lookup.py (continuations already in the conversation, no
draft model), decoder.py (verify and accept), autopilot.py (plain, lookup or draft, each
cycle) over controller.py (the draft's k, and when drafting cannot pay), rewind.py (undo
layers that cannot trim), pair.py (the draft pair, or lookup alone)."""
