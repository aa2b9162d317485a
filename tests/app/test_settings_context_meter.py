"""The context-fill meter: the tokens the next turn would hold of the model's context, with
the documents' share, measured by the engine's own fit check (a real EngineWorker with a
one-token-per-character model answers the window's probes)."""

from PySide6.QtCore import Qt

from brisk.app.context_fill import PROBE_ID_OFFSET
from brisk.engine.api.conversation import CancelToken
from brisk.engine.api.events import EngineErrored, ModelLoaded, TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.host.worker import CheckDocument, ConversationEvent, DocumentChecked, EngineWorker
from brisk.engine.turn.documents import Document, Fit
from brisk.engine.turn.prompt import PLAIN_SEPARATOR

CONTEXT = 2048


class CountingTokenizer:
    chat_template = None  # plain paragraphs: the count below is exact

    def encode(self, text, **_):
        return list(range(len(text)))


class CharModel:
    id, context_length, path = "big", CONTEXT, None
    config = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8}
    tokenizer = CountingTokenizer()


def probes(engine):
    return [c for c in engine.commands if isinstance(c, CheckDocument) and c.conversation_id >= PROBE_ID_OFFSET]


def measured(qtbot, w, engine, seen: int) -> int:
    """Wait for the window's next probe, answer it with the real worker, return the count."""
    qtbot.waitUntil(lambda: len(probes(engine)) > seen)
    worker = EngineWorker(lambda model_id: CharModel(), memory_available=lambda: 2**30)
    engine.play(*worker.handle(probes(engine)[-1], CancelToken()))
    return len(probes(engine))


def expected(*parts: str) -> str:
    used = len(PLAIN_SEPARATOR.join(parts)) + 1  # check_fit's total: the prompt and one answer token
    return f"Context: {used:,} of {CONTEXT:,} tokens ({used / CONTEXT:.0%})"


def loaded_chat(qtbot, make_window, engine):
    w = make_window()
    w.composer.edit.setPlainText("hello")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    cid = w.controller.current
    engine.play(ConversationEvent(cid, TurnFinished("hi there", [1], TurnMetrics(finish_reason="stop"))))
    return w, cid


def test_the_meter_waits_for_the_model_and_asks_nothing_that_would_load_it(qtbot, make_window, engine):
    w = make_window()
    qtbot.waitUntil(lambda: w.composer.meter.label.text() == "Context fill: shown once big is loaded")
    assert probes(engine) == []


def test_once_the_model_loads_the_meter_no_longer_says_it_waits_for_it(qtbot, make_window, engine):
    # The probe waits behind a turn the engine is running (the first message after launch):
    # the meter kept "shown once big is loaded" beside a dashboard saying it was loaded.
    w = make_window()
    qtbot.waitUntil(lambda: w.composer.meter.label.text() == "Context fill: shown once big is loaded")
    w.composer.edit.setPlainText("hello")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    engine.play(ModelLoaded("big", {"context_length": CONTEXT, "architecture": "llama"}))
    qtbot.waitUntil(lambda: len(probes(engine)) == 1)  # not answered: the turn holds the engine
    assert w.composer.meter.label.text() == "Context fill: measuring…"


def test_the_meter_counts_the_chat_then_what_is_typed_then_the_documents(qtbot, make_window, engine):
    w, cid = loaded_chat(qtbot, make_window, engine)
    meter = w.composer.meter.label
    seen = measured(qtbot, w, engine, 0)  # the turn ran on the chat's model: it is loaded
    assert meter.text() == expected("hello", "hi there", "")
    qtbot.keyClicks(w.composer.edit, "How long is the Vistula?")
    seen = measured(qtbot, w, engine, seen)  # one measure once typing paused, not one per key
    assert seen == 2 and meter.text() == expected("hello", "hi there", "How long is the Vistula?")
    doc = Document("river.txt", "text", "The Vistula is 1,047 km long.", 29)
    engine.play(DocumentChecked(cid, doc, Fit(29, 100, CONTEXT, 0, 0, True)))
    seen = measured(qtbot, w, engine, seen)
    with_doc = f"{doc.as_prompt()}\n\nHow long is the Vistula?"
    assert meter.text() == expected("hello", "hi there", with_doc) + " · documents 29"
    w.composer.attachments[0].findChild(type(w.composer.send_button), "").click()  # ✕ on the chip
    seen = measured(qtbot, w, engine, seen)
    assert meter.text() == expected("hello", "hi there", "How long is the Vistula?")


def test_the_meter_counts_the_system_prompt_and_moves_after_each_turn(qtbot, make_window, engine):
    w, cid = loaded_chat(qtbot, make_window, engine)
    seen = measured(qtbot, w, engine, 0)
    w.settings_panel.system.setPlainText("Be brief.")
    seen = measured(qtbot, w, engine, seen)
    assert w.composer.meter.label.text() == expected("Be brief.", "hello", "hi there", "")
    w.composer.edit.setPlainText("more")
    qtbot.keyClick(w.composer.edit, Qt.Key_Return)
    engine.play(ConversationEvent(cid, TurnFinished("yes", [1], TurnMetrics(finish_reason="stop"))))
    measured(qtbot, w, engine, seen)  # typing, sending and the answer within one pause: one measure, after it
    assert w.composer.meter.label.text() == expected("Be brief.", "hello", "hi there", "more", "yes", "")


def test_deleting_the_open_chat_empties_the_meter_and_undo_measures_it_again(qtbot, make_window, engine):
    w, cid = loaded_chat(qtbot, make_window, engine)
    seen = measured(qtbot, w, engine, 0)
    w.delete_with_undo(cid)
    qtbot.waitUntil(lambda: w.composer.meter.label.text() == "")
    w.undo_delete()
    measured(qtbot, w, engine, seen)
    assert w.composer.meter.label.text() == expected("hello", "hi there", "")


def test_a_model_loaded_by_the_app_is_measured_at_once(qtbot, make_window, engine):
    w = make_window()
    engine.play(ModelLoaded("big", {"context_length": CONTEXT, "architecture": "llama"}))
    measured(qtbot, w, engine, 0)
    assert w.composer.meter.label.text() == expected("")


def test_a_probe_that_fails_is_a_status_line_not_a_failed_answer(qtbot, make_window, engine):
    w, cid = loaded_chat(qtbot, make_window, engine)
    qtbot.waitUntil(lambda: len(probes(engine)) == 1)
    probe = probes(engine)[-1]
    engine.play(ConversationEvent(probe.conversation_id, EngineErrored("template failed", "template")))
    assert w.chat_view.messages[-1].status.text() == "" and not w.composer.message.isVisibleTo(w)
    assert w.statusBar().currentMessage() == "template failed"
