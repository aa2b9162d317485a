"""The engine behind the app: commands in, typed events out, one conversation at a time.

`EngineWorker.handle(command, cancel)` yields events; the app runs it on its single engine
thread (app/engine_thread.py) and the tests drive it directly. It owns the loaded models
(a few, least recently used dropped) and one `Session` per open conversation, so a chat's
prompt cache survives while the user switches between chats. Every failure is an event.
The API server's conversations (negative ids) are bounded by their owner, the server's
queue, by bytes (`ForgetConversation`), and `DescribeSessions` tells it which are alive.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Union

from brisk.engine.accel.speculative.controller import PairCosts
from brisk.engine.accel.speculative.drafters import check_draft_pair
from brisk.engine.api.conversation import CancelToken
from brisk.engine.api.errors import BriskError
from brisk.engine.api.events import EngineErrored, EngineEvent, ModelLoaded, ModelLoadProgressed, TurnFinished
from brisk.engine.api.metrics import TurnMetrics
from brisk.engine.api.session import Session
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.model_commands import MODEL_COMMANDS, ModelsChanged, RemoveModel, run_model_command
from brisk.engine.kv.saved import SavedCaches
from brisk.engine.runtime.crash_log import user_message

if TYPE_CHECKING:
    from brisk.engine.turn.documents import Document

log = logging.getLogger(__name__)

# Target plus draft for the current chat, and one more for switching back and forth.
MAX_MODELS = 3
MAX_SESSIONS = 4  # prompt caches kept for recently used chats (the server's are bounded by bytes)


@dataclass(frozen=True)
class LoadModel:
    model_id: str


@dataclass(frozen=True)
class Answer:
    """Answer a conversation. `messages` is its whole history as the store holds it (the one
    owner of history), ending with the user message to answer. A new turn, a regenerate and
    an edit are all this command: the session's prompt cache keeps whatever prefix is
    unchanged and reads only the rest."""

    conversation_id: int
    settings: ChatSettings
    messages: list


@dataclass(frozen=True)
class ForgetConversation:
    """Drop a conversation's session and prompt cache (the server's LRU by bytes)."""

    conversation_id: int


@dataclass(frozen=True)
class DescribeSessions:
    """Which conversations have a live session, and the bytes their prompt caches hold."""


@dataclass(frozen=True)
class SessionsDescribed:
    sessions: dict[int, int]  # conversation id -> KV bytes its caches reserve (target and draft)


@dataclass(frozen=True)
class CheckDocument:
    """Would `path` (or a document already read) fit, after `history` and the documents
    attached before it? Sent again when the chat's model or KV setting changes."""

    conversation_id: int
    path: str
    settings: ChatSettings
    history: list
    document: Document | None = None  # already read: checked again without reading the file


@dataclass(frozen=True)
class ConversationEvent:
    """An engine event of one conversation."""

    conversation_id: int
    event: object


@dataclass(frozen=True)
class DocumentChecked:
    conversation_id: int
    document: object  # brisk.engine.turn.documents.Document
    fit: object  # brisk.engine.turn.documents.Fit
    recheck: bool = False  # a document already attached, checked again (CheckDocument.document)


TURN_COMMANDS = (Answer,)
# What `EngineWorker.handle` yields: engine events, scoped to their chat when they belong to one.
WorkerEvent = Union[EngineEvent, ConversationEvent, DocumentChecked, ModelsChanged, SessionsDescribed]


