"""Keep every rank on the same path through a turn (SPMD).

Every rank runs the same Session code on the same prompt: the same tokens go into the
same forward, the cache is trimmed, packed and reused the same way, and the logits are
the same on every rank (all_sum and all_gather give every rank identical bytes), so
greedy and seeded sampling pick the same tokens. Rank 0's is the session the user sees;
the others print nothing.

Two things could still part the ranks, and are pinned here:

- the speculative decoder's choices (draft length, lookup or plain, the scout) follow
  measured times, and each rank measures its own: its clock is replaced by rank 0's,
  shared with one tiny all_sum per reading;
- costs stored from earlier conversations differ between machines: ranks start from none.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import mlx.core as mx

from brisk.engine.distributed.group import Rank
from brisk.engine.runtime.mx_values import float_list, int_list


class AgreedClock:
    """`perf_counter` as rank 0 reads it, on every rank. Every rank reads it at the same
    points (they run the same code), so the all_sums pair up."""

    def __init__(self, rank: Rank):
        self.rank = rank
        self.origin = time.perf_counter()

    def perf_counter(self) -> float:
        elapsed = time.perf_counter() - self.origin if self.rank.rank == 0 else 0.0
        whole = float(int(elapsed))
        mine = mx.array([whole, elapsed - whole], dtype=mx.float32)  # float32 keeps µs this way
        agreed = float_list(mx.distributed.all_sum(mine, group=self.rank.group, stream=mx.cpu))
        return agreed[0] + agreed[1]


def pin_speculation_clock(rank: Rank) -> None:
    """The speculative decoder reads rank 0's clock (its module's `time`, nothing else)."""
    from brisk.engine.accel.speculative import decoder

    clock = AgreedClock(rank)
    decoder.time = SimpleNamespace(perf_counter=clock.perf_counter)  # type: ignore[assignment]


def gather_rank_metrics(rank: Rank, kv_bytes: int) -> list[dict]:
    """Every rank's weight and KV bytes, in rank order (one all_gather: call on every rank)."""
    report = rank.report
    weight = getattr(report, "weight_bytes", 0)
    model = getattr(report, "model_weight_bytes", 0)
    resident = getattr(report, "resident_weight_bytes", weight)
    fields = [weight, model, resident, kv_bytes, mx.get_peak_memory()]
    mine = mx.array([fields], dtype=mx.int64)
    flat = int_list(mx.distributed.all_gather(mine, group=rank.group, stream=mx.cpu).reshape(-1))
    rows = [flat[i : i + len(fields)] for i in range(0, len(flat), len(fields))]
    hosts = rank.hosts
    return [
        {
            "rank": i,
            "host": hosts[i] if i < len(hosts) else "?",
            "weight_bytes": int(row[0]),
            "weight_share": round(row[0] / row[1], 4) if row[1] else None,
            "resident_weight_bytes": int(row[2]),
            "kv_bytes": int(row[3]),
            "peak_memory_bytes": int(row[4]),
        }
        for i, row in enumerate(rows)
    ]


PROBE_ENV = "BRISK_PROBE_COLLECTIVES"  # set by `brisk bench distributed`


def probe_collectives(rank: Rank, config: dict, dtype: mx.Dtype, *, repeats: int = 30) -> dict:
    """The collectives one decode step makes, timed on this group with their real sizes:
    two all_sums of the hidden state per layer (attention and MLP outputs), one for the
    embedding lookup, and the head's all_gather of each rank's vocabulary slice. Each is
    evaluated alone, as the decode graph's data dependencies force. Every rank calls this."""
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    vocab_slice = int(config["vocab_size"]) // rank.size
    small = mx.zeros((1, 1, hidden), dtype=dtype)
    logits = mx.zeros((vocab_slice, 1, 1), dtype=dtype)

    def timed(make, times: int) -> tuple[float, float]:
        """(median, fastest) seconds of one evaluation: the fastest is the link and the
        ring's own cost; the median adds waiting for the peer to be scheduled."""
        mx.eval(make())  # the first one pays for any setup
        seconds = []
        for _ in range(times):
            started = time.perf_counter()
            mx.eval(make())
            seconds.append(time.perf_counter() - started)
        return statistics.median(seconds), min(seconds)

    sum_s, sum_fastest = timed(lambda: mx.distributed.all_sum(small, group=rank.group, stream=mx.cpu), repeats)
    gather_s, gather_fastest = timed(
        lambda: mx.distributed.all_gather(logits, group=rank.group, stream=mx.cpu), max(3, repeats // 3)
    )
    sums = 2 * layers + 1
    # a ring all_sum of B bytes sends 2(N-1)/N x B from each rank; an all_gather (N-1)/N x N x slice
    share = (rank.size - 1) / rank.size
    sent = sums * 2 * share * small.nbytes + share * rank.size * logits.nbytes
    return {
        "collectives_per_token": sums + 1,
        "all_sum_s": sum_s,
        "all_gather_s": gather_s,
        "collective_s_per_token": sums * sum_s + gather_s,
        "all_sum_fastest_s": sum_fastest,
        "all_gather_fastest_s": gather_fastest,
        "collective_fastest_s_per_token": sums * sum_fastest + gather_fastest,
        "collective_bytes_sent_per_token": int(sent),
    }
