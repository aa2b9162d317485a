"""Per-chat settings, saved with the chat: models, acceleration, KV precision, sampling."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QScrollArea,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from brisk.app.preferences import measured_draft_cost
from brisk.app.widgets.prompt_presets import PresetPicker
from brisk.app.widgets.safe_text import plain_label
from brisk.engine.accel.speculative.drafters import draft_compatibility
from brisk.engine.accel.uniprefill.plan import ModelDefaults, defaults_for
from brisk.engine.api.errors import InvalidSettings
from brisk.engine.api.settings import ChatSettings

NO_DRAFT = "(none)"
# KV cache choices: label -> (kv_bits, k_bits, v_bits, kv_auto), smallest packed last.
KV_CHOICES = {
    "auto": (16, None, None, True),
    "16": (16, None, None, False),
    "8": (8, None, None, False),
    "K8/V4": (4, 8, 4, False),
    "4": (4, None, None, False),
}
# The packed choices' (key bits, value bits), as the self-test keys its results.
KV_PRECISION = {label: (k or kv, v or kv) for label, (kv, k, v, auto) in KV_CHOICES.items() if not auto and kv < 16}


def kv_label(settings: ChatSettings) -> str:
    if settings.kv_auto:
        return "auto"
    k_bits, v_bits = settings.kv_precision()
    return str(k_bits) if k_bits == v_bits else f"K{k_bits}/V{v_bits}"


def stored_kv_results(model_id: str) -> dict:
    """What this model's packed-KV self-test said (engine/kv/fidelity.py); {} if never run."""
    from brisk.engine.kv.fidelity import FidelityStore
    from brisk.engine.models.store import ModelStore

    try:
        return FidelityStore(ModelStore().path(model_id)).load()
    except Exception:  # not installed, unreadable: nothing measured to show
        return {}


# Drafting pays only when a draft step costs well under a target step (about a third at
# the acceptance our pairs reach); the hint says so when no installed model is that small.
NO_USEFUL_DRAFT = (
    "No installed model can speed up {model}: drafting pays when the draft's step costs less than "
    "about a third of the target's, so a draft needs to be several times smaller (ideally of the "
    "same family, sharing its tokenizer)."
)


