"""Saved prompt caches are signed: HMAC-SHA256 (RFC 2104) under a random key of this
installation, kept 0600 in Brisk's data folder beside the chat database.

An unkeyed digest only catches accidents: anyone who can edit a cache file can recompute
it (a file re-hashed to claim 30 more tokens than its KV holds was accepted and answered
from the wrong context). The MAC covers everything a load rebuilds: Brisk's state (model,
tokenizer, tokens, position map, KV mode) and, per layer, its class and every value of its
state (arrays as shape, dtype and raw bytes; offsets and other scalars by value).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from pathlib import Path
from typing import Any, cast

from brisk.engine.runtime.private_files import ensure_private_dir, read_private_file, write_private_file

KEY_NAME = "prompt-cache.key"
KEY_BYTES = 32  # HMAC-SHA256's block-sized key: more adds nothing


def key_path(home: Path | None = None) -> Path:
    if home is None:
        from brisk.engine.models.store import brisk_home

        home = brisk_home()
    return Path(home) / KEY_NAME


def installation_key(home: Path | None = None) -> bytes:
    """This installation's signing key, made (O_EXCL, mode 0600) on first use. UnsafeLocation
    when its folder or file could have been changed by another user."""
    path = key_path(home)
    ensure_private_dir(path.parent)
    try:
        key = read_private_file(path, max_bytes=KEY_BYTES)
        if len(key) == KEY_BYTES:
            return key
        # A short key (a crash while an older Brisk wrote it): a new one; old caches miss once.
        write_private_file(path, secrets.token_bytes(KEY_BYTES))
    except FileNotFoundError:
        try:
            write_private_file(path, secrets.token_bytes(KEY_BYTES), replace=False)
        except FileExistsError:
            pass  # another Brisk made it first: use theirs
    return read_private_file(path, max_bytes=KEY_BYTES)


def cache_mac(key: bytes, state: dict, layers) -> str:
    """HMAC-SHA256 of `state` (without its own "mac") and of every value the layers save."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    mac = hmac.new(key, b"brisk prompt cache 2\0", hashlib.sha256)
    signed = {k: v for k, v in state.items() if k != "mac"}
    mac.update(json.dumps(signed, sort_keys=True).encode() + b"\0")
    for layer in layers:
        mac.update(type(layer).__name__.encode() + b"\0")
        for name, value in cast("list[tuple[str, Any]]", tree_flatten(layer.state)):  # its stub is loose
            mac.update(f"{name}\0".encode())
            if isinstance(value, mx.array):
                mac.update(f"{value.shape}{value.dtype}\0".encode())
                mac.update(np.array(mx.view(value, mx.uint8)).tobytes())
            else:  # an offset, a bit width, a layout name beside the arrays
                mac.update(f"{type(value).__name__}:{value!r}\0".encode())
    return mac.hexdigest()


def same_mac(a, b: str) -> bool:
    return isinstance(a, str) and hmac.compare_digest(a.encode(), b.encode())
