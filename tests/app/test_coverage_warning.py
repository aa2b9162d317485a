"""A sparse answer says which method read the prompt and how much, and warns, with a
one-click dense "Read it all and answer again", when the question's own passages were
mostly skipped (the engine's `question_dropped`)."""

from PySide6.QtCore import Qt

from brisk.app.widgets.coverage import CoverageMap
from brisk.engine.host.worker import Answer
from tests.app.test_window import answer, metrics, send

FLAGGED = {
    "method": "specprefill",
    "new_tokens": 4000,
    "read_share": 0.2,
    "layers": [[-1, [[0, 400], [3600, 4000]]]],
    "skipped": [[400, 3600, "Archive note: the storage code"]],
    "question_regions": [[1800, 1840]],
    "question_read": 0.0,
    "question_dropped": True,
}
KEPT = {**FLAGGED, "layers": [[-1, [[0, 400], [1790, 1850], [3600, 4000]]]], "question_read": 1.0}
KEPT["question_dropped"] = False


def test_the_footer_names_the_method_and_the_share_read(qtbot):
    cover = CoverageMap(KEPT)
    qtbot.addWidget(cover)
    assert cover.label.text() == "SpecPrefill read 20% of the prompt in full"
    assert cover.warning is None and cover.answer_again is None and not cover.flagged
    assert "100% read in full." in cover.toolTip()
    uni = CoverageMap({"new_tokens": 10, "read_share": 0.5, "layers": [[4, [[0, 5]]]]})  # stored before "method"
    qtbot.addWidget(uni)
    assert uni.label.text().startswith("UniPrefill read 50%")


def test_a_dropped_question_passage_is_a_visible_warning_with_one_click(qtbot):
    cover = CoverageMap(FLAGGED)
    qtbot.addWidget(cover)
    cover.show()
    assert cover.flagged and cover.warning.isVisible() and cover.answer_again.isVisible()
    assert "mostly skipped (0% of them read in full)" in cover.warning.text()
    assert cover.answer_again.text() == "Read it all and answer again"
    assert "(mostly skipped)" in cover.toolTip()
    with qtbot.waitSignal(cover.read_all_requested, timeout=1000):
        qtbot.mouseClick(cover.answer_again, Qt.LeftButton)


def test_answer_again_regenerates_that_turn_densely_and_the_dense_answer_has_no_warning(qtbot, make_window, engine):
    w = make_window()
    w.settings_panel.sparse.setCurrentText("on")
    cid = send(qtbot, w, "What is the storage code of the Heron ledger?").conversation_id
    answer(engine, cid, ["amber-otter"], metrics(prefill_method="specprefill", coverage=FLAGGED))
    cover = w.chat_view.messages[-1].coverage
    assert cover is not None and cover.flagged
    n = len(engine.commands)
    qtbot.mouseClick(cover.answer_again, Qt.LeftButton)
    command = engine.commands[n]
    assert isinstance(command, Answer) and command.settings.sparse_prefill == "off"
    assert command.settings.uniprefill == "off"
    assert [m.content for m in command.messages] == ["What is the storage code of the Heron ledger?"]
    assert w.settings_panel.settings().sparse_prefill == "on"  # only that turn reads densely
    answer(engine, cid, ["ivory-falcon"], metrics(sparse_prefill="off", kept_tokens=0))
    assert w.chat_view.messages[-1].coverage is None
    w.controller.open(cid)  # the stored flagged version stays flagged when paged back to
    w.controller.show_version(-1)
    again = w.chat_view.messages[-1].coverage
    assert again is not None and again.flagged
