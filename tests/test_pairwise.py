"""tests/pairwise.py: the smaller kernel grids still meet every pair of values."""

import itertools

import pytest

from tests.pairwise import rotate_over


@pytest.mark.parametrize("sizes,rotated", [((4, 2, 6, 2), 3), ((3, 3), 3), ((6, 2, 2), 2), ((1,), 4)])
def test_every_core_combination_once_and_every_pair_with_the_rotated_axis(sizes, rotated):
    core = {f"a{i}": list(range(n)) for i, n in enumerate(sizes)}
    names, cases = rotate_over(core, "r", [f"v{j}" for j in range(rotated)])
    assert names == ",".join([*core, "r"])
    assert {case[:-1] for case in cases} == set(itertools.product(*core.values()))
    for axis, values in enumerate(core.values()):
        assert {(case[axis], case[-1]) for case in cases} == set(
            itertools.product(values, [f"v{j}" for j in range(rotated)])
        )
    assert len(cases) < len(set(itertools.product(*core.values()))) * rotated or len(sizes) == 1


def test_an_axis_named_with_commas_is_spread_into_its_parameters():
    names, cases = rotate_over({"n,k": [(1, 2), (3, 4)]}, "hq,hkv", [(5, 6), (7, 8)])
    assert names == "n,k,hq,hkv" and {len(case) for case in cases} == {4}
