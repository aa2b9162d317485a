"""UniPrefill's scoring and selection at one drop layer, as its released code runs it.

The last QUERY_WINDOW query rows score every key: causal softmax(q·kᵀ·scale) in float32,
summed over the rows and all query heads (GQA heads read their KV head). Key masses are
summed within BLOCK-token blocks of the current tokens, normalized, sorted, and blocks are
kept while the mass before them is at most `p` (the block that crosses `p` stays, and so
does the top block). The first SINKS positions of the prompt and the last QUERY_WINDOW
tokens always stay; MIN_TOKENS or fewer drop nothing.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

BLOCK = 64
QUERY_WINDOW = 128
SINKS = 128
MIN_TOKENS = 2 * QUERY_WINDOW


def key_mass(queries: mx.array, keys: mx.array, scale: float) -> mx.array:
    """(S,) attention mass the query rows put on each key, summed over rows and heads.

    queries (1, Hq, Lq, D) are the last Lq of the S positions keys (1, Hkv, S, D) hold,
    so row i sees keys up to S - Lq + i. Tiled per KV head: a head's scores are at most
    (Hq/Hkv)·Lq·S floats."""
    _, hq, lq, d = queries.shape
    hkv, s = keys.shape[1], keys.shape[2]
    rep = hq // hkv
    row_end = mx.arange(s - lq, s)[:, None]  # (Lq, 1): the last key each row sees
    visible = mx.arange(s)[None] <= row_end  # (Lq, S)
    total = mx.zeros((s,), mx.float32)
    for h in range(hkv):
        q = queries[0, h * rep : (h + 1) * rep].astype(mx.float32) * scale  # (rep, Lq, D)
        scores = q @ keys[0, h].astype(mx.float32).T  # (rep, Lq, S)
        scores = mx.where(visible, scores, -mx.inf)
        total = total + mx.softmax(scores, axis=-1).sum(axis=(0, 1))
        mx.eval(total)
    return total


def select_blocks(mass: np.ndarray, positions: np.ndarray, p: float, *, tail: int = QUERY_WINDOW) -> np.ndarray:
    """Indices (sorted) of the current tokens to keep, from their key `mass` (n,) and
    their prompt `positions` (n,); the last `tail` tokens always stay (the query window,
    or a sliding window when later layers have one)."""
    n = len(mass)
    if n <= MIN_TOKENS or p >= 1.0:  # p = 1 keeps every block, rounding of the sums aside
        return np.arange(n)
    starts = np.arange(0, n, BLOCK)
    block_mass = np.add.reduceat(mass.astype(np.float64), starts)
    block_mass = block_mass / max(block_mass.sum(), 1e-30)
    order = np.argsort(-block_mass, kind="stable")
    before = np.cumsum(block_mass[order]) - block_mass[order]
    keep = np.zeros(len(starts), bool)
    keep[order[before <= p]] = True
    keep[order[0]] = True
    token_keep = np.repeat(keep, BLOCK)[:n]
    token_keep |= positions < SINKS
    token_keep[-tail:] = True
    return np.flatnonzero(token_keep)
