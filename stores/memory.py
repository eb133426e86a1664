"""The order state store in memory: ``TableStateStore``'s contract, for unit tests.

It keeps what the table keeps, laid out the same way (``stores.layout``): per shard
partition, rows by RowKey (the order record, the step records, the index rows, the
outbox rows), each as the properties a read of it returns, with its ETag. A
write is the list of operations ``TableStateStore._commit`` builds (create, If-Match
update, index upserts and deletes, outbox creates), applied all or nothing under one
lock; the Order object is then left exactly as ``TableStateStore`` leaves it. What is
kept is what the service gives back for what was written (``stores/codec.py``: None not
stored, EDM types as a read returns them, a value the SDK cannot write refused), and
reads parse those entities with ``entities.parse_order``, so serialization is exercised
as on Azure; the service's limits that a bug could hit
are enforced (a string property of more than 32K UTF-16 units, an entity over 1 MiB or
255 properties, a transaction of more than 100 operations: refused, as Azure refuses
them). ``tests/integration/test_store_contract.py`` runs one suite on both stores.

Deterministic (ETags and write ids are counters) and fast. For tests of outage
handling, ``fail_next`` makes the next calls fail as if the store did not answer.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import logging
import threading
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any, Final

from azure.data.tables import TableEntity

from core.errors import (
    ConcurrencyConflict,
    OrderAlreadyExists,
    OrderNotFound,
    StorageUnavailable,
)
from core.model import Order
from core.order_message import utf16_units
from core.ports import AgentControlStore, ListFilter, OutboxEntry, SavedNotices, StateStore
from core.states import OrderStatus
from dashboard.ports import DashboardStore
from stores import codec, control_rows, entities, layout, listing, writes
from stores.control_rows import ControlRows
from stores.dashboard_rows import DashboardRows
from stores.outages import OutageRows
from stores.sweeps import SweepReads
from stores.turns import TurnRows
from stores.writes import Op

log = logging.getLogger(__name__)

#: Azure Table Storage limits (a write beyond them is refused with 400).
MAX_STRING_UNITS: Final = 32 * 1024  # a string property: 64 KiB of UTF-16
MAX_PROPERTIES: Final = 252  # plus PartitionKey, RowKey and Timestamp: 255
MAX_ENTITY_BYTES: Final = 1024 * 1024
MAX_KEY_UNITS: Final = 512  # a key: 1 KiB of UTF-16
MAX_OPERATIONS: Final = 100  # per entity group transaction
_KEY_FORBIDDEN: Final = frozenset("/\\#?") | {chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))}


class _Refused(Exception):
    """The transaction was refused as a whole: 404, 409 or 412 on operation ``index``."""

    def __init__(self, status: int, index: int, row: str):
        super().__init__(f"{status} on operation {index} ({row})")
        self.status = status


class _Invalid(Exception):
    """What Azure answers with 400: an entity or a transaction over the service's limits."""


