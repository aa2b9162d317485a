"""The command line's hooks for distributed runs (engine/host/cli.py calls these)."""

from __future__ import annotations

import argparse

from brisk.engine.distributed.hostfile import MAX_RANKS


def add_rank_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ranks",
        type=int,
        default=None,  # left out: one process, no launcher
        help=f"split the model across N local processes on loopback, N from 2 to {MAX_RANKS} "
        "(tensor parallel, through mlx.launch); leave it out to run in one process",
    )
    p.add_argument(
        "--hostfile",
        help="split the model across the hosts of this mlx.launch hostfile (ring backend; ranks listen "
        "on the IPs it names)",
    )
    p.add_argument("--join-timeout", type=float, default=120.0, help="seconds for every rank to join (default 120)")
    p.add_argument(
        "--rank-timeout",
        type=float,
        default=30.0,
        help="seconds of silence after which a rank counts as gone and the run stops (default 30)",
    )


def wants_ranks(args) -> bool:
    """True in the launching brisk of a distributed run (never inside a rank)."""
    from brisk.engine.distributed.group import current

    return current() is None and (bool(getattr(args, "hostfile", None)) or getattr(args, "ranks", None) is not None)


def launch(args, argv: list[str], *, chat: bool = False) -> int:
    """Start the ranks, each running this command (`chat`: what the user types reaches them)."""
    from brisk.engine.api.errors import BriskError
    from brisk.engine.distributed.hostfile import loopback, read_hostfile
    from brisk.engine.distributed.launch import run_on_ranks

    if args.hostfile and args.ranks is not None:
        raise BriskError("Give --ranks (local ranks) or --hostfile (hosts), not both")
    if not (args.join_timeout > 0 and args.rank_timeout > 0):  # nan too: it would never time out
        raise BriskError("--join-timeout and --rank-timeout must be positive")
    if getattr(args, "kv_bits", None) == "auto":
        raise BriskError("--kv-bits auto is not available with ranks yet: give 16, 8 or 4")
    size = len(read_hostfile(args.hostfile) if args.hostfile else loopback(args.ranks))  # both check the count
    check_model_splits(args.model, size)
    return run_on_ranks(
        argv,
        ranks=args.ranks,
        hostfile=args.hostfile,
        join_timeout=args.join_timeout,
        rank_timeout=args.rank_timeout,
        relay_input=chat,
    )


def check_model_splits(model_id: str, size: int) -> None:
    """Refuse, before any rank starts, an installed model whose architecture or shapes
    cannot be split `size` ways (a model not installed yet is left to the ranks)."""
    from brisk.engine.api.errors import UnsupportedModel
    from brisk.engine.distributed.shard import check_shardable
    from brisk.engine.models.folder import mlx_model_class, read_config
    from brisk.engine.models.store import ModelStore

    store = ModelStore()
    if not store.has(model_id):
        return
    config = read_config(store.path(model_id))
    try:
        model_class = mlx_model_class(config)
    except UnsupportedModel:
        return  # an architecture mlx-lm does not know: the ranks' loader says so
    check_shardable(model_class, config, size)


def split_refusal(model_id: str, size: int) -> str | None:
    """Why the ranks cannot serve `model_id` (one line), or None: rank 0's server refuses
    such a request with a 400 and leaves the model out of /v1/models."""
    from brisk.engine.api.errors import BriskError
    from brisk.engine.distributed.shard import ShardingRefused

    try:
        check_model_splits(model_id, size)
    except ShardingRefused as exc:
        return f"The model '{model_id}' cannot be served on {size} ranks: {exc}"
    except BriskError:  # a folder it cannot read: the loader names the problem
        return None
    return None


def pair_costs():
    """The speculative decoder's stored costs, or none on a rank (machines differ: each
    rank would choose differently)."""
    from brisk.engine.accel.speculative.controller import PairCosts
    from brisk.engine.accel.speculative.costs_file import StoredPairCosts
    from brisk.engine.distributed.group import current

    return PairCosts() if current() is not None else StoredPairCosts()


def chat_input():
    """On a rank of `brisk chat`: the user's lines and Ctrl-C, as the launching brisk passes
    them on (engine/distributed/chat_input.py). Elsewhere None: the terminal's own."""
    from brisk.engine.distributed.chat_input import RankInput
    from brisk.engine.distributed.group import current

    rank = current()
    return RankInput(rank) if rank is not None else None


def rank_metrics(session) -> dict:
    """On a rank: every rank's weight and KV bytes (a collective: every rank calls it at
    the same point). Elsewhere: nothing."""
    from brisk.engine.distributed.group import current

    rank = current()
    if rank is None:
        return {}
    import os

    from brisk.engine.api.metrics import kv_bytes_measured
    from brisk.engine.distributed.lockstep import PROBE_ENV, gather_rank_metrics, probe_collectives

    kv = kv_bytes_measured(session.cache.layers) if session.cache.layers is not None else 0
    out: dict = {"parallel": "tensor", "ranks": gather_rank_metrics(rank, kv)}
    if os.environ.get(PROBE_ENV) == "1":
        dtype = session.lm.model.parameters()["model"]["norm"]["weight"].dtype
        out["collectives"] = probe_collectives(rank, session.lm.config, dtype)
    return out
