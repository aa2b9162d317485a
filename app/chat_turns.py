"""A chat's turns: a question sent (or an answer regenerated, or a question edited) to the
engine, local or remote, and the answer streaming back into the chat view, the dashboard and
the store.

Answers are written to the store while they stream (at most every SAVE_INTERVAL_S), so
killing the app mid-answer loses at most that much text and never a committed message.

ChatTurns is a part of ChatController (app/controller.py), which mixes it in: it uses the
controller's store, engines, widgets, current chat and waiting documents.
"""

from __future__ import annotations

import time
from dataclasses import replace

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from brisk.app.preferences import record_draft_cost
from brisk.app.store import StoreError
from brisk.engine.api.events import (
    ContextTruncated,
    EngineErrored,
    EngineWarned,
    PrefillProgressed,
    TokenEmitted,
    TurnFinished,
)
from brisk.engine.host.worker import Answer
from brisk.engine.turn.documents import join_attached

SAVE_INTERVAL_S = 0.5
# An answer the store refused (disk full, read-only) is kept in memory and retried this often.
RETRY_SAVE_MS = 5000
TITLE_CHARS = 48


class ChatTurns:
    """Sending turns and seeing their answers through; mixed into ChatController."""

    def _init_turns(self) -> None:
        self.busy = False
        self._answer: dict | None = None  # the streaming answer: conversation, message id, text, last save
        self._turn_job = None  # the engine job of the answer being generated
        # answers the store could not take yet: message id -> (text, finish reason, metrics)
        self.unsaved: dict[int, tuple] = {}
        self._retry = QTimer(self)
        self._retry.setInterval(RETRY_SAVE_MS)
        self._retry.timeout.connect(self.retry_unsaved)

    # --- sending, regenerating, editing ----------------------------------------------------

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
        if self._rechecking.get(cid) and self._documents.get(cid):  # fits checked under the old settings
            self.composer.show_message(
                "Still checking whether the attachments fit these settings: send once that is shown", error=True
            )
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

    # --- the engine's events for a turn ----------------------------------------------------

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

    def _server_event(self, event) -> None:
        if isinstance(event, TurnFinished):
            metrics = event.metrics.to_dict()
            self.dashboard.model_ran(metrics)
            self.dashboard.show_api_turn(metrics, model=self.default_settings.model)  # not the open chat's
        elif isinstance(event, EngineErrored):
            self.notice.emit(f"API request failed: {event.message}")

    def _remember_draft_cost(self, cid: int, metrics: dict) -> None:
        """A turn that drafted measured its draft's step cost: drafts are ranked by it from now on."""
        ratio = metrics.get("draft_cost_ratio") or 0.0
        settings = self.settings_panel.settings() if cid == self.current else None
        if ratio > 0 and settings is not None and settings.draft:
            record_draft_cost(settings.model, settings.draft, ratio)
            self.settings_panel.set_settings(settings)  # re-ranks the draft list

    # --- the streaming answer, saved as it comes ----------------------------------------------

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


def _title(text: str) -> str:
    line = " ".join(text.split())
    return line[:TITLE_CHARS] + ("…" if len(line) > TITLE_CHARS else "") or "New chat"


def _unique(title: str, taken: set[str]) -> str:
    """Two chats opened with the same question stay apart in the list: "Title (2)"."""
    n, candidate = 2, title
    while candidate in taken:
        candidate, n = f"{title} ({n})", n + 1
    return candidate
