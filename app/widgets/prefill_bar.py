"""What a turn does before its first token, phase by phase, each with its own progress and
the time that phase has left, so a long prompt never looks frozen. The estimate is the
engine's (engine/turn/prefill_eta.py, carried by PrefillProgressed); for a producer that sends
none, the bar runs the same estimator on its own clock."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QProgressBar

from brisk.engine.turn.prefill_eta import PrefillEta

# phase -> (words, step within a sparse prefill or None); phases are engine/api/literal_types.py's
PHASES = {
    "kv_check": ("Checking packed KV on this model (once per model)", None),
    "draft": ("The draft reads the prompt", 1),
    "select": ("The draft chooses what to keep", 2),
    "kept": ("The model reads the kept part", 3),
    "prompt": ("Reading the prompt", None),
}
SPARSE_STEPS = 3


class PrefillBar(QProgressBar):
    def __init__(self, parent=None, *, clock=time.monotonic):
        super().__init__(parent)
        self.setObjectName("prefillBar")
        self.setRange(0, 1000)
        self.hide()
        self._clock = clock
        self.phase = ""
        self._eta = PrefillEta()  # only for events that carry no estimate

    def start(self) -> None:
        self.phase, self._eta = "", PrefillEta()
        self.setValue(0)
        self.setFormat("Reading the prompt…")
        self.show()

    def progress(self, done: int, total: int, phase: str = "prompt", seconds_left: float | None = None) -> None:
        counted = phase not in ("select", "kv_check")  # these two say what they do, not how far
        if counted and (total <= 0 or (done >= total and phase == "prompt")):
            self.hide()  # the prompt is read: the first token is next (a finished phase stays at 100%)
            return
        self.phase = phase
        self.show()
        ours = self._eta.update(self._clock(), done, total, phase)
        eta = seconds_left if seconds_left is not None else ours
        words, step = PHASES.get(phase, PHASES["prompt"])
        prefix = f"Step {step} of {SPARSE_STEPS}: " if step else ""
        if not counted:
            self.setValue(0)
            self.setFormat(f"{prefix}{words}…")
            return
        self.setValue(int(1000 * done / total))
        self.setFormat(
            f"{prefix}{words}: {done / total:.0%} of {total:,} tokens"
            + (f" · about {_duration(eta)} left" if eta is not None else "")
        )

    def finish(self) -> None:
        self.hide()


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
