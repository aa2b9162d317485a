"""Prefill progress with percentage and ETA, so a long prompt never looks frozen."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QProgressBar


class PrefillBar(QProgressBar):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("prefillBar")
        self.setRange(0, 1000)
        self.hide()
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self.setValue(0)
        self.setFormat("Reading the prompt…")
        self.show()

    def progress(self, done: int, total: int) -> None:
        if total <= 0 or done >= total:
            self.hide()
            return
        if self.isHidden():
            self.start()
        share = done / total
        self.setValue(int(1000 * share))
        elapsed = time.monotonic() - self._started
        eta = elapsed * (1 - share) / share if share > 0 else None
        self.setFormat(f"Reading the prompt: {share:.0%} of {total:,} tokens"
                       + (f" · about {_duration(eta)} left" if eta is not None else ""))

    def finish(self) -> None:
        self.hide()


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
