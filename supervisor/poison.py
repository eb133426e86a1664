"""Every message that ends in a poison or dead-letter queue raises an operator alert
(contract 3.11), and is kept.

The Functions host moves a Storage queue message to ``<queue>-poison`` after
``maxDequeueCount`` failed deliveries; malformed agent messages are quarantined there
at once with a reason (``messaging/quarantine.py``); Service Bus moves messages to a
queue's dead-letter sub-queue. A trigger on each of those hands the message here: one
alert (on ``operator-alerts`` and an ``OPERATOR ALERT`` ERROR log, which the Azure
Monitor alert rule matches) that names the queue, the order and step when the message
says them, why it was given up on, and the message itself. A message too large to ride
inside its alert is kept in the state table (``stores/kept.py``) and the alert says
where; ``python -m admin kept`` shows it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, Protocol

from core.messages import alert_message
from core.names import Names
from core.ports import Clock, QueueSender
from runtime.logs import get_logger, order_context
from runtime.metrics import METRICS

log = get_logger(__name__)

#: An alert is a Storage queue message (64 KiB): the original rides along up to this.
MAX_INLINE_CHARS: Final = 40_000
PREVIEW_CHARS: Final = 2_000


class Keeper(Protocol):
    def keep(self, queue: str, text: str, reason: str, at: Any) -> str: ...


@dataclass(frozen=True)
class Poisoned:
    """A message that was given up on, as the trigger saw it."""

    queue: str  # where it was given up on: "<queue>-poison" or "<queue>/$DeadLetterQueue"
    body: bytes
    deliveries: int | None = None
    reason: str | None = None  # the dead-letter reason, when the broker gives one


class PoisonWatch:
    def __init__(self, queues: QueueSender, names: Names, keeper: Keeper, clock: Clock):
        self._queues = queues
        self._names = names
        self._keeper = keeper
        self._clock = clock

    def alert(self, poisoned: Poisoned) -> dict[str, Any]:
        now = self._clock()
        text = poisoned.body.decode("utf-8", errors="replace")
        source = poisoned.queue.removesuffix("-poison").split("/")[0]
        original, why = text, poisoned.reason
        record = _json(text)
        if record is not None and {"reason", "message", "queue"} <= record.keys():
            # quarantined by the app itself: its record says why
            original, why = str(record["message"]), str(record["reason"])
        if why is None:
            why = (
                f"its function failed on it {poisoned.deliveries} times"
                if poisoned.deliveries
                else "its function kept failing on it"
            )
        about = _json(original) or {}
        order_id = about.get("orderId") if isinstance(about.get("orderId"), str) else ""
        step = about.get("step") if isinstance(about.get("step"), str) else ""
        reason = (
            f"a message on {source} was given up on and moved to {poisoned.queue}: {why}. "
            "Nothing retries it: read it here, fix the cause, and send it again to "
            f"{source} if it should still run"
        )
        extra: dict[str, Any] = {"queue": source, "poisonQueue": poisoned.queue}
        if len(original) <= MAX_INLINE_CHARS:
            extra["message"] = original
        else:
            extra["messagePreview"] = original[:PREVIEW_CHARS]
            extra["keptAs"] = self._keeper.keep(poisoned.queue, original, why, now)
            reason += f" (the whole message is kept: python -m admin kept {extra['keptAs']})"
        body = alert_message(
            order_id or "", step or "", reason, poisoned.deliveries or 0, now, **extra
        )
        with order_context(order_id=order_id or None, step=step or None):
            # The alert rule in infra/ matches this text; keep it stable.
            log.error(
                "OPERATOR ALERT order=%s step=%s failureCount=%s: %s",
                order_id,
                step,
                poisoned.deliveries or 0,
                reason,
                extra={"event": "operator_alert", "reason": reason, "queue": poisoned.queue},
            )
        self._queues.send(self._names.operator_alerts, body)
        METRICS.inc("poison_alerts", queue=source)
        return json.loads(body)  # type: ignore[no-any-return]


def _json(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