class _Partition:
    """One partition: rows by RowKey, and the keys in order for range reads."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[dict[str, Any], str]] = {}
        self.keys: list[str] = []

    def keys_between(self, low: str, high: str, *, after: bool = False) -> list[str]:
        """Keys in ``[low, high)`` (``(low, high)`` if ``after``)."""
        start = (bisect.bisect_right if after else bisect.bisect_left)(self.keys, low)
        return self.keys[start : bisect.bisect_left(self.keys, high)]

    def put(self, row: str, properties: dict[str, Any], etag: str) -> None:
        if row not in self.rows:
            bisect.insort(self.keys, row)
        self.rows[row] = (properties, etag)

    def delete(self, row: str) -> None:
        del self.rows[row]
        del self.keys[bisect.bisect_left(self.keys, row)]


class InMemoryStateStore(SweepReads, ControlRows, OutageRows, DashboardRows, TurnRows):
    """``core.ports.StateStore`` in memory, with ``TableStateStore``'s observable semantics."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._partitions: dict[str, _Partition] = {}
        self._etags = itertools.count(1)
        self._write_ids = itertools.count(1)
        self._faults: list[tuple[int, BaseException, frozenset[str] | None]] = []
        self._written: set[str] = set()  # orders saved through this store (``recent``)

    # --- test hooks ----------------------------------------------------------------

    def fail_next(
        self, n: int = 1, exc: BaseException | None = None, *, only: Collection[str] = ()
    ) -> None:
        """Make the next ``n`` calls (of the methods named in ``only``, or of any) fail as if
        the store did not answer: they raise ``exc`` (``StorageUnavailable`` by default),
        change nothing, and ``delete_outbox`` logs and keeps the rows, as TableStateStore
        does. An iterator (``due_pending``, ...) fails when it is first read."""
        error = exc or StorageUnavailable("the in-memory store is unavailable (fail_next)")
        with self._lock:
            self._faults.append((n, error, frozenset(only) or None))

    def rows(self, partition: str) -> list[TableEntity]:
        """Every row of a partition, in key order (what a query of the partition returns)."""
        with self._lock:
            part = self._partitions.get(partition, _Partition())
            return [_entity(*part.rows[row]) for row in part.keys]

    def put_row(self, entity: dict[str, Any]) -> None:
        """Write a row as it is (an upsert): a stray row, a manual edit, an older layout."""
        with self._lock:
            self._apply(str(entity["PartitionKey"]), [Op("upsert", str(entity["RowKey"]), entity)])

    def delete_row(self, partition: str, row: str) -> None:
        with self._lock:
            self._apply(partition, [Op("delete", row)])

    def _fault(self, method: str) -> None:
        with self._lock:
            for n, (left, error, only) in enumerate(self._faults):
                if only is None or method in only:
                    if left <= 1:
                        del self._faults[n]
                    else:
                        self._faults[n] = (left - 1, error, only)
                    raise copy.copy(error)

    # --- reads ---------------------------------------------------------------------

    def load(self, order_id: str) -> Order | None:
        self._fault("load")
        return self._load(order_id)

    def _load(self, order_id: str) -> Order | None:
        prefix = layout.order_prefix(order_id)
        rows = self._range(layout.shard_of(order_id), prefix, prefix + layout.HIGH)
        return entities.parse_stored(order_id, rows)

    def recent(self, order_id: str) -> Order | None:
        """The order as this store last wrote it (``TableStateStore.recent``; one store
        object stands for every process here, so it is what ``load`` returns, with no
        fault injected: a read that makes no request cannot fail)."""
        with self._lock:
            written = order_id in self._written
        return self._load(order_id) if written else None

    def _range(
        self,
        shard: str,
        low: str,
        high: str,
        select: list[str] | None = None,
        limit: int | None = None,
        *,
        after: bool = False,
    ) -> list[TableEntity]:
        with self._lock:
            part = self._partitions.get(shard)
            if part is None:
                return []
            keys = part.keys_between(low, high, after=after)[:limit]
            found = [_entity(*part.rows[row]) for row in keys]
        return found if select is None else [_select(e, select) for e in found]

    def _before_read(self, method: str) -> None:
        self._fault(method)

    def list_by_status(
        self, where: ListFilter | OrderStatus, page_size: int, token: str | None
    ) -> tuple[list[str], str | None]:
        """Order ids by status (and filter), newest first: ``stores.listing``'s merge over
        this store's rows."""
        if isinstance(where, OrderStatus):
            where = ListFilter(where)
        if token is not None:
            listing.parse_token(token)  # a bad token is refused before any fault
        self._fault("list_by_status")
        return listing.list_page(self._status_rows, where, page_size, token)

    def count_by_status(self, where: ListFilter, cap: int = listing.COUNT_CAP) -> int:
        """How many orders match, to ``cap`` at most."""
        self._fault("count_by_status")
        return listing.count(self._status_rows, where, cap)

    def _status_rows(
        self,
        shard: str,
        low: str,
        high: str,
        workflow: str | None,
        select: list[str],
        strictly: bool,
    ) -> Iterator[dict[str, Any]]:
        for e in self._range(shard, low, high, [*select, "Workflow"], after=strictly):
            if workflow is None or e.get("Workflow") == workflow:  # the table's Workflow eq
                yield e

    def create(self, order: Order) -> SavedNotices:
        """Write a new order (order record, first step, index, outbox) all or nothing;
        ``OrderAlreadyExists`` if any of its rows exists."""
        return self._commit(order, creating=True)

    def save(self, order: Order) -> SavedNotices:
        """Write what changed, conditional on the order record's ETag and on every changed
        step record's (a new one must not exist): ``ConcurrencyConflict`` otherwise."""
        return self._commit(order, creating=False)

    def _commit(self, order: Order, *, creating: bool) -> SavedNotices:
        write_id = f"{next(self._write_ids):032x}"
        order.version += 1
        try:
            commit = writes.plan_commit(order, write_id, creating=creating)
            with self._lock:
                self._fault("create" if creating else "save")
                etags = self._apply(commit.partition, commit.ops)
        except _Refused as exc:
            order.version -= 1
            if creating:
                raise OrderAlreadyExists(
                    f"order {order.order_id} already exists", order_id=order.order_id
                ) from exc
            raise ConcurrencyConflict(
                f"order {order.order_id} changed while it was being updated ({exc})",
                order_id=order.order_id,
            ) from exc
        except _Invalid as exc:
            order.version -= 1
            raise StorageUnavailable(
                f"transaction for order {order.order_id} failed: {exc}", order_id=order.order_id
            ) from exc
        except BaseException:
            order.version -= 1
            raise
        with self._lock:
            self._written.add(order.order_id)
        return writes.adopt(order, commit, etags)

    def _apply(self, partition: str, ops: list[Op]) -> dict[str, str]:
        """One entity group transaction: every operation, or (``_Refused``, ``_Invalid``)
        none. Returns the new ETag of each row written. Call with the lock held."""
        if len(ops) > MAX_OPERATIONS:
            raise _Invalid(f"{len(ops)} operations in one transaction (at most 100)")
        if len({op.row for op in ops}) < len(ops):
            raise _Invalid("one transaction names the same entity twice")
        part = self._partitions.setdefault(partition, _Partition())
        todo: list[tuple[Op, dict[str, Any] | None]] = []
        for n, op in enumerate(ops):
            current = part.rows.get(op.row)
            if op.kind == "create" and current is not None:
                raise _Refused(409, n, op.row)
            if op.kind in ("update", "merge") and current is None:
                raise _Refused(404, n, op.row)
            if op.kind in ("update", "merge") and current is not None and current[1] != op.etag:
                raise _Refused(412, n, op.row)
            if op.kind == "delete" and op.etag and current is not None and current[1] != op.etag:
                raise _Refused(412, n, op.row)
            if op.kind == "delete" and current is None:
                if not layout.is_index_row(op.row):
                    raise _Refused(404, n, op.row)
                # As TableStateStore._submit: a row the state implies is gone (a manual
                # repair, a restore); saving without deleting it beats failing forever.
                log.warning("index row %s was already gone; saving without deleting it", op.row)
                continue
            kept = None
            if op.kind != "delete" and op.entity is not None:
                source = {**op.entity, "PartitionKey": partition, "RowKey": op.row}
                if op.kind == "merge" and current is not None:
                    source = {**_entity(*current), **source}
                kept = _kept(source)
            todo.append((op, kept))
        etags: dict[str, str] = {}
        for op, kept in todo:
            if kept is None:
                part.delete(op.row)
                continue
            etags[op.row] = f'W/"mem-{next(self._etags):08d}"'
            part.put(op.row, kept, etags[op.row])
        return etags

    def _control_commit(self, ops: list[Op], row: str, write_id: str) -> str:
        """An agent's control row and its audit row, all or nothing (``stores.control_rows``)."""
        with self._lock:
            self._fault("write_control")
            try:
                etags = self._apply(control_rows.PARTITION, ops)
            except _Refused as exc:
                raise ConcurrencyConflict(f"{row} changed while it was being updated") from exc
            except _Invalid as exc:
                raise StorageUnavailable(f"the change to {row} failed: {exc}") from exc
        return etags[row]

    # --- repair --------------------------------------------------------------------

    def repair_index(self, order_id: str, attempts: int = 5) -> dict[str, Any]:
        """Rebuild an order's index rows from its state, as ``TableStateStore.repair_index``
        does (the same report; a repair stamps a new ``WriteId`` on the order record, so
        a save of a copy loaded before it is a conflict). Atomic here: ``attempts`` is
        never needed."""
        self._fault("repair_index")
        partition = layout.shard_of(order_id)
        with self._lock:
            order = self._load(order_id)
            if order is None:
                raise OrderNotFound(f"no order with id {order_id!r}", order_id=order_id)
            found = [_select(row, writes.INDEX_FIELDS) for row in self.rows(partition)]
            existing = {str(e["RowKey"]): dict(e) for e in found if e["OrderRef"] == order_id}
            report, changes = writes.plan_repair(order, existing)
            if not report["repaired"]:
                return report
            etag = order.etag
            guard_row = layout.order_row(order_id)
            for start in range(0, len(changes), MAX_OPERATIONS - 1):
                guard = writes.repair_guard(order_id, etag, f"{next(self._write_ids):032x}")
                etag = self._apply(partition, [guard, *changes[start : start + 99]])[guard_row]
        log.warning(
            "order %s: index repaired (removed %s, added %s, rewritten %s)",
            order_id,
            report["removed"],
            report["added"],
            report["rewritten"],
        )
        return report

    # --- the dashboard's rows (stores/dashboard_rows.py) -----------------------------------------

    def _transact(self, partition: str, ops: list[Op]) -> dict[str, str]:
        with self._lock:
            self._fault("write_dashboard")
            try:
                return self._apply(partition, ops)
            except _Refused as exc:
                raise ConcurrencyConflict(f"rows of {partition} changed meanwhile ({exc})") from exc
            except _Invalid as exc:
                raise StorageUnavailable(f"transaction in {partition} failed: {exc}") from exc

    def _delete_rows(self, partition: str, rows: list[str]) -> None:
        self._fault("delete_activity")
        with self._lock:
            part = self._partitions.get(partition)
            for row in rows:
                if part is not None and row in part.rows:
                    part.delete(row)

    def delete_outbox(self, saved: SavedNotices | list[OutboxEntry]) -> None:
        entries = saved.entries if isinstance(saved, SavedNotices) else tuple(saved)
        if not entries:
            return
        try:
            self._fault("delete_outbox")
        except Exception as exc:  # noqa: BLE001 - as TableStateStore: the sweep resends
            log.warning("could not delete %d outbox rows (the sweep will): %s", len(entries), exc)
            return
        with self._lock:
            for entry in entries:
                part = self._partitions.get(entry.partition)
                if part is not None and entry.row in part.rows:
                    part.delete(entry.row)


