"""The ports the services depend on; adapters live in stores/ and messaging/.

``StateStore`` has two adapters that pass one contract suite
(``tests/integration/test_store_contract.py``): ``stores.tables.TableStateStore`` (Azure
Table Storage) and ``stores.memory.InMemoryStateStore`` (for unit tests of the services).
``AgentControlStore`` (the agents' runtime controls and their audit, ``core.controls``)
and ``OutageStore`` (the agents' shared outage records, ``core.outages``) are kept by the
same two stores, beside the orders, under the same contract suite.
``AgentTransport`` has two adapters that pass one contract suite
(``tests/integration/test_transport_contract.py``):
``messaging.storage_queues.StorageQueueTransport`` (on Azurite) and
``messaging.servicebus.ServiceBusTransport`` (on localbus, through the real SDK).
The dashboard's port, which speaks the dashboard's types, is ``dashboard.ports``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from core.controls import AgentControl, AuditEntry
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.outages import Outage
from core.search import FIELD_NAME, check_value, text_of
from core.states import OrderStatus

_WORKFLOW = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EVENT = re.compile(r"(?=.{1,48}\Z)[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class IndexEntry:
    """A row of a sweep's index: the order's active step and its due time (Pending) or
    deadline (Processing)."""

    order_id: str
    step: str
    at: datetime


@dataclass(frozen=True)
class OutboxEntry:
    """A notice committed with a transition and not yet sent (transactional outbox)."""

    partition: str
    row: str
    kind: str
    queue: str | None
    body: str
    order_id: str


@dataclass(frozen=True)
class SavedNotices:
    """Notices committed with a save: send them, then ``delete_outbox`` them."""

    partition: str
    entries: tuple[OutboxEntry, ...]


@dataclass(frozen=True)
class ListFilter:
    """What a listing keeps: one status, optionally one workflow and a creation-time range
    (``created_from`` inclusive, ``created_to`` exclusive). With ``search``, the status may
    be None: any."""

    status: OrderStatus | None
    workflow: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    #: only orders that wait for this event (an ``Event`` step, or a remote's callback):
    #: the operators' inbox (docs/contracts.md §3.13); they are ``processing``
    waiting: str | None = None
    #: only orders whose data, or a step's result, has this value
    #: (``core.search.search_text``) in this field, one their plan searches by
    #: (docs/contracts.md §3.14, §3.17): ``(field, value)``, the field as the query names it
    search: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.workflow is not None and not _WORKFLOW.fullmatch(self.workflow):
            raise ValueError("workflow must be 1-64 characters of A-Z a-z 0-9 - _")
        if self.waiting is not None and not _EVENT.fullmatch(self.waiting):
            raise ValueError("waiting must name an event: kebab-case (a-z, 0-9, -), 1-48")
        if self.search is not None:
            name, value = self.search
            if not FIELD_NAME.fullmatch(name):
                raise ValueError(f"{name[:80]!r} is not a field name")
            check_value(name, value)
        elif self.status is None:
            raise ValueError("a listing names a status, unless it searches")
        for name in ("created_from", "created_to"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ValueError(f"{name} must carry a time zone")
        if self.created_from and self.created_to and self.created_from >= self.created_to:
            raise ValueError("the time range is empty: 'from' must be before 'to'")

    def with_status(self, status: OrderStatus) -> ListFilter:
        return replace(self, status=status)

    def matches(self, order: Order) -> bool:
        """Whether the order, as read now, is one this filter lists: what a listing checks
        of each order its index rows name (a row can be behind the order, or stray)."""
        return (
            (self.status is None or order.status is self.status)
            and (self.workflow is None or order.workflow == self.workflow)
            and (self.created_from is None or order.created_at >= self.created_from)
            and (self.created_to is None or order.created_at < self.created_to)
            and (self.waiting is None or self.waiting in order.awaited_events())
            and (self.search is None or text_of(order, self.search[0]) == self.search[1])
        )


class StateStore(Protocol):
    """Where orders live. Every write is atomic for one order and conditional on what was
    read (``ConcurrencyConflict`` if another writer came first); ``create`` refuses an id
    that exists (``OrderAlreadyExists``); a store that cannot answer raises
    ``StorageUnavailable``, records that cannot be read ``CorruptOrder``."""

    def load(self, order_id: str) -> Order | None: ...

    def recent(self, order_id: str) -> Order | None:
        """The order as this process last wrote it, if it still has it (no request):
        a hint that may be stale. Saving it is conditional on its ETags like any save
        (``ConcurrencyConflict`` if another writer came first); None: ``load`` it."""
        ...

    def create(self, order: Order) -> SavedNotices: ...

    def save(self, order: Order) -> SavedNotices: ...

    def due_pending(self, now: datetime, limit_per_shard: int = 500) -> Iterator[IndexEntry]:
        """Active Pending steps that may run at ``now``."""
        ...

    def held_pending(self, agent: str, limit_per_shard: int = 1000) -> Iterator[IndexEntry]:
        """Active Pending steps that wait for ``agent``'s pause, whatever their due time."""
        ...

    def expired_processing(
        self, before: datetime, limit_per_shard: int = 500
    ) -> Iterator[IndexEntry]:
        """Processing steps whose CompleteBy is before ``before``."""
        ...

    def stale_outbox(self, before: datetime, limit_per_shard: int = 200) -> Iterator[OutboxEntry]:
        """Notices committed before ``before`` and still not sent."""
        ...

    def delete_outbox(self, saved: SavedNotices | list[OutboxEntry]) -> None: ...

    def list_by_status(
        self, where: ListFilter | OrderStatus, page_size: int, token: str | None
    ) -> tuple[list[str], str | None]:
        """Order ids matching, newest first, a page at a time (``InvalidContinuationToken``
        for a token this store did not hand out). With ``where.search``: the ids its search
        rows name (``stores.layout.search_rows``), newest first, of the workflow and time
        range asked for; the status, and whether the order still has that value, are for the
        caller to check on the orders it loads (``ListFilter.matches``)."""
        ...

    def count_by_status(self, where: ListFilter, cap: int = 1000) -> int: ...

    def repair_index(self, order_id: str, attempts: int = 5) -> dict[str, Any]: ...


