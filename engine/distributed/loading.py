"""The loader's two hooks on a rank (engine/models/loader.py): split the lazily loaded model
before any weight is read, and note what the rank holds once the weights are in memory."""

from __future__ import annotations

import mlx.core as mx

from brisk.engine.distributed.group import Rank
from brisk.engine.distributed.shard import shard_model, weight_bytes


def shard_loaded(model, config: dict, rank: Rank) -> None:
    whole = weight_bytes(model)  # lazy arrays know their sizes without being read
    rank.report = shard_model(model, config, rank.group, model_bytes=whole)
    mx.eval(model.parameters())  # reads this rank's slices only


def note_resident(model, rank: Rank) -> None:
    """The bytes this rank's weights take after the compute-dtype cast (float32 on a CPU)."""
    if rank.report is not None:
        rank.report.resident_weight_bytes = weight_bytes(model)
