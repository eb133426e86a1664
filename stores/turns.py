"""The slots of per-key concurrency in the state table (``core.turns.TurnStore``; what they
mean: ``core.turns``).

One partition per workflow and key, so no row is hot for the whole app and no key's
line delays another's (no new table to deploy; sweeps and listings never read these
partitions):

    turn|<workflow>|<digest>   slot         the holders (JSON: orderId, since), the key
                               q|<orderId>  an order in line, with the time it came

and one row per key with a slot in the partition ``turns``, which the supervisor's
sweep reads (``turn_keys``):

    turns                      <workflow>|<digest>   the workflow and the key

Every change of a slot is one entity group transaction: the slot row If-Match its ETag
(or a create), with the deletes of the waiting rows it promotes or drops; of two
writers the second gets ``ConcurrencyConflict`` and decides again on what the first
wrote. A waiting row is written alone (a create: an order already in line keeps its
place). The keys' list is written after the slot row is created and removed after an
empty slot is, then the slot read again (``forget_slot``), so a slot with rows is
always listed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

from azure.core.exceptions import AzureError

from core.errors import ConcurrencyConflict, StorageUnavailable
from core.timefmt import ensure_utc, iso_exact, parse_iso
from core.turns import Holder, Settled, Slot, Waiter, key_digest
from stores.rows import RowReads
from stores.writes import Op

#: The partition that lists the keys with a slot.
KEYS_PARTITION: Final = "turns"
SLOT_ROW: Final = "slot"
WAITER_PREFIX: Final = "q|"
_HIGH: Final = "~"


def partition_of(workflow: str, key: str) -> str:
    return f"turn|{workflow}|{key_digest(key)}"


def _key_row(workflow: str, key: str) -> str:
    return f"{workflow}|{key_digest(key)}"


def slot_entity(slot: Slot, holders: Iterable[Holder], limit: int) -> dict[str, Any]:
    return {
        "PartitionKey": partition_of(slot.workflow, slot.key),
        "RowKey": SLOT_ROW,
        "Workflow": slot.workflow,
        "Key": slot.key,
        "Limit": limit,
        "Holders": json.dumps(
            [{"orderId": h.order_id, "since": iso_exact(h.since)} for h in holders],
            separators=(",", ":"),
        ),
    }


def parse_slot(workflow: str, key: str, rows: Iterable[Any]) -> Slot:
    holders: tuple[Holder, ...] = ()
    waiting: list[Waiter] = []
    etag: str | None = None
    limit = 0
    for row in rows:
        name = str(row["RowKey"])
        if name == SLOT_ROW:
            etag = row.metadata["etag"]
            limit = int(row.get("Limit") or 0)
            holders = tuple(
                Holder(str(h["orderId"]), parse_iso(str(h["since"])))
                for h in json.loads(str(row.get("Holders") or "[]"))
            )
        elif name.startswith(WAITER_PREFIX):
            at = row.get("At")
            when = ensure_utc(at) if isinstance(at, datetime) else datetime.min.replace(tzinfo=UTC)
            waiting.append(Waiter(str(row.get("OrderRef") or name[len(WAITER_PREFIX) :]), when))
    return Slot(workflow, key, holders, tuple(waiting), etag, limit)


class TurnRows(RowReads):
    """``TurnStore`` over a store's rows (``TableStateStore``, ``InMemoryStateStore``): it
    uses their ``_range`` and ``_transact`` (``stores.dashboard_rows`` says what they do)."""

    def _transact(self, partition: str, ops: list[Op]) -> dict[str, str]:
        raise NotImplementedError

    def _turn_rows(self, partition: str, low: str, high: str) -> list[Any]:
        try:
            return list(self._range(partition, low, high))
        except AzureError as exc:
            raise StorageUnavailable(f"could not read the slot {partition}: {exc}") from exc

    def read_slot(self, workflow: str, key: str) -> Slot:
        self._before_read("read_slot")
        rows = self._turn_rows(partition_of(workflow, key), "", _HIGH)
        return parse_slot(workflow, key, rows)

    def add_waiter(self, workflow: str, key: str, order_id: str, at: datetime) -> None:
        partition = partition_of(workflow, key)
        row = WAITER_PREFIX + order_id
        entity = {"PartitionKey": partition, "RowKey": row, "OrderRef": order_id, "At": at}
        with contextlib.suppress(ConcurrencyConflict):  # in line already: it keeps its place
            self._transact(partition, [Op("create", row, entity)])

    def write_slot(self, slot: Slot, settled: Settled) -> None:
        partition = partition_of(slot.workflow, slot.key)
        entity = slot_entity(slot, settled.holders, settled.limit)
        first = (
            Op("create", SLOT_ROW, entity)
            if slot.etag is None
            else Op("update", SLOT_ROW, entity, slot.etag)
        )
        drops = [
            Op("delete", WAITER_PREFIX + order_id, _keys(partition, WAITER_PREFIX + order_id))
            for order_id in settled.drop
        ]
        self._transact(partition, [first, *drops])
        if slot.etag is None:
            self._list_key(slot.workflow, slot.key)

    def _list_key(self, workflow: str, key: str) -> None:
        row = _key_row(workflow, key)
        entity = {"PartitionKey": KEYS_PARTITION, "RowKey": row, "Workflow": workflow, "Key": key}
        self._transact(KEYS_PARTITION, [Op("upsert", row, entity)])

    def turn_keys(self, limit: int, after: str = "") -> list[tuple[str, str]]:
        self._before_read("turn_keys")
        fields = ["RowKey", "Workflow", "Key"]
        try:
            rows = list(self._range(KEYS_PARTITION, after, _HIGH, fields, limit + 1))
        except AzureError as exc:
            raise StorageUnavailable(f"could not read the keys with a slot: {exc}") from exc
        found = [(str(r["Workflow"]), str(r["Key"])) for r in rows if r["RowKey"] != after]
        return found[:limit]

    def forget_slot(self, slot: Slot) -> bool:
        if slot.etag is None or not slot.empty:
            return False
        partition = partition_of(slot.workflow, slot.key)
        try:
            self._transact(
                partition, [Op("delete", SLOT_ROW, _keys(partition, SLOT_ROW), slot.etag)]
            )
        except ConcurrencyConflict:
            return False
        row = _key_row(slot.workflow, slot.key)
        with contextlib.suppress(ConcurrencyConflict):  # gone already
            self._transact(KEYS_PARTITION, [Op("delete", row, _keys(KEYS_PARTITION, row))])
        if self._turn_rows(partition, "", _HIGH):  # someone came meanwhile: listed again
            self._list_key(slot.workflow, slot.key)
            return False
        return True


def _keys(partition: str, row: str) -> dict[str, str]:
    return {"PartitionKey": partition, "RowKey": row}
