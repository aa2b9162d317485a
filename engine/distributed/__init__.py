"""A model split over several MLX processes (ranks): `brisk run --ranks N` / `--hostfile`.
How and why it is split: docs/distributed.md."""
