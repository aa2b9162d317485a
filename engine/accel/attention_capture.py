"""What a model's attention layers see: SpecPrefill's draft and UniPrefill's drop layers
both score tokens from the post-RoPE queries and keys an attention call receives."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def capture_attention(model, sink: list) -> Iterator[None]:
    """Record (queries, keys, scale) of every attention call `model` makes through
    mlx-lm's shared SDPA, by rebinding that name in the modules its layers come from."""
    names = {type(m).__module__ for _, m in model.named_modules()}
    patched = []
    for name in names:
        module = sys.modules.get(name)
        original = getattr(module, "scaled_dot_product_attention", None)
        if original is None:
            continue

        def spy(queries, keys, values, *args, _original=original, **kwargs):
            scale = kwargs.get("scale", args[1] if len(args) > 1 else None)
            sink.append((queries, keys, scale))
            return _original(queries, keys, values, *args, **kwargs)

        setattr(module, "scaled_dot_product_attention", spy)
        patched.append((module, original))
    if not patched:
        raise NotImplementedError(f"{type(model).__module__} does not use mlx-lm's shared attention")
    try:
        yield
    finally:
        for module, original in patched:
            setattr(module, "scaled_dot_product_attention", original)
