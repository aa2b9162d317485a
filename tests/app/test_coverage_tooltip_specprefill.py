"""The coverage tooltip says truly where the skipped passages went: SpecPrefill's target
never read them at any layer (its map's one row is layer -1, the whole model), while
UniPrefill's shallow layers did read what its deepest layers dropped."""

from brisk.app.widgets.coverage import coverage_tooltip

SKIPPED = [[846, 2062, "terms and conditions of this License"]]


def test_specprefill_skipped_passages_are_said_unread_not_skipped_by_deep_layers():
    tooltip = coverage_tooltip(
        {"layers": [[-1, [[0, 846], [2062, 3000]]]], "read_share": 0.6, "new_tokens": 3000, "skipped": SKIPPED}
    )
    assert "deepest layers" not in tooltip
    assert "Largest passages the model did not read:" in tooltip and "846–2,062" in tooltip


def test_uniprefill_skipped_passages_still_name_the_deepest_layers():
    tooltip = coverage_tooltip(
        {"layers": [[7, [[0, 846]]], [15, [[0, 846]]]], "read_share": 0.3, "new_tokens": 3000, "skipped": SKIPPED}
    )
    assert "Largest passages skipped by the deepest layers:" in tooltip
