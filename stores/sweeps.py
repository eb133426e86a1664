"""The reads the sweeps make, the same on every store: index and outbox ranges up to a
time, shard by shard, skipping (and logging) a malformed row instead of stopping.

A store provides ``_range(shard, low, high, select, limit)`` (its rows with RowKey in
``[low, high)``, in key order) and may hook ``_before_read(method)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime

from azure.core.exceptions import AzureError

from core.errors import StorageUnavailable
from core.ports import IndexEntry, OutboxEntry
from core.timefmt import sortable
from stores import entities, layout
from stores.rows import RowReads


class SweepReads(RowReads):
    def due_pending(self, now: datetime, limit_per_shard: int = 500) -> Iterator[IndexEntry]:
        """Active Pending steps that may run at ``now`` (due at or before it)."""
        self._before_read("due_pending")
        return self._index("pending", now, limit_per_shard, inclusive=True)

    def held_pending(self, agent: str, limit_per_shard: int = 1000) -> Iterator[IndexEntry]:
        """Active Pending steps that wait for ``agent``'s pause, whatever their due time:
        the whole ``pending|`` range of each shard (the work in flight, not history)."""
        self._before_read("held_pending")
        for shard in layout.all_shards():
            try:
                select = ["RowKey", "OrderRef", "StepName", "PausedFor"]
                rows = (
                    e
                    for e in self._range(shard, "pending|", "pending|" + layout.HIGH, select)
                    if e.get("PausedFor") == agent
                )
                entries = entities.well_formed(rows, entities.index_entry, f"index row in {shard}")
                yield from itertools.islice(entries, limit_per_shard)
            except AzureError as exc:
                raise StorageUnavailable(f"could not read the pending index: {exc}") from exc

    def expired_processing(
        self, before: datetime, limit_per_shard: int = 500
    ) -> Iterator[IndexEntry]:
        """Processing steps whose CompleteBy is before ``before`` (strictly)."""
        self._before_read("expired_processing")
        return self._index("processing", before, limit_per_shard, inclusive=False)

    def stale_outbox(self, before: datetime, limit_per_shard: int = 200) -> Iterator[OutboxEntry]:
        """Notices committed before ``before`` and not yet sent (and deleted)."""
        self._before_read("stale_outbox")
        high = f"outbox|{sortable(before)}"
        for shard in layout.all_shards():
            try:
                rows = iter(self._range(shard, "outbox|", high, limit=limit_per_shard))
                what = f"outbox row in {shard}"
                yield from entities.well_formed(rows, entities.outbox_entry, what)
            except AzureError as exc:
                raise StorageUnavailable(f"could not read the outbox: {exc}") from exc

    def _index(
        self, prefix: str, until: datetime, limit: int, *, inclusive: bool
    ) -> Iterator[IndexEntry]:
        high = f"{prefix}|{sortable(until)}" + ("|" + layout.HIGH if inclusive else "")
        for shard in layout.all_shards():
            try:
                select = ["RowKey", "OrderRef", "StepName"]
                rows = iter(self._range(shard, prefix + "|", high, select, limit))
                yield from entities.well_formed(
                    rows,
                    entities.index_entry,
                    f"index row in {shard} (python -m admin repair-index <orderId> rebuilds "
                    "an order's index)",
                )
            except AzureError as exc:
                raise StorageUnavailable(f"could not read the {prefix} index: {exc}") from exc
