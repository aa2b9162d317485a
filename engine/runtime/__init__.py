"""The process around MLX: BLAS, threads, mlx-lm hooks, memory facts, crash log, paths."""
