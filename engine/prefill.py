"""Dense chunked prefill: the baseline that sparse-prefill strategies replace."""

from __future__ import annotations

from typing import Iterator


def prefill_chunks(model, cache, tokens: list[int], step: int) -> Iterator[int]:
    """Run `tokens` through `model` into `cache`, `step` at a time; yield tokens done so far.

    Evaluating the cache after each chunk bounds the graph (and memory), and gives the
    caller a point to report progress and check for cancellation.
    """
    import mlx.core as mx

    done = 0
    while done < len(tokens):
        chunk = tokens[done: done + step]
        model(mx.array(chunk)[None], cache=cache)  # (1, L) -> logits discarded
        mx.eval([c.state for c in cache])
        done += len(chunk)
        mx.clear_cache()
        yield done
