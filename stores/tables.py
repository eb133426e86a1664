"""The order state store on Azure Table Storage.

Every write is one entity group transaction in the order's partition, with
If-Match on the ETag of every record it changes (never an upsert, which skips
the check). The domain sees ``ConcurrencyConflict`` / ``OrderAlreadyExists``,
never an SDK exception.

Ambiguous writes: the SDK retries a request that timed out, and the first try
may have applied. A conditional retry of an applied write fails with 412, so
it can never apply twice; to tell "someone else won" from "my own first try
won", each save stamps the order record with a fresh ``WriteId`` and, on a
conflict, re-reads it (``resolve_conflict``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from core.errors import ConcurrencyConflict, OrderAlreadyExists, StorageUnavailable
from core.model import Notice, Order
from core.states import OrderStatus
from core.timefmt import sortable
from stores import entities, layout, sdk_patches

log = logging.getLogger(__name__)


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
        return entities.parse_order(rows)

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
                for e in self._range(
                    shard, prefix + "|", high, ["RowKey", "OrderRef", "StepName"], limit
                ):
                    _, when, _, _ = e["RowKey"].split("|", 3)
                    yield IndexEntry(e["OrderRef"], e["StepName"], _parse_sortable(when))
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
                for e in self._range(shard, "outbox|", high, limit=limit_per_shard):
                    yield _outbox_entry(e)
            except AzureError as exc:
                raise StorageUnavailable(f"could not read the outbox: {exc}") from exc

    def list_by_status(
        self, status: OrderStatus, page_size: int, token: str | None
    ) -> tuple[list[str], str | None]:
        """Order ids with a status, a page at a time across shards.

        The token is ``<shard number>:<the table's own continuation token or ->``.
        """
        shard_index, table_token = 0, None
        if token:
            head, _, rest = token.partition(":")
            shard_index = int(head)
            table_token = json.loads(rest) if rest and rest != "-" else None
        shards = layout.all_shards()
        ids: list[str] = []
        low = f"status|{status}|"
        while shard_index < len(shards) and len(ids) < page_size:
            pager: Any = self._table.query_entities(
                "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                parameters={"pk": shards[shard_index], "lo": low, "hi": low + layout.HIGH},
                select=["OrderRef"],
                results_per_page=page_size - len(ids),
            ).by_page(continuation_token=table_token)
            page = next(pager, None)
            ids.extend(e["OrderRef"] for e in (page or []))
            table_token = pager.continuation_token if page is not None else None
            if table_token is None:
                shard_index += 1
        if shard_index >= len(shards):
            return ids, None
        return ids, f"{shard_index}:{json.dumps(table_token) if table_token else '-'}"

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
            results = self._table.submit_transaction(ops)
        except AzureError as exc:
            order.version -= 1
            refused = isinstance(exc, TableTransactionError) and exc.status_code in (409, 412, 404)
            # Refused: maybe our own first try, applied, then retried by the SDK (412).
            # Unanswered (the SDK does not retry a POST whose response was lost): maybe
            # applied. Either way the WriteId on the order record tells whose write stands.
            # A refused create is never ours: nothing retries it.
            if not (creating and refused) and self._wrote(order.order_id, write_id):
                log.warning(
                    "order %s: a write whose answer was lost or refused had applied (write %s)",
                    order.order_id,
                    write_id,
                )
                return self._reload_after(order, write_id, outbox, partition)
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

    def _wrote(self, order_id: str, write_id: str) -> bool:
        """After an ambiguous or refused write: did our own write apply after all?"""
        try:
            record = self._table.get_entity(
                layout.shard_of(order_id), layout.order_row(order_id), select=["WriteId"]
            )
        except (ResourceNotFoundError, AzureError):
            return False
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

    def delete_outbox(self, saved: SavedNotices | list[OutboxEntry]) -> None:
        entries = saved.entries if isinstance(saved, SavedNotices) else tuple(saved)
        for entry in entries:
            try:
                self._table.delete_entity(entry.partition, entry.row)
            except ResourceNotFoundError:
                pass  # someone else (the sweep, or our own retried call) delivered it
            except HttpResponseError as exc:
                log.warning("could not delete outbox row %s: %s", entry.row, exc)


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


__all__ = ["IndexEntry", "Notice", "OutboxEntry", "SavedNotices", "TableStateStore"]
