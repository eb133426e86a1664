"""The dashboard's rows, the same on every store (``dashboard.ports.DashboardStore``).

Activity rows live in the orders' shard partitions (``stores/activity.py``); the
figures in a partition of their own, ``dashboard``, which no sweep reads:

    cursor|<shard>          per shard: the activity rows the last run counted and may not
                            have deleted yet (``Counted``), and the newest time counted
    min|<yyyy-mm-ddTHH:MM>  what happened in that minute (``Figures``, JSON)
    hour|<yyyy-mm-ddTHH>    the same for the hour: the sum of its minutes

A store provides ``_range(partition, low, high, select, limit)``, ``_transact(partition,
ops)`` (one entity group transaction: the new ETags, ``ConcurrencyConflict`` when refused
with 404/409/412) and ``_delete_rows(partition, rows)`` (each row, one already gone is
no error).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Final

from azure.core.exceptions import AzureError

from core.errors import StorageUnavailable
from core.timefmt import parse_sortable, sortable
from dashboard.figures import Activity, InFlight
from dashboard.ports import RowWrite, StoredRow
from stores import activity, layout
from stores.rows import RowReads
from stores.writes import Op

log = logging.getLogger(__name__)

PARTITION: Final = "dashboard"


class DashboardRows(RowReads):
    def _transact(self, partition: str, ops: list[Op]) -> dict[str, str]:
        raise NotImplementedError

    def _delete_rows(self, partition: str, rows: list[str]) -> None:
        raise NotImplementedError

    def activity(
        self, shard: str, before: datetime, limit: int
    ) -> list[tuple[str, Activity | None]]:
        high = activity.PREFIX + sortable(before)
        try:
            rows = list(self._range(shard, activity.PREFIX, high, activity.FIELDS, limit))
        except AzureError as exc:
            raise StorageUnavailable(f"could not read {shard}'s activity rows: {exc}") from exc
        out: list[tuple[str, Activity | None]] = []
        for row in rows:
            parsed = activity.parse(dict(row))
            if parsed is None:
                log.error("malformed activity row %s/%s: skipped", shard, row.get("RowKey"))
            out.append((str(row["RowKey"]), parsed))
        return out

    def delete_activity(self, shard: str, rows: list[str]) -> None:
        try:
            self._delete_rows(shard, rows)
        except AzureError as exc:
            raise StorageUnavailable(f"could not delete {shard}'s activity rows: {exc}") from exc

    def add_activity(self, event: Activity) -> None:
        partition, key = activity.poison_row(event.at)
        self._transact(partition, [Op("create", key, activity.entity(partition, key, event))])

    def dashboard_rows(self, low: str, high: str, limit: int = 1000) -> list[StoredRow]:
        try:
            rows = list(self._range(PARTITION, low, high, None, limit))
        except AzureError as exc:
            raise StorageUnavailable(f"could not read the dashboard: {exc}") from exc
        return [
            StoredRow(
                str(r["RowKey"]),
                {k: v for k, v in r.items() if k not in ("PartitionKey", "RowKey")},
                str(getattr(r, "metadata", {}).get("etag", "")),
            )
            for r in rows
        ]

    def write_dashboard(self, writes: list[RowWrite]) -> dict[str, str]:
        ops = []
        for w in writes:
            if w.value is None:
                ops.append(
                    Op("delete", w.row, {"PartitionKey": PARTITION, "RowKey": w.row}, w.etag)
                )
                continue
            entity = {**w.value, "PartitionKey": PARTITION, "RowKey": w.row}
            ops.append(
                Op("create", w.row, entity)
                if w.etag is None
                else Op("update", w.row, entity, w.etag)
            )
        return self._transact(PARTITION, ops)

    def in_flight(self, limit_per_shard: int = 1000) -> list[InFlight]:
        """Every active step: the whole ``pending|`` and ``processing|`` ranges of each
        shard (work in flight, never history), but for the steps that wait for an event or a
        delay (``Waits``): they sit there on purpose, and their own deadline ends them."""
        out: list[InFlight] = []
        select = ["RowKey", "OrderRef", "StepName", "Agent", "Since", "PausedFor", "Waits"]
        for shard in layout.all_shards():
            for prefix, state in (("pending|", "Pending"), ("processing|", "Processing")):
                try:
                    rows = list(
                        self._range(shard, prefix, prefix + layout.HIGH, select, limit_per_shard)
                    )
                except AzureError as exc:
                    raise StorageUnavailable(f"could not read the {prefix} index: {exc}") from exc
                for row in rows:
                    if row.get("Waits"):
                        continue
                    entry = _in_flight(dict(row), state)
                    if entry is not None:
                        out.append(entry)
        return out


def _in_flight(row: dict[str, Any], state: str) -> InFlight | None:
    """An index row as an active step; None if malformed. A Pending step counts from its
    due time (the key); a Processing one from its claim (``Since``; a row written before
    it existed counts from its deadline, the key)."""
    parts = str(row.get("RowKey", "")).split("|")
    try:
        since_text = row.get("Since") if state == "Processing" else None
        since = parse_sortable(str(since_text or parts[1]))
        return InFlight(
            str(row.get("OrderRef") or parts[2]),
            str(row.get("StepName") or parts[3]),
            str(row.get("Agent") or ""),
            state,
            since,
            str(row.get("PausedFor") or ""),
        )
    except (IndexError, ValueError):
        log.error("malformed index row %s: skipped by the stuck check", row.get("RowKey"))
        return None