class AgentControlStore(Protocol):
    """The agents' runtime controls: one record per agent ever changed, each write
    conditional on the ETag read (``ConcurrencyConflict`` if another came first; a
    control read as new must not exist yet) and made with its audit entry in one
    transaction. ``StorageUnavailable`` if the store does not answer, or the outcome of a
    write is unknown."""

    def read_controls(self) -> dict[str, AgentControl]: ...

    def write_control(self, control: AgentControl, entry: AuditEntry) -> AgentControl:
        """Store ``control`` (If-Match its ``etag``; None: create) and append ``entry``;
        returns it with its new ETag."""
        ...

    def audit_page(
        self, page_size: int, token: str | None = None, agent: str | None = None
    ) -> tuple[list[AuditEntry], str | None]:
        """Audit entries, newest first (of one agent, or all), a page at a time
        (``InvalidContinuationToken`` for a token this store did not hand out)."""


class OutageStore(Protocol):
    """The agents' shared outage records (``core.outages``): one per agent, each write
    conditional on the ETag read (``ConcurrencyConflict`` if another came first; a record
    read as new must not exist yet). ``StorageUnavailable`` if the store does not answer,
    or the outcome of a write is unknown."""

    def read_outages(self) -> dict[str, Outage]: ...

    def write_outage(self, outage: Outage) -> Outage:
        """Store ``outage`` (If-Match its ``etag``; None: create); returns it with its new
        ETag."""
        ...


class Clock(Protocol):
    def __call__(self) -> datetime: ...


class ScheduledSender(Protocol):
    """A queue whose messages can be scheduled to the millisecond and are pushed to their
    trigger when due (Service Bus: ``messaging.servicebus``)."""

    def send_at(self, queue: str, body: str, at: datetime) -> None:
        """``body`` on ``queue``, invisible until ``at`` (UTC). Raises StorageUnavailable
        (retry later) or an OrderError subclass (never sendable)."""
        ...


class QueueSender(Protocol):
    """Storage queues: orders-rejected, operator-alerts, order-dispatch, replyTo queues."""

    def send(
        self,
        queue: str,
        body: str,
        *,
        delay_seconds: float = 0,
        ttl_seconds: int | None = None,
        create: bool = True,
    ) -> None:
        """``create``: a queue that does not exist yet is created (the app's own queues);
        False: ``QueueMissing`` instead (an order's ``replyTo``, never created)."""
        ...

    def exists(self, queue: str) -> bool:
        """Whether the queue exists (``StorageUnavailable`` if that cannot be told)."""
        ...


class AgentTransport(Protocol):
    """The agent request/reply queues: Service Bus, or Storage queues on Azurite.

    A request goes to its agent's own queue (``Names.agent_queue``), due at once; both
    messages carry their ids in the JSON body (docs/contracts.md §3.3), a reply lives an
    hour whatever its deadline. A send that fails raises an ``OrderError``
    (``StorageUnavailable``: retry later). Where the adapters differ by design (message
    properties and duplicate detection on Service Bus; a request's life past its deadline;
    queues created on first use on Storage), the contract suite states each side."""

    def send_request(self, request: AgentRequest) -> bool:
        """Send; False if the deadline has already passed (nothing sent)."""
        ...

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        """Send to ``reply_to`` (the request's reply queue) or the default reply queue."""
        ...
