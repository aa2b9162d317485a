"""Model management through the engine worker: progress events, results, clean failures."""

import pytest

from brisk.engine.api.events import DownloadProgressed, EngineErrored
from brisk.engine.api.session import CancelToken
from brisk.engine.host.model_commands import ImportGGUF, ModelsChanged, RemoveModel
from brisk.engine.host.worker import EngineWorker
from brisk.engine.models.store import ModelStore
from tests.gguf_writer import write_gguf
from tests.tiny_models import make_tiny_model

# Runs no model, kernel or process, so no kernel plan changes it: CI runs it once (tests/plan_guard.py).
pytestmark = pytest.mark.plan_independent


def test_import_gguf_then_remove_through_the_worker(tmp_path):
    gguf = write_gguf(make_tiny_model(tmp_path / "src", "llama"), tmp_path / "tiny.gguf")
    worker = EngineWorker(lambda mid: None)
    events = list(worker.handle(ImportGGUF(str(gguf), "tiny-imported"), CancelToken()))
    progress = [e for e in events if isinstance(e, DownloadProgressed)]
    assert progress and progress[-1].done_bytes == progress[-1].total_bytes
    assert isinstance(events[-1], ModelsChanged) and "tiny-imported" in events[-1].message
    assert ModelStore().has("tiny-imported")
    (removed,) = worker.handle(RemoveModel("tiny-imported"), CancelToken())
    assert isinstance(removed, ModelsChanged) and not ModelStore().has("tiny-imported")


def test_broken_gguf_is_an_error_event_and_installs_nothing(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    (event,) = EngineWorker(lambda mid: None).handle(ImportGGUF(str(bad), "broken"), CancelToken())
    assert isinstance(event, EngineErrored) and event.kind == "gguf_import"
    assert not ModelStore().has("broken")
