"""What an operator watches, read only: the dashboard's figures and the agents' outages,
the stuck steps, the messages kept, and what waits on the alert, rejected and poison
queues (the console's alerts and dashboard pages).

The queues are peeked, never received: the console shows them and leaves them for
whatever consumes them (an alerting integration, ``python -m admin``). A Storage queue
shows at most 32 messages to a peek; the approximate count says how many wait in all.
What they quote of an agent message shows no token (``core/redact.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from azure.core.exceptions import AzureError, ResourceNotFoundError

from core.names import Names
from core.order_message import strict_json
from core.outages import Outage
from core.redact import without_tokens
from dashboard.figures import STUCK_ROW
from dashboard.ports import StoredRow
from messaging.storage_queues import StorageQueues
from stores.kept import KeptMessages, KeptSummary, as_shown

PEEK: int = 32
PREVIEW_CHARS: int = 300


class WatchedStore(Protocol):
    """The rows the dashboard timer keeps, and the agents' outage records."""

    def dashboard_rows(self, low: str, high: str, limit: int = 1000) -> list[StoredRow]: ...

    def read_outages(self) -> dict[str, Outage]: ...


@dataclass
class Waiting:
    """What waits on one queue: how many (None: unknown), the first few, or the trouble."""

    queue: str
    count: int | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None


class Watch:
    """The operator's reads of what needs attention (never an order's records)."""

    def __init__(
        self, store: WatchedStore, kept: KeptMessages, queues: StorageQueues, names: Names
    ):
        self._store = store
        self._kept = kept
        self._queues = queues
        self._names = names

    def dashboard_rows(self, low: str, high: str, limit: int = 1000) -> list[StoredRow]:
        """The dashboard partition's rows from ``low`` to ``high`` (the figures' buckets)."""
        return self._store.dashboard_rows(low, high, limit)

    def read_outages(self) -> dict[str, Outage]:
        """The agents' outage records, by agent."""
        return self._store.read_outages()

    def stuck_rows(self) -> list[StoredRow]:
        """The stuck list the dashboard timer's last run kept."""
        return self._store.dashboard_rows(STUCK_ROW, STUCK_ROW + "~")

    def kept(self, limit: int = 50) -> list[KeptSummary]:
        """The oldest ``limit`` messages kept aside, as an operator is shown them."""
        return [as_shown(k, self._names) for k in self._kept.summaries(limit=limit)]

    def alerts(self) -> Waiting:
        """The operator alerts waiting on their queue, newest first."""
        waiting = self._peek(self._names.operator_alerts)
        waiting.messages.sort(key=lambda m: str(m["body"].get("at", "")), reverse=True)
        return waiting

    def rejected(self) -> list[Waiting]:
        """Rejected orders, then every poison queue (with at least one message or trouble)."""
        queues = [self._names.orders_rejected, *self._names.poison_queues()]
        return [w for w in (self._peek(q) for q in queues) if w.count or w.problem]

    def _peek(self, queue: str) -> Waiting:
        client = self._queues.client(queue)
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
            if not self._names.holds_orders(queue):  # an agent message's token never shows
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
