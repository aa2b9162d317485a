"""Python numbers out of MLX arrays, typed as what they are.

mlx's stubs type `.item()` as any scalar (int, float or complex) and `.tolist()` as a nested
list or a scalar, so every caller would need its own cast; these say once what the caller
knows: which kind of number, and that the array is one-dimensional."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # importing this module does not load MLX (kv_fidelity loads it lazily)
    import mlx.core as mx


def item_int(a: mx.array) -> int:
    """The one value of an integer (or boolean) array."""
    return int(cast(int, a.item()))


def item_float(a: mx.array) -> float:
    """The one value of a real-valued array."""
    return float(cast(float, a.item()))


def int_list(a: mx.array) -> list[int]:
    """A one-dimensional integer array as a list."""
    return cast(list[int], a.tolist())


def float_list(a: mx.array) -> list[float]:
    """A one-dimensional real-valued array as a list."""
    return cast(list[float], a.tolist())


def tree_leaves(tree) -> list:
    """The leaves of a nested structure of lists and dicts, in mlx.utils.tree_flatten's
    order (its stub types the result as a list of pairs or a dict, so a loop over pairs
    does not type-check)."""
    from mlx.utils import tree_flatten

    return [leaf for _, leaf in cast("list[tuple[str, Any]]", tree_flatten(tree))]
