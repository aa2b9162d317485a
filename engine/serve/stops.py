"""OpenAI's `stop` sequences over streamed text.

Text is released only when no stop sequence can still begin in it: the longest tail that
is the start of some stop is held back until the next piece decides it.
"""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: list[str]):
        self.stops = stops
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """The text that can be sent now; sets `stopped` (and drops the rest) at a stop."""
        if self.stopped:
            return ""
        text = self._held + piece
        hits = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[: min(hits)]
        keep = max((n for stop in self.stops for n in range(1, len(stop)) if text.endswith(stop[:n])), default=0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of the answer: what was held back was not a stop after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