def _kept(entity: dict[str, Any]) -> dict[str, Any]:
    """The entity as the table keeps it (what a read returns: ``stores/codec.py``; a value
    the SDK cannot write raises ``TypeError`` as the SDK does), refused as Azure would
    refuse it if it is over the service's limits."""
    for key in ("PartitionKey", "RowKey"):
        value = str(entity[key])
        if utf16_units(value) > MAX_KEY_UNITS or _KEY_FORBIDDEN & set(value):
            raise _Invalid(f"{key} {value[:80]!r} is not a valid key")
    values = {k: v for k, v in entity.items() if v is not None}
    if len(values) - 2 > MAX_PROPERTIES:
        raise _Invalid(f"{len(values)} properties (at most 255 with the system properties)")
    size = 4
    for name, value in values.items():
        units = utf16_units(value) if isinstance(value, str) else 0
        if units > MAX_STRING_UNITS:
            raise _Invalid(f"property {name} holds {units} UTF-16 units (at most 32K)")
        size += 8 + 2 * len(name) + (4 + 2 * units if isinstance(value, str) else 8)
    if size > MAX_ENTITY_BYTES:
        raise _Invalid(f"the entity is about {size} bytes (at most 1 MiB)")
    return codec.as_read(values)


def _entity(properties: dict[str, Any], etag: str) -> TableEntity:
    """A row as a query returns it: a new TableEntity, with its ETag in ``metadata``."""
    return codec.StoredEntity(properties, etag)


def _select(entity: TableEntity, names: list[str]) -> TableEntity:
    """A query with ``select``: only those properties, None for one the row lacks."""
    return codec.StoredEntity({name: entity.get(name) for name in names}, entity.metadata["etag"])


if TYPE_CHECKING:  # the ports, checked by mypy
    _PORT: StateStore = InMemoryStateStore()
    _CONTROLS: AgentControlStore = InMemoryStateStore()
    _DASHBOARD: DashboardStore = InMemoryStateStore()
