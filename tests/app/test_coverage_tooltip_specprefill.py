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


def test_the_question_line_says_it_is_a_word_match_not_where_the_answer_is():
    """A user's trial: "quote the sentence defining Legal Entity" read 100% of the passages
    matched by the question's rare words, yet the sentence itself was cut (its words were too
    common to match). The line claims only what it measured."""
    tooltip = coverage_tooltip(
        {
            "layers": [[-1, [[0, 846]]]],
            "read_share": 0.2,
            "new_tokens": 3000,
            "question_regions": [[10, 43]],
            "question_read": 1.0,
        }
    )
    assert "your question points to" not in tooltip
    assert "Passages sharing rare words with your question: 100% read in full." in tooltip
