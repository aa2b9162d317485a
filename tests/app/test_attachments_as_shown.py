"""Attachments exactly as shown (issue 58 item 1): ✕ removes a document from what is sent and
from the fit check, and the fit is checked again when the chat's model or KV setting changes.
Driven through the real composer and settings widgets; the engine is the recording fake."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from brisk.engine.host.worker import Answer, CheckDocument, DocumentChecked
from brisk.engine.turn.documents import Document, Fit
from tests.app.test_window import send

ALPHA = "alpha.txt holds the private number 4471."
BETA = "beta.txt says the meeting is on Friday."
FITS = Fit(12, 40, 8192, 0, 0, True)


def attach(qtbot, w, engine, name, text, fit=FITS):
    """What the app does for a picked file: asks the engine to check it, then shows its answer."""
    w.composer.attach_requested.emit(f"/tmp/{name}")
    check = engine.commands[-1]
    assert isinstance(check, CheckDocument)
    document = Document(name, "text", text, len(text))
    engine.play(DocumentChecked(check.conversation_id, document, fit))
    return check


def remove(qtbot, w, name):
    chip = next(c for c in w.composer.attachments if name in c.label.text())
    qtbot.mouseClick(chip.findChild(QPushButton), Qt.LeftButton)


def test_a_removed_attachment_is_not_sent_stored_or_counted(qtbot, make_window, engine):
    w = make_window()
    attach(qtbot, w, engine, "alpha.txt", ALPHA)
    remove(qtbot, w, "alpha.txt")
    assert w.composer.attachments == []
    beta_check = attach(qtbot, w, engine, "beta.txt", BETA)
    # beta's fit is checked after the chat alone: the removed file no longer counts
    assert all("4471" not in m.content for m in beta_check.history)
    command = send(qtbot, w, "When is the meeting?")
    assert isinstance(command, Answer)
    sent = command.messages[-1].content
    assert "Friday" in sent and "4471" not in sent and "alpha.txt" not in sent
    stored = next(m.content for m in w.controller.store.messages(command.conversation_id) if m.role == "user")
    assert "Friday" in stored and "4471" not in stored
    names = [a["name"] for a in w.controller.store.attachments(command.conversation_id)]
    assert names == ["beta.txt"]


def test_a_later_document_is_checked_after_the_ones_attached_before_it(qtbot, make_window, engine):
    w = make_window()
    attach(qtbot, w, engine, "alpha.txt", ALPHA)
    beta_check = attach(qtbot, w, engine, "beta.txt", BETA)
    assert any("4471" in m.content for m in beta_check.history)


def test_removing_one_checks_the_rest_again_without_it(qtbot, make_window, engine):
    w = make_window()
    attach(qtbot, w, engine, "alpha.txt", ALPHA)
    attach(qtbot, w, engine, "beta.txt", BETA, fit=Fit(12, 9000, 8192, 0, 0, False, "beta.txt is 12 tokens; too many"))
    before = len(engine.commands)
    remove(qtbot, w, "alpha.txt")
    recheck = engine.commands[before:]
    assert len(recheck) == 1 and recheck[0].document.name == "beta.txt"
    assert all("4471" not in m.content for m in recheck[0].history)
    engine.play(DocumentChecked(recheck[0].conversation_id, recheck[0].document, FITS, recheck=True))
    assert [c.label.text().split(" ")[0] for c in w.composer.attachments] == ["beta.txt"]
    assert isinstance(send(qtbot, w, "Go"), Answer)  # it fits now: Send is no longer refused


def test_another_model_checks_the_attachments_again_and_send_follows_the_new_answer(qtbot, make_window, engine):
    w = make_window()
    attach(qtbot, w, engine, "alpha.txt", ALPHA)
    before = len(engine.commands)
    w.settings_panel.model.setCurrentText("tiny")  # another model: another context
    recheck = [c for c in engine.commands[before:] if isinstance(c, CheckDocument)]
    assert len(recheck) == 1 and recheck[0].settings.model == "tiny" and recheck[0].document.name == "alpha.txt"
    too_big = Fit(12, 9000, 2048, 0, 0, False, "alpha.txt is 12 tokens; with the conversation that is 9,000")
    engine.play(DocumentChecked(recheck[0].conversation_id, recheck[0].document, too_big, recheck=True))
    count = len(engine.commands)
    send(qtbot, w, "Summarize")
    assert len(engine.commands) == count  # refused, with the new model's reason
    assert "9,000" in w.composer.message.text()
    w.settings_panel.model.setCurrentText("big")
    again = [c for c in engine.commands[count:] if isinstance(c, CheckDocument)]
    engine.play(DocumentChecked(again[0].conversation_id, again[0].document, FITS, recheck=True))
    assert isinstance(send(qtbot, w, "Summarize"), Answer)


def test_a_setting_that_does_not_change_the_fit_checks_nothing_again(qtbot, make_window, engine):
    w = make_window()
    attach(qtbot, w, engine, "alpha.txt", ALPHA)
    before = len(engine.commands)
    w.settings_panel.temperature.setValue(0.3)
    assert not [c for c in engine.commands[before:] if isinstance(c, CheckDocument)]


def test_a_recheck_that_arrives_after_its_document_was_removed_is_dropped(qtbot, make_window, engine):
    w = make_window()
    attach(qtbot, w, engine, "alpha.txt", ALPHA)
    w.settings_panel.model.setCurrentText("tiny")
    recheck = engine.commands[-1]
    remove(qtbot, w, "alpha.txt")
    engine.play(DocumentChecked(recheck.conversation_id, recheck.document, FITS, recheck=True))
    assert w.composer.attachments == []
    command = send(qtbot, w, "Hello")
    assert "4471" not in command.messages[-1].content


def test_after_a_model_switch_the_old_models_refusal_is_not_shown_while_the_new_fit_is_checked(
    qtbot, make_window, engine
):
    """The old model's "does not fit" stayed (and refused Send with its reason) for the ~30 s the
    engine took to load the new model and answer the check."""
    w = make_window()
    too_big = Fit(12, 9000, 2048, 0, 0, False, "alpha.txt is 12 tokens; with the conversation that is 9,000")
    attach(qtbot, w, engine, "alpha.txt", ALPHA, fit=too_big)
    assert "9,000" in w.composer.message.text()
    before = len(engine.commands)
    w.settings_panel.model.setCurrentText("tiny")
    assert w.composer.message.text() == "Checking whether alpha.txt fits these settings…"
    count = len(engine.commands)
    send(qtbot, w, "Summarize")
    assert len(engine.commands) == count  # not sent on a fit nobody has checked for this model
    assert w.composer.message.text().startswith("Still checking whether the attachments fit")
    recheck = [c for c in engine.commands[before:] if isinstance(c, CheckDocument)][0]
    engine.play(DocumentChecked(recheck.conversation_id, recheck.document, FITS, recheck=True))
    assert isinstance(send(qtbot, w, "Summarize"), Answer)


def test_a_fit_check_that_fails_after_a_model_switch_leaves_send_working(qtbot, make_window, engine):
    from brisk.engine.api.events import EngineErrored
    from brisk.engine.host.worker import ConversationEvent

    w = make_window()
    attach(qtbot, w, engine, "beta.txt", BETA)
    w.settings_panel.model.setCurrentText("tiny")
    engine.play(ConversationEvent(w.controller.current, EngineErrored("The model could not be loaded")))
    assert isinstance(send(qtbot, w, "Go"), Answer)  # the last fits stand; Send is not stuck
