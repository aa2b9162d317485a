"""A chat's prompt cache survives the app: saved beside the database when the session
leaves memory, restored on the chat's first turn, refused when the model changed."""

import pytest

from brisk.engine.api.conversation import CancelToken, Message
from brisk.engine.api.events import TurnFinished
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.worker import Answer, EngineWorker
from brisk.engine.kv.saved import SavedCaches

DOCUMENT = "The committee met on Tuesday to review the water budget for the coming year. " * 6


@pytest.fixture(params=["float32", "4-bit weights"])
def tiny_llama(request, tiny_llama, tiny_llama_q4):
    """Every test here runs on a float model and on a quantized one."""
    return tiny_llama if request.param == "float32" else tiny_llama_q4


def settings(**kw):
    return ChatSettings(**{"model": "tiny-llama", "temperature": 0.0, "max_tokens": 6, **kw})


def finished(worker, command):
    events = [e.event for e in worker.handle(command, CancelToken())]
    return [e for e in events if isinstance(e, TurnFinished)][0]


def first_chat(lm, folder):
    worker = EngineWorker(
        {"tiny-llama": lm}.__getitem__, memory_available=lambda: 2**30, saved_caches=SavedCaches(folder)
    )
    done = finished(worker, Answer(1, settings(), [Message("user", DOCUMENT)]))
    worker.close()  # the app exits
    return [Message("user", DOCUMENT), Message("assistant", done.text), Message("user", "What was reviewed?")], done


def test_a_reopened_chat_reads_only_its_new_message(tiny_llama, tmp_path):
    history, first = first_chat(tiny_llama, tmp_path)
    assert (tmp_path / "chat-1.safetensors").stat().st_mode & 0o777 == 0o600
    reopened = EngineWorker(
        {"tiny-llama": tiny_llama}.__getitem__, memory_available=lambda: 2**30, saved_caches=SavedCaches(tmp_path)
    )
    follow = finished(reopened, Answer(1, settings(), history))
    assert follow.metrics.cached_tokens >= first.metrics.prompt_tokens
    cold = list(Session(tiny_llama, settings()).answer(history))
    assert follow.token_ids == [e for e in cold if isinstance(e, TurnFinished)][0].token_ids


def test_a_saved_cache_of_another_model_is_refused_and_deleted(tiny_llama, tmp_path):
    from brisk.engine.models.loader import load_folder
    from tests.tiny_models import make_tiny_model

    history, _ = first_chat(tiny_llama, tmp_path)
    other = load_folder(make_tiny_model(tmp_path / "other", "llama", seed=7), model_id="other")
    worker = EngineWorker(
        {"other": other}.__getitem__, memory_available=lambda: 2**30, saved_caches=SavedCaches(tmp_path)
    )
    follow = finished(worker, Answer(1, settings(model="other"), history))
    assert follow.metrics.cached_tokens == 0 and not (tmp_path / "chat-1.safetensors").exists()


def test_a_damaged_saved_cache_costs_one_prefill_not_the_chat(tiny_llama, tmp_path):
    history, _ = first_chat(tiny_llama, tmp_path)
    (tmp_path / "chat-1.safetensors").write_bytes(b"half a file")
    worker = EngineWorker(
        {"tiny-llama": tiny_llama}.__getitem__, memory_available=lambda: 2**30, saved_caches=SavedCaches(tmp_path)
    )
    follow = finished(worker, Answer(1, settings(), history))
    assert follow.metrics.cached_tokens == 0 and follow.token_ids


def test_at_most_max_files_are_kept(tiny_llama, tmp_path):
    saved = SavedCaches(tmp_path, max_files=2)
    for cid in range(4):
        session = Session(tiny_llama, settings())
        list(session.send(f"chat number {cid}"))
        saved.save(cid, session)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat-2.safetensors", "chat-3.safetensors"]
