"""Speculative decoding with exact sampling (Leviathan et al., 2023): drafters.py (same or
cross tokenizer), decoder.py (verify and accept), controller.py (k per cycle, and when
drafting cannot pay), rewind.py (undo layers that cannot trim), pair.py (the draft pair)."""
