"""Keeps the composer's context meter at what the next turn would hold. It asks the engine's
own fit check (engine/turn/documents.py check_fit, through CheckDocument) about the message as it
would be sent: the chat's history and system prompt, the documents waiting, the text typed.
It measures once typing pauses, on attach and remove, when a chat opens or its settings
change, when a model loads and after each turn."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer

from brisk.app.store import StoreError
from brisk.engine.api.conversation import Message
from brisk.engine.api.events import ModelLoaded, TurnFinished
from brisk.engine.host.worker import CheckDocument, ConversationEvent, DocumentChecked
from brisk.engine.turn.documents import Document, join_attached

# A measure after each keystroke would queue work on the engine thread; one after a pause does not.
MEASURE_DELAY_MS = 300
# Probes travel under an id no chat has, so a probe that fails is a status-bar line, never a
# failed turn in the chat it measured.
PROBE_ID_OFFSET = 1 << 40


@dataclass(frozen=True)
class MessageProbe(Document):
    """The next user message as it would be sent (documents joined with the typed text)."""

    def as_prompt(self) -> str:
        return self.text


class ContextFill(QObject):
    def __init__(self, controller):
        super().__init__(controller)
        self.controller = controller
        self.meter = controller.composer.meter
        # Models the engine has loaded (a load, or a turn that ran on one): measuring with
        # another would load it just to fill the meter.
        self.loaded: set[str] = set()
        self._probe: MessageProbe | None = None
        self._documents = 0  # the documents' tokens in the measure under way
        self._documents_exact = True  # False: a document's count stopped past the context
        self._timer = QTimer(self, singleShot=True, interval=MEASURE_DELAY_MS)
        self._timer.timeout.connect(self.measure)
        controller.composer.edit.textChanged.connect(self.schedule)
        controller.composer.attachment_removed.connect(self.schedule)
        controller.settings_panel.changed.connect(self.schedule)
        controller.conversations_changed.connect(self.schedule)  # a chat deleted or restored, a message sent
        controller.engine.event.connect(self._engine_event)

    def schedule(self, *_) -> None:
        self._timer.start()

    def measure(self) -> None:
        c = self.controller
        cid = c.current
        if cid is None:
            self.meter.show_unknown("")
            return
        settings = c.settings_panel.settings()
        if settings.model.startswith("remote:"):  # the tokenizer is on the server; it refuses what does not fit
            self.meter.show_unknown("Context fill: not measured with a remote engine (the server checks it)")
            return
        if settings.model not in self.loaded:
            self.meter.show_unknown(f"Context fill: shown once {settings.model} is loaded")
            return
        waiting = c._documents.get(cid, [])
        text = join_attached([(d.name, d.text) for d, _ in waiting], c.composer.edit.toPlainText().strip())
        try:
            history = c._history(cid)
            sent = sum(a["tokens"] for a in c.store.attachments(cid) if isinstance(a["tokens"], int))
        except (StoreError, sqlite3.Error):  # the store closed (quitting) or failing: nothing to measure
            self.meter.show_unknown("")
            return
        if settings.system_prompt:
            history = [Message("system", settings.system_prompt), *history]
        self._probe = MessageProbe("(the next message)", "text", text, len(text.encode()))
        self._documents = sent + sum(fit.tokens for _, fit in waiting)
        self._documents_exact = all(fit.tokens_exact for _, fit in waiting)
        if not self.meter.bar.isVisible():  # "shown once … is loaded" is stale now; a turn may hold the engine
            self.meter.show_unknown("Context fill: measuring…")
        c.engine.submit(CheckDocument(cid + PROBE_ID_OFFSET, "", settings, history, document=self._probe))

    def _engine_event(self, item) -> None:
        if isinstance(item, DocumentChecked) and item.document is self._probe and self._probe is not None:
            self._probe = None
            if item.conversation_id - PROBE_ID_OFFSET == self.controller.current:
                fit = item.fit
                self.meter.show_fill(
                    fit.conversation_tokens,
                    fit.context_length,
                    self._documents,
                    exact=fit.tokens_exact,
                    documents_exact=self._documents_exact,
                )
        elif isinstance(item, DocumentChecked):  # a document attached, or checked again
            self.schedule()
        elif isinstance(item, ModelLoaded):
            self.loaded.add(item.model_id)
            self.schedule()
        elif isinstance(item, ConversationEvent) and isinstance(item.event, TurnFinished):
            if item.conversation_id == self.controller.current:  # its model ran the turn
                self.loaded.add(self.controller.settings_panel.settings().model)
            self.schedule()
