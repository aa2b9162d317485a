"""What a turn does before its first token, phase by phase, each with its own progress and
an ETA from the rate measured in that phase, so a long prompt never looks frozen."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QProgressBar

# phase -> (words, step within a sparse prefill or None); phases are engine/vocabulary.py's
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
        self._samples: list[tuple[float, int]] = []  # (time, done) in this phase

    def start(self) -> None:
        self.phase, self._samples = "", []
        self.setValue(0)
        self.setFormat("Reading the prompt…")
        self.show()

    def progress(self, done: int, total: int, phase: str = "prompt") -> None:
        counted = phase not in ("select", "kv_check")  # these two say what they do, not how far
        if counted and (total <= 0 or (done >= total and phase == "prompt")):
            self.hide()  # the prompt is read: the first token is next (a finished phase stays at 100%)
            return
        if phase != self.phase:
            self.phase, self._samples = phase, []
        self.show()
        self._samples.append((self._clock(), done))
        words, step = PHASES.get(phase, PHASES["prompt"])
        prefix = f"Step {step} of {SPARSE_STEPS}: " if step else ""
        if not counted:
            self.setValue(0)
            self.setFormat(f"{prefix}{words}…")
            return
        self.setValue(int(1000 * done / total))
        eta = estimate_left(self._samples, total)
        self.setFormat(
            f"{prefix}{words}: {done / total:.0%} of {total:,} tokens"
            + (f" · about {_duration(eta)} left" if eta is not None else "")
        )

    def finish(self) -> None:
        self.hide()


def estimate_left(samples: list[tuple[float, int]], total: int) -> float | None:
    """Seconds left, from the measured cost per token in this phase. Each token costs more
    the later it sits (attention reads everything before it), so the cost is fitted as
    a + b·position over the chunks read so far and integrated over what remains; the first
    chunk (warm-up) is left out once there are others."""
    steps = [(t1 - t0, d0, d1) for (t0, d0), (t1, d1) in zip(samples, samples[1:]) if d1 > d0 and t1 > t0]
    if not steps:
        return None
    if len(steps) >= 3:
        steps = steps[1:]
    points = [((d0 + d1) / 2, dt / (d1 - d0)) for dt, d0, d1 in steps]  # (position, seconds per token)
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in points) / spread) if spread else 0.0
    base = max(mean_y - slope * mean_x, 0.0)
    done = samples[-1][1]
    return base * (total - done) + slope / 2 * (total**2 - done**2)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
