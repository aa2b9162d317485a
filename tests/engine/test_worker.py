"""The engine worker the app's engine thread runs: commands in, scoped events out."""

from brisk.engine.api.errors import ModelNotFound
from brisk.engine.api.events import EngineErrored, ModelLoaded, TokenEmitted, TurnFinished
from brisk.engine.api.session import CancelToken, Message
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.worker import (
    Answer,
    CheckDocument,
    ConversationEvent,
    DocumentChecked,
    EngineWorker,
    LoadModel,
)


def worker_for(lm):
    def load(model_id):
        if model_id != lm.id:
            raise ModelNotFound(f"Model {model_id} is not installed")
        return lm

    return EngineWorker(load, memory_available=lambda: 2**30)


def settings(**kw):
    return ChatSettings(**{"model": "tiny-llama", "temperature": 0.0, "max_tokens": 8, **kw})


def run(worker, command, cancel=None):
    return list(worker.handle(command, cancel or CancelToken()))


def test_send_yields_scoped_events_and_reuses_the_prompt_cache(tiny_llama):
    worker = worker_for(tiny_llama)
    first = run(worker, Answer(7, settings(), [Message("user", "Hello")]))
    assert all(isinstance(e, ConversationEvent) and e.conversation_id == 7 for e in first)
    done = [e.event for e in first if isinstance(e.event, TurnFinished)][0]
    history = [Message("user", "Hello"), Message("assistant", done.text)]
    second = run(worker, Answer(7, settings(), history + [Message("user", "And then?")]))
    metrics = [e.event for e in second if isinstance(e.event, TurnFinished)][0].metrics
    assert metrics.cached_tokens > 0  # the session and its cache were kept for chat 7


def test_regenerate_answers_the_same_greedily(tiny_llama):
    worker = worker_for(tiny_llama)
    hi = [Message("user", "Hi")]
    first = [e.event for e in run(worker, Answer(1, settings(), hi)) if isinstance(e.event, TurnFinished)][0]
    again = run(worker, Answer(1, settings(), [Message("user", "Hi")]))
    assert [e.event for e in again if isinstance(e.event, TurnFinished)][0].token_ids == first.token_ids


def test_unknown_model_and_bad_document_become_error_events(tiny_llama, tmp_path):
    worker = worker_for(tiny_llama)
    (event,) = run(worker, Answer(3, settings(model="missing"), [Message("user", "Hi")]))
    assert isinstance(event.event, EngineErrored) and "missing" in event.event.message
    (event,) = run(worker, CheckDocument(3, str(tmp_path / "none.txt"), settings(), []))
    assert isinstance(event.event, EngineErrored) and event.event.kind == "document"
    (loaded,) = run(worker, LoadModel("tiny-llama"))
    assert isinstance(loaded, ModelLoaded) and loaded.info["context_length"] == tiny_llama.context_length


def test_check_document_reports_its_fit(tiny_llama, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("Meeting notes: the budget grew. " * 10)
    (event,) = run(worker_for(tiny_llama), CheckDocument(5, str(path), settings(), []))
    assert isinstance(event, DocumentChecked) and event.fit.fits and event.document.name == "notes.txt"
    assert not event.recheck
    path.unlink()  # checked again (another model, a document removed): from the text already read
    (again,) = run(worker_for(tiny_llama), CheckDocument(5, str(path), settings(), [], document=event.document))
    assert isinstance(again, DocumentChecked) and again.recheck and again.document is event.document
    assert again.fit == event.fit


def test_cancel_stops_the_turn_and_keeps_the_partial_answer(tiny_llama):
    worker, cancel = worker_for(tiny_llama), CancelToken()
    events = []
    for e in worker.handle(Answer(2, settings(max_tokens=50), [Message("user", "Hello")]), cancel):
        events.append(e.event)
        if isinstance(e.event, TokenEmitted):
            cancel.cancel()
    assert events[-1].metrics.finish_reason == "cancelled"


def test_choosing_a_draft_mid_chat_keeps_the_targets_prompt_cache(tiny_llama, tmp_path):
    """Issue 15: a new draft used to start a new session, and the follow-up re-read the whole chat."""
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    draft = load_folder(
        make_tiny_model(tmp_path / "d", "llama", hidden_size=32, intermediate_size=64), model_id="tiny-draft"
    )
    models = {"tiny-llama": tiny_llama, "tiny-draft": draft}
    worker = EngineWorker(models.__getitem__, memory_available=lambda: 2**30)
    first = [e.event for e in run(worker, Answer(5, settings(), [Message("user", "The quick brown fox")]))]
    done = [e for e in first if isinstance(e, TurnFinished)][0]
    history = [Message("user", "The quick brown fox"), Message("assistant", done.text)]
    follow_up = history + [Message("user", "and then?")]
    second = [e.event for e in run(worker, Answer(5, settings(draft="tiny-draft"), follow_up))]
    metrics = [e for e in second if isinstance(e, TurnFinished)][0].metrics
    assert metrics.cached_tokens >= done.metrics.prompt_tokens
    assert metrics.prefilled_tokens < metrics.prompt_tokens - done.metrics.prompt_tokens + 8
