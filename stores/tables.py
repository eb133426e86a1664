"""The order state store on Azure Table Storage.

Every write is one entity group transaction in the order's partition, with
If-Match on the ETag of every record it changes (never an upsert, which skips
the check). The domain sees ``ConcurrencyConflict`` / ``OrderAlreadyExists``,
never an SDK exception.

Ambiguous writes: the SDK retries a request that timed out, and the first try
may have applied. A conditional retry of an applied write fails with 412, so
it can never apply twice; to tell "someone else won" from "my own first try
won", each save stamps the order record with a fresh ``WriteId`` and, on a
conflict, re-reads it (``_wrote``). When even that re-read fails, the outcome is
unknown: ``StorageUnavailable`` says so, never a guess either way.

Damaged data never blocks the rest: records that cannot be parsed are
``CorruptOrder`` (for that order only), malformed index or outbox rows are
skipped with an ERROR log, a save tolerates an index row that is already gone,
and ``repair_index`` rebuilds an order's index rows from its state.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from core.errors import (
    ConcurrencyConflict,
    CorruptOrder,
    OrderAlreadyExists,
    OrderNotFound,
    StorageUnavailable,
)
from core.model import Notice, Order
from core.states import OrderStatus
from core.timefmt import sortable
from stores import entities, layout, listing, sdk_patches
from stores.listing import InvalidContinuationToken, ListFilter

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What reading a malformed entity raises: a missing property (KeyError), a bad value or
#: JSON text (ValueError, json.JSONDecodeError), a property of the wrong type (TypeError,
#: AttributeError), a number out of range (OverflowError).
_PARSE_ERRORS = (KeyError, ValueError, TypeError, AttributeError, IndexError, OverflowError)


@dataclass(frozen=True)
class IndexEntry:
    order_id: str
    step: str
    at: datetime  # due time (pending) or deadline (processing)


@dataclass(frozen=True)
class OutboxEntry:
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


class TableStateStore:
    def __init__(self, table: TableClient):
        sdk_patches.apply()
        self._table = table

    @property
    def table(self) -> TableClient:
        return self._table

    def ensure_table(self) -> None:
        with contextlib.suppress(ResourceExistsError):
            self._table.create_table()

    # --- reads ---------------------------------------------------------------------

    def load(self, order_id: str) -> Order | None:
        prefix = layout.order_prefix(order_id)
        try:
            rows = list(
                self._table.query_entities(
                    "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                    parameters={
                        "pk": layout.shard_of(order_id),
                        "lo": prefix,
                        "hi": prefix + layout.HIGH,
                    },
                )
            )
        except AzureError as exc:
            raise StorageUnavailable(
                f"could not read order {order_id}: {exc}", order_id=order_id
            ) from exc
        try:
            return entities.parse_order(rows)
        except _PARSE_ERRORS as exc:
            raise CorruptOrder(
                f"order {order_id}'s stored records cannot be read "
                f"({type(exc).__name__}: {exc}); repair them by hand (see the operator's guide)",
                order_id=order_id,
            ) from exc

    def _range(
        self,
        shard: str,
        low: str,
        high: str,
        select: list[str] | None = None,
        limit: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        pages = self._table.query_entities(
            "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
            parameters={"pk": shard, "lo": low, "hi": high},
            select=select,
            results_per_page=min(limit or 1000, 1000),
        )
        for n, entity in enumerate(pages):
            if limit is not None and n >= limit:
                return
            yield entity

    def _index(
        self, prefix: str, until: datetime, limit: int, *, inclusive: bool
    ) -> Iterator[IndexEntry]:
        high = f"{prefix}|{sortable(until)}" + ("|" + layout.HIGH if inclusive else "")
        for shard in layout.all_shards():
            try:
                rows = self._range(
                    shard, prefix + "|", high, ["RowKey", "OrderRef", "StepName"], limit
                )
                yield from _well_formed(
                    rows,
                    _index_entry,
                    f"index row in {shard} (python -m admin repair-index <orderId> rebuilds "
                    "an order's index)",
                )
            except AzureError as exc:
                raise StorageUnavailable(f"could not read the {prefix} index: {exc}") from exc

    def due_pending(self, now: datetime, limit_per_shard: int = 500) -> Iterator[IndexEntry]:
        """Active Pending steps that may run at ``now`` (lost dispatches, backoffs over)."""
        return self._index("pending", now, limit_per_shard, inclusive=True)

    def expired_processing(
        self, before: datetime, limit_per_shard: int = 500
    ) -> Iterator[IndexEntry]:
        """Processing steps whose CompleteBy is before ``before``."""
        return self._index("processing", before, limit_per_shard, inclusive=False)

    def stale_outbox(self, before: datetime, limit_per_shard: int = 200) -> Iterator[OutboxEntry]:
        high = f"outbox|{sortable(before)}"
        for shard in layout.all_shards():
            try:
                rows = self._range(shard, "outbox|", high, limit=limit_per_shard)
                yield from _well_formed(rows, _outbox_entry, f"outbox row in {shard}")
            except AzureError as exc:
                raise StorageUnavailable(f"could not read the outbox: {exc}") from exc

    def list_by_status(
        self, where: ListFilter | OrderStatus, page_size: int, token: str | None
    ) -> tuple[list[str], str | None]:
        """Order ids by status (and filter), newest first, a page at a time
        (``stores.listing``; a bad token is ``InvalidContinuationToken``)."""
        if isinstance(where, OrderStatus):
            where = ListFilter(where)
        return listing.list_page(self._table, where, page_size, token)

    def count_by_status(self, where: ListFilter, cap: int = listing.COUNT_CAP) -> int:
        """How many orders match, to ``cap`` at most."""
        return listing.count(self._table, where, cap)

    # --- writes --------------------------------------------------------------------

    def create(self, order: Order) -> SavedNotices:
        """Write a new order (order record, first step, index, outbox) in one transaction."""
        try:
            return self._commit(order, creating=True)
        except ConcurrencyConflict as exc:
            raise OrderAlreadyExists(
                f"order {order.order_id} already exists", order_id=order.order_id
            ) from exc

    def save(self, order: Order) -> SavedNotices:
        """Write what changed, conditional on every ETag read. ``ConcurrencyConflict`` if any
        record changed since ``load`` (re-load and decide again)."""
        return self._commit(order, creating=False)

    def _commit(self, order: Order, *, creating: bool) -> SavedNotices:
        partition = layout.shard_of(order.order_id)
        write_id = uuid.uuid4().hex
        order.version += 1
        ops: list[tuple[str, dict[str, Any], dict[str, Any]] | tuple[str, dict[str, Any]]] = []
        ops.append(self._write_op(entities.order_entity(order, write_id), order.etag, creating))
        changed = [s for s in order.steps if s.changed or s.etag is None]
        for step in changed:
            ops.append(self._write_op(entities.step_entity(step), step.etag, False))
        before: dict[str, dict[str, str]] = order.store_meta.get("index", {})
        after = layout.index_rows(order)
        for row in before.keys() - after.keys():
            ops.append(("delete", {"PartitionKey": partition, "RowKey": row}))
        for row in after.keys() - before.keys():
            ops.append(
                (
                    "upsert",
                    {"PartitionKey": partition, "RowKey": row, **after[row]},
                    {"mode": UpdateMode.REPLACE},
                )
            )
        outbox = [
            OutboxEntry(
                partition,
                layout.outbox_row(order.updated_at, order.order_id, f"{order.version}-{n}"),
                notice.kind,
                notice.queue,
                notice.body,
                order.order_id,
            )
            for n, notice in enumerate(order.outbox)
        ]
        for entry in outbox:
            ops.append(
                (
                    "create",
                    {
                        "PartitionKey": partition,
                        "RowKey": entry.row,
                        "OrderRef": order.order_id,
                        "NoticeKind": entry.kind,
                        "Queue": entry.queue or "",
                        "Body": entry.body,
                    },
                )
            )
        try:
            results = self._submit(order.order_id, ops)
        except AzureError as exc:
            order.version -= 1
            refused = isinstance(exc, TableTransactionError) and exc.status_code in (409, 412, 404)
            # Refused: maybe our own first try, applied, then retried by the SDK (412).
            # Unanswered (the SDK does not retry a POST whose response was lost): maybe
            # applied. Either way the WriteId on the order record tells whose write stands.
            # A refused create is never ours: nothing retries it.
            mine = False if creating and refused else self._wrote(order.order_id, write_id)
            if mine:
                log.warning(
                    "order %s: a write whose answer was lost or refused had applied (write %s)",
                    order.order_id,
                    write_id,
                )
                return self._reload_after(order, write_id, outbox, partition)
            if mine is None:
                # Never guess: "not ours" would turn an applied change into a false conflict.
                raise StorageUnavailable(
                    f"the outcome of the write to order {order.order_id} is unknown: the store "
                    "did not confirm it and could not be asked afterwards whether it applied; "
                    "read the order again, and retry if it did not change",
                    order_id=order.order_id,
                ) from exc
            if refused:
                raise ConcurrencyConflict(
                    f"order {order.order_id} changed while it was being updated "
                    f"({getattr(exc, 'status_code', '')} {getattr(exc, 'error_code', '')})",
                    order_id=order.order_id,
                ) from exc
            raise StorageUnavailable(
                f"transaction for order {order.order_id} failed: {exc}", order_id=order.order_id
            ) from exc
        order.etag = results[0]["etag"]
        for step, result in zip(changed, results[1 : 1 + len(changed)], strict=True):
            step.etag = result["etag"]
            step.changed = False
        order.store_meta["index"] = after
        order.store_meta["write_id"] = write_id
        order.outbox = []
        return SavedNotices(partition, tuple(outbox))

    def _submit(self, order_id: str, ops: list[Any]) -> list[Any]:
        """``submit_transaction``, tolerating index rows that are already gone."""
        while True:
            try:
                return list(self._table.submit_transaction(ops))
            except AzureError as exc:
                missing = _missing_index_row(exc, ops)
                if missing is None:
                    raise
                # The row the stored state implies is not there (a manual repair, a restore,
                # an older layout). The batch was refused as a whole, nothing applied: drop
                # that delete and resubmit, or every save of this order would fail forever.
                log.warning(
                    "order %s: index row %s was already gone; saving without deleting it",
                    order_id,
                    ops[missing][1]["RowKey"],
                )
                del ops[missing]

    def _wrote(self, order_id: str, write_id: str) -> bool | None:
        """After an ambiguous or refused write: did our own write apply after all?
        ``None``: cannot tell (the re-read failed too)."""
        try:
            record = self._table.get_entity(
                layout.shard_of(order_id), layout.order_row(order_id), select=["WriteId"]
            )
        except ResourceNotFoundError:
            return False  # no order record: nothing of ours applied
        except AzureError as exc:
            log.warning("order %s: could not re-read its WriteId: %s", order_id, exc)
            return None
        return bool(record.get("WriteId") == write_id)

    def _reload_after(
        self, order: Order, write_id: str, outbox: list[OutboxEntry], partition: str
    ) -> SavedNotices:
        fresh = self.load(order.order_id)
        if fresh is None or fresh.store_meta["write_id"] != write_id:
            raise ConcurrencyConflict(
                f"order {order.order_id} changed again right after an ambiguous write",
                order_id=order.order_id,
            )
        # What we wrote is what is stored: adopt its ETags as if the write had answered.
        order.version = fresh.version
        order.etag = fresh.etag
        etags = {s.seq: s.etag for s in fresh.steps}
        for step in order.steps:
            step.etag = etags.get(step.seq)
            step.changed = False
        order.store_meta = fresh.store_meta
        order.outbox = []
        return SavedNotices(partition, tuple(outbox))

    @staticmethod
    def _write_op(
        entity: dict[str, Any], etag: str | None, creating: bool
    ) -> tuple[str, dict[str, Any], dict[str, Any]] | tuple[str, dict[str, Any]]:
        if etag is None:
            return ("create", entity)
        if creating:  # pragma: no cover - a new order has no ETags
            raise AssertionError("creating an order that was loaded")
        return (
            "update",
            entity,
            {
                "mode": UpdateMode.REPLACE,
                "etag": etag,
                "match_condition": MatchConditions.IfNotModified,
            },
        )

    # --- repair --------------------------------------------------------------------

    def repair_index(self, order_id: str, attempts: int = 5) -> dict[str, Any]:
        """Rebuild an order's index rows from its state: delete the rows its state does not
        imply, write the ones missing. Conditional on the order record's ETag (a merge that
        stamps a new ``WriteId``), so it cannot race a save: a save in between makes it look
        again. Idempotent; returns what it found and did."""
        partition = layout.shard_of(order_id)
        for _ in range(attempts):
            order = self.load(order_id)  # CorruptOrder: the state itself needs a person
            if order is None:
                raise OrderNotFound(f"no order with id {order_id!r}", order_id=order_id)
            try:
                found = {
                    str(e["RowKey"]): dict(e)
                    for e in self._table.query_entities(
                        "PartitionKey eq @pk and OrderRef eq @id",
                        parameters={"pk": partition, "id": order_id},
                        select=["RowKey", "OrderRef", "StepName", "Workflow"],
                    )
                }
            except AzureError as exc:
                raise StorageUnavailable(
                    f"could not read order {order_id}'s index rows: {exc}", order_id=order_id
                ) from exc
            existing = {k: v for k, v in found.items() if layout.is_index_row(k)}
            wanted = layout.index_rows(order)
            stray = sorted(existing.keys() - wanted.keys())
            missing = sorted(wanted.keys() - existing.keys())
            wrong = sorted(
                k
                for k in wanted.keys() & existing.keys()
                if any(existing[k].get(name) != value for name, value in wanted[k].items())
            )
            report: dict[str, Any] = {
                "orderId": order_id,
                "status": str(order.status),
                "removed": stray,
                "added": missing,
                "rewritten": wrong,
                "kept": sorted((wanted.keys() & existing.keys()) - set(wrong)),
                "repaired": bool(stray or missing or wrong),
            }
            if not report["repaired"]:
                return report
            changes: list[Any] = [
                ("delete", {"PartitionKey": partition, "RowKey": k}) for k in stray
            ]
            changes += [
                (
                    "upsert",
                    {"PartitionKey": partition, "RowKey": k, **wanted[k]},
                    {"mode": UpdateMode.REPLACE},
                )
                for k in missing + wrong
            ]
            try:
                etag = order.etag
                for start in range(0, len(changes), 99):  # 100 operations per transaction
                    guard = (
                        "update",
                        {
                            "PartitionKey": partition,
                            "RowKey": layout.order_row(order_id),
                            "WriteId": uuid.uuid4().hex,
                        },
                        {
                            "mode": UpdateMode.MERGE,
                            "etag": etag,
                            "match_condition": MatchConditions.IfNotModified,
                        },
                    )
                    results = self._table.submit_transaction([guard, *changes[start : start + 99]])
                    etag = results[0]["etag"]
            except TableTransactionError as exc:
                if exc.status_code in (404, 409, 412):
                    log.info("order %s changed during the index repair; looking again", order_id)
                    continue
                raise StorageUnavailable(
                    f"index repair of order {order_id} failed: {exc}", order_id=order_id
                ) from exc
            except AzureError as exc:
                raise StorageUnavailable(
                    f"index repair of order {order_id} may not have completed ({exc}); "
                    "run it again (it is idempotent)",
                    order_id=order_id,
                ) from exc
            log.warning(
                "order %s: index repaired (removed %s, added %s, rewritten %s)",
                order_id,
                stray,
                missing,
                wrong,
            )
            return report
        raise ConcurrencyConflict(
            f"order {order_id} kept changing during the index repair; run it again",
            order_id=order_id,
        )

    def delete_outbox(self, saved: SavedNotices | list[OutboxEntry]) -> None:
        entries = saved.entries if isinstance(saved, SavedNotices) else tuple(saved)
        for entry in entries:
            try:
                self._table.delete_entity(entry.partition, entry.row)
            except ResourceNotFoundError:
                pass  # someone else (the sweep, or our own retried call) delivered it
            except AzureError as exc:  # refused, or no answer at all (connection lost)
                # The notice went out; the row stays, and the sweep sends it again later
                # (at-least-once). Never an error for the caller: its work is done.
                log.warning("could not delete outbox row %s (the sweep will): %s", entry.row, exc)


def _missing_index_row(exc: AzureError, ops: list[Any]) -> int | None:
    """The position of the index-row delete a transaction failed on with 404, if that is why.

    Azure and Azurite answer a refused batch with the failing operation's position in the
    message (``"2:The specified resource does not exist."``), which azure-data-tables 12.7
    exposes as ``TableTransactionError.index`` (0 when it cannot tell: never an index delete).
    """
    if not isinstance(exc, TableTransactionError) or exc.status_code != 404:
        return None
    index = getattr(exc, "index", None)
    if not isinstance(index, int) or not 0 < index < len(ops):
        return None
    op = ops[index]
    if op[0] != "delete" or not layout.is_index_row(str(op[1].get("RowKey", ""))):
        return None
    return index


def _well_formed(
    rows: Iterator[dict[str, Any]], parse: Callable[[dict[str, Any]], T], what: str
) -> Iterator[T]:
    """``parse`` of each row; a malformed one (a manual edit) is skipped with an ERROR log
    rather than ending every sweep."""
    for e in rows:
        try:
            entry = parse(e)
        except _PARSE_ERRORS as exc:
            log.error(
                "skipping malformed %s: %s (%s: %s)", what, e.get("RowKey"), type(exc).__name__, exc
            )
            continue
        yield entry


def _index_entry(e: dict[str, Any]) -> IndexEntry:
    _, when, _, _ = e["RowKey"].split("|", 3)
    return IndexEntry(str(e["OrderRef"]), str(e["StepName"]), _parse_sortable(when))


def _outbox_entry(e: dict[str, Any]) -> OutboxEntry:
    return OutboxEntry(
        e["PartitionKey"],
        e["RowKey"],
        e["NoticeKind"],
        e.get("Queue") or None,
        e["Body"],
        e["OrderRef"],
    )


def _parse_sortable(text: str) -> datetime:
    return datetime.strptime(text, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)


__all__ = [
    "IndexEntry",
    "InvalidContinuationToken",
    "ListFilter",
    "Notice",
    "OutboxEntry",
    "SavedNotices",
    "TableStateStore",
]
