"""The order state store on Azure Table Storage.

(Over 400 lines because the reads, the conditional writes, the ambiguous-write
resolution and the index repair share the same transaction rules; listing and the
record layout are already their own modules.)

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
from collections.abc import Iterator
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableEntity, TableTransactionError, UpdateMode

from core.errors import (
    ConcurrencyConflict,
    CorruptOrder,
    OrderAlreadyExists,
    OrderError,
    OrderNotFound,
    StorageUnavailable,
)
from core.model import Order
from core.ports import ListFilter, OutboxEntry, SavedNotices
from core.states import OrderStatus
from stores import codec, control_rows, entities, layout, listing, writes
from stores.control_rows import ControlRows
from stores.dashboard_rows import DashboardRows
from stores.outages import OutageRows
from stores.recent import MAX_BODY_CHARS, RecentWrites
from stores.sweeps import SweepReads
from stores.turns import TurnRows

log = logging.getLogger(__name__)

T = TypeVar("T")


class TableStateStore(SweepReads, ControlRows, OutageRows, DashboardRows, TurnRows):
    def __init__(self, table: TableClient, recent: RecentWrites | None = None):
        """``recent``: what this process wrote last of each order (``stores/recent.py``);
        a store of its own by default."""
        self._table = table
        self._recent = recent if recent is not None else RecentWrites()

    @property
    def table(self) -> TableClient:
        return self._table

    def ensure_table(self) -> None:
        """Create the table if missing. Storage that does not answer is
        ``StorageUnavailable``, as for every other request: the process's first request
        may be the one that meets an outage, and it answers 503 (``retryable``) like the
        rest, not a 500; the next one tries again."""
        try:
            with contextlib.suppress(ResourceExistsError):
                self._table.create_table()
        except AzureError as exc:
            raise StorageUnavailable(f"could not create or reach the state table: {exc}") from exc

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
        order = entities.parse_stored(order_id, rows)
        if order is not None:
            order.store_meta["rows"] = {
                str(e["RowKey"]): e for e in rows if e.get("Kind") in _RECORD_KINDS
            }
        return order

    def recent(self, order_id: str) -> Order | None:
        """The order as this process last wrote it, if it still has it: no request. A hint
        that may be stale (another instance may have changed it since): saving it is
        conditional on its ETags like any save, and refused if so (``stores/recent.py``)."""
        rows = self._recent.rows(order_id)
        if rows is None:
            return None
        try:
            order = entities.parse_stored(order_id, list(rows.values()))
        except CorruptOrder:  # pragma: no cover - rows this process wrote itself
            self._recent.forget(order_id)
            return None
        if order is not None:
            order.store_meta["rows"] = rows
        return order

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

    def list_by_status(
        self, where: ListFilter | OrderStatus, page_size: int, token: str | None
    ) -> tuple[list[str], str | None]:
        """Order ids by status (and filter), newest first, a page at a time
        (``stores.listing``; a bad token is ``InvalidContinuationToken``)."""
        if isinstance(where, OrderStatus):
            where = ListFilter(where)
        return listing.list_page(listing.table_rows(self._table), where, page_size, token)

    def count_by_status(self, where: ListFilter, cap: int = listing.COUNT_CAP) -> int:
        """How many orders match, to ``cap`` at most."""
        return listing.count(listing.table_rows(self._table), where, cap)

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
        write_id = uuid.uuid4().hex
        order.version += 1
        try:
            commit = writes.plan_commit(order, write_id, creating=creating)
        except BaseException:
            order.version -= 1
            raise
        ops = commit.ops
        partition = commit.partition
        outbox = list(commit.outbox)
        try:
            results = self._submit(order.order_id, ops)
        except AzureError as exc:
            order.version -= 1
            self._recent.forget(order.order_id)
            refused = isinstance(exc, TableTransactionError) and exc.status_code in (409, 412, 404)
            # Refused: maybe our own first try, applied, then retried by the SDK (it
            # retries a POST answered 500, 503 or 504: a create then meets 409, an update
            # 412). Unanswered (the SDK does not retry a POST whose response was lost):
            # maybe applied. Either way the WriteId on the order record tells whose write
            # stands (docs/contracts.md#fact-post-not-retried).
            mine = self._wrote(order.order_id, write_id)
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
        except BaseException:  # not the store's answer (a transport bug): nothing to adopt
            order.version -= 1
            self._recent.forget(order.order_id)
            raise
        etags = {op.row: r["etag"] for op, r in zip(ops, results, strict=True) if r.get("etag")}
        saved = writes.adopt(order, commit, etags)
        self._remember(order, ops, etags, creating=creating)
        return saved

    def _remember(
        self, order: Order, ops: list[writes.Op], etags: dict[str, str], *, creating: bool
    ) -> None:
        """Keep the order's records as a read would now return them (``stores/recent.py``):
        those read before (``load``), with the ones this transaction wrote in their place."""
        rows: dict[str, Any] = {} if creating else dict(order.store_meta.get("rows") or {})
        for op in ops:
            entity = op.entity
            if op.kind in ("create", "update") and entity and entity.get("Kind") in _RECORD_KINDS:
                rows[op.row] = _as_read(entity, etags[op.row])
        order.store_meta["rows"] = rows
        record = rows.get(layout.order_row(order.order_id))
        if record is None or _body_chars(record) > MAX_BODY_CHARS:
            self._recent.forget(order.order_id)
        else:
            self._recent.remember(order.order_id, rows)

    def _submit(self, order_id: str, ops: list[writes.Op]) -> list[Any]:
        """``submit_transaction``, tolerating index rows that are already gone (a missing
        one is dropped from ``ops``, in place)."""
        while True:
            try:
                return list(self._table.submit_transaction([_sdk(op) for op in ops]))
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
                    ops[missing].row,
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

    def _control_commit(self, ops: list[writes.Op], row: str, write_id: str) -> str:
        """An agent's control row and its audit row, in one transaction
        (``stores.control_rows``); an outcome in doubt is settled by the row's ``WriteId``."""
        try:
            results = self._table.submit_transaction([_sdk(op) for op in ops])
        except AzureError as exc:
            try:
                stored = self._table.get_entity(control_rows.PARTITION, row, select=["WriteId"])
            except ResourceNotFoundError:
                stored = None
            except AzureError:
                raise StorageUnavailable(
                    f"the outcome of the change to {row} is unknown: the store did not confirm "
                    "it and could not be asked afterwards; read the agents again, and retry "
                    "if it did not change"
                ) from exc
            if stored is not None and stored.get("WriteId") == write_id:
                return str(stored.metadata["etag"])  # ours applied; its answer was lost
            if isinstance(exc, TableTransactionError) and exc.status_code in (404, 409, 412):
                raise ConcurrencyConflict(f"{row} changed while it was being updated") from exc
            raise StorageUnavailable(f"the change to {row} failed: {exc}") from exc
        return str(results[0]["etag"])

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
                        select=writes.INDEX_FIELDS,
                    )
                }
            except AzureError as exc:
                raise StorageUnavailable(
                    f"could not read order {order_id}'s index rows: {exc}", order_id=order_id
                ) from exc
            report, changes = writes.plan_repair(order, found)
            if not report["repaired"]:
                return report
            try:
                etag = order.etag
                for start in range(0, len(changes), 99):  # 100 operations per transaction
                    guard = writes.repair_guard(order_id, etag, uuid.uuid4().hex)
                    batch = [guard, *changes[start : start + 99]]
                    results = self._table.submit_transaction([_sdk(op) for op in batch])
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
                report["removed"],
                report["added"],
                report["rewritten"],
            )
            return report
        raise ConcurrencyConflict(
            f"order {order_id} kept changing during the index repair; run it again",
            order_id=order_id,
        )

    # --- the dashboard's rows (stores/dashboard_rows.py) -----------------------------------------

    def _transact(self, partition: str, ops: list[writes.Op]) -> dict[str, str]:
        if len(ops) == 1 and ops[0].kind != "delete":
            return self._one(partition, ops[0])
        try:
            results = self._table.submit_transaction([_sdk(op) for op in ops])
        except AzureError as exc:
            raise _refused(partition, "transaction", exc, TableTransactionError) from exc
        return {op.row: r["etag"] for op, r in zip(ops, results, strict=True) if r.get("etag")}

    def _one(self, partition: str, op: writes.Op) -> dict[str, str]:
        """A transaction of one operation, sent as that operation alone: the same request
        (one billed transaction, all or nothing) without the batch's multipart body, whose
        building and parsing cost the SDK several times the CPU of the operation itself
        (a thread pool per batch, the response parsed by ``email``: bench/turns.py's
        acceptance burst, profiled). Its answers mean what the batch's do. (Not a delete:
        ``delete_entity`` takes a missing row for done, where a batch refuses it.)"""
        kind, entity, options = (*_sdk(op), {})[:3]
        try:
            if kind == "create":
                result = self._table.create_entity(entity)
            elif kind == "upsert":
                result = self._table.upsert_entity(entity, **options)
            else:
                result = self._table.update_entity(entity, **options)
        except AzureError as exc:
            raise _refused(partition, "write", exc) from exc
        etag = result.get("etag") if isinstance(result, dict) else None
        return {op.row: etag} if etag else {}

    def _delete_rows(self, partition: str, rows: list[str]) -> None:
        for start in range(0, len(rows), 100):
            chunk = rows[start : start + 100]
            try:
                self._table.submit_transaction(
                    [("delete", {"PartitionKey": partition, "RowKey": r}) for r in chunk]
                )
            except TableTransactionError as exc:
                if exc.status_code != 404:
                    raise
                for row in chunk:  # one was already gone: the others one by one
                    with contextlib.suppress(ResourceNotFoundError):
                        self._table.delete_entity(partition, row)

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


