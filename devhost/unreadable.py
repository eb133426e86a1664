"""A queue devhost cannot read is told once (docs/contracts.md §3.5, docs/operating.md).

A listener whose every receive fails only backs off and polls again: its messages wait.
After ``UNREADABLE_AFTER_SECONDS`` of nothing but failures, one ``queue-unreadable`` alert
goes to ``operator-alerts`` with a WARNING, and the first receive that works after it sends
one ``queue-recovered``; an alert not sent is tried again a minute later. Per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from core.messages import QUEUE_RECOVERED_ALERT, QUEUE_UNREADABLE_ALERT, queue_alert_message
from core.names import OPERATOR_ALERTS

log = logging.getLogger("devhost.unreadable")
UNREADABLE_AFTER_SECONDS: Final = 60.0  # of nothing but failed receives, before an alert
MAX_REASON_CHARS: Final = 500


@dataclass
class _Episode:
    started: float  # monotonic
    since: datetime
    last_error: str = ""
    alerted: bool = False
    next_try: float = 0.0  # monotonic: when a send that failed may be tried again


class UnreadableQueues:
    """The failing queues of one devhost process; ``send(queue, body)`` puts an alert on
    ``operator-alerts``, ``clock`` and ``now`` (the time alerts carry) are the tests'."""

    def __init__(
        self,
        send: Callable[[str, str], None],
        *,
        after: float = UNREADABLE_AFTER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._send, self._after, self._clock, self._now = send, after, clock, now
        self._episodes: dict[str, _Episode] = {}
        self._lock = threading.Lock()

    def failed(self, queue: str, error: object) -> None:
        """A receive from ``queue`` failed with ``error``."""
        at = self._clock()
        with self._lock:
            episode = self._episodes.setdefault(queue, _Episode(at, self._now()))
            episode.last_error = str(error)[:MAX_REASON_CHARS]
            if episode.alerted or at - episode.started < self._after or at < episode.next_try:
                return
            episode.alerted = True  # taken: no other listener of the queue sends it too
        seconds = at - episode.started
        reason = (
            f"every receive from {queue} has failed for {seconds:.0f} s; the last: "
            f"{episode.last_error}. Its messages wait (none is lost): fix the cause (the "
            "identity's rights on the queue, a message the storage cannot return) and "
            "they are read again"
        )
        log.warning("cannot read queue %s for %.0f s: %s", queue, seconds, episode.last_error)
        if not self._tell(QUEUE_UNREADABLE_ALERT, queue, episode.since, reason):
            with self._lock:
                episode.alerted, episode.next_try = False, at + self._after

    def read(self, queue: str) -> None:
        """A receive from ``queue`` worked."""
        if queue not in self._episodes:  # the common case, without the lock
            return
        with self._lock:
            episode = self._episodes.pop(queue, None)
        if episode is None or not episode.alerted:
            return
        log.warning("queue %s is read again (unreadable since %s)", queue, episode.since)
        self._tell(QUEUE_RECOVERED_ALERT, queue, episode.since, f"{queue} is read again")

    def _tell(self, kind: str, queue: str, since: datetime, reason: str) -> bool:
        body = queue_alert_message(kind, queue, since, reason, self._now())
        try:
            self._send(OPERATOR_ALERTS, body)
        except Exception as error:  # noqa: BLE001 - the alert is logged either way
            log.warning("could not send the %s alert for %s: %s", kind, queue, error)
            return False
        return True
