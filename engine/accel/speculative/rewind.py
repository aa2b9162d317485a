"""Taking tokens back out of a prompt cache after a speculative step.

Most layers trim (mlx-lm's `trim`). Those that cannot are snapshotted before the step
and restored after it, then the tokens to keep are fed again: recurrent layers
(`ArraysCache`, whose state is overwritten each token) and a sliding-window cache that has
wrapped (its ring buffer overwrote old slots). Anything else is refused, never rewound
wrongly.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, RotatingKVCache


class CannotRewind(Exception):
    """The cache has a layer this module does not know how to take tokens out of."""


def _rewindable(layer) -> bool:
    return isinstance(layer, (ArraysCache, RotatingKVCache)) or layer.is_trimmable()


def _snapshot(layer):
    # mx.array(a) is a new array object: later in-place slice writes to `a` do not reach it.
    if isinstance(layer, ArraysCache):
        return [None if a is None else mx.array(a) for a in layer.cache]
    if isinstance(layer, RotatingKVCache):
        copy = lambda a: None if a is None else mx.array(a)  # noqa: E731
        return copy(layer.keys), copy(layer.values), layer.offset, layer._idx
    raise CannotRewind(f"cannot take tokens back out of a {type(layer).__name__} layer")


def _restore(layer, saved) -> None:
    if isinstance(layer, ArraysCache):
        layer.cache = list(saved)
    else:
        layer.keys, layer.values, layer.offset, layer._idx = saved


def _trims(layer, incoming: int) -> bool:
    if isinstance(layer, RotatingKVCache):
        return layer.offset + incoming < layer.max_size
    return layer.is_trimmable()


class CacheCheckpoint:
    """Marks a cache before tokens go in; `rewind` keeps only the first ones of them."""

    def __init__(self, cache, incoming: int):
        """`incoming`: how many tokens may go in before `rewind` (a sliding window that
        would wrap meanwhile is snapshotted too)."""
        self.cache = cache
        self.saved = {i: _snapshot(layer) for i, layer in enumerate(cache) if not _trims(layer, incoming)}
        # where each trimmed layer stood: a forward that fails partway has fed its first layers only
        self.offsets = {i: getattr(layer, "offset", None) for i, layer in enumerate(cache) if i not in self.saved}

    @staticmethod
    def check(cache) -> None:
        """Raise CannotRewind now if some layer could not be rewound later."""
        CacheCheckpoint(cache, 0)

    @staticmethod
    def possible(cache) -> bool:
        """Whether every layer could be rewound (check without the snapshot)."""
        return all(_rewindable(layer) for layer in cache)

    def restore(self, fed: int) -> None:
        """Put every layer back as it was at the mark, also after a forward that failed
        partway (its first layers took the token, the rest did not). `fed`: the tokens that
        went in whole, trimmed from a layer that does not say where it stands."""
        for i, layer in enumerate(self.cache):
            if i in self.saved:
                _restore(layer, self.saved[i])
            else:
                mark = self.offsets[i]
                layer.trim(fed if mark is None else layer.offset - mark)
        mx.eval([layer.state for layer in self.cache])

    @staticmethod
    def trims(cache, incoming: int) -> bool:
        """Whether every layer could trim `incoming` tokens back off (no snapshot needed)."""
        return all(_trims(layer, incoming) for layer in cache)

    def rewind(self, model, fed: list[int], keep: int) -> None:
        """`fed` tokens went in since the mark; keep the first `keep` of them."""
        drop = len(fed) - keep
        if drop <= 0:
            return
        if not self.saved:
            for layer in self.cache:
                layer.trim(drop)
            return
        for i, layer in enumerate(self.cache):
            if i in self.saved:
                _restore(layer, self.saved[i])
            else:
                layer.trim(len(fed))
        if keep:
            model(mx.array(fed[:keep])[None], cache=self.cache)
        mx.eval([layer.state for layer in self.cache])
