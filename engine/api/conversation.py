"""What a conversation is made of, as plain data: messages and the cancel flag of a turn.

Kept apart from `Session` so that rendering (engine/turn/prompt.py), documents and the app can
use them without importing the session (which imports them back).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field

from brisk.engine.api.errors import TurnCancelled


class CancelToken:
    """Set from any thread; the engine checks it between prefill chunks and tokens."""

    def __init__(self):
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Blocks until cancelled (True) or `timeout` seconds pass (False)."""
        return self._event.wait(timeout)

    def check(self) -> None:
        if self._event.is_set():
            raise TurnCancelled()


@dataclass
class Message:
    role: str  # system | user | assistant
    content: str
    finish_reason: str | None = None  # for answers: stop | length | context | cancelled | error
    token_ids: list[int] = field(default_factory=list)
    metrics: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)
