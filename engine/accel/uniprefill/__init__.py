"""UniPrefill ("Universal Long-Context Prefill Acceleration via Block-wise Dynamic
Sparsification", 2026): no draft; at some full-attention layers the target scores its own
64-token blocks and later layers process only the survivors. selection.py: scoring and
block selection; prefill.py: the layer-by-layer prefill; plan.py: whether and how it runs."""
