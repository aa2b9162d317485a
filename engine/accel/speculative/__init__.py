"""Speculative decoding with exact sampling (Leviathan et al., 2023): drafters.py (a draft
model, same or cross tokenizer), lookup.py (continuations already in the conversation, no
draft model), decoder.py (the loop: the target's side, verify and accept), which runs one
cycle at a time: plain_run.py, draft_cycle.py or lookup_cycle.py (their shared interface:
cycle.py); autopilot.py (plain, lookup or draft, each cycle) over controller.py (the draft's
k, and when drafting cannot pay), rewind.py (undo layers that cannot trim), pair.py (the
draft pair, or lookup alone)."""
