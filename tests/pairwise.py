"""Parameter grids smaller than a full cross product, for the kernel tests.

`rotate_over` keeps the full product of the axes that choose a kernel's code path (bits,
group, rows, shapes) and spreads an axis that only changes an input's encoding (the dtype the
scales are stored in, the GQA head ratio) over it, so that each of its values still meets
every value of every other axis: every pair is tested, at a fraction of the cases.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence


def rotate_over(core: dict[str, Sequence[Any]], name: str, values: Sequence[Any]) -> tuple[str, list[tuple]]:
    """(argnames, cases) for `pytest.mark.parametrize`: each combination of `core`'s axes once,
    with `name` taking the value of `values` that meets the most (axis value, its value) pairs
    not yet tested (the grid is the same every run), plus a case for any pair that pass missed.
    An axis name with commas ("n,k") takes tuples and is spread into its parameters."""
    names, axes = list(core), [list(v) for v in core.values()]
    combos = list(itertools.product(*(range(len(axis)) for axis in axes)))
    untested = {
        (axis, index, value)
        for axis, indices in enumerate(axes)
        for index in range(len(indices))
        for value in range(len(values))
    }
    used = [0] * len(values)
    cases = []
    for combo in combos:
        # the value meeting the most untested pairs; among those the least used, then the first
        chosen = max(
            range(len(values)),
            key=lambda value: (
                sum((axis, index, value) in untested for axis, index in enumerate(combo)),
                -used[value],
                -value,
            ),
        )
        untested -= {(axis, index, chosen) for axis, index in enumerate(combo)}
        used[chosen] += 1
        row: list[Any] = []
        for axis, index in enumerate(combo):
            row.extend(_spread(names[axis], axes[axis][index]))
        cases.append((*row, *_spread(name, values[chosen])))
    while untested:  # what the greedy pass missed: one more case for each pair still untested
        axis, index, value = min(untested)
        combo = next(c for c in combos if c[axis] == index)
        untested -= {(a, i, value) for a, i in enumerate(combo)}
        cases.append(
            (*(v for a, i in enumerate(combo) for v in _spread(names[a], axes[a][i])), *_spread(name, values[value]))
        )
    return ",".join([*names, name]), cases


def _spread(name: str, value: Any) -> tuple:
    return tuple(value) if "," in name else (value,)
