"""Issue 58, found in a by-hand pass under Xvfb + openbox (2026-11-27): what the real app
showed that the earlier tests did not pin."""

from engine.events import TokenEmitted
from engine.worker import ConversationEvent
from tests.app.test_window import send


def test_the_model_line_stops_saying_loading_once_the_answer_streams(qtbot, make_window, engine):
    """A Qwen chat whose model the engine already held (a document's fit check had loaded
    it): 'Loading qwen… for this message…' stayed beside the streaming answer until the turn
    ended. The first token came from that model, so it is loaded."""
    w = make_window()
    qwen = w.store.create_conversation("qwen chat", {"model": "tiny"})
    w.controller.open(qwen)
    cid = send(qtbot, w).conversation_id
    assert w.dashboard.model_state.text() == "Loading tiny for this message…"
    engine.play(ConversationEvent(cid, TokenEmitted("Hel", 1)))
    assert "Loading" not in w.dashboard.model_state.text()
    assert w.dashboard.model_state.text().startswith("tiny loaded")
