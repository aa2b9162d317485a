"""Model management as engine commands (for the app's model manager): install a bundled
model, download from a hub, import a GGUF, remove. Long operations report progress as
events and stop when cancelled."""

from __future__ import annotations

import queue
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Iterator

from brisk.engine.api.errors import BriskError
from brisk.engine.api.events import DownloadProgressed, EngineErrored


@dataclass(frozen=True)
class InstallBundled:
    model_id: str


@dataclass(frozen=True)
class PullModel:
    repo_id: str
    model_id: str | None = None


@dataclass(frozen=True)
class ImportGGUF:
    path: str
    model_id: str


@dataclass(frozen=True)
class RemoveModel:
    model_id: str


@dataclass(frozen=True)
class ModelsChanged:
    """The installed models changed; `message` says how."""

    message: str


@dataclass(frozen=True)
class ModelCommandFailed(EngineErrored):
    """A model manager's command failed: the manager shows it, not the chat (it is no
    chat's error), in the app's words rather than the CLI's."""


# CLI advice in the store's and downloader's messages, and what the app says instead.
_CLI_ADVICE = (
    (re.compile(r"; remove it first or choose another --id"), "; remove it first or install it under another name"),
    (re.compile(r"; `brisk models rm [^`]*` first"), "; remove it in Models first"),
    (re.compile(r"choose another --id"), "choose another name"),
)


def app_wording(message: str) -> str:
    for pattern, words in _CLI_ADVICE:
        message = pattern.sub(words, message)
    return message


def run_model_command(command, cancel, store=None) -> Iterator[DownloadProgressed | ModelsChanged | ModelCommandFailed]:
    try:
        yield from _run_model_command(command, cancel, store)
    except BriskError as exc:
        yield ModelCommandFailed(app_wording(str(exc)), exc.kind)


def _run_model_command(command, cancel, store=None) -> Iterator[DownloadProgressed | ModelsChanged]:
    from brisk.engine.models.store import ModelStore, validate_model_id

    store = store or ModelStore()
    if isinstance(command, RemoveModel):
        store.remove(command.model_id)
        yield ModelsChanged(f"Removed {command.model_id}")
    elif isinstance(command, InstallBundled):
        from brisk.engine.models.bundled import install_bundled

        def work(report):
            return install_bundled(
                command.model_id, store=store, progress=lambda m: report(DownloadProgressed(command.model_id, 0, 0, m))
            )

        entry = yield from _streamed(work)
        yield ModelsChanged(f"Installed {entry.id}")
    elif isinstance(command, PullModel):
        from brisk.engine.models.download import pull

        def work(report):
            return pull(
                command.repo_id,
                store=store,
                model_id=command.model_id,
                on_progress=report,
                should_stop=lambda: cancel.cancelled,
            )

        entry = yield from _streamed(work)
        yield ModelsChanged(f"Downloaded {entry.id}")
    elif isinstance(command, ImportGGUF):
        from brisk.engine.models.gguf_import import import_gguf

        model_id = validate_model_id(command.model_id)
        name = Path(command.path).name

        def work(report):
            with store.staging(model_id) as stage:
                import_gguf(
                    Path(command.path),
                    stage,
                    progress=lambda done, total: report(DownloadProgressed(model_id, done, total, name)),
                )
                return store.register(stage, model_id=model_id, source=f"gguf:{name}")

        entry = yield from _streamed(work)
        yield ModelsChanged(f"Imported {entry.id} from {name}")
    else:
        raise TypeError(f"not a model command: {command!r}")


def _streamed(work: Callable) -> Generator[DownloadProgressed, None, Any]:
    """Run `work(report)` on a helper thread and yield what it reports, then return its result
    (a generator cannot yield from inside a callback)."""
    events: queue.Queue = queue.Queue()
    done = object()
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = work(events.put)
        except BaseException as exc:  # re-raised on the engine thread
            outcome["error"] = exc
        events.put(done)

    threading.Thread(target=run, name="brisk-model-op", daemon=True).start()
    while (item := events.get()) is not done:
        yield item
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


MODEL_COMMANDS = (InstallBundled, PullModel, ImportGGUF, RemoveModel)
