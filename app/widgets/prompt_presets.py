"""System-prompt presets: a few built in, and the user's own (kept in app.ini through
app/preferences.py). Picking one fills the chat's system prompt; the chat saves it as usual."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QInputDialog, QToolButton, QWidget

from brisk.app.preferences import MAX_PRESET_NAME_CHARS, MAX_PRESETS, saved_prompt_presets, write_prompt_presets

# Short, general prompts that small local models follow well.
BUILTIN_PRESETS = {
    "Concise": "Answer briefly and directly. Use short paragraphs or a list; skip preamble and repetition.",
    "Explain step by step": "Explain your reasoning step by step, then state the final answer on its own line.",
    "Code helper": (
        "You are a careful programming assistant. Give working code in fenced blocks with the language "
        "named, explain only what is not obvious, and point out edge cases."
    ),
    "Summarizer": (
        "Summarize the user's text or attached document: the main points first as a short list, then "
        "anything the reader must not miss. Do not add facts that are not in the text."
    ),
    "Translator": (
        "Translate the user's text into English (or into the language they name), keeping its meaning, "
        "tone and formatting. Reply with the translation only."
    ),
}
CHOOSE = "Presets…"


class PresetError(ValueError):
    """A preset that cannot be saved or deleted; the message says why in one line."""


def save_preset(name: str, text: str) -> str:
    """Save (or overwrite) the user's preset `name`; returns the name as kept."""
    name, text = " ".join(name.split()), text.strip()
    presets = saved_prompt_presets()
    if not text:
        raise PresetError("Write a system prompt first, then save it as a preset")
    if not name:
        raise PresetError("A preset needs a name")
    if len(name) > MAX_PRESET_NAME_CHARS:
        raise PresetError(f"A preset's name can be at most {MAX_PRESET_NAME_CHARS} characters")
    if name in BUILTIN_PRESETS:
        raise PresetError(f"“{name}” is a built-in preset: choose another name")
    if name not in presets and len(presets) >= MAX_PRESETS:
        raise PresetError(f"At most {MAX_PRESETS} presets can be saved: delete one first")
    presets[name] = text
    write_prompt_presets(presets)
    return name


def delete_preset(name: str) -> None:
    if name in BUILTIN_PRESETS:
        raise PresetError(f"“{name}” is built in and cannot be deleted")
    presets = saved_prompt_presets()
    if presets.pop(name, None) is None:
        raise PresetError(f"There is no saved preset “{name}”")
    write_prompt_presets(presets)


class PresetPicker(QWidget):
    """Pick / save / delete. `chosen(text)` asks the panel to put a preset's text in the box;
    `problem(text)` is a one-line refusal for the panel to show ('' clears it)."""

    chosen = Signal(str)
    problem = Signal(str)

    def __init__(self, current_text, parent=None):
        super().__init__(parent)
        self.current_text = current_text  # () -> the system prompt in the box now
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.combo = QComboBox()
        # as narrow as the other rows: a long preset name is elided, not a wider settings column
        self.combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(8)
        self.combo.setToolTip("Built-in and saved system prompts: picking one replaces the system prompt below")
        self.combo.activated.connect(self._picked)  # the user's pick only, not a programmatic select
        self.save_button = QToolButton()  # narrower than push buttons: the row fits the settings column
        self.save_button.setText("Save…")
        self.save_button.setToolTip("Save the system prompt below as a preset")
        self.save_button.clicked.connect(self._save)
        self.delete_button = QToolButton()
        self.delete_button.setText("Delete")
        self.delete_button.setToolTip("Delete the chosen saved preset (built-in ones stay)")
        self.delete_button.clicked.connect(self._delete)
        row.addWidget(self.combo, 1)
        row.addWidget(self.save_button)
        row.addWidget(self.delete_button)
        self.refresh()

    def presets(self) -> dict[str, str]:
        return {**BUILTIN_PRESETS, **saved_prompt_presets()}

    def refresh(self, select: str = "") -> None:
        """Refill the list and select the preset `select`, else the one whose text is in the box."""
        self.combo.blockSignals(True)
        self.combo.clear()
        self.combo.addItem(CHOOSE, None)
        for name, text in BUILTIN_PRESETS.items():
            self.combo.addItem(name, text)
        saved = saved_prompt_presets()
        if saved:
            self.combo.insertSeparator(self.combo.count())
            for name, text in saved.items():
                self.combo.addItem(name, text)
        if select:
            self.combo.setCurrentIndex(max(0, self.combo.findText(select)))
        self.combo.blockSignals(False)
        self.follow_text()

    def follow_text(self) -> None:
        text = (self.current_text() or "").strip()
        index = self.combo.currentIndex()
        # Two presets may hold the same text (a built-in one saved under a name of one's own): the one
        # chosen stays chosen, so it can be deleted; else the first that holds the text
        if index < 1 or not text or self.combo.itemData(index) != text:
            index = next((i for i in range(1, self.combo.count()) if text and self.combo.itemData(i) == text), 0)
        self.combo.setCurrentIndex(index)
        self.delete_button.setEnabled(self.combo.currentText() in saved_prompt_presets() and index > 0)

    def _picked(self, index: int) -> None:
        text = self.combo.itemData(index)
        if isinstance(text, str):
            self.chosen.emit(text)
        self.follow_text()

    def _save(self) -> None:
        if not (self.current_text() or "").strip():  # said before a name is asked for, not after
            self.problem.emit("Write a system prompt first, then save it as a preset")
            return
        chosen = self.combo.currentText()
        suggested = chosen if chosen in saved_prompt_presets() else ""
        name, ok = QInputDialog.getText(self, "Save system prompt", "Preset name:", text=suggested)
        if not ok:
            return
        try:
            kept = save_preset(name, self.current_text() or "")
        except PresetError as exc:
            self.problem.emit(str(exc))
            return
        self.problem.emit("")
        self.refresh(select=kept)

    def _delete(self) -> None:
        try:
            delete_preset(self.combo.currentText())
        except PresetError as exc:
            self.problem.emit(str(exc))
            return
        self.problem.emit("")
        self.refresh()
