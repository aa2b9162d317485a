"""Per-chat settings, saved with the chat: models, acceleration, KV precision, sampling."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QPlainTextEdit,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine.accel.speculative.drafters import draft_compatibility
from engine.settings import ChatSettings

NO_DRAFT = "(none)"


class SettingsPanel(QWidget):
    changed = Signal(object)  # ChatSettings

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("settingsPanel")
        self._settings = ChatSettings()
        self._entries: dict[str, object] = {}
        self._loading = False
        outer = QVBoxLayout(self)
        form = QFormLayout()
        outer.addLayout(form)
        outer.addStretch()  # spare height below the form, not between its rows
        self.model = QComboBox()
        self.draft = QComboBox()
        self.badge = QLabel("")
        self.badge.setObjectName("draftBadge")
        self.badge.setWordWrap(True)
        self.sparse = _combo(("off", "on", "auto"))
        self.keep = QSlider(Qt.Horizontal)
        self.keep.setRange(5, 100)
        self.keep_label = QLabel()
        self.spec = _combo(("off", "on", "auto"))
        self.num_draft = QSpinBox()
        self.num_draft.setRange(1, 16)
        self.kv_bits = _combo(("16", "8", "4"))
        self.system = QPlainTextEdit()
        self.system.setPlaceholderText("System prompt (optional)")
        self.system.setFixedHeight(64)
        self.temperature = _spin(0.0, 2.0, 0.05)
        self.top_p = _spin(0.05, 1.0, 0.05)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.overflow = _combo(("refuse", "truncate_oldest"))
        for label, widget in (("Model", self.model), ("Draft model", self.draft), ("", self.badge),
                              ("Sparse prefill", self.sparse), ("Keep", self.keep), ("", self.keep_label),
                              ("Speculative decoding", self.spec), ("Draft tokens (k)", self.num_draft),
                              ("KV cache bits", self.kv_bits), ("System prompt", self.system),
                              ("Temperature", self.temperature), ("Top-p", self.top_p),
                              ("Max tokens", self.max_tokens), ("Context overflow", self.overflow)):
            form.addRow(label, widget)
        for combo in (self.model, self.draft, self.sparse, self.spec, self.kv_bits, self.overflow):
            combo.currentIndexChanged.connect(self._emit)
        for spin in (self.num_draft, self.temperature, self.top_p, self.max_tokens):
            spin.valueChanged.connect(self._emit)
        self.keep.valueChanged.connect(self._emit)
        self.system.textChanged.connect(self._emit)

    def set_models(self, entries: list) -> None:
        """Installed models (catalog entries): the choices for target and draft."""
        self._entries = {e.id: e for e in entries}
        self._loading = True
        for combo, extra in ((self.model, []), (self.draft, [NO_DRAFT])):
            combo.clear()
            combo.addItems(extra + sorted(self._entries))
        self._loading = False
        self.set_settings(self._settings)

    def set_settings(self, settings: ChatSettings) -> None:
        self._loading = True
        self._settings = settings
        _select(self.model, settings.model)
        _select(self.draft, settings.draft or NO_DRAFT)
        _select(self.sparse, settings.sparse_prefill)
        self.keep.setValue(round(settings.sparse_keep * 100))
        _select(self.spec, settings.spec_decode)
        self.num_draft.setValue(settings.num_draft)
        _select(self.kv_bits, str(settings.kv_bits))
        self.system.setPlainText(settings.system_prompt or "")
        self.temperature.setValue(settings.temperature)
        self.top_p.setValue(settings.top_p)
        self.max_tokens.setValue(settings.max_tokens)
        _select(self.overflow, settings.context_overflow)
        self._loading = False
        self._refresh()

    def settings(self) -> ChatSettings:
        return self._settings

    def _emit(self, *_):
        if self._loading:
            return
        draft = self.draft.currentText()
        self._settings = replace(
            self._settings, model=self.model.currentText() or self._settings.model,
            draft=None if draft in ("", NO_DRAFT) else draft, sparse_prefill=self.sparse.currentText(),
            sparse_keep=self.keep.value() / 100, spec_decode=self.spec.currentText(),
            num_draft=self.num_draft.value(), kv_bits=int(self.kv_bits.currentText()),
            system_prompt=self.system.toPlainText().strip() or None, temperature=round(self.temperature.value(), 2),
            top_p=round(self.top_p.value(), 2), max_tokens=self.max_tokens.value(),
            context_overflow=self.overflow.currentText())
        self._refresh()
        self.changed.emit(self._settings)

    def _refresh(self) -> None:
        s = self._settings
        adapts = " (auto adapts it)" if s.sparse_prefill == "auto" else ""
        self.keep_label.setText(f"{s.sparse_keep:.0%} of 32-token chunks{adapts}")
        self.keep.setEnabled(s.sparse_prefill != "off")
        self.num_draft.setEnabled(s.spec_decode == "on")
        target, draft = self._entries.get(s.model), self._entries.get(s.draft or "")
        if not s.draft:
            self.badge.setText("No draft: sparse prefill and speculative decoding need one")
            self.badge.setProperty("kind", "none")
        elif target is None or draft is None:
            self.badge.setText("Draft or target is not installed")
            self.badge.setProperty("kind", "incompatible")
        else:
            kind, why = draft_compatibility(target, draft)
            self.badge.setText(f"{kind}: {why}")
            self.badge.setProperty("kind", kind.split()[0])
        self.badge.style().unpolish(self.badge)
        self.badge.style().polish(self.badge)


def _combo(items) -> QComboBox:
    combo = QComboBox()
    combo.addItems(list(items))
    return combo


def _spin(lo: float, hi: float, step: float) -> QDoubleSpinBox:
    spin = QDoubleSpinBox()
    spin.setRange(lo, hi)
    spin.setSingleStep(step)
    spin.setDecimals(2)
    return spin


def _select(combo: QComboBox, text: str) -> None:
    index = combo.findText(text)
    if index < 0 and text:
        combo.addItem(text)
        index = combo.findText(text)
    combo.setCurrentIndex(max(0, index))
