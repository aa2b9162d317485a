"""Dense chunked prefill: the baseline that sparse-prefill strategies replace."""

from __future__ import annotations

from typing import Iterator

from brisk.engine.api.errors import PrefillMemoryError

# Float32 bytes a chunk of `step` queries needs beside the weights and the cache: MLX's
# CPU attention materializes the scores and their softmax (2 per head, query and key),
# the MLP its gate, up and activation rows.
SCORE_ARRAYS = 2
MLP_ARRAYS = 3


def prefill_step_bytes(config: dict, step: int, context: int) -> int:
    args = config.get("text_config") or config
    heads = args.get("num_attention_heads") or 1
    intermediate = args.get("intermediate_size") or 4 * (args.get("hidden_size") or 0)
    return 4 * (SCORE_ARRAYS * heads * step * context + MLP_ARRAYS * step * intermediate)


def check_prefill_memory(lm, step: int, context: int, available: int) -> None:
    """PrefillMemoryError, with both numbers, when one chunk would need more than is free
    (MKL crashed outright on a 28K-token chunk instead of failing)."""
    need = prefill_step_bytes(lm.config, step, context)
    if need > available:
        raise PrefillMemoryError(
            f"Reading the prompt in chunks of {step:,} tokens at {context:,} tokens of context needs about "
            f"{need / 2**30:.1f} GiB of working memory; {available / 2**30:.1f} GiB is free. "
            "Lower the prefill step (--prefill-step), shorten the conversation, or free memory."
        )


def prefill_chunks(model, cache, tokens: list[int], step: int) -> Iterator[int]:
    """Run `tokens` through `model` into `cache`, `step` at a time; yield tokens done so far.

    Evaluating the cache after each chunk bounds the graph (and memory), and gives the
    caller a point to report progress and check for cancellation.
    """
    import mlx.core as mx

    done = 0
    while done < len(tokens):
        chunk = tokens[done : done + step]
        model(mx.array(chunk)[None], cache=cache)  # (1, L) -> logits discarded
        mx.eval([c.state for c in cache])
        done += len(chunk)
        mx.clear_cache()
        yield done
