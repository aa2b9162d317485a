"""SpecPrefill (Liu et al., 2025): a draft scores the prompt's chunks, the target prefills
the kept ones at their original positions. scoring.py: the draft's scoring and chunk
selection; plan.py: whether it runs this turn. RoPE positions past the dropped tokens
are engine/accel/positions.py (shared with UniPrefill)."""