#: The rows ``entities.parse_order`` reads: what ``RecentWrites`` keeps of an order.
_RECORD_KINDS = frozenset({"order", "step"})


def _as_read(entity: dict[str, Any], etag: str) -> TableEntity:
    """A written entity as a query returns it (None not stored, types as the service gives
    them back: ``stores/codec.py``), with the ETag its transaction answered."""
    return codec.stored(entity, etag)


def _body_chars(record: dict[str, Any]) -> int:
    return sum(len(v) for k, v in record.items() if k.startswith("Body") and isinstance(v, str))


def _refused(
    partition: str,
    what: str,
    exc: AzureError,
    answers: type[HttpResponseError] = HttpResponseError,
) -> OrderError:
    """A write of ``partition``'s rows that failed: the service's answer (``answers``: a
    batch's is a ``TableTransactionError``) that a row changed, was there already or was
    gone (404, 409, 412: ``ConcurrencyConflict``, decide again), or anything else
    (``StorageUnavailable``). A batch and a write of one row answer alike."""
    status = exc.status_code if isinstance(exc, answers) else None
    if status in (404, 409, 412):
        return ConcurrencyConflict(f"rows of {partition} changed meanwhile ({status})")
    return StorageUnavailable(f"{what} in {partition} failed: {exc}")


def _missing_index_row(exc: AzureError, ops: list[writes.Op]) -> int | None:
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
    if op.kind != "delete" or not layout.is_index_row(op.row):
        return None
    return index


def _sdk(op: writes.Op) -> tuple[Any, ...]:
    """An operation as ``TableClient.submit_transaction`` takes it."""
    if op.kind == "delete" and op.etag is not None:
        return (
            "delete",
            op.entity,
            {"etag": op.etag, "match_condition": MatchConditions.IfNotModified},
        )
    if op.kind == "delete":
        return ("delete", op.entity)
    if op.kind == "create":
        return ("create", op.entity)
    if op.kind == "upsert":
        return ("upsert", op.entity, {"mode": UpdateMode.REPLACE})
    mode = UpdateMode.REPLACE if op.kind == "update" else UpdateMode.MERGE
    return (
        "update",
        op.entity,
        {"mode": mode, "etag": op.etag, "match_condition": MatchConditions.IfNotModified},
    )
