"""OpenAI's `stop` sequences over streamed text.

Text is released only when no stop sequence can still begin in it: the longest tail that
is the start of some stop is held back until the next piece decides it.

Each stop has a Knuth–Morris–Pratt matcher (Knuth, Morris & Pratt 1977, "Fast pattern
matching in strings") that reads every character once: a piece costs time in its own
length, however long the stops are. The earlier scanner compared every prefix of every
stop with the text's end at each token, quadratic in a stop's length: one request with a
1,000,000-character stop held the event loop for 29 s. Stops are also bounded (count and
length, as OpenAI bounds the count) by `check_stops`, which request parsing calls.
"""

from __future__ import annotations

MAX_STOPS = 4  # OpenAI's limit
# A stop is a marker (`\n\nUser:`, `</answer>`, a chat template's end token): 256 characters
# hold any of them, and bound the text held back from a stream while a stop may be starting.
MAX_STOP_CHARS = 256


def check_stops(stops: list[str]) -> None:
    """Raises ValueError (one line, for the client) where there are too many stops or one is too long."""
    if len(stops) > MAX_STOPS:
        raise ValueError(f"stop takes at most {MAX_STOPS} sequences (got {len(stops)})")
    for i, stop in enumerate(stops):
        if len(stop) > MAX_STOP_CHARS:
            raise ValueError(f"stop[{i}] is {len(stop):,} characters long; the most is {MAX_STOP_CHARS}")


def _failure(stop: str) -> list[int]:
    """fail[i]: the longest proper prefix of stop[: i + 1] that is also its suffix."""
    fail = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = fail[k - 1]
        if stop[i] == stop[k]:
            k += 1
        fail[i] = k
    return fail


class _Matcher:
    """One stop: `matched` is the longest prefix of it that the text read so far ends with."""

    def __init__(self, stop: str):
        self.stop, self.fail, self.matched = stop, _failure(stop), 0

    def step(self, char: str) -> tuple[bool, int]:
        """(whole stop matched, automaton transitions taken) after one more character."""
        stop, k, steps = self.stop, self.matched, 1
        while k and char != stop[k]:
            k = self.fail[k - 1]
            steps += 1
        if char == stop[k]:
            k += 1
        self.matched = k
        return k == len(stop), steps


class StopScanner:
    def __init__(self, stops: list[str]):
        self.stops = stops
        self._matchers = [_Matcher(stop) for stop in stops if stop]
        self._empty_stop = "" in stops  # found at once, before any text
        self._held = ""
        self.stopped = False
        self.steps = 0  # automaton transitions so far: linear in the text read (the tests bound it)

    def feed(self, piece: str) -> str:
        """The text that can be sent now; sets `stopped` (and drops the rest) at a stop."""
        if self.stopped:
            return ""
        text = self._held + piece
        if self._empty_stop:
            self.stopped = True
            return ""
        offset = len(self._held)
        first = None  # where the earliest stop found in this piece begins, in `text`
        for matcher in self._matchers:
            for i, char in enumerate(piece):
                done, steps = matcher.step(char)
                self.steps += steps
                if done:  # one stop's first occurrence ends first and so begins first
                    start = offset + i + 1 - len(matcher.stop)
                    first = start if first is None else min(first, start)
                    break
        if first is not None:
            self.stopped, self._held = True, ""
            return text[:first]
        # No stop completed, so every matcher holds a proper prefix of its stop.
        keep = max((m.matched for m in self._matchers), default=0)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        """At the end of the answer: what was held back was not a stop after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
