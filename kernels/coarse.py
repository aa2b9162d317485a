"""Coarse products, for passes whose outputs are ranked, not decoded.

A sparse-prefill draft reads the prompt only to rank its tokens
(engine/accel/specprefill/scoring.py). Inside `coarse_products()` the products built on this
thread take the cheaper precision llama.cpp runs everything at: tiled quantized products round
x to 8 bits a block instead of 15 (one integer pass instead of two; ~1e-2 of a layer's largest
output instead of 1e-4), and long-chunk attention multiplies in bfloat16 pairs with float32
sums where the CPU has AVX512-BF16 (twice the float32 FMA rate). Read as each node is built.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class _Coarse(threading.local):
    active = False


COARSE = _Coarse()  # per thread: another thread's graphs stay exact


@contextmanager
def coarse_products() -> Iterator[None]:
    before, COARSE.active = COARSE.active, True
    try:
        yield
    finally:
        COARSE.active = before
