"""The dashboard's store port (``DashboardStore``): its activity rows and its own
partition of figures, kept by the same two stores as the orders (``stores/activity.py``,
``stores/dashboard_rows.py``) under one contract (``tests/integration/test_dashboard.py``).

It speaks the dashboard's types (``dashboard.figures``), so it lives here, beside them,
not in ``core.ports``: the domain knows nothing of the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from dashboard.figures import Activity, InFlight


@dataclass(frozen=True)
class StoredRow:
    """A row of the dashboard's own partition: its properties and ETag."""

    row: str
    value: dict[str, Any]
    etag: str


@dataclass(frozen=True)
class RowWrite:
    """One write of a dashboard transaction: ``value`` None deletes (If-Match ``etag``);
    ``etag`` None creates (the row must not exist); otherwise a replace If-Match."""

    row: str
    value: dict[str, Any] | None
    etag: str | None = None


class DashboardStore(Protocol):
    """The dashboard's reads and writes (``supervisor/aggregator.py``,
    ``console/dashboard_page.py``): activity rows per shard, and the figures' own partition,
    written all or nothing (``ConcurrencyConflict`` if a row changed since read)."""

    def activity(
        self, shard: str, before: datetime, limit: int
    ) -> list[tuple[str, Activity | None]]:
        """The shard's activity rows stamped before ``before``, oldest first, at most
        ``limit`` (None for a malformed row)."""
        ...

    def delete_activity(self, shard: str, rows: list[str]) -> None:
        """Delete these activity rows; one already gone is no error."""
        ...

    def add_activity(self, activity: Activity) -> None:
        """An activity row of its own (a poisoned message: no order transaction)."""
        ...

    def dashboard_rows(self, low: str, high: str, limit: int = 1000) -> list[StoredRow]:
        """The dashboard partition's rows with keys in ``[low, high)``, in key order."""
        ...

    def write_dashboard(self, writes: list[RowWrite]) -> dict[str, str]:
        """One transaction in the dashboard partition; the new ETag of each row written."""
        ...

    def in_flight(self, limit_per_shard: int = 1000) -> list[InFlight]:
        """Every active step, from the ``pending|`` and ``processing|`` index ranges."""
        ...
