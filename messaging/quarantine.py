"""Transport messages that can never be processed: kept, with their reason, never retried.

A malformed agent request or reply (or order-dispatch message) goes to
``<queue>-poison`` (the same place the Functions host puts a message that failed
``maxDequeueCount`` times) as ``{"reason", "message", "queue", "at"}``, with an ERROR log:
one bad message costs one delivery, not five, and it says why. Text that is not UTF-8
also carries ``messageBase64``, its exact bytes. The poison queue's trigger then raises
the operator alert (``supervisor/poison.py``).

The record must fit a Storage queue message (64 KiB of UTF-8); a message near that size
(or a Service Bus message, up to 256 KB) makes it larger once quoted, and a record that
cannot be sent would turn one quarantine into retries and a dead letter. So when the
record is too large (``stores.kept.MAX_RECORD_BYTES``) and a ``keeper`` is given, the
original is kept in the state table (``stores/kept.py``, ``python -m admin kept show``)
and the record carries ``messagePreview`` (its first 2,000 characters) and ``keptAs``
instead of ``message`` (and ``orderId``/``step`` when the message names them, so the alert
still can); ``reason``, ``queue`` and ``at`` are always there. Without a
keeper the full record is sent as before (if it is too large the send fails, and the
host's retries and poison/dead-letter path, which also alerts, take over).

An agent message's ``token`` is a secret: the record, its kept copy and the log line quote
the message with every token value replaced (``core/redact.py``).
"""

from __future__ import annotations

import base64
import json
from datetime import datetime

from core.messages import rejection_message
from core.ports import Clock, QueueSender
from core.redact import without_tokens, without_tokens_bytes
from observability.logs import get_logger
from observability.metrics import METRICS
from stores.kept import Keeper, fits_a_queue_message

log = get_logger(__name__)


def record_of(
    raw: bytes,
    reason: str,
    now: datetime,
    *,
    keeper: Keeper | None,
    kept_in: str,
    name_the_order: bool = False,
    **extra: str,
) -> tuple[str, str | None]:
    """The record that reports a message given up on (a rejected order, a quarantined agent
    message): ``{"reason", "message", "at"}`` plus ``extra``, and ``messageBase64`` (the
    exact bytes) when the text is not UTF-8. When that record would not fit a queue
    message and a ``keeper`` is given, the original is kept (under ``kept_in``) and the
    record carries ``messagePreview`` and ``keptAs`` instead (and, with
    ``name_the_order``, the ``orderId``/``step`` the message names). Returns the record
    and the kept copy's key, if any."""
    exact: str | None = None
    try:
        text = raw.decode("utf-8")
        body = rejection_message(reason, text, now, **extra)
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        exact = base64.b64encode(raw).decode("ascii")  # the exact bytes
        body = rejection_message(reason, text, now, **extra, messageBase64=exact)
    if keeper is None or fits_a_queue_message(body):
        return body, None
    kept_as = keeper.keep(
        kept_in,
        text if exact is None else exact,
        reason,
        now,
        encoding="text" if exact is None else "base64",
    )
    about = _about(text) if name_the_order else {}
    return rejection_message(reason, text, now, kept_as=kept_as, **extra, **about), kept_as


def quarantine(
    queues: QueueSender,
    queue: str,
    raw: bytes,
    reason: str,
    clock: Clock,
    keeper: Keeper | None = None,
) -> None:
    poison_queue = f"{queue}-poison"
    raw, reason = without_tokens_bytes(raw), without_tokens(reason)  # never quote a token
    body, kept_as = record_of(
        raw,
        reason,
        clock(),
        keeper=keeper,
        kept_in=poison_queue,
        name_the_order=True,
        queue=queue,
    )
    queues.send(poison_queue, body)
    METRICS.inc("quarantined", queue=queue)
    log.error(
        "message on %s quarantined to %s: %s%s",
        queue,
        poison_queue,
        reason,
        f" (too large for its record: kept as {kept_as})" if kept_as else "",
        extra={"event": "message_quarantined"},
    )


def _about(text: str) -> dict[str, str]:
    """``orderId`` and ``step`` as the message says them, for a record that cannot quote
    it (the alert names the order; ``supervisor/poison.py`` checks them)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: v[:100] for k in ("orderId", "step") if isinstance(v := value.get(k), str) and v}