class SettingsPanel(QWidget):
    changed = Signal(object)  # ChatSettings

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("settingsPanel")
        self._settings = ChatSettings()
        self._entries: dict[str, object] = {}
        self._remotes: dict[str, str] = {}  # remote engine id -> where it is (app/remote_client.py)
        self._local_tips: dict[object, str] = {}  # tooltips a remote engine's reasons replace
        self._loading = False
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        # A refusal (a seed that is not a number, a preset without a name) above the form, in one line
        self.problem = plain_label()
        self.problem.setObjectName("settingsProblem")
        self.problem.setStyleSheet("color: #d0453a;")  # the red of a failed self-test mark, on either theme
        self.problem.setWordWrap(True)
        self.problem.hide()
        outer.addWidget(self.problem)
        # The rows outgrow a short window: they scroll up and down, never sideways (the column
        # keeps the form's width, as it did before the rows scrolled)
        self.scroll = scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        scroll.verticalScrollBar().rangeChanged.connect(self._keep_focus_in_view)
        outer.addWidget(scroll)
        inner = QWidget()
        column = QVBoxLayout(inner)
        self.form = form = QFormLayout()
        column.addLayout(form)
        column.addStretch()  # spare height below the form, not between its rows
        scroll.setWidget(inner)
        self.model = QComboBox()
        self.draft = QComboBox()
        self.draft.setToolTip(
            "Only models that can speed this chat's model up are offered: smaller than it, "
            "cheapest step first (as measured on this machine once a turn drafted with the "
            "pair, else by parameter count)"
        )
        self.badge = QLabel("")
        self.badge.setObjectName("draftBadge")
        self.badge.setWordWrap(True)
        self.sparse = _combo(("off", "on", "auto"))
        self.keep = QSlider(Qt.Horizontal)
        self.keep.setRange(5, 100)
        self.keep_label = QLabel()
        self.keep_label.setWordWrap(True)  # its note must not widen the column past the panel
        self.uniprefill = _combo(("off", "on", "auto"))
        self.mass = _spin(0.80, 1.00, 0.005, decimals=3)  # per-model defaults such as 0.985
        self.mass.setToolTip(
            "Attention mass kept at each drop layer: 1.00 drops nothing; lower is faster and "
            "riskier (0.99 is the paper's setting)"
        )
        self.spec = _combo(("off", "on", "auto"))
        self.spec.setToolTip(
            "auto: each cycle decodes plainly, verifies a continuation found in the chat, or "
            "drafts with the draft model, whichever is measured to be faster. The answer is the "
            "model's own either way"
        )
        self.lookup = QCheckBox("Look up continuations in the chat")
        self.lookup.setToolTip(
            "Quotes of an attached document, a code file being edited, an earlier answer being "
            "restated: tokens already in the conversation are proposed for free, no draft "
            "model needed"
        )
        self.num_draft = QSpinBox()
        self.num_draft.setRange(1, 16)
        self.kv_bits = QComboBox()
        for key in KV_CHOICES:  # the item's data is the choice; its text adds what the self-test said
            self.kv_bits.addItem(key, key)
        self.kv_results = stored_kv_results  # model id -> self-test results (replaceable in tests)
        self.measured_costs = measured_draft_cost  # (target, draft) -> measured step cost ratio or None
        self.system = QPlainTextEdit()
        self.system.setPlaceholderText("System prompt (optional)")
        self.system.setFixedHeight(64)
        self.presets = PresetPicker(self.system.toPlainText)
        self.presets.chosen.connect(self.system.setPlainText)  # textChanged saves it with the chat
        self.presets.problem.connect(self.show_problem)
        self.temperature = _spin(0.0, 2.0, 0.05)
        self.top_p = _spin(0.05, 1.0, 0.05)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 1000)
        self.top_k.setSpecialValueText("off")  # 0: no top-k cut
        self.min_p = _spin(0.0, 0.99, 0.01)
        self.min_p.setSpecialValueText("off")
        self.repetition_penalty = _spin(0.5, 2.0, 0.05)
        self.seed = QLineEdit()
        self.seed.setPlaceholderText("random each turn")
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.overflow = _combo(("refuse", "truncate_oldest"))
        for label, widget in (
            ("Model", self.model),
            ("Draft model", self.draft),
            ("", self.badge),
            ("SpecPrefill (draft)", self.sparse),
            ("Keep", self.keep),
            ("", self.keep_label),
            ("UniPrefill (no draft)", self.uniprefill),
            ("Kept attention mass", self.mass),
            ("Speculative decoding", self.spec),
            ("", self.lookup),
            ("Draft tokens (k)", self.num_draft),
            ("KV cache bits", self.kv_bits),
            ("System prompt", self.presets),
            ("", self.system),
            ("Temperature", self.temperature),
            ("Top-p", self.top_p),
            ("Top-k", self.top_k),
            ("Min-p", self.min_p),
            ("Repetition penalty", self.repetition_penalty),
            ("Seed", self.seed),
            ("Max tokens", self.max_tokens),
            ("Context overflow", self.overflow),
        ):
            form.addRow(label, widget)
        self._explain()
        inner.adjustSize()
        scroll.setMinimumWidth(inner.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width())
        for combo in (self.model, self.draft, self.sparse, self.uniprefill, self.spec, self.kv_bits, self.overflow):
            combo.currentIndexChanged.connect(self._emit)
        for spin in (
            self.num_draft,
            self.mass,
            self.temperature,
            self.top_p,
            self.top_k,
            self.min_p,
            self.repetition_penalty,
            self.max_tokens,
        ):
            spin.valueChanged.connect(self._emit)
        self.keep.valueChanged.connect(self._emit)
        self.lookup.toggled.connect(self._emit)
        self.system.textChanged.connect(self._emit)
        self.system.textChanged.connect(self.presets.follow_text)
        self.seed.textChanged.connect(self._emit)

    def _explain(self) -> None:
        """A tooltip on every setting (and on its label): what it does and what it costs."""
        tips = {
            self.model: "The model that answers in this chat. Changing it starts its prompt cache afresh",
            self.badge: "Whether the draft shares the model's tokenizer (drafts exactly) or is translated",
            self.sparse: "SpecPrefill: the draft reads a long prompt and the model reads only the chunks the draft "
            "found important. auto: prompts past the threshold, when importance is not flat",
            self.keep: "With SpecPrefill on: the share of the prompt's 32-token chunks the model reads",
            self.keep_label: "With SpecPrefill on: the share of the prompt's 32-token chunks the model reads",
            self.num_draft: "Tokens the draft proposes per cycle when speculative decoding is on (auto adapts it)",
            self.system: "Instructions the model sees before the conversation, in every turn",
            self.temperature: "0 always takes the likeliest token (repeatable answers); higher is more varied",
            self.top_p: "Sample only from the likeliest tokens holding this share of probability (1.00: all)",
            self.top_k: "Sample only from this many likeliest tokens (off: no limit)",
            self.min_p: "Drop tokens less likely than this share of the likeliest one's probability (off: keep all)",
            self.repetition_penalty: "Above 1.00 makes tokens already in the recent text less likely (1.00: off)",
            self.seed: "A whole number makes sampled answers repeatable; empty picks a new random seed each turn",
            self.presets: "Built-in and saved system prompts: pick one, or save the one below under a name",
            self.max_tokens: "The longest answer, in tokens; the context's free room may stop it sooner",
            self.overflow: "When the conversation outgrows the model's context: refuse with a message, or leave "
            "out the oldest messages",
        }
        for widget, tip in tips.items():
            if not widget.toolTip():
                widget.setToolTip(tip)
        if not self.kv_bits.toolTip():
            self.kv_bits.setToolTip(
                "Bits per key and value in the KV cache: fewer hold longer contexts in less "
                "memory. auto picks the fewest that passed this model's self-test"
            )
        form = self.form
        for row in range(form.rowCount()):
            label = form.itemAt(row, QFormLayout.LabelRole)
            field = form.itemAt(row, QFormLayout.FieldRole)
            if label is not None and field is not None and field.widget() is not None:
                label.widget().setToolTip(field.widget().toolTip())

    def set_models(self, entries: list) -> None:
        """Installed models (catalog entries): the choices for target and draft."""
        self._entries = {e.id: e for e in entries}
        self._loading = True
        self.model.clear()
        self.model.addItems(sorted(self._entries))
        for remote_id, where in sorted(self._remotes.items()):  # after the local models, picked alike
            self.model.addItem(remote_id)
            self.model.setItemData(self.model.count() - 1, f"A Brisk server: {where}", Qt.ToolTipRole)
        self._loading = False
        self.set_settings(self._settings)

    def set_remotes(self, remotes: dict[str, str]) -> None:
        """Remote engines (id -> where, in words), offered in the model list after the installed models."""
        self._remotes = dict(remotes)
        self.set_models(list(self._entries.values()))

    def draft_choices(self, model_id: str) -> list[str]:
        """Installed models that could draft for `model_id`: smaller than it (never itself),
        the cheapest step first; same-tokenizer drafts before translating ones of equal cost."""
        target = self._entries.get(model_id)
        if target is None:
            return []
        useful = [e for e in self._entries.values() if draft_compatibility(target, e)[0] != "incompatible"]
        useful.sort(
            key=lambda e: (self.draft_cost(model_id, e.id)[0], e.tokenizer_fingerprint != target.tokenizer_fingerprint)
        )
        return [e.id for e in useful]

    def draft_cost(self, model_id: str, draft_id: str) -> tuple[float, bool]:
        """(a draft step's cost in target steps, whether measured): measured on this machine
        when a turn drafted with the pair, else estimated from the parameter counts (decode
        streams the weights)."""
        measured = self.measured_costs(model_id, draft_id)
        if measured is not None:
            return measured, True
        return self._entries[draft_id].parameters / self._entries[model_id].parameters, False

    def _fill_drafts(self, model_id: str) -> None:
        choices = self.draft_choices(model_id)
        self.draft.clear()
        self.draft.addItems([NO_DRAFT, *choices])
        for i, draft_id in enumerate(choices, start=1):
            cost, measured = self.draft_cost(model_id, draft_id)
            self.draft.setItemData(
                i,
                f"a draft step measured at {cost:.0%} of a {model_id} step on this machine"
                if measured
                else f"{cost:.0%} of {model_id}'s parameters (not measured yet: "
                "a turn that drafts with it measures it)",
                Qt.ToolTipRole,
            )

    def set_settings(self, settings: ChatSettings) -> None:
        self._loading = True
        self._settings = settings
        _select(self.model, settings.model)
        self._fill_drafts(settings.model)
        _select(self.draft, settings.draft or NO_DRAFT)
        _select(self.sparse, settings.sparse_prefill)
        self.keep.setValue(round(settings.sparse_keep * 100))
        _select(self.uniprefill, settings.uniprefill)
        self.mass.setValue(settings.uniprefill_p if settings.uniprefill_p is not None else self._uni_defaults().p)
        _select(self.spec, settings.spec_decode)
        self.lookup.setChecked(settings.lookup)
        self.num_draft.setValue(settings.num_draft)
        self.kv_bits.setCurrentIndex(max(0, self.kv_bits.findData(kv_label(settings))))
        self.system.setPlainText(settings.system_prompt or "")
        self.presets.follow_text()
        self.temperature.setValue(settings.temperature)
        self.top_p.setValue(settings.top_p)
        self.top_k.setValue(settings.top_k)
        self.min_p.setValue(settings.min_p)
        self.repetition_penalty.setValue(settings.repetition_penalty)
        self.seed.setText("" if settings.seed is None else str(settings.seed))
        self.max_tokens.setValue(settings.max_tokens)
        self.show_problem("")
        _select(self.overflow, settings.context_overflow)
        self._loading = False
        self._refresh()

    def settings(self) -> ChatSettings:
        return self._settings

    def _emit(self, *_):
        if self._loading:
            return
        model = self.model.currentText() or self._settings.model
        if model != self._settings.model:  # another target: offer the drafts that can help it
            kept = self.draft.currentText()
            self._loading = True
            self._fill_drafts(model)
            _select(self.draft, kept if kept in self.draft_choices(model) else NO_DRAFT)
            self._loading = False
        draft = self.draft.currentText()
        seed, seed_problem = _seed(self.seed.text())
        if seed_problem:  # the seed keeps its last saved value until it reads; the other fields still save
            seed = self._settings.seed
        candidate = replace(
            self._settings,
            model=model,
            draft=None if draft in ("", NO_DRAFT) else draft,
            sparse_prefill=self.sparse.currentText(),
            sparse_keep=self.keep.value() / 100,
            uniprefill=self.uniprefill.currentText(),
            uniprefill_p=self._mass(),
            spec_decode=self.spec.currentText(),
            lookup=self.lookup.isChecked(),
            num_draft=self.num_draft.value(),
            **self._kv_fields(),
            system_prompt=self.system.toPlainText().strip() or None,
            temperature=round(self.temperature.value(), 2),
            top_p=round(self.top_p.value(), 2),
            top_k=self.top_k.value(),
            min_p=round(self.min_p.value(), 2),
            repetition_penalty=round(self.repetition_penalty.value(), 2),
            seed=seed,
            max_tokens=self.max_tokens.value(),
            context_overflow=self.overflow.currentText(),
        )
        try:
            self._settings = candidate.validate()  # the engine's own checks, before anything is saved
        except InvalidSettings as exc:
            self.show_problem(f"Not saved: {exc}")
            return
        self.show_problem(seed_problem)
        if self._settings.uniprefill_p is None:  # the spin follows the (maybe new) model's default
            self._loading = True
            self.mass.setValue(self._uni_defaults().p)
            self._loading = False
        self._refresh()
        self.changed.emit(self._settings)

    def show_problem(self, text: str) -> None:
        self.problem.setText(text)
        self.problem.setVisible(bool(text))

    def _keep_focus_in_view(self, *_) -> None:
        """The rows' view changed height (the one-line refusal above it came or went): the box
        being typed in stays in it."""
        focus = self.focusWidget()
        if focus is not None and self.scroll.isAncestorOf(focus):
            self.scroll.ensureWidgetVisible(focus, 0, 8)

    def _kv_fields(self) -> dict:
        kv_bits, k_bits, v_bits, auto = KV_CHOICES.get(self.kv_bits.currentData(), KV_CHOICES["16"])
        return {"kv_bits": kv_bits, "k_bits": k_bits, "v_bits": v_bits, "kv_auto": auto}

    def refresh_kv(self) -> None:
        """Mark each packed precision with what this model's self-test said (after a turn
        measured it, the marks appear)."""
        from brisk.engine.kv.fidelity import auto_precision, result_key

        results = self.kv_results(self._settings.model)
        group = self._settings.kv_group_size
        for i in range(self.kv_bits.count()):
            label, text = self.kv_bits.itemData(i), self.kv_bits.itemData(i)
            if label == "auto":
                k_bits, v_bits = auto_precision(results, group) if results else (None, None)
                tip = (
                    "Packed KV only where this model's self-test says it keeps the answers (the test runs "
                    "once, on the first packed turn)"
                )
                if k_bits and k_bits < 16:
                    text, tip = f"auto: K{k_bits}/V{v_bits}", f"The smallest precision that passed: K{k_bits}/V{v_bits}"
                elif results:
                    text, tip = "auto: 16", "No packed precision kept this model's answers: auto uses 16-bit KV"
            elif label in KV_PRECISION:
                result = results.get(result_key(*KV_PRECISION[label], group))
                tip = (
                    "Not tested on this model yet: the first packed turn runs a short self-test"
                    if result is None
                    else f"{'Passed' if result['passed'] else 'FAILED'} on this model: {result['why']}"
                )
                if result is not None:
                    text = f"{label}: {'keeps answers' if result['passed'] else 'changes answers'}"
                self.kv_bits.setItemData(i, _mark(result), Qt.DecorationRole)
            else:
                tip = "Unquantized KV: exact, 3.2x the memory of 4-bit"
            self.kv_bits.setItemText(i, text)
            self.kv_bits.setItemData(i, tip, Qt.ToolTipRole)
        self.kv_bits.setToolTip(self.kv_bits.itemData(self.kv_bits.currentIndex(), Qt.ToolTipRole) or "")

    def _mass(self) -> float | None:
        """The spin's p, or None (the model's default) while it shows the default untouched."""
        value = round(self.mass.value(), 3)
        return None if self._settings.uniprefill_p is None and value == self._uni_defaults().p else value

    def _uni_defaults(self) -> ModelDefaults:
        """UniPrefill's p and `auto` break-even measured for the chat model's architecture."""
        entry = self._entries.get(self._settings.model)
        return defaults_for(getattr(entry, "architecture", ""))

    def _refresh(self) -> None:
        s = self._settings
        self.mass.setEnabled(s.uniprefill != "off")
        threshold = s.uniprefill_threshold if s.uniprefill_threshold is not None else self._uni_defaults().break_even
        tip = (
            "UniPrefill needs no draft: the model drops the blocks of a long prompt its own "
            f"attention ignores, from a few layers on. auto: prompts of {threshold:,}+ new tokens "
            "(where it was measured to pay on this kind of model)"
        )
        self.uniprefill.setToolTip(tip)
        label = self.form.labelForField(self.uniprefill)
        if label is not None:
            label.setToolTip(tip)
        adapts = " (not used by auto)" if s.sparse_prefill == "auto" else ""
        self.keep_label.setText(f"{s.sparse_keep:.0%} of 32-token chunks{adapts}")
        self.keep.setEnabled(s.sparse_prefill != "off")
        self.num_draft.setEnabled(s.spec_decode == "on")
        self.refresh_kv()
        self.lookup.setEnabled(s.spec_decode != "off")
        self._mark_remote(s.model in self._remotes or s.model.startswith("remote:"))
        target, draft = self._entries.get(s.model), self._entries.get(s.draft or "")
        if s.model in self._remotes or s.model.startswith("remote:"):
            self.badge.setText("Remote engine: the server drafts with its own models, if any")
            self.badge.setProperty("kind", "none")
        elif not s.draft and target is not None and not self.draft_choices(s.model):
            self.badge.setText(NO_USEFUL_DRAFT.format(model=s.model))
            self.badge.setProperty("kind", "none")
        elif not s.draft:
            self.badge.setText("No draft: SpecPrefill needs one (UniPrefill and lookup decoding do not)")
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

    def _mark_remote(self, remote: bool) -> None:
        """A remote engine's chat: settings that act on this machine's models, or that the
        server's API does not take, are disabled and say why; the rest travel with each message."""
        why = {
            self.draft: "A remote engine cannot draft with a model on this machine",
            self.sparse: "SpecPrefill needs a draft model beside the model: not with a remote engine",
            self.keep: "SpecPrefill needs a draft model beside the model: not with a remote engine",
            self.num_draft: "Drafting is the server's with a remote engine",
            self.top_k: "The server's OpenAI-compatible API takes no top-k",
            self.min_p: "The server's OpenAI-compatible API takes no min-p",
            self.repetition_penalty: "The server's OpenAI-compatible API takes no repetition penalty",
            self.overflow: "The server refuses a conversation beyond its model's context",
        }
        sent = {
            self.kv_bits: "Sent to the server with each message (auto: the server's choice); "
            "the self-test marks are this machine's",
            self.uniprefill: "Sent to the server with each message",
            self.spec: "Sent to the server with each message (it drafts with its own models)",
        }
        for widget, tip in (*why.items(), *sent.items()):
            if remote:
                self._local_tips.setdefault(widget, widget.toolTip())
                widget.setToolTip(tip)
            elif widget in self._local_tips:
                widget.setToolTip(self._local_tips.pop(widget))
            if widget in why and remote:
                widget.setEnabled(False)
            elif widget in why and widget not in (self.keep, self.num_draft):  # _refresh decides those two
                widget.setEnabled(True)
            label = self.form.labelForField(widget)
            if label is not None:
                label.setToolTip(widget.toolTip())


