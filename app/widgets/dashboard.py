"""Live numbers of the open chat: TTFT as waited, split into the parts the engine measured
(and what the prompt cache and sparse prefill saved), prefill/decode speed over the chat's
stored turns, acceptance, KV memory, process memory, the chat's model; API requests apart."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QFrame, QGridLayout, QGroupBox, QLabel, QScrollArea, QVBoxLayout, QWidget

from brisk.app.widgets.gauges import LineChart, RingGauge
from brisk.app.widgets.safe_text import plain_tooltip

RECENT_TURNS = 5
SOURCE_COLORS = {"draft": "#58a6ff", "lookup": "#3fb950"}  # the chat's tints, opaque
# A dense prefill at least this long measures a model's prefill rate well enough to price
# what the prompt cache saves (a 1-token regenerate "measured" 1366 s saved once).
MIN_RATE_TOKENS = 256
# A turn whose prompt came this much from the prompt cache read a handful of new tokens: its
# "prefill rate" measures overheads (2.2 tok/s was plotted), so it is labelled, not plotted.
CACHE_HIT_SHARE = 0.9
# The wait for the first token, part by part (TurnMetrics fields): (field, words).
WAIT_PARTS = (
    ("queue_s", "waiting for the engine"),
    ("model_load_s", "model load"),
    ("cache_restore_s", "cache restore"),
    ("kv_check_s", "KV check"),
    ("prepare_s", "template"),
    ("prefill_s", "prefill"),
    ("first_step_s", "first step"),
)
TTFT_TIP = (
    "Time from Send to the first answer token on screen: what you waited. Below it, where that "
    "time went, each part measured where it happens: waiting for the engine (another job ran "
    "first), loading the model, restoring this chat's saved prompt cache from disk, the "
    "packed-KV self-test, the chat template and tokenizing, reading the new prompt tokens "
    "(prefill) and the first decode step; 'on screen' is the rest (the token reaching the "
    "window). Answers saved before this was measured show the engine's part only."
)


class Dashboard(QScrollArea):
    """Scrolls vertically: on a 768-high screen the wrapped lines need more height than the
    column has, and a squeezed layout drew the TTFT box's lines over each other."""

    def __init__(self, parent=None, *, memory_probe=None, free_memory_probe=None, poll_ms: int = 1000):
        super().__init__(parent)
        self.setObjectName("dashboard")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # lines wrap to the width instead
        content = QWidget()
        content.setObjectName("dashboardContent")
        layout = QVBoxLayout(content)
        ttft_box = QGroupBox("Time to first token")
        box = QVBoxLayout(ttft_box)
        self.ttft = QLabel("–")
        self.ttft.setObjectName("ttftValue")
        self.breakdown = QLabel("")
        self.breakdown.setObjectName("ttftParts")
        self.breakdown.setWordWrap(True)
        self.saved = QLabel("")
        self.saved.setWordWrap(True)
        self.recent = QLabel("")
        self.recent.setWordWrap(True)
        for w in (self.ttft, self.breakdown, self.saved, self.recent):
            box.addWidget(w)
        layout.addWidget(ttft_box)
        speed_box = QGroupBox("This chat's speed over turns (tok/s)")
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
        self.ttft.setToolTip(TTFT_TIP)
        self.breakdown.setToolTip(TTFT_TIP)
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
        # A remote engine's chat: where it answers, and each rank's memory there when it has ranks
        self.remote_note = QLabel("")
        self.remote_note.setObjectName("remoteNote")
        self.remote_note.setTextFormat(Qt.PlainText)  # it quotes a server's address and model id
        self.remote_note.hide()
        self.describe_remote = lambda model_id: ""  # remote id -> 'name at url (model)'; set by the window
        self._remote_seen: dict[str, str] = {}  # remote id -> its last turn's words (where, model, ranks)
        for w in (self.chat_model, self.remote_note, self.spec_note, self.kv_note, self.memory, self.model_state):
            w.setWordWrap(True)  # a long line must not widen the column while a turn runs
            layout.addWidget(w)
        # The API server's requests: their own chart and line, never the open chat's.
        self.api_box = QGroupBox("API requests (tok/s)")
        api_layout = QVBoxLayout(self.api_box)
        self.api_chart = LineChart(["prefill", "decode"])
        self.api_note = QLabel("")
        self.api_note.setObjectName("apiNote")
        self.api_note.setWordWrap(True)
        api_layout.addWidget(self.api_chart)
        api_layout.addWidget(self.api_note)
        self.api_box.hide()  # until the first request
        layout.addWidget(self.api_box)
        # Model names and metrics come from stored chats, errors quote files: none of it is markup.
        labels = (self.ttft, self.breakdown, self.saved, self.recent, self.speed, self.spec_note, self.kv_note)
        for w in (*labels, self.memory, self.model_state, self.chat_model, self.api_note):
            w.setTextFormat(Qt.PlainText)
        layout.addStretch()
        self.setWidget(content)
        self._ttfts: list[float] = []
        self._prefill_rates: dict[str, float] = {}  # model -> tok/s of its last long dense prefill
        self._contexts: dict[str, int] = {}  # model -> context length, from ModelLoaded or a turn
        self._loaded: dict[str, str] = {}  # model -> its line once loaded ("x loaded (llama, ...)")
        self._loading: set[str] = set()  # models whose load (the app's start) has not ended yet
        self._chat_model = ""  # the open chat's model ("": no chat open)
        self._waiting = False  # a turn of the open chat waits for its first token
        self._memory_probe = memory_probe or process_memory_bytes
        self._free_memory_probe = free_memory_probe or _free_memory
        self._timer = QTimer(self, interval=poll_ms)
        self._timer.timeout.connect(self.refresh_memory)
        self._timer.start()
        self.refresh_memory()

    def reset(self) -> None:
        self._ttfts = []
        self._waiting = False
        self.chart.clear()
        for w in (self.breakdown, self.saved, self.recent, self.spec_note, self.kv_note, self.speed):
            w.setText("")
        self.ttft.setText("–")
        self.acceptance.set_value(0, "–")
        self.kv.set_value(0, "–")

    def waiting(self) -> None:
        """A turn started: the big number waits, a small line says for what, and the last
        turn's split goes (it was not this wait's)."""
        self.ttft.setText("…")
        self.breakdown.setText("")
        self.saved.setText("Waiting for the first token…")
        self._waiting = True  # a model not loaded yet is loading now, not "at the next message"
        self._show_model_line()

    def first_token(self, seconds: float) -> None:
        """The first token is on screen: its time, live (the exact one comes with the metrics)."""
        self.ttft.setText(f"{seconds:.2f} s")
        self.saved.setText("")
        self._waiting = False
        model = self._chat_model
        if model and not model.startswith("remote:") and model not in self._loaded:
            # the token came from it: "Loading … for this message" is stale (its context comes with the turn)
            self.model_state.setText(f"{model} loaded")

    def turn_failed(self) -> None:
        """A turn ended without metrics: nothing is waited for any more."""
        if self.ttft.text() == "…":
            self.ttft.setText("–")
        self._waiting = False
        self._show_model_line()
        self.breakdown.setText("")
        self.saved.setText("")

    def set_model_state(self, text: str) -> None:
        """A step of a load in progress, said as it happens."""
        self.model_state.setText(text)

    def set_context(self, model: str, context_length: int) -> None:
        self._contexts[model] = context_length

    def loading(self, model: str) -> None:
        """A load of `model` was asked for: a chat of that model opened meanwhile says so."""
        self._loading.add(model)
        self.model_state.setText(f"Loading {model}…")

    def load_failed(self) -> None:
        self._loading.clear()
        self._show_model_line()

    def model_loaded(self, model: str, info: dict) -> None:
        """A model is loaded: the line names it if it is the open chat's (or no chat is open),
        else it goes on naming the chat's own model."""
        self._loading.discard(model)
        context = int(info.get("context_length") or 0)
        self.set_context(model, context)
        self._loaded[model] = f"{model} loaded ({info.get('architecture', '?')}, {context:,} tokens of context)"
        self._show_model_line(fallback=model)

    def set_chat_models(self, model: str, draft: str | None) -> None:
        """The open chat's own model and draft (not whichever model loaded last)."""
        self._chat_model = model
        self.chat_model.setText(f"This chat: {model}" + (f" · draft {draft}" if draft else " · no draft"))
        where = self.describe_remote(model) if model.startswith("remote:") else ""
        # the server's last turn said more (its model, its ranks' memory) than the address alone
        self.remote_note.setText(self._remote_seen.get(model) or (f"Remote engine: {where}" if where else ""))
        self.remote_note.setVisible(bool(self.remote_note.text()))
        self._show_model_line()

    def clear_chat(self) -> None:
        """No chat is open any more (the open one was deleted)."""
        self._chat_model = ""
        self.reset()
        self.chat_model.setText("")

    def model_ran(self, m: dict) -> None:
        """A turn just ran on m's model (a live turn, not a stored one): it is loaded now."""
        model, context = m.get("model_id"), m.get("context_length") or 0
        if model and model not in self._loaded:
            self.set_context(model, context)
            self._loaded[model] = f"{model} loaded ({context:,} tokens of context)"
        self._show_model_line()

    def _show_model_line(self, fallback: str = "") -> None:
        model = self._chat_model or fallback
        if model.startswith("remote:"):  # nothing loads here: the server holds the model
            self.model_state.setText("The model runs on the server, not in this app")
        elif model in self._loaded:
            self.model_state.setText(self._loaded[model])
        elif model in self._loading:  # not "loads at this chat's next message" while it loads
            self.model_state.setText(f"Loading {model}…")
        elif model and self._chat_model and self._waiting:
            self.model_state.setText(f"Loading {model} for this message…")
        elif model and self._chat_model:
            self.model_state.setText(f"{model} loads at this chat's next message")

    def show_history(self, turns: list[dict], *, model: str = "") -> None:
        """An opened chat's stored turns, oldest first: its own chart, the last one's numbers."""
        self.reset()
        for m in turns[:-1]:
            self._plot(self.chart, m)
            if not stopped_early(m):
                self._ttfts = (self._ttfts + [waited(m)])[-RECENT_TURNS:]
        if turns:
            self.show_turn(turns[-1], model=model)

    def show_api_turn(self, m: dict, *, model: str = "") -> None:
        """An API server request's turn: its own box, the open chat's numbers untouched."""
        self.api_box.show()
        self._plot(self.api_chart, m)
        self.api_note.setText(
            f"Last API request ({m.get('model_id') or model}): TTFT {m.get('ttft_s', 0.0):.2f} s · "
            f"{_prefill_words(m)} · decode {m.get('decode_tps') or 0.0:,.1f} tok/s"
        )

    def show_turn(self, m: dict, *, model: str = "") -> None:
        """A finished turn's metrics (TurnMetrics.to_dict(), with the app's waited_s and
        queue_s when it measured them) of `model`."""
        model = m.get("model_id") or model
        self._waiting = False
        if stopped_early(m):
            self.ttft.setText("–")  # nothing was waited for to the end
            self.breakdown.setText("")
        else:
            self._ttfts = (self._ttfts + [waited(m)])[-RECENT_TURNS:]
            self.ttft.setText(f"{waited(m):.2f} s")
            self.breakdown.setText(wait_split(m))
        self.recent.setText("Recent: " + " · ".join(f"{t:.2f} s" for t in self._ttfts) if self._ttfts else "")
        rate = m.get("prefill_tps") or 0.0
        dense = m.get("sparse_outcome") != "used" and m.get("prefill_method", "dense") == "dense"
        if model and dense and m.get("prefilled_tokens", 0) >= MIN_RATE_TOKENS and rate:
            self._prefill_rates[model] = rate
        measured = self._prefill_rates.get(model)
        notes = []
        if m.get("restored_tokens"):
            notes.append(
                f"restored {m['restored_tokens']:,} tokens of this chat's prompt cache from disk "
                f"in {m.get('cache_restore_s', 0.0):.1f} s"
            )
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
        self._plot(self.chart, m)
        self.speed.setText(f"Last turn: {_prefill_words(m)} · decode {m.get('decode_tps') or 0.0:,.1f} tok/s")
        step = m.get("decode_step")  # which decode step ran: compiled, or mlx-lm's and why
        self.speed.setToolTip(plain_tooltip(f"Decode step: {step}") if step else "")
        self._show_speculation(m)
        used = m.get("kv_bytes", 0)
        held = m.get("prompt_tokens", 0) + m.get("generated_tokens", 0)
        context = m.get("context_length") or self._contexts.get(model, 0)  # the turn's own model's
        # The gauge: this chat's KV against the same KV at the model's full context.
        full = used / held * context if used and held and context else 0
        self.kv.set_value(min(used / full, 1.0) if full else 0.0, _size(used))
        free = self._free_memory_probe()
        k_bits, v_bits = m.get("k_bits", m.get("kv_bits", 16)), m.get("v_bits", m.get("kv_bits", 16))
        precision = f"{k_bits} bits" if k_bits == v_bits else f"K{k_bits}/V{v_bits} bits"
        self.kv_note.setToolTip(plain_tooltip(str(m.get("kv_check") or "")))
        remote = (m.get("extra") or {}).get("remote")
        self.kv_note.setText(
            f"KV cache {_size(used)} at {precision}"
            + (f" of {_size(full)} at the full {context:,}-token context" if full else "")
            + (f" · {_size(free)} memory free" if free and not remote else "")
            + (" (on the server)" if remote else "")
        )
        if remote:
            self._remote_seen[model] = remote_words(m)
            self.remote_note.setText(self._remote_seen[model])
            self.remote_note.show()

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

    @staticmethod
    def _plot(chart: LineChart, m: dict) -> None:
        """A turn's point: a cache hit has no prefill rate to plot (a gap, not a collapse)."""
        chart.add(prefill=None if cache_hit(m) else m.get("prefill_tps") or 0.0, decode=m.get("decode_tps") or 0.0)

    def refresh_memory(self) -> None:
        used = self._memory_probe()
        self.memory.setText(f"Process memory: {_size(used)}" if used else "")


