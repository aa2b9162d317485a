"""What the window does: conversations from the store, commands to the engine thread,
engine events into the widgets and the store.

Answers are written to the store while they stream (at most every SAVE_INTERVAL_S), so
killing the app mid-answer loses at most that much text and never a committed message.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import QApplication

from brisk.app.context_fill import ContextFill
from brisk.app.preferences import record_draft_cost
from brisk.app.store import StoreError
from brisk.app.widgets.safe_text import plain_tooltip
from brisk.engine.api.conversation import Message
from brisk.engine.api.errors import InvalidSettings
from brisk.engine.api.events import (
    ContextTruncated,
    EngineErrored,
    EngineWarned,
    ModelLoaded,
    ModelLoadProgressed,
    PrefillProgressed,
    TokenEmitted,
    TurnFinished,
)
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.model_commands import ModelCommandFailed
from brisk.engine.host.worker import (
    Answer,
    CheckDocument,
    ConversationEvent,
    DocumentChecked,
    LoadModel,
)
from brisk.engine.turn.documents import join_attached

SAVE_INTERVAL_S = 0.5
# An answer the store refused (disk full, read-only) is kept in memory and retried this often.
RETRY_SAVE_MS = 5000
TITLE_CHARS = 48


class ChatController(QObject):
    notice = Signal(str)  # a message for the status bar
    conversations_changed = Signal()
    busy_changed = Signal(bool)

    def __init__(
        self,
        store,
        engine,
        *,
        chat_view,
        composer,
        prefill_bar,
        settings_panel,
        dashboard,
        default_settings: ChatSettings | None = None,
        remote=None,
        parent=None,
    ):
        super().__init__(parent)
        self.store, self.engine = store, engine
        self.remote = remote  # app/remote_engine.py: turns of chats whose model is a Brisk server elsewhere
        self.chat_view, self.composer, self.prefill_bar = chat_view, composer, prefill_bar
        self.settings_panel, self.dashboard = settings_panel, dashboard
        self.default_settings = default_settings or ChatSettings()
        self.current: int | None = None
        # True once a chat opened: the panel then shows settings the user saw (and may have edited
        # after deleting that chat), which the next new chat takes
        self._panel_shows_chat = False
        self.busy = False
        self._answer: dict | None = None  # the streaming answer: conversation, message id, text, last save
        self._turn_job = None  # the engine job of the answer being generated
        self._documents: dict[int, list] = {}  # conversation -> documents checked and waiting to be sent
        self._reading: dict[int, list[str]] = {}  # conversation -> names of documents still being read
        self._fit_key: dict[int, tuple] = {}  # conversation -> the settings its documents were checked under
        self.search_text = ""
        # answers the store could not take yet: message id -> (text, finish reason, metrics)
        self.unsaved: dict[int, tuple] = {}
        self._retry = QTimer(self)
        self._retry.setInterval(RETRY_SAVE_MS)
        self._retry.timeout.connect(self.retry_unsaved)
        engine.event.connect(self.on_event)
        if remote is not None:
            remote.event.connect(self.on_event)
        composer.send_requested.connect(self.send)
        composer.stop_requested.connect(self.stop)
        composer.attach_requested.connect(self.attach)
        composer.attachment_removed.connect(self.remove_attachment)
        chat_view.regenerate_requested.connect(self.regenerate)
        chat_view.read_all_requested.connect(self.read_all)
        settings_panel.changed.connect(self.settings_changed)
        self.context_fill = ContextFill(self)  # the composer's context meter

    # --- conversations -----------------------------------------------------------------

    def conversations(self):
        return self.store.conversations(self.search_text)

    def new_conversation(self) -> int | None:
        if self.current is not None and self.is_empty(self.current):  # already a fresh one: not a second
            self.conversations_changed.emit()
            return self.current
        settings = self.settings_panel.settings() if self._panel_shows_chat else self.default_settings
        try:
            cid = self.store.create_conversation("New chat", settings.to_dict())
        except StoreError as exc:
            self.notice.emit(f"Cannot start a new chat: {exc}")
            return None
        self.current = cid  # the sidebar, redrawn now, highlights the new chat (not the one left)
        self.conversations_changed.emit()
        self.open(cid)
        return cid

    def is_empty(self, cid: int) -> bool:
        """No message sent and no document waiting: a "New chat" the user has not used."""
        return not self._documents.get(cid) and not self._reading.get(cid) and not self.store.messages(cid)

    def drop_if_empty(self, cid: int | None) -> None:
        """An unused chat is not kept: dropped when the user leaves it or quits (issue 58)."""
        if cid is None or self.store.read_only or not self.is_empty(cid):
            return
        try:
            self.store.drop_empty(cid)
        except StoreError:
            return  # kept; the next start drops it
        self._fit_key.pop(cid, None)
        if cid == self.current:
            self.current = None
        # later: this may run inside the sidebar's own selection signal, which must not refill it
        QTimer.singleShot(0, self, self.conversations_changed.emit)

    def open(self, cid: int) -> None:
        if self.current is not None and self.current != cid:
            self.drop_if_empty(self.current)
        self.current = cid
        conv = self.store.conversation(cid)
        self.chat_view.clear()
        documents = {a["name"]: a for a in self.store.attachments(cid)}
        stored = self.store.messages(cid)
        for m in stored:
            widget = self.chat_view.add_message(
                m.role,
                m.content,
                m.finish_reason,
                documents=documents,
                coverage=(m.metrics or {}).get("coverage") if m.role == "assistant" else None,
            )
            if m.note:  # a row the store could only partly read (app/chat_schema.py) says so
                widget.setToolTip(plain_tooltip(m.note))  # it quotes the stored value
        marked = [m.note for m in stored if m.note]
        if marked:
            self.notice.emit(f"{len(marked)} message(s) of this chat are marked (hover over one): {marked[0]}")
        if stored and stored[-1].role == "assistant":  # only the last answer pages: later turns built on it
            self.chat_view.messages[-1].set_versions(*self.store.versions(cid, len(stored) - 1))
        # the chat's own turns, from the store: its speed chart and its last turn's numbers
        turns = [m.metrics for m in stored if m.role == "assistant" and m.metrics]
        self.dashboard.show_history(turns, model=conv.settings.get("model", ""))
        try:
            settings = ChatSettings.from_dict({**self.default_settings.to_dict(), **conv.settings})
        except InvalidSettings as exc:  # a damaged row must not keep the chat from opening
            settings = self.default_settings
            self.notice.emit(f"This chat's saved settings were unusable and defaults are shown ({exc})")
        self.settings_panel.set_settings(settings)
        self._panel_shows_chat = True
        self.dashboard.set_chat_models(settings.model, settings.draft)
        self._fit_key[cid] = _fit_key(settings)
        self._show_attachments(cid)
        self.context_fill.schedule()

    def rename(self, cid: int, title: str) -> None:
        if self._saved("Cannot rename", self.store.rename, cid, title):
            self.conversations_changed.emit()

    def delete(self, cid: int) -> None:
        if not self._saved("Cannot delete", self.store.delete, cid):
            return
        if cid == self.current:
            self.current = None
            self.chat_view.clear()
            self.dashboard.clear_chat()  # its numbers were the deleted chat's
        self.conversations_changed.emit()

    def undelete(self, cid: int) -> bool:
        restored = self._saved("Cannot restore", self.store.undelete, cid)
        self.conversations_changed.emit()
        return restored

    def search(self, text: str) -> None:
        self.search_text = text
        self.conversations_changed.emit()

    def settings_changed(self, settings: ChatSettings) -> None:
        if self.current is not None:
            self._saved("Settings not saved", self.store.save_settings, self.current, settings.to_dict())
            self.dashboard.set_chat_models(settings.model, settings.draft)
            if self._fit_key.get(self.current) != _fit_key(settings):  # another model, KV size or overflow
                self._fit_key[self.current] = _fit_key(settings)
                self._recheck_attachments(self.current)

    # --- turns ---------------------------------------------------------------------------

    def send(self, text: str) -> None:
        if self.busy:
            self.notice.emit("Brisk is still answering: stop it (Esc) or wait")
            return
        if self.current is None and self.new_conversation() is None:
            return
        cid, settings = self.current, self.settings_panel.settings()
        if self._reading.get(cid):  # else the question goes without it, and the chip comes after
            self.composer.show_message(f"Still reading {self._reading[cid][0]}: send once it is shown", error=True)
            return
        documents = self._documents.get(cid, [])
        too_big = [fit for _, fit in documents if not fit.fits]
        if too_big and settings.context_overflow != "truncate_oldest":
            self.composer.show_message(
                too_big[0].reason + ". Remove it, or set context overflow to truncate_oldest.", error=True
            )
            return
        content = join_attached([(d.name, d.text) for d, _ in documents], text)
        history = self._history(cid)
        try:  # one transaction: a refused write leaves the message in the box and nothing half-saved
            with self.store._transaction():
                for doc, fit in documents:
                    self.store.add_attachment(cid, doc.name, doc.kind, fit.tokens, doc.text, doc.pages)
                if not history:
                    taken = {c.title for c in self.store.conversations() if c.id != cid}
                    self.store.rename(cid, _unique(_title(text or documents[0][0].name), taken))
                self.store.add_message(cid, "user", content)
                answer_id = self.store.begin_answer(cid)
        except StoreError as exc:
            self.composer.show_message(
                f"{exc}. Your message is still here: send it again once that is fixed.", error=True
            )
            self.notice.emit(str(exc))
            return
        self._documents.pop(cid, None)
        self.composer.clear_attachments()
        self.composer.edit.clear()
        self.composer.show_message("")
        self.chat_view.add_message(
            "user",
            content,
            documents={d.name: {"kind": d.kind, "tokens": fit.tokens, "pages": d.pages} for d, fit in documents},
        )
        self._start_answer(cid, answer_id)
        self._turn_job = self._submit_turn(Answer(cid, settings, self._history(cid)))
        self.conversations_changed.emit()

    def read_all(self) -> None:
        """Regenerate the last answer once with dense prefill (the chat's settings stay)."""
        self.regenerate(dense=True)

    def regenerate(self, dense: bool = False) -> None:
        cid = self.current
        if cid is None or self.busy:
            return
        messages = self.store.messages(cid)
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
        if last_user is None:
            return
        try:  # the answer there is kept as an earlier version ("< 1/2 >")
            answer_id = self.store.regenerate_at(cid, last_user + 1)
        except StoreError as exc:
            self.notice.emit(f"Cannot regenerate: {exc}")
            return
        focused = QApplication.focusWidget()  # the button clicked goes with the rebuilt chat
        in_chat = focused is not None and (focused is self.chat_view or self.chat_view.isAncestorOf(focused))
        self.open(cid)
        self.composer.show_message("")  # a retry: the failed turn's line is stale now
        self._start_answer(cid, answer_id, shown=True)
        if in_chat:  # else Qt hands the focus on to the sidebar's search box, which the next keys filter
            self.chat_view.setFocus(Qt.OtherFocusReason)
        settings = self.settings_panel.settings()
        if dense:
            settings = replace(settings, sparse_prefill="off", uniprefill="off")
        self._turn_job = self._submit_turn(Answer(cid, settings, self._history(cid)))

    def show_version(self, step: int) -> None:
        """Page the last answer through the versions Regenerate kept (-1 older, +1 newer);
        the conversation goes on from the one shown."""
        cid = self.current
        if cid is None or self.busy:
            return
        messages = self.store.messages(cid)
        if not messages or messages[-1].role != "assistant":
            return
        if self._saved("Cannot switch answers", self.store.show_version, cid, len(messages) - 1, step):
            self.open(cid)
            self.chat_view.focus_versions(step)

    def edit(self, index: int, text: str) -> None:
        cid = self.current
        if cid is None:
            return
        if self.busy:
            self.notice.emit("Brisk is still answering: stop it (Esc), then edit")
            return
        stored = self.store.messages(cid)
        if not 0 <= index < len(stored) or stored[index].role != "user":
            return
        try:
            with self.store._transaction():
                self.store.truncate(cid, index + 1)
                self.store.set_content(stored[index].id, text)
                answer_id = self.store.begin_answer(cid)
        except StoreError as exc:
            self.notice.emit(f"Cannot edit: {exc}")
            return
        self.open(cid)
        self._start_answer(cid, answer_id, shown=True)
        self._turn_job = self._submit_turn(Answer(cid, self.settings_panel.settings(), self._history(cid)))

    def stop(self) -> None:
        """Stop this chat's answer (also before the engine reaches it), nothing else: a model
        download or document check goes on."""
        if self._turn_job is not None:
            self._turn_job.cancel()

    def _submit_turn(self, answer: Answer):
        """A turn goes to the remote engine its chat names, else to this machine's engine."""
        from brisk.app.remote_client import is_remote

        if self.remote is not None and is_remote(answer.settings.model):
            return self.remote.submit(answer)
        return self.engine.submit(answer)

    def attach(self, path: str) -> None:
        from brisk.app.remote_client import is_remote

        if is_remote(self.settings_panel.settings().model):  # the fit check needs the model's tokenizer here
            self.composer.show_message(
                "Documents attach to chats with a local model; with a remote engine, paste the text", error=True
            )
            return
        if self.current is None:
            self.new_conversation()
        self.composer.show_message("Reading the document…")
        self._reading.setdefault(self.current, []).append(Path(path).name)
        settings = self.settings_panel.settings()
        self.engine.submit(CheckDocument(self.current, path, settings, self._history_with(self.current, None)))

    def remove_attachment(self, index: int) -> None:
        """✕ on a chip: the document leaves what is sent, and the rest's fit is checked without it."""
        documents = self._documents.get(self.current, []) if self.current is not None else []
        if 0 <= index < len(documents):
            documents.pop(index)
            self._recheck_attachments(self.current)
        self.composer.show_message("")

    def _recheck_attachments(self, cid: int | None) -> None:
        """Each attached document checked again, after the chat and the documents before it,
        under the chat's settings now (its chips keep their old fit until the answers come)."""
        documents = self._documents.get(cid, []) if cid is not None else []
        if cid is None or not documents:
            return
        settings = self.settings_panel.settings()
        for i, (doc, _) in enumerate(documents):
            self.engine.submit(CheckDocument(cid, doc.name, settings, self._history_with(cid, i), document=doc))

    def load_model(self, model_id: str) -> None:
        self.dashboard.loading(model_id)
        self.engine.submit(LoadModel(model_id))

    def _server_event(self, event) -> None:
        if isinstance(event, TurnFinished):
            metrics = event.metrics.to_dict()
            self.dashboard.model_ran(metrics)
            self.dashboard.show_api_turn(metrics, model=self.default_settings.model)  # not the open chat's
        elif isinstance(event, EngineErrored):
            self.notice.emit(f"API request failed: {event.message}")

    # --- engine events ---------------------------------------------------------------

    def on_event(self, item) -> None:
        if isinstance(item, ConversationEvent):
            cid = item.conversation_id
            answering = self._answer is not None and self._answer["cid"] == cid
            if isinstance(item.event, EngineErrored) and self._reading.get(cid) and not answering:
                self._reading[cid].pop(0)  # a read that failed (the engine runs jobs in order)
            self._conversation_event(item.conversation_id, item.event)
        elif isinstance(item, DocumentChecked):
            if not item.recheck and self._reading.get(item.conversation_id):
                self._reading[item.conversation_id].pop(0)
            self._document_checked(item)
        elif isinstance(item, ModelLoadProgressed):
            self.dashboard.set_model_state(f"{item.model_id}: {item.message}")
            # what, from where and how much: said before it starts; the kernels' one-time compile too
            if item.message.startswith(("Downloading ", "Compiling Brisk's CPU kernels")):
                self.notice.emit(item.message)
        elif isinstance(item, ModelLoaded):
            self.dashboard.model_loaded(item.model_id, item.info)
        elif isinstance(item, EngineErrored):
            self.notice.emit(item.message)
            self.dashboard.load_failed()  # (a load's failure is not a chat's: it comes unscoped)
            if not isinstance(item, ModelCommandFailed):  # the model manager shows its own errors
                self.composer.show_message(item.message, error=True)
        elif isinstance(item, EngineWarned):
            self.notice.emit(item.message)

    def _conversation_event(self, cid: int, event) -> None:
        if cid < 0:  # an API server request (app/api_server.py): the dashboard shows its turns apart
            self._server_event(event)
            return
        visible = cid == self.current
        answer = self._answer if self._answer and self._answer["cid"] == cid else None
        if isinstance(event, PrefillProgressed) and visible:
            self.prefill_bar.progress(event.done, event.total, event.phase, event.seconds_left)
        elif isinstance(event, TokenEmitted):
            if answer is not None:
                answer["text"] += event.text
                self._maybe_save(answer)
            if visible:
                self.prefill_bar.finish()
                self.chat_view.append_to_last(event.text, event.source)
                if answer is not None and not answer.get("first_at"):
                    answer["first_at"] = time.monotonic()  # on screen now: what the user waited for
                    self.dashboard.first_token(answer["first_at"] - answer["started"])
        elif isinstance(event, TurnFinished):
            metrics = event.metrics.to_dict()
            if answer is not None:
                metrics.update(_waited(answer, metrics))
            if metrics.get("kv_check"):
                self.settings_panel.refresh_kv()  # a first packed turn measured this model's KV fidelity
            self._remember_draft_cost(cid, metrics)
            if answer is not None:
                self._finish_saved(answer["id"], event.text, metrics["finish_reason"], metrics)
                self._end_answer()
            if visible:
                self.prefill_bar.finish()
                self.chat_view.flush()
                if self.chat_view.messages:
                    self.chat_view.messages[-1].set_finish(metrics["finish_reason"])
                    self.chat_view.messages[-1].set_coverage(metrics.get("coverage"))
                self.dashboard.model_ran(metrics)
                self.dashboard.show_turn(metrics, model=self.settings_panel.settings().model)
        elif isinstance(event, EngineErrored):
            if answer is not None:
                self._finish_saved(answer["id"], answer["text"], "error", None)
                self._end_answer()
            if visible:
                self.prefill_bar.finish()
                self.chat_view.flush()
                if self.chat_view.messages and self.chat_view.messages[-1].role == "assistant":
                    self.chat_view.messages[-1].set_finish("error")
                self.composer.show_message(event.message, error=True)
                self.dashboard.turn_failed()
            self.notice.emit(event.message)
        elif isinstance(event, EngineWarned):
            self.notice.emit(event.message)
        elif isinstance(event, ContextTruncated):
            self.notice.emit(f"The {event.dropped_messages} oldest messages no longer fit and were left out")

    def _remember_draft_cost(self, cid: int, metrics: dict) -> None:
        """A turn that drafted measured its draft's step cost: drafts are ranked by it from now on."""
        ratio = metrics.get("draft_cost_ratio") or 0.0
        settings = self.settings_panel.settings() if cid == self.current else None
        if ratio > 0 and settings is not None and settings.draft:
            record_draft_cost(settings.model, settings.draft, ratio)
            self.settings_panel.set_settings(settings)  # re-ranks the draft list

    def _document_checked(self, item: DocumentChecked) -> None:
        doc, fit = item.document, item.fit
        documents = self._documents.setdefault(item.conversation_id, [])
        at = next((i for i, (known, _) in enumerate(documents) if known is doc), None)
        if at is not None:  # a re-check: the same document's fit now
            documents[at] = (doc, fit)
        elif not item.recheck:
            documents.append((doc, fit))
        else:
            return  # removed while its re-check was under way
        if item.conversation_id == self.current:
            self._show_attachments(item.conversation_id)
            self.composer.show_message("" if fit.fits else fit.reason, error=not fit.fits)

    def _show_attachments(self, cid: int) -> None:
        self.composer.clear_attachments()
        for doc, fit in self._documents.get(cid, []):
            self.composer.add_attachment(doc.name, fit.tokens, fit.fits, fit.reason, exact=fit.tokens_exact)

    def _history_with(self, cid: int, attached: int | None) -> list[Message]:
        """The chat's messages and the first `attached` documents waiting to be sent (None: all):
        what a document's fit is checked after."""
        documents = self._documents.get(cid, [])[:attached]
        return [*self._history(cid), *(Message("user", doc.as_prompt()) for doc, _ in documents)]

    # --- helpers ----------------------------------------------------------------------

    def _start_answer(self, cid: int, answer_id: int, *, shown: bool = False) -> None:
        now = time.monotonic()
        self._answer = {"cid": cid, "id": answer_id, "text": "", "saved_at": now, "started": now}
        self.dashboard.waiting()
        if not (shown and self.chat_view.messages and self.chat_view.messages[-1].role == "assistant"):
            self.chat_view.add_message("assistant")
        self.prefill_bar.start()
        self._set_busy(True)

    def _end_answer(self) -> None:
        self._answer = None
        self._set_busy(False)

    def save_before_quit(self) -> None:
        """The answer streaming now, as far as it got, and answers kept in memory after a failed
        save: saved at once (saves are otherwise every SAVE_INTERVAL_S)."""
        if self._answer is not None:
            try:
                self.store.set_content(self._answer["id"], self._answer["text"])
            except StoreError:
                pass  # the restart marks it interrupted with what the last save held
        self.retry_unsaved()

    def _maybe_save(self, answer: dict) -> None:
        now = time.monotonic()
        if now - answer["saved_at"] >= SAVE_INTERVAL_S:
            answer["saved_at"] = now
            try:
                self.store.set_content(answer["id"], answer["text"])
            except StoreError as exc:  # the answer goes on in memory; the final save retries
                if not answer.get("save_failed"):
                    answer["save_failed"] = True
                    self.notice.emit(f"{exc}: the answer is kept in memory and saved when possible")

    def _finish_saved(self, message_id: int, text: str, finish_reason: str, metrics) -> None:
        """Save a finished answer, or keep it in memory and retry (disk full, read-only)."""
        try:
            self.store.finish_answer(message_id, text, finish_reason, metrics)
        except StoreError as exc:
            self.unsaved[message_id] = (text, finish_reason, metrics)
            self.notice.emit(f"{exc}: the answer is shown and kept in memory; Brisk retries saving it")
            self._retry.start()

    def retry_unsaved(self) -> None:
        for message_id, (text, finish_reason, metrics) in list(self.unsaved.items()):
            try:
                self.store.finish_answer(message_id, text, finish_reason, metrics)
            except StoreError:
                return  # still failing: try again at the next tick
            del self.unsaved[message_id]
            self.notice.emit("An answer that could not be saved earlier is now saved")
        self._retry.stop()

    def _saved(self, what: str, write, *args) -> bool:
        try:
            write(*args)
        except StoreError as exc:
            self.notice.emit(f"{what}: {exc}")
            return False
        return True

    def _history(self, cid: int) -> list[Message]:
        return _as_engine_messages(self.store.messages(cid))

    def _set_busy(self, busy: bool) -> None:
        """Busy while a turn runs (document checks and model loads do not block sending)."""
        self.busy = busy
        self.composer.set_busy(busy)
        self.busy_changed.emit(busy)


def _waited(answer: dict, metrics: dict) -> dict:
    """The app's share of the turn's timing, on its own clock (time.monotonic, as the engine
    stamps engine_started_at): Send to the engine taking the turn up, and Send to the first
    token on screen (absent when none was shown)."""
    timing = {}
    if metrics.get("engine_started_at"):
        timing["queue_s"] = max(0.0, metrics["engine_started_at"] - answer["started"])
    if answer.get("first_at"):
        timing["waited_s"] = answer["first_at"] - answer["started"]
    return timing


def _fit_key(settings: ChatSettings) -> tuple:
    """The settings a document's fit depends on: the model's context and the KV cache's size."""
    kv = (settings.kv_precision(), settings.kv_auto, settings.kv_group_size)
    return (settings.model, *kv, settings.context_overflow)


def _title(text: str) -> str:
    line = " ".join(text.split())
    return line[:TITLE_CHARS] + ("…" if len(line) > TITLE_CHARS else "") or "New chat"


def _unique(title: str, taken: set[str]) -> str:
    """Two chats opened with the same question stay apart in the list: "Title (2)"."""
    n, candidate = 2, title
    while candidate in taken:
        candidate, n = f"{title} ({n})", n + 1
    return candidate


def _as_engine_messages(stored) -> list[Message]:
    """Stored messages as the engine's (empty answers, failed or still starting, and rows the
    store could not read, left out)."""
    return [Message(m.role, m.content, m.finish_reason) for m in stored if m.sent and (m.content or m.role == "user")]
