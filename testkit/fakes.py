"""The app's outside world, faked for a run in process: a settable clock, queues and an
agent transport that keep what they are given, and a keeper of oversized messages.

The kit's runs use them (``testkit.world``), and so does the product's own suite
(``tests/support.py`` and ``tests/unit/test_services_in_memory.py`` import them from
here): one fake of each, not one per suite.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from core.errors import QueueMissing, StorageUnavailable
from core.messages import AgentReply, AgentRequest


class FakeClock:
    """A settable UTC clock, shared by everything one test builds."""

    def __init__(self, start: datetime | None = None):
        self.now = start or datetime.now(UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self.now += timedelta(seconds=seconds)
            return self.now

    def set(self, when: datetime) -> datetime:
        """Move the clock to ``when`` (never back)."""
        with self._lock:
            self.now = max(self.now, when)
            return self.now


@dataclass
class Sent:
    queue: str
    body: str
    delay_seconds: float = 0
    #: when it was sent, by the queues' clock (None: the queues were given no clock)
    at: datetime | None = None

    @property
    def due(self) -> datetime | None:
        """When it becomes visible on its queue (None: no clock)."""
        return None if self.at is None else self.at + timedelta(seconds=self.delay_seconds)


class RecordingQueues:
    """``QueueSender``: keeps every message (with the time it was sent, given a ``clock``)."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self.sent: list[Sent] = []
        #: queues that do not exist (every other one does)
        self.missing: set[str] = set()
        self._clock = clock

    def send(
        self,
        queue: str,
        body: str,
        *,
        delay_seconds: float = 0,
        ttl_seconds: int | None = None,
        create: bool = True,
    ) -> None:
        if queue in self.missing:
            if not create:
                raise QueueMissing(f"queue {queue} does not exist")
            self.missing.discard(queue)
        at = self._clock() if self._clock is not None else None
        self.sent.append(Sent(queue, body, delay_seconds, at))

    def exists(self, queue: str) -> bool:
        return queue not in self.missing

    def on(self, queue: str) -> list[dict[str, Any]]:
        return [json.loads(s.body) for s in self.sent if s.queue == queue]


class RecordingTransport:
    """``AgentTransport``: keeps every request and reply."""

    def __init__(self) -> None:
        self.requests: list[AgentRequest] = []
        self.replies: list[AgentReply] = []
        self.fail_next = 0  # how many of the next requests fail to send

    def send_request(self, request: AgentRequest) -> bool:
        if self.fail_next:
            self.fail_next -= 1
            raise StorageUnavailable("the request queue is unavailable (fail_next)")
        self.requests.append(request)
        return True

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        self.replies.append(reply)
        return True


class RecordingKeeper:
    """``stores.kept.Keeper``: keeps a message too large for its rejection record."""

    def __init__(self) -> None:
        self.kept: list[tuple[str, str]] = []

    def keep(
        self, queue: str, text: str, reason: str, at: datetime, *, encoding: str = "text"
    ) -> str:
        self.kept.append((queue, text))
        return f"kept|{len(self.kept)}"
