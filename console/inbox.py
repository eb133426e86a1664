"""What waits for an operator on queues: alerts, rejected orders and poisoned messages.

Peeked, never received: the console shows them and leaves them for whatever consumes
them (an alerting integration, ``python -m admin``). A Storage queue shows at most 32
messages to a peek; the approximate count says how many wait in all. What they quote of
an agent message shows no token (``core/redact.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError

from bootstrap import AppContext
from core.order_message import strict_json
from core.redact import without_tokens

PEEK: int = 32
PREVIEW_CHARS: int = 300


@dataclass
class Waiting:
    queue: str
    count: int | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None


def _peek(ctx: AppContext, queue: str) -> Waiting:
    client = ctx.queues.client(queue)
    try:
        count = client.get_queue_properties().approximate_message_count
        peeked = client.peek_messages(max_messages=PEEK)
    except ResourceNotFoundError:
        return Waiting(queue, 0)
    except AzureError as exc:
        return Waiting(queue, None, problem=f"could not read {queue}: {type(exc).__name__}")
    messages = []
    for message in peeked:
        text = str(message.content or "")
        if not ctx.names.holds_orders(queue):  # an agent message's token never shows
            text = without_tokens(text)
        try:
            body = strict_json(text)  # never a RecursionError, whatever a queue holds
        except ValueError:
            body = None
        messages.append(
            {
                "body": body if isinstance(body, dict) else {},
                "text": text[:PREVIEW_CHARS] + ("…" if len(text) > PREVIEW_CHARS else ""),
                "insertedOn": message.inserted_on,
            }
        )
    return Waiting(queue, count, messages)


def alerts(ctx: AppContext) -> Waiting:
    """The operator alerts waiting on their queue, newest first."""
    waiting = _peek(ctx, ctx.names.operator_alerts)
    waiting.messages.sort(key=lambda m: str(m["body"].get("at", "")), reverse=True)
    return waiting


def rejected(ctx: AppContext) -> list[Waiting]:
    """Rejected orders, then every poison queue (with at least one message or trouble)."""
    queues = [ctx.names.orders_rejected, *ctx.names.poison_queues()]
    return [w for w in (_peek(ctx, q) for q in queues) if w.count or w.problem]