# ChatSettings.validate's bound for a seed, said for people
MAX_SEED = 2**63 - 1


def _seed(text: str) -> tuple[int | None, str]:
    """The seed box's text as (seed or None for random, '' or why it is refused)."""
    text = text.strip().replace(",", "").replace("_", "")
    if not text:
        return None, ""
    if not text.isdecimal() or not text.isascii():
        return None, f"Seed must be a whole number from 0 to {MAX_SEED:,}, or empty for a random seed each turn"
    if int(text) > MAX_SEED:
        return None, f"Seed must be at most {MAX_SEED:,} (empty: a random seed each turn)"
    return int(text), ""


def _mark(result: dict | None):
    """A green or red dot for a passed or failed self-test; nothing when untested."""
    from PySide6.QtGui import QColor

    return None if result is None else QColor("#2e9d57" if result["passed"] else "#d0453a")


def _combo(items) -> QComboBox:
    combo = QComboBox()
    combo.addItems(list(items))
    return combo


def _spin(lo: float, hi: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    spin = QDoubleSpinBox()
    spin.setDecimals(decimals)
    spin.setRange(lo, hi)
    spin.setSingleStep(step)
    return spin


def _select(combo: QComboBox, text: str) -> None:
    index = combo.findText(text)
    if index < 0 and text:
        combo.addItem(text)
        index = combo.findText(text)
    combo.setCurrentIndex(max(0, index))