class EngineWorker:
    def __init__(
        self,
        load: Callable[[str], object] | None = None,
        *,
        memory_available: Callable[[], int] | None = None,
        saved_caches: SavedCaches | None = None,
        pair_costs: PairCosts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        from brisk.engine.models.bundled import load_installing_default

        self._load = load or (
            lambda model_id: load_installing_default(
                model_id, progress=lambda message: self._progress(model_id, message)
            )
        )
        # Set by the thread that runs the worker: loading blocks its generator, so steps of a
        # long first-run install are reported through this side channel as they happen.
        self.on_progress: Callable[[object], None] | None = None
        self._models: OrderedDict[str, object] = OrderedDict()
        self._sessions: OrderedDict[int, Session] = OrderedDict()
        self._memory_available = memory_available or _memory_available
        # measured draft/verify costs, for every chat's sessions (the app's outlive restarts)
        self._pair_costs = pair_costs or PairCosts()
        self._saved = saved_caches  # prompt caches kept across app restarts (None: in memory only)
        # time.monotonic: the turn's start is compared with the app's Send (tests inject one)
        self._clock = clock

    def _progress(self, model_id: str, message: str) -> None:
        log.info("%s: %s", model_id, message)
        if self.on_progress is not None:
            self.on_progress(ModelLoadProgressed(model_id, message))

    def handle(self, command, cancel: CancelToken) -> Iterator[WorkerEvent]:
        cid = getattr(command, "conversation_id", None)
        try:
            yield from self._dispatch(command, cancel)
        except BriskError as exc:
            yield _scoped(cid, EngineErrored(str(exc), exc.kind))
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:  # the engine thread must outlive any bug, a Rust panic too
            # (the tokenizers library raises pyo3's PanicException, a BaseException, on a
            # hostile tokenizer.json: it killed the server's engine thread for good)
            log.exception("engine command failed")
            yield _scoped(
                cid, EngineErrored(user_message(exc, context="The engine"), "internal", traceback.format_exc())
            )

    def _dispatch(self, command, cancel) -> Iterator[WorkerEvent]:
        if cancel.cancelled:  # stopped before it started: it never starts
            if isinstance(command, TURN_COMMANDS):
                yield ConversationEvent(
                    command.conversation_id, TurnFinished("", [], TurnMetrics(finish_reason="cancelled"))
                )
            return
        if isinstance(command, LoadModel):
            lm = self.model(command.model_id)
            yield ModelLoaded(
                lm.id,
                {"architecture": lm.info.architecture, "context_length": lm.context_length, "dtype": lm.compute_dtype},
            )
        elif isinstance(command, Answer):
            cid = command.conversation_id
            # when the engine took the turn up (the app compares it with its Send), and what
            # the turn waited for before its session: model loads, a cache restore
            setup: dict = {"engine_started_at": self._clock()}
            session = self._session(cid, command.settings, setup)
            for event in self._scoped_events(cid, session.answer(command.messages, cancel=cancel)):
                if isinstance(event.event, TurnFinished):
                    event.event.metrics.update(setup)
                yield event
        elif isinstance(command, CheckDocument):
            yield self._check_document(command)
        elif isinstance(command, ForgetConversation):
            self._sessions.pop(command.conversation_id, None)
        elif isinstance(command, DescribeSessions):
            yield SessionsDescribed({cid: session_bytes(s) for cid, s in self._sessions.items()})
        elif isinstance(command, MODEL_COMMANDS):
            if isinstance(command, RemoveModel):  # a loaded model's files are about to go
                self._models.pop(command.model_id, None)
                self._sessions.clear()
            yield from run_model_command(command, cancel)
        else:
            raise BriskError(f"Unknown engine command {type(command).__name__}")

    def model(self, model_id: str):
        if model_id in self._models:
            self._models.move_to_end(model_id)
            return self._models[model_id]
        lm = self._load(model_id)
        self._models[model_id] = lm
        while len(self._models) > MAX_MODELS:
            dropped, _ = self._models.popitem(last=False)
            self._sessions = OrderedDict(
                (c, s) for c, s in self._sessions.items() if dropped not in (s.lm.id, getattr(s.draft, "id", None))
            )
        return lm

    def _session(self, cid: int, settings: ChatSettings, setup: dict | None = None) -> Session:
        """The conversation's session, reused (with its prompt cache) while its model is
        unchanged; a new draft replaces only the draft's state. `setup` gets the seconds spent
        loading models and restoring a saved prompt cache (TurnMetrics fields)."""
        setup = {} if setup is None else setup
        settings = settings.validate()
        session = self._sessions.get(cid)
        started = self._clock()
        draft = self.model(settings.draft) if settings.draft else None
        if session is None or session.lm.id != settings.model:
            lm = self.model(settings.model)
            setup["model_load_s"] = self._clock() - started
            if draft is not None:
                check_draft_pair(lm, draft)
            session = Session(lm, settings, draft=draft, pair_costs=self._pair_costs, clock=self._clock)
            if self._saved is not None:
                restoring = self._clock()
                if self._saved.restore(cid, session):
                    setup["cache_restore_s"] = self._clock() - restoring
                    setup["restored_tokens"] = session.cached_tokens
        elif getattr(session.draft, "id", None) != settings.draft:
            setup["model_load_s"] = self._clock() - started  # the new draft's load, if it was not loaded
            if draft is not None:
                check_draft_pair(session.lm, draft)
            session.use_draft(draft)  # a new draft: the target's prompt cache stays
        session.settings = settings
        self._sessions[cid] = session
        self._sessions.move_to_end(cid)
        chats = [c for c in self._sessions if not is_server_conversation(c)]
        for evicted in chats[: max(0, len(chats) - MAX_SESSIONS)]:  # least recently used first
            self._save(evicted, self._sessions.pop(evicted))
        return session

    def close(self) -> None:
        """Before the app exits (on the engine thread): keep every open chat's prompt cache."""
        for cid, session in self._sessions.items():
            self._save(cid, session)

    def _save(self, cid: int, session: Session) -> None:
        if self._saved is not None and not is_server_conversation(cid):
            self._saved.save(cid, session)

    def _check_document(self, command: CheckDocument) -> DocumentChecked:
        from brisk.engine.turn.documents import check_fit, read_document

        document = command.document or read_document(command.path)
        lm = self.model(command.settings.model)
        fit = check_fit(lm, command.history, document, command.settings, memory_available=self._memory_available())
        return DocumentChecked(command.conversation_id, document, fit, recheck=command.document is not None)

    @staticmethod
    def _scoped_events(cid: int, events) -> Iterator[ConversationEvent]:
        for event in events:
            yield ConversationEvent(cid, event)


def is_server_conversation(cid: int) -> bool:
    """Negative ids are the API server's conversations (engine/host/serve/scheduler.py), never a chat's."""
    return cid < 0


def session_bytes(session: Session) -> int:
    """The memory a session's prompt caches reserve: the target's and its draft's buffers."""
    from brisk.engine.api.metrics import kv_bytes_allocated

    caches = [session.cache] + ([session.pair.cache] if session.pair is not None else [])
    return sum(kv_bytes_allocated(c.layers) for c in caches if c.layers is not None)


def _scoped(cid, event):
    return event if cid is None else ConversationEvent(cid, event)


def _memory_available() -> int:
    from brisk.engine.runtime.info import memory_available

    return memory_available()
