"""The table side of retention (docs/contracts.md §3.12): find finished orders, read their
rows exactly, delete them once archived, put them back on restore.

Candidates come from the status index (``status|<status>|<newest-first created>|<id>``):
orders created before a time are one range per shard, its end, so a run reads only
orders old enough to be due (an order finishes after it is created, so every order
that finished before the cutoff was created before it).

An archived order leaves one small row behind, in the same transaction that deletes its
rows: ``archived|<orderId>`` in its partition, naming the blob that holds it. The API
answers an archived order's id with where it went, and ``restore`` finds it by id. Its
twin ``archived-at|<when>|<orderId>`` orders them by time, so that ``expire`` removes
both once the archive's lifecycle rule has deleted the blob (``ARCHIVE_DAYS``): the
table keeps nothing of an order for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableClient, TableTransactionError

from core.errors import StorageUnavailable
from core.states import OrderStatus
from core.timefmt import sortable
from stores import entities, layout

log = logging.getLogger(__name__)

IF_UNCHANGED: Final = MatchConditions.IfNotModified
#: Operations in one entity group transaction.
MAX_TRANSACTION: Final = 100


def tombstone_row(order_id: str) -> str:
    return f"archived|{order_id}"


def expiry_row(archived_at: datetime, order_id: str) -> str:
    """The tombstone's twin, in time order: what ``expire`` reads (``archived-at|`` does
    not share the ``archived|`` prefix)."""
    return f"archived-at|{sortable(archived_at)}|{order_id}"


@dataclass(frozen=True)
class Candidate:
    order_id: str
    workflow: str
    status: OrderStatus
    created_at: datetime


@dataclass
class StoredOrder:
    """An order's rows as stored (ETags in each row's metadata), what its state says."""

    order_id: str
    rows: list[Any]  # TableEntity: the properties, and the ETag in .metadata
    status: OrderStatus
    workflow: str
    created_at: datetime
    finished_at: datetime
    #: notices committed and not yet sent (outbox rows): the order waits for them
    unsent_notices: int


@dataclass(frozen=True)
class Tombstone:
    order_id: str
    blob: str
    archived_at: datetime
    workflow: str
    status: str
    etag: str
    expiry_row: str


class TableRetention:
    def __init__(self, table: TableClient):
        self._table = table

    def candidates(self, status: OrderStatus, created_before: datetime) -> Iterator[Candidate]:
        """Orders with ``status`` created before ``created_before``, shard by shard, each
        shard's oldest last (lazily: stop reading when you have enough)."""
        low = layout.status_prefix(str(status)) + layout.newest_first(created_before)
        high = layout.status_prefix(str(status)) + layout.HIGH
        for shard in layout.all_shards():
            try:
                rows = self._table.query_entities(
                    "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                    parameters={"pk": shard, "lo": low, "hi": high},
                    select=["RowKey", "OrderRef", "Workflow"],
                    results_per_page=200,
                )
                for row in rows:
                    order_id, workflow = row.get("OrderRef"), row.get("Workflow")
                    created = layout.created_of_status_row(str(row.get("RowKey", "")))
                    if (
                        isinstance(order_id, str)
                        and order_id
                        and isinstance(workflow, str)
                        and created
                    ):
                        yield Candidate(order_id, workflow, status, created)
                    else:
                        log.error("malformed status index row %s/%s skipped", shard, row)
            except AzureError as exc:
                raise StorageUnavailable(f"could not read the status index: {exc}") from exc

    def read(self, order_id: str) -> StoredOrder | None:
        """The order's rows (records, their index rows, unsent notices); None: gone."""
        partition = layout.shard_of(order_id)
        prefix = layout.order_prefix(order_id)
        try:
            records = list(self._range(partition, prefix, prefix + layout.HIGH))
            if not records:
                return None
            order = entities.parse_stored(order_id, records)
            assert order is not None
            wanted = layout.index_rows(order)
            index = self._points(partition, sorted(wanted))
            unsent = self._table.query_entities(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi and OrderRef eq @id",
                parameters={
                    "pk": partition,
                    "lo": "outbox|",
                    "hi": "outbox|" + layout.HIGH,
                    "id": order_id,
                },
                select=["RowKey"],
            )
            outbox = list(unsent)
        except AzureError as exc:
            raise StorageUnavailable(
                f"could not read order {order_id}: {exc}", order_id=order_id
            ) from exc
        head = next(r for r in records if r["RowKey"] == layout.order_row(order_id))
        restored = head.get("RestoredAt")
        finished = order.updated_at
        if isinstance(restored, datetime) and restored > finished:
            finished = restored
        return StoredOrder(
            order_id,
            records + index,
            order.status,
            order.workflow,
            order.created_at,
            finished,
            len(outbox),
        )

    def remove(self, stored: StoredOrder, blob: str, archived_at: datetime) -> bool:
        """Delete the order's rows, each only if unchanged since read, and leave its
        tombstone, in one transaction. False: something changed (kept; look again)."""
        partition = layout.shard_of(stored.order_id)
        if len(stored.rows) + 1 > MAX_TRANSACTION:
            raise StorageUnavailable(
                f"order {stored.order_id} has {len(stored.rows)} rows: more than one "
                "transaction deletes; archive it by hand",
                order_id=stored.order_id,
            )
        ops: list[tuple[Any, ...]] = [
            (
                "delete",
                {"PartitionKey": partition, "RowKey": row["RowKey"]},
                {"etag": row.metadata["etag"], "match_condition": MatchConditions.IfNotModified},
            )
            for row in stored.rows
        ]
        twin = expiry_row(archived_at, stored.order_id)
        ops.append(
            (
                "create",
                {
                    "PartitionKey": partition,
                    "RowKey": tombstone_row(stored.order_id),
                    "OrderRef": stored.order_id,
                    "Blob": blob,
                    "ArchivedAt": archived_at,
                    "Workflow": stored.workflow,
                    "Status": str(stored.status),
                    "ExpiryRow": twin,
                },
            )
        )
        ops.append(("create", {"PartitionKey": partition, "RowKey": twin, "Ref": stored.order_id}))
        try:
            self._table.submit_transaction(ops)
        except TableTransactionError as exc:
            if exc.status_code in (404, 409, 412):
                return False
            raise StorageUnavailable(
                f"could not delete archived order {stored.order_id}: {exc}",
                order_id=stored.order_id,
            ) from exc
        except AzureError as exc:
            raise StorageUnavailable(
                f"deleting archived order {stored.order_id} may not have completed: {exc}",
                order_id=stored.order_id,
            ) from exc
        return True

    def tombstone(self, order_id: str) -> Tombstone | None:
        try:
            row = self._table.get_entity(layout.shard_of(order_id), tombstone_row(order_id))
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise StorageUnavailable(
                f"could not read order {order_id}'s archive row: {exc}", order_id=order_id
            ) from exc
        return Tombstone(
            order_id,
            str(row["Blob"]),
            row["ArchivedAt"],
            str(row.get("Workflow", "")),
            str(row.get("Status", "")),
            str(row.metadata["etag"]),
            str(row.get("ExpiryRow") or ""),
        )

    def put_back(self, tomb: Tombstone, rows: list[dict[str, Any]], restored_at: datetime) -> None:
        """Write an archived order's rows back and remove its tombstone, in one transaction
        (conditional on the tombstone's ETag: two restores cannot both write)."""
        partition = layout.shard_of(tomb.order_id)
        head = layout.order_row(tomb.order_id)
        ops: list[tuple[Any, ...]] = [
            (
                "delete",
                {"PartitionKey": partition, "RowKey": tombstone_row(tomb.order_id)},
                {"etag": tomb.etag, "match_condition": MatchConditions.IfNotModified},
            )
        ]
        if tomb.expiry_row:
            ops.append(("delete", {"PartitionKey": partition, "RowKey": tomb.expiry_row}))
        for row in rows:
            if row.get("PartitionKey") != partition:
                raise ValueError(
                    f"row {row.get('RowKey')!r} is not in order {tomb.order_id}'s partition"
                )
            entity = {**row, "RestoredAt": restored_at} if row["RowKey"] == head else row
            ops.append(("create", entity))
        try:
            self._table.submit_transaction(ops)
        except TableTransactionError as exc:
            raise StorageUnavailable(
                f"could not restore order {tomb.order_id} ({exc.status_code}: it was restored "
                "or changed meanwhile; read it)",
                order_id=tomb.order_id,
            ) from exc
        except AzureError as exc:
            raise StorageUnavailable(
                f"restoring order {tomb.order_id} may not have completed: {exc}",
                order_id=tomb.order_id,
            ) from exc

    def expire(self, before: datetime, limit: int) -> int:
        """Remove the tombstones of orders archived before ``before`` (their blobs are gone
        by then), with their twins, up to ``limit``; how many went."""
        gone = 0
        high = f"archived-at|{sortable(before)}"
        for shard in layout.all_shards():
            try:
                for row in self._range(shard, "archived-at|", high):
                    if gone >= limit:
                        return gone
                    order_id = str(row.get("Ref", ""))
                    ops: list[tuple[Any, ...]] = [
                        ("delete", {"PartitionKey": shard, "RowKey": row["RowKey"]}),
                    ]
                    tomb = self.tombstone(order_id) if order_id else None
                    if tomb is not None and tomb.expiry_row == row["RowKey"]:
                        ops.append(
                            (
                                "delete",
                                {"PartitionKey": shard, "RowKey": tombstone_row(order_id)},
                                {
                                    "etag": tomb.etag,
                                    "match_condition": MatchConditions.IfNotModified,
                                },
                            )
                        )
                    try:
                        self._table.submit_transaction(ops)
                        gone += 1
                    except TableTransactionError as exc:
                        if exc.status_code not in (404, 409, 412):
                            raise
            except AzureError as exc:
                raise StorageUnavailable(f"could not expire archive rows: {exc}") from exc
        return gone

    # --- reads ---------------------------------------------------------------------

    def _range(self, partition: str, low: str, high: str) -> Iterator[Any]:
        return iter(
            self._table.query_entities(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                parameters={"pk": partition, "lo": low, "hi": high},
            )
        )

    def _points(self, partition: str, keys: list[str]) -> list[Any]:
        found = []
        for key in keys:
            try:
                found.append(self._table.get_entity(partition, key))
            except ResourceNotFoundError:
                continue  # an index row already gone: nothing to delete
        return found
