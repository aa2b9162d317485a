"""Brisk's inference engine: models, sessions, generation strategies. No Qt here.

The optimized BLAS has to be loaded before anything imports `mlx.core`, so it is the
first thing this package does (see engine/blas.py).
"""

from engine.blas import preload_optimized_blas

preload_optimized_blas()
