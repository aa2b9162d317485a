"""Brisk's inference engine: models, sessions, generation strategies. No Qt here.

The optimized BLAS has to be loaded before anything imports `mlx.core`, so it is the
first thing this package does (see engine/runtime/blas.py).
"""

import os

from brisk.engine.runtime.blas import preload_optimized_blas
from brisk.engine.runtime.hub_env import quiet_hub_telemetry

# Brisk uses transformers for tokenizers only; its "PyTorch was not found" notice is noise.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

quiet_hub_telemetry()  # before anything imports huggingface_hub (engine/runtime/hub_env.py)
preload_optimized_blas()
