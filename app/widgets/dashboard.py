"""Live numbers of the current chat: TTFT (and what the prompt cache and sparse prefill
saved), prefill/decode speed over turns, acceptance, KV memory, process memory, model state."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QGridLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from app.widgets.gauges import LineChart, RingGauge
from app.widgets.safe_text import plain_tooltip

RECENT_TURNS = 5
SOURCE_COLORS = {"draft": "#58a6ff", "lookup": "#3fb950"}  # the chat's tints, opaque
# A dense prefill at least this long measures a model's prefill rate well enough to price
# what the prompt cache saves (a 1-token regenerate "measured" 1366 s saved once).
MIN_RATE_TOKENS = 256


class Dashboard(QWidget):
    def __init__(self, parent=None, *, memory_probe=None, free_memory_probe=None, poll_ms: int = 1000):
        super().__init__(parent)
        self.setObjectName("dashboard")
        layout = QVBoxLayout(self)
        ttft_box = QGroupBox("Time to first token")
        box = QVBoxLayout(ttft_box)
        self.ttft = QLabel("–")
        self.ttft.setObjectName("ttftValue")
        self.saved = QLabel("")
        self.saved.setWordWrap(True)
        self.recent = QLabel("")
        for w in (self.ttft, self.saved, self.recent):
            box.addWidget(w)
        layout.addWidget(ttft_box)
        speed_box = QGroupBox("Speed over turns (tok/s)")
        QVBoxLayout(speed_box).addWidget(chart := LineChart(["prefill", "decode"]))
        self.chart = chart
        layout.addWidget(speed_box)
        self.speed = QLabel("")
        self.speed.setWordWrap(True)
        self.speed.setObjectName("speedNumbers")
        self.speed.setToolTip(
            "The last turn: prompt tokens served per second of time to first token (prefill), "
            "and answer tokens per second after the first (decode)"
        )
        layout.addWidget(self.speed)
        gauges = QGridLayout()
        self.acceptance = RingGauge("accepted")
        self.acceptance.setToolTip(
            "Share of proposed tokens the model kept in the last turn, per source: the "
            "draft model's (blue) and continuations looked up in the chat (green). "
            "Decoding is exact: kept tokens are the model's own choice"
        )
        self.kv = RingGauge("KV cache")
        self.kv.setToolTip(
            "KV cache of this chat now, against what it would take at the model's full context "
            "(measured from the cache's arrays); free memory is shown beside it"
        )
        self.ttft.setToolTip("Time from Send to the first answer token: template, tokenizing and prefill included")
        gauges.addWidget(self.acceptance, 0, 0)
        gauges.addWidget(self.kv, 0, 1)
        layout.addLayout(gauges)
        self.spec_note = QLabel("")
        self.spec_note.setWordWrap(True)
        self.kv_note = QLabel("")
        self.kv_note.setWordWrap(True)  # a long line would widen the dashboard and squeeze the chat
        self.memory = QLabel("")
        self.model_state = QLabel("No model loaded")
        self.model_state.setObjectName("modelState")
        self.chat_model = QLabel("")
        self.chat_model.setObjectName("chatModel")
        self.chat_model.setWordWrap(True)
        for w in (self.chat_model, self.spec_note, self.kv_note, self.memory, self.model_state):
            w.setWordWrap(True)  # a long line must not widen the column while a turn runs
            layout.addWidget(w)
        # Model names and metrics come from stored chats, errors quote files: none of it is markup.
        labels = (self.ttft, self.saved, self.recent, self.speed, self.spec_note, self.kv_note, self.memory)
        for w in (*labels, self.model_state, self.chat_model):
            w.setTextFormat(Qt.PlainText)
        layout.addStretch()
        self._ttfts: list[float] = []
        self._prefill_rates: dict[str, float] = {}  # model -> tok/s of its last long dense prefill
        self._contexts: dict[str, int] = {}  # model -> context length, from ModelLoaded
        self._memory_probe = memory_probe or process_memory_bytes
        self._free_memory_probe = free_memory_probe or _free_memory
        self._timer = QTimer(self, interval=poll_ms)
        self._timer.timeout.connect(self.refresh_memory)
        self._timer.start()
        self.refresh_memory()

    def reset(self) -> None:
        self._ttfts = []
        self.chart.clear()
        for w in (self.saved, self.recent, self.spec_note, self.kv_note, self.speed):
            w.setText("")
        self.ttft.setText("–")
        self.acceptance.set_value(0, "–")
        self.kv.set_value(0, "–")

    def waiting(self) -> None:
        """A turn started: the big number waits, and a small line says for what."""
        self.ttft.setText("…")
        self.saved.setText("Waiting for the first token…")

    def first_token(self, seconds: float) -> None:
        """The first token is on screen: its time, live (the exact one comes with the metrics)."""
        self.ttft.setText(f"{seconds:.2f} s")
        self.saved.setText("")

    def turn_failed(self) -> None:
        """A turn ended without metrics: nothing is waited for any more."""
        if self.ttft.text() == "…":
            self.ttft.setText("–")
        self.saved.setText("")

    def set_model_state(self, text: str) -> None:
        self.model_state.setText(text)

    def set_context(self, model: str, context_length: int) -> None:
        self._contexts[model] = context_length

    def set_chat_models(self, model: str, draft: str | None) -> None:
        """The open chat's own model and draft (not whichever model loaded last)."""
        self.chat_model.setText(f"This chat: {model}" + (f" · draft {draft}" if draft else " · no draft"))

    def show_turn(self, m: dict, *, model: str = "") -> None:
        """A finished turn's metrics (TurnMetrics.to_dict()) of `model`."""
        self._ttfts = (self._ttfts + [m.get("ttft_s", 0.0)])[-RECENT_TURNS:]
        self.ttft.setText(f"{m.get('ttft_s', 0.0):.2f} s")
        self.recent.setText("Recent: " + " · ".join(f"{t:.2f} s" for t in self._ttfts))
        rate = m.get("prefill_tps") or 0.0
        dense = m.get("sparse_outcome") != "used" and m.get("prefill_method", "dense") == "dense"
        if model and dense and m.get("prefilled_tokens", 0) >= MIN_RATE_TOKENS and rate:
            self._prefill_rates[model] = rate
        measured = self._prefill_rates.get(model)
        notes = []
        if m.get("cached_tokens"):
            notes.append(
                f"prompt cache reused {m['cached_tokens']:,} tokens"
                + (
                    f" (~{m['cached_tokens'] / measured:.1f} s saved at the {measured:.0f} tok/s "
                    "this model prefilled at)"
                    if measured
                    else ""
                )
            )
        if m.get("sparse_outcome") == "used":
            skipped = m.get("prompt_tokens", 0) - m.get("cached_tokens", 0) - m.get("kept_tokens", 0)
            notes.append(f"sparse prefill skipped {skipped:,} tokens (scoring {m.get('scoring_s', 0):.1f} s)")
        if m.get("prefill_method") == "uniprefill" and m.get("drops"):
            kept = m["drops"][-1][2]
            notes.append(
                f"UniPrefill: the deepest layers read {kept:,} of {m['drops'][0][1]:,} new tokens, "
                f"{m.get('flops_saved', 0):.0%} of prefill work skipped"
            )
        self.saved.setText("; ".join(notes))
        self.chart.add(prefill=rate, decode=m.get("decode_tps") or 0.0)
        self.speed.setText(f"Last turn: prefill {rate:,.1f} tok/s · decode {m.get('decode_tps') or 0.0:,.1f} tok/s")
        step = m.get("decode_step")  # which decode step ran: compiled, or mlx-lm's and why
        self.speed.setToolTip(plain_tooltip(f"Decode step: {step}") if step else "")
        self._show_speculation(m)
        used = m.get("kv_bytes", 0)
        held = m.get("prompt_tokens", 0) + m.get("generated_tokens", 0)
        context = self._contexts.get(model, 0)
        # The gauge: this chat's KV against the same KV at the model's full context.
        full = used / held * context if used and held and context else 0
        self.kv.set_value(min(used / full, 1.0) if full else 0.0, _size(used))
        free = self._free_memory_probe()
        k_bits, v_bits = m.get("k_bits", m.get("kv_bits", 16)), m.get("v_bits", m.get("kv_bits", 16))
        precision = f"{k_bits} bits" if k_bits == v_bits else f"K{k_bits}/V{v_bits} bits"
        self.kv_note.setToolTip(plain_tooltip(str(m.get("kv_check") or "")))
        self.kv_note.setText(
            f"KV cache {_size(used)} at {precision}"
            + (f" of {_size(full)} at the full {context:,}-token context" if full else "")
            + (f" · {_size(free)} memory free" if free else "")
        )

    def _show_speculation(self, m: dict) -> None:
        """The acceptance ring, an arc per source that proposed this turn, and how it went."""
        sources = [
            (name, m[kept], m[proposed])
            for name, kept, proposed in (
                ("draft", "accepted_tokens", "draft_tokens"),
                ("lookup", "lookup_accepted", "lookup_tokens"),
            )
            if m.get(proposed)
        ]
        if not sources:
            self.acceptance.set_arcs([(0.0, None)], "–", "accepted")
            self.spec_note.setText(f"Speculative decoding: {m.get('spec_decode', 'off')}")
            return
        self.acceptance.set_arcs(
            [(kept / proposed, SOURCE_COLORS[name]) for name, kept, proposed in sources],
            " · ".join(f"{kept / proposed:.0%}" for _, kept, proposed in sources),
            " · ".join(name for name, _, _ in sources),
        )
        parts = [f"{name} kept {kept:,} of {proposed:,}" for name, kept, proposed in sources]
        k = f", mean k {m['mean_k']:.1f}" if m.get("mean_k") else ""
        self.spec_note.setText(
            f"Speculative: {m.get('tokens_per_cycle', 0):.2f} tokens per target pass, "
            f"{m.get('mean_accepted_run', 0):.1f} kept per verify{k} · " + " · ".join(parts)
        )

    def refresh_memory(self) -> None:
        used = self._memory_probe()
        self.memory.setText(f"Process memory: {_size(used)}" if used else "")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _free_memory() -> int:
    from engine.info import memory_available

    return memory_available()


def process_memory_bytes() -> int:
    """Resident memory of this process (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as fh:
            import os

            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
