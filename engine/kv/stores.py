"""Where a PackedKVCache (engine/kv/packed_cache.py) keeps its keys and values.

- `RowStore`: rows (B, H, capacity, ...) of values, or of keys in the per-token layout:
  dense, or packed per token; written in place, capacity grown in steps.
- `ChannelStore`: keys packed per channel over groups of 32 tokens, channel-major, plus
  the newest keys dense. A step at position p reads the keys before
  `decode_packed_limit(p)` packed and the rest dense, so what a token sees depends on
  its position only, never on how steps were batched (a verify pass equals one-token steps).
"""

from __future__ import annotations

import mlx.core as mx

from brisk.kernels.packed_kv import SCALE_DTYPE, TOKEN_GROUP, ChannelPacked, Dense, KVLayout, TokenPacked


class RowStore:
    """Rows (B, H, capacity, ...) of values, or of keys in the per-token layout: dense, or
    packed per token. Written in place at a position; capacity grows in steps."""

    def __init__(self, bits: int, group: int):
        self.bits, self.group = bits, group
        self.buffers: list[mx.array] | None = None

    def write(self, x: mx.array, start: int, step: int) -> None:
        parts: tuple[mx.array, ...]
        if self.bits >= 16:
            parts = (x,)
        else:
            packed = TokenPacked.pack(x, bits=self.bits, group=self.group)
            parts = (packed.data, packed.scales, packed.biases)
        stop = start + x.shape[2]
        if self.buffers is None or stop > self.buffers[0].shape[2]:
            grow = (stop - start + step - 1) // step * step
            held = [] if self.buffers is None else [b[..., :start, :] for b in self.buffers]
            fresh = [mx.zeros((*p.shape[:2], grow, p.shape[3]), p.dtype) for p in parts]
            self.buffers = [mx.concatenate([h, f], axis=2) for h, f in zip(held, fresh)] if held else fresh
        for buffer, part in zip(self.buffers, parts):
            buffer[..., start:stop, :] = part

    def view(self, n: int) -> KVLayout:
        if self.buffers is None:
            raise RuntimeError("the store holds nothing yet")
        held = [b[..., :n, :] for b in self.buffers]
        if self.bits >= 16:
            return Dense(held[0])
        data, scales, biases = held
        return TokenPacked(data, scales, biases, self.bits, self.group)

    def arrays(self, n: int) -> list:
        return [] if self.buffers is None or not n else [b[..., :n, :] for b in self.buffers]

    def adopt(self, arrays: list) -> None:
        self.buffers = list(arrays) or None


def decode_packed_limit(position: int) -> int:
    """How many keys a one-token step at `position` reads packed: whole groups, all but
    the last 32 to 63 tokens (those stay dense so a rollback never reaches packed keys)."""
    return max(0, position // TOKEN_GROUP * TOKEN_GROUP - TOKEN_GROUP)


# Steps of at most this many tokens (decode, speculative verify) read each key exactly as
# one-token steps would; longer ones (prefill chunks) read keys alike in every row.
PER_ROW_LIMITS_MAX = TOKEN_GROUP


class ChannelStore:
    """Keys packed per channel (channel-major buffers growing along the token axis) for the
    first `packed` tokens; dense float16 rows from `recent_from` (<= packed) on. A step at
    position p reads keys before decode_packed_limit(p) packed, so which keys a token sees
    packed depends on its position only, never on how steps were batched: greedy
    speculative decoding stays equal to plain decoding."""

    def __init__(self, bits: int):
        self.bits, self.packed, self.recent_from = bits, 0, 0
        self.buffers: list[mx.array] | None = None
        self.recent: mx.array | None = None  # dense float16 rows from recent_from on
        self.limits: tuple[int, ...] | None = None  # the current step's rows

    def begin(self, start: int, steps: int, step: int) -> None:
        """Before writing `steps` tokens at `start`: pack what their rows read packed, and
        drop dense rows no later step reads."""
        clip = lambda p: min(max(decode_packed_limit(p), self.recent_from), start // TOKEN_GROUP * TOKEN_GROUP)  # noqa: E731
        if steps <= PER_ROW_LIMITS_MAX:
            self.limits = tuple(clip(start + i) for i in range(steps))
        else:
            self.limits = (clip(start),) * steps
        if self.limits[-1] > self.packed:
            dense = self._rows()[..., self.packed - self.recent_from : self.limits[-1] - self.recent_from, :]
            self._store(ChannelPacked.pack(dense, bits=self.bits), step)
        drop = self.limits[0] - self.recent_from
        if drop:
            self.recent, self.recent_from = self._rows()[..., drop:, :], self.limits[0]

    def _rows(self) -> mx.array:
        """The dense rows (a step that packs or drops some has written them)."""
        if self.recent is None:
            raise RuntimeError("no dense key rows to pack or drop")
        return self.recent

    def append(self, keys: mx.array) -> None:
        new = keys.astype(SCALE_DTYPE)
        self.recent = new if self.recent is None else mx.concatenate([self.recent, new], axis=2)

    def _store(self, packed: ChannelPacked, step: int) -> None:
        per, start, stop = 32 // self.bits, self.packed, self.packed + packed.packed
        parts = (packed.data, packed.scales, packed.biases)
        if self.buffers is None or stop // per > self.buffers[0].shape[-1]:
            grow = (stop - start + step - 1) // step * step
            cols = [start // per, start // TOKEN_GROUP, start // TOKEN_GROUP]
            fresh = [
                mx.zeros((*p.shape[:3], w), p.dtype)
                for p, w in zip(parts, (grow // per, grow // TOKEN_GROUP, grow // TOKEN_GROUP))
            ]
            self.buffers = (
                fresh
                if self.buffers is None
                else [mx.concatenate([b[..., :c], f], axis=-1) for b, c, f in zip(self.buffers, cols, fresh)]
            )
        self.buffers[0][..., start // per : stop // per] = parts[0]
        for buffer, part in zip(self.buffers[1:], parts[1:]):
            buffer[..., start // TOKEN_GROUP : stop // TOKEN_GROUP] = part
        self.packed = stop

    def truncate(self, keep: int) -> None:
        """Hold only the first `keep` tokens. A rollback stays within the dense rows; an edit
        further back turns the cut group's kept tokens back into dense rows (as read)."""
        self.limits = None
        if keep >= self.recent_from:
            self.recent = None if self.recent is None else self.recent[..., : keep - self.recent_from, :]
            self.packed = min(self.packed, keep // TOKEN_GROUP * TOKEN_GROUP)
            return
        start = keep // TOKEN_GROUP * TOKEN_GROUP
        self.recent = self.view().dequantize_packed(SCALE_DTYPE)[..., start:keep, :]
        self.packed = self.recent_from = start

    def view(self) -> ChannelPacked:
        per, groups = 32 // self.bits, self.packed // TOKEN_GROUP
        data, scales, biases = self.buffers or [mx.zeros((0, 0, 0, 0), mx.uint32)] * 3
        return ChannelPacked(
            data[..., : self.packed // per],
            scales[..., :groups],
            biases[..., :groups],
            self.bits,
            self.recent,
            self.recent_from,
            self.limits,
        )

    def dense_rows(self) -> int:
        return 0 if self.recent is None else self.recent.shape[2]

    def arrays(self) -> list:
        view = self.view()
        held = [view.data, view.scales, view.biases] if self.packed else []
        return held + ([self.recent] if self.dense_rows() else [])
