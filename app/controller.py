"""What the window does: conversations from the store, commands to the engine thread,
engine events into the widgets and the store.

This module holds the chats (new, open, rename, delete, search, settings), the documents
attached before a question is sent, model loading, and the routing of engine events. A
chat's turns (send, regenerate, edit, stop, the answer streaming in and its saves) are
app/chat_turns.py's ChatTurns, which ChatController mixes in.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QTimer, Signal

from brisk.app.chat_turns import ChatTurns
from brisk.app.context_fill import ContextFill
from brisk.app.store import StoreError
from brisk.app.widgets.safe_text import plain_tooltip
from brisk.engine.api.conversation import Message
from brisk.engine.api.errors import InvalidSettings
from brisk.engine.api.events import (
    EngineErrored,
    EngineWarned,
    ModelLoaded,
    ModelLoadProgressed,
)
from brisk.engine.api.settings import ChatSettings
from brisk.engine.host.model_commands import ModelCommandFailed
from brisk.engine.host.worker import (
    CheckDocument,
    ConversationEvent,
    DocumentChecked,
    LoadModel,
)

# model-load steps whose message says what goes on until the next step or the load's end
LASTING_STEPS = ("Downloading ", "Compiling Brisk's CPU kernels", "Compiling: ")


class ChatController(ChatTurns, QObject):
    notice = Signal(str)  # a message for the status bar
    lasting_notice = Signal(str)  # one that stays while what it says goes on; "" when it ended
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
        self._init_turns()  # app/chat_turns.py: the streaming answer, answers not saved yet
        self._documents: dict[int, list] = {}  # conversation -> documents checked and waiting to be sent
        self._reading: dict[int, list[str]] = {}  # conversation -> names of documents still being read
        self._fit_key: dict[int, tuple] = {}  # conversation -> the settings its documents were checked under
        self._rechecking: dict[int, int] = {}  # conversation -> its documents' fit checks not answered yet
        self.search_text = ""
        self._lasting = False  # a download or compile is being said in the status bar
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

    # --- documents attached before sending, models ----------------------------------------

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
        self._rechecking[cid] = self._rechecking.get(cid, 0) + len(documents)
        if cid == self.current:  # the old fit (another model's, say) is not this chat's any more
            self.composer.show_message(f"Checking whether {_documents_fit(documents)} these settings…")

    def load_model(self, model_id: str) -> None:
        self.dashboard.loading(model_id)
        self.engine.submit(LoadModel(model_id))

    # --- engine events ---------------------------------------------------------------

    def on_event(self, item) -> None:
        if not isinstance(item, ModelLoadProgressed) and self._lasting:
            self._say_lasting("")  # the load is over (loaded, failed, or its turn has begun)
        if isinstance(item, ConversationEvent):
            cid = item.conversation_id
            answering = self._answer is not None and self._answer["cid"] == cid
            if isinstance(item.event, EngineErrored) and self._reading.get(cid) and not answering:
                self._reading[cid].pop(0)  # a read that failed (the engine runs jobs in order)
            elif isinstance(item.event, EngineErrored) and not answering:
                self._recheck_answered(cid, all_of_them=True)  # the checks failed: the last fits stand
            self._conversation_event(item.conversation_id, item.event)
        elif isinstance(item, DocumentChecked):
            if not item.recheck and self._reading.get(item.conversation_id):
                self._reading[item.conversation_id].pop(0)
            self._document_checked(item)
        elif isinstance(item, ModelLoadProgressed):
            self.dashboard.set_model_state(f"{item.model_id}: {item.message}")
            # a download (what, from where, how much) and the kernels' one-time compile are said
            # in the status bar for as long as they go on; the compile's end for a while
            if item.message.startswith(LASTING_STEPS) and " failed after " not in item.message:
                self._say_lasting(item.message)
            elif item.message.startswith(("Compiled ", "Compiling ")):
                self._say_lasting("")
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

    def _say_lasting(self, text: str) -> None:
        self._lasting = bool(text)
        self.lasting_notice.emit(text)

    def _document_checked(self, item: DocumentChecked) -> None:
        doc, fit = item.document, item.fit
        if item.recheck:
            self._recheck_answered(item.conversation_id)
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

    def _recheck_answered(self, cid: int, *, all_of_them: bool = False) -> None:
        left = 0 if all_of_them else self._rechecking.get(cid, 0) - 1
        if left > 0:
            self._rechecking[cid] = left
        else:
            self._rechecking.pop(cid, None)

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

    def _saved(self, what: str, write, *args) -> bool:
        try:
            write(*args)
        except StoreError as exc:
            self.notice.emit(f"{what}: {exc}")
            return False
        return True

    def _history(self, cid: int) -> list[Message]:
        return _as_engine_messages(self.store.messages(cid))


def _documents_fit(documents: list) -> str:
    return f"{documents[0][0].name} fits" if len(documents) == 1 else f"the {len(documents)} attachments fit"


def _fit_key(settings: ChatSettings) -> tuple:
    """The settings a document's fit depends on: the model's context and the KV cache's size."""
    kv = (settings.kv_precision(), settings.kv_auto, settings.kv_group_size)
    return (settings.model, *kv, settings.context_overflow)


def _as_engine_messages(stored) -> list[Message]:
    """Stored messages as the engine's (empty answers, failed or still starting, and rows the
    store could not read, left out)."""
    return [Message(m.role, m.content, m.finish_reason) for m in stored if m.sent and (m.content or m.role == "user")]