def remote_words(m: dict) -> str:
    """Where a remote turn ran, what answered, and each rank's memory there (when it has ranks)."""
    extra = m.get("extra") or {}
    remote = extra.get("remote") or {}
    lines = [
        f"Remote engine: {remote.get('name', '?')} at {remote.get('url', '?')} · model {remote.get('model') or '?'}"
    ]
    ranks = [r for r in extra.get("ranks") or [] if isinstance(r, dict)]
    if ranks:
        parallel = f" ({extra['parallel']} parallel)" if extra.get("parallel") else ""
        lines.append(f"{len(ranks)} ranks{parallel}, memory on each:")
        for r in ranks:
            share = f" ({r['weight_share']:.0%})" if isinstance(r.get("weight_share"), float) else ""
            lines.append(
                f"• rank {r.get('rank', '?')} ({r.get('host', '?')}): {_size(r.get('weight_bytes') or 0)} weights"
                f"{share}, {_size(r.get('kv_bytes') or 0)} KV, peak {_size(r.get('peak_memory_bytes') or 0)}"
            )
    return "\n".join(lines)


def stopped_early(m: dict) -> bool:
    """The turn ended before its first token (stopped, or failed)."""
    return not m.get("generated_tokens") and m.get("finish_reason") in ("cancelled", "error")


