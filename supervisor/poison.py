"""Every message that ends in a poison or dead-letter queue raises an operator alert
(docs/contracts.md §3.11), and is kept.

The Functions host moves a Storage queue message to ``<queue>-poison`` after
``maxDequeueCount`` failed deliveries; malformed agent messages are quarantined there
at once with a reason (``messaging/quarantine.py``); Service Bus moves messages to a
queue's dead-letter sub-queue. A trigger on each of those hands the message here: one
alert (on ``operator-alerts`` and an ``OPERATOR ALERT`` ERROR log, which the Azure
Monitor alert rule matches) that names the queue, the order and step when the message
says them, why it was given up on, what happens next, and the message itself
(``message``; plus ``messageBase64``, its exact bytes, when it is not UTF-8).

An alert is a Storage queue message: 64 KiB of UTF-8. A message longer than
``MAX_INLINE_CHARS``, or one whose alert would weigh more than
``stores.kept.MAX_RECORD_BYTES`` (JSON escapes: a quote is two bytes, a character
outside ASCII up to twelve), is kept in the state table (``stores/kept.py``) and the
alert carries ``messagePreview`` and ``keptAs`` instead; ``python -m admin kept show
<keptAs>`` shows it. A quarantine record that already kept its message passes its
``keptAs`` on. Every field taken from the message is bounded, so the alert always fits.

An agent message's ``token`` is a secret: the alert, the kept copy and the log line quote a
message from any queue but the orders' with every token value replaced
(``core/redact.py``); an order is quoted as it came (docs/contracts.md §3.1).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from core.messages import alert_message
from core.names import Names, poison
from core.order_message import is_valid_order_id
from core.ports import Clock, QueueSender
from core.redact import base64_without_tokens, without_tokens, without_tokens_bytes
from dashboard.figures import POISON, Activity
from observability.logs import get_logger, log_operator_alert
from observability.metrics import METRICS
from stores.kept import PREVIEW_CHARS, Keeper, fits_a_queue_message, is_kept_row

log = get_logger(__name__)

#: The original rides inside its alert up to this many characters (and while the alert
#: stays under MAX_RECORD_BYTES); longer ones are kept.
MAX_INLINE_CHARS: Final = 40_000
#: Why a message was given up on, as the message, the broker or a record says it.
MAX_WHY_CHARS: Final = 1_000
_STEP = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
MAX_STEP_CHARS: Final = 100


@dataclass(frozen=True)
class Poisoned:
    """A message that was given up on, as the trigger saw it."""

    queue: str  # where it was given up on: "<queue>-poison" or "<queue>/$DeadLetterQueue"
    body: bytes
    deliveries: int | None = None
    reason: str | None = None  # the dead-letter reason, when the broker gives one


@dataclass
class _Original:
    text: str  # the message as text (invalid UTF-8 replaced)
    exact: str | None = None  # base64 of its bytes, when they are not UTF-8
    kept_as: str | None = None  # already kept (a quarantine record that was too large)
    order_id: str = ""
    step: str = ""


class PoisonWatch:
    def __init__(
        self,
        queues: QueueSender,
        names: Names,
        keeper: Keeper,
        clock: Clock,
        record: Callable[[Activity], None] | None = None,
    ):
        """``record`` counts each alert for the dashboard (an activity row; best effort)."""
        self._record = record
        self._queues = queues
        self._names = names
        self._keeper = keeper
        self._clock = clock

    def alert(self, poisoned: Poisoned) -> dict[str, Any]:
        now = self._clock()
        source = poisoned.queue.removesuffix("-poison").split("/")[0]
        secret = not self._names.holds_orders(source)  # it may carry an attempt's token
        if secret:
            poisoned = dataclasses.replace(
                poisoned,
                body=without_tokens_bytes(poisoned.body),
                reason=None if poisoned.reason is None else without_tokens(poisoned.reason),
            )
        original, why = self._original(poisoned, secret)
        if why is None:
            why = (
                f"its function failed on it {poisoned.deliveries} times"
                if poisoned.deliveries
                else "its function kept failing on it"
            )
        why = _cut(why, MAX_WHY_CHARS)
        reason = (
            f"a message on {source} was given up on and moved to {poisoned.queue}: {why}. "
            f"{self._next(source)}"
        )
        failures = poisoned.deliveries or 0
        extra: dict[str, Any] = {"queue": source, "poisonQueue": poisoned.queue}

        def body_with(fields: dict[str, Any], why_kept: str = "") -> str:
            return alert_message(
                original.order_id,
                original.step,
                reason + why_kept,
                failures,
                now,
                **extra,
                **fields,
            )

        inline: dict[str, Any] = {"message": original.text}
        if original.exact is not None:
            inline["messageBase64"] = original.exact
        body = body_with(inline)
        if (
            original.kept_as is not None
            or len(original.text) > MAX_INLINE_CHARS
            or not fits_a_queue_message(body)
        ):
            kept_as = original.kept_as or self._keeper.keep(
                poisoned.queue,
                original.text if original.exact is None else original.exact,
                why,
                now,
                encoding="text" if original.exact is None else "base64",
            )
            preview = original.text[:PREVIEW_CHARS]
            hint = f" (the whole message is kept: python -m admin kept show {kept_as})"
            body = body_with({"messagePreview": preview, "keptAs": kept_as}, hint)
            while not fits_a_queue_message(body) and preview:  # pragma: no cover - bounded
                preview = preview[: len(preview) // 2]
                body = body_with({"messagePreview": preview, "keptAs": kept_as}, hint)
        alert: dict[str, Any] = json.loads(body)
        log_operator_alert(
            log, original.order_id, alert["step"], failures, alert["reason"], queue=source
        )
        self._queues.send(self._names.operator_alerts, body)
        METRICS.inc("poison_alerts", queue=source)
        if self._record is not None:
            try:  # the dashboard's count; the alert itself is sent
                self._record(Activity(now, POISON, original.order_id or "", step=source))
            except Exception as exc:  # noqa: BLE001 - never fail an alert for a figure
                log.warning("could not count the poison alert for the dashboard: %s", exc)
        return alert

    def _original(self, poisoned: Poisoned, secret: bool) -> tuple[_Original, str | None]:
        """The message given up on, and why, if a quarantine record or the broker says.
        ``secret``: what a quarantine record quotes loses its tokens too (a record written
        before quarantine removed them)."""
        try:
            original = _Original(poisoned.body.decode("utf-8"))
        except UnicodeDecodeError:
            original = _Original(
                poisoned.body.decode("utf-8", errors="replace"),
                base64.b64encode(poisoned.body).decode("ascii"),
            )
        why = poisoned.reason
        record = _json(original.text)
        # Quarantined by the app itself (messaging/quarantine.py): its record says why.
        if record is not None and self._is_quarantine_record(poisoned.queue, record):
            why = record["reason"]
            inner, preview = record.get("message"), record.get("messagePreview")
            exact = record.get("messageBase64")
            original = _Original(
                inner if isinstance(inner, str) else str(preview or ""),
                exact if isinstance(exact, str) else None,
                None if isinstance(inner, str) else record["keptAs"],
            )
            if secret:
                why = without_tokens(why)
                original.text = without_tokens(original.text)
                if original.exact is not None:
                    original.exact = base64_without_tokens(original.exact)
            record = _json(original.text) or record  # a kept record: its own orderId/step
        if record is not None:
            order_id, step = record.get("orderId"), record.get("step")
            if isinstance(order_id, str) and is_valid_order_id(order_id):
                original.order_id = order_id
            if isinstance(step, str) and len(step) <= MAX_STEP_CHARS and _STEP.fullmatch(step):
                original.step = step
        return original, why

    def _is_quarantine_record(self, queue: str, record: dict[str, Any]) -> bool:
        """Written by messaging/quarantine.py: reason, queue, at, and the message or the key
        of its kept copy. Orders are never quarantined (they are rejected), so on the orders'
        poison queue such fields are an order's business data, not a record."""
        kept_as = record.get("keptAs")
        return (
            queue != poison(self._names.orders)
            and isinstance(record.get("reason"), str)
            and isinstance(record.get("queue"), str)
            and "at" in record
            and (
                isinstance(record.get("message"), str)
                or (isinstance(kept_as, str) and is_kept_row(kept_as))
            )
        )

    def _next(self, source: str) -> str:
        """What happens to the work the message stood for, and what the operator does."""
        if source in (*self._names.agent_queues(), self._names.agent_replies):
            return (
                "Its step is not lost: when the step's deadline passes the supervisor retries "
                "it (same idempotency key); if its order reaches error, work it as any other. "
                "Read the message here and fix the cause if it recurs"
            )
        if source == self._names.order_dispatch:
            return (
                "The order is not lost: the scheduler's sweep dispatches pending steps whose "
                "dispatch was lost. Read the message here and fix the cause if it recurs"
            )
        if source == self._names.order_wakeups:
            return (
                "The order is not lost: the scheduler's sweep starts its steps once they are "
                "due, and the supervisor ends its delays and waits at their time, later than "
                "the wake-up would have. Read the message here and fix the cause if it recurs"
            )
        return (
            "Nothing retries it: read it here, fix the cause, and send it again to "
            f"{source} if it should still run"
        )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\u2026"


def _json(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
