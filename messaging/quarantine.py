"""Transport messages that can never be processed: kept, with their reason, never retried.

A malformed agent request or reply goes to ``<queue>-poison`` (the same
place the Functions host puts a message that failed ``maxDequeueCount``
times) as ``{"reason", "message", "queue", "at"}``, with an ERROR log: one bad
message costs one delivery, not five, and it says why.
"""

from __future__ import annotations

import json

from core.ports import Clock, QueueSender
from core.timefmt import iso
from runtime.logs import get_logger
from runtime.metrics import METRICS

log = get_logger(__name__)


def quarantine(queues: QueueSender, queue: str, raw: bytes, reason: str, clock: Clock) -> None:
    text = raw.decode("utf-8", errors="replace")
    body = json.dumps(
        {"reason": reason, "message": text, "queue": queue, "at": iso(clock())},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    queues.send(f"{queue}-poison", body)
    METRICS.inc("quarantined", queue=queue)
    log.error(
        "message on %s quarantined to %s-poison: %s",
        queue,
        queue,
        reason,
        extra={"event": "message_quarantined"},
    )
