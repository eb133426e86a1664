"""What a write to the state table consists of, decided without touching the table.

``plan_commit`` turns an order's changes into one entity group transaction: its order
record (If-Match on its ETag, or create), every changed step record (If-Match, or
create), the index rows its state implies (upserts and deletes against what was read)
and the notices it committed (outbox rows). ``adopt`` leaves the Order as a store
leaves it after the transaction applied. ``plan_repair`` compares an order's index rows
with what its state implies. ``stores.tables`` submits these to Azure; ``stores.memory``
applies them to its dictionaries: both stores write the same rows by the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.model import Order, StepRecord
from core.ports import OutboxEntry, SavedNotices
from stores import activity, entities, layout


@dataclass(frozen=True)
class Op:
    """One operation of a transaction: ``create`` (must not exist), ``update`` (replace,
    If-Match ``etag``), ``merge`` (If-Match ``etag``), ``upsert`` (replace), ``delete``."""

    kind: str
    row: str
    entity: dict[str, Any] | None = None
    etag: str | None = None


@dataclass
class Commit:
    partition: str
    write_id: str
    ops: list[Op]
    changed: list[StepRecord]
    index: dict[str, dict[str, str]]
    outbox: tuple[OutboxEntry, ...] = field(default_factory=tuple)


def _delete(partition: str, row: str) -> Op:
    return Op("delete", row, {"PartitionKey": partition, "RowKey": row})


def write_op(entity: dict[str, Any], etag: str | None) -> Op:
    row = str(entity["RowKey"])
    return Op("create", row, entity) if etag is None else Op("update", row, entity, etag)


def plan_commit(order: Order, write_id: str, *, creating: bool) -> Commit:
    """The transaction that stores ``order``'s changes (``order.version`` is already the
    new one). A created order has no ETags: every record is a create."""
    if creating and order.etag is not None:  # pragma: no cover - a programming error
        raise AssertionError("creating an order that was loaded")
    partition = layout.shard_of(order.order_id)
    ops = [write_op(entities.order_entity(order, write_id), order.etag)]
    changed = [s for s in order.steps if s.changed or s.etag is None]
    ops += [write_op(entities.step_entity(s), s.etag) for s in changed]
    before: dict[str, dict[str, str]] = order.store_meta.get("index", {})
    after = layout.index_rows(order)
    ops += [_delete(partition, row) for row in sorted(before.keys() - after.keys())]
    ops += [
        Op("upsert", row, {"PartitionKey": partition, "RowKey": row, **after[row]})
        for row in sorted(after.keys() - before.keys())
    ]
    outbox = tuple(
        OutboxEntry(
            partition,
            layout.outbox_row(order.updated_at, order.order_id, f"{order.version}-{n}"),
            notice.kind,
            notice.queue,
            notice.body,
            order.order_id,
        )
        for n, notice in enumerate(order.outbox)
    )
    # What the order did in this save, time-ordered, for the dashboard (stores/activity.py).
    before_events = order.store_meta.get("activity")
    if before_events is None:
        before_events = set() if creating else activity.tags(order)
    ops += [
        Op("create", key, activity.entity(partition, key, event))
        for key, event in activity.activities(order, before_events)
    ]
    ops += [
        Op(
            "create",
            entry.row,
            {
                "PartitionKey": partition,
                "RowKey": entry.row,
                "OrderRef": order.order_id,
                "NoticeKind": entry.kind,
                "Queue": entry.queue or "",
                "Body": entry.body,
            },
        )
        for entry in outbox
    ]
    return Commit(partition, write_id, ops, changed, after, outbox)


def adopt(order: Order, commit: Commit, etags: Mapping[str, str]) -> SavedNotices:
    """The transaction applied; ``etags`` maps each written row to its new ETag."""
    order.etag = etags[layout.order_row(order.order_id)]
    for step in commit.changed:
        step.etag = etags[layout.step_row(step.order_id, step.seq, step.step)]
        step.changed = False
    order.store_meta["index"] = commit.index
    order.store_meta["write_id"] = commit.write_id
    order.store_meta["activity"] = activity.tags(order)
    order.outbox = []
    return SavedNotices(commit.partition, commit.outbox)


#: What a repair reads of each index row.
INDEX_FIELDS = [
    "RowKey",
    "OrderRef",
    "StepName",
    "Workflow",
    "PausedFor",
    "Agent",
    "Since",
    "Waits",
    "Field",
    "Value",
]


def plan_repair(
    order: Order, existing: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, Any], list[Op]]:
    """Compare the index rows found (``existing``: RowKey -> properties, the order's rows
    only) with those its state implies; the report and the operations that fix them."""
    found = {k: v for k, v in existing.items() if layout.is_index_row(k)}
    wanted = layout.index_rows(order)
    stray = sorted(found.keys() - wanted.keys())
    missing = sorted(wanted.keys() - found.keys())
    wrong = sorted(
        k
        for k in wanted.keys() & found.keys()
        if any(found[k].get(name) != value for name, value in wanted[k].items())
    )
    report: dict[str, Any] = {
        "orderId": order.order_id,
        "status": str(order.status),
        "removed": stray,
        "added": missing,
        "rewritten": wrong,
        "kept": sorted((wanted.keys() & found.keys()) - set(wrong)),
        "repaired": bool(stray or missing or wrong),
    }
    partition = layout.shard_of(order.order_id)
    ops = [_delete(partition, k) for k in stray]
    ops += [
        Op("upsert", k, {"PartitionKey": partition, "RowKey": k, **wanted[k]})
        for k in missing + wrong
    ]
    return report, ops


def repair_guard(order_id: str, etag: str | None, write_id: str) -> Op:
    """The first operation of each repair transaction: a new ``WriteId`` on the order
    record, If-Match on what the repair read, so a save in between makes it look again."""
    row = layout.order_row(order_id)
    entity = {"PartitionKey": layout.shard_of(order_id), "RowKey": row, "WriteId": write_id}
    return Op("merge", row, entity, etag)