def cache_hit(m: dict) -> bool:
    """The turn's prompt came (almost) all from the prompt cache: it read a handful of tokens."""
    prompt = m.get("prompt_tokens", 0)
    return bool(prompt) and m.get("cached_tokens", 0) >= CACHE_HIT_SHARE * prompt


def _prefill_words(m: dict) -> str:
    if cache_hit(m):
        restored = m.get("restored_tokens", 0)
        how = f"restored {restored:,} tokens from disk" if restored else f"reused {m.get('cached_tokens', 0):,} tokens"
        return f"prefill: cache hit: {how}, read {m.get('prefilled_tokens', 0):,} new"
    return f"prefill {m.get('prefill_tps') or 0.0:,.1f} tok/s"


def engine_parts(m: dict) -> float:
    """The engine's measured share of the wait (the parts after the queue)."""
    split = sum(m.get(name) or 0.0 for name, _ in WAIT_PARTS[1:])
    return split if split else m.get("ttft_s", 0.0)  # turns from before the split was measured


def waited(m: dict) -> float:
    """Send to the first token on screen. Never less than the parts measured inside it (a
    clock read on another thread cannot make the whole smaller than its parts). An engine
    that did not stamp its start (answers saved before, test doubles) gives its TTFT."""
    if not m.get("engine_started_at"):
        return m.get("ttft_s", 0.0)
    return max(m.get("waited_s") or 0.0, (m.get("queue_s") or 0.0) + engine_parts(m))


def wait_split(m: dict) -> str:
    """Where the wait went, in words: the parts over 5 ms, and what is left ('on screen')."""
    parts = [(words, m.get(name) or 0.0) for name, words in WAIT_PARTS]
    if not any(seconds for _, seconds in parts[1:]):
        return ""  # saved before the parts were measured: the big number is the engine's TTFT
    rest = waited(m) - sum(seconds for _, seconds in parts)
    parts.append(("on screen", rest))
    shown = [f"{words} {seconds:.2f} s" for words, seconds in parts if seconds >= 0.005]
    if m.get("restored_tokens"):
        shown = [p + f" ({m['restored_tokens']:,} tokens)" if p.startswith("cache restore") else p for p in shown]
    return " + ".join(shown)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _free_memory() -> int:
    from brisk.engine.runtime.info import memory_available

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
