"""The two hooks every store gives the readers it mixes in (``SweepReads``,
``ControlRows``, ``DashboardRows``): its rows in a key range, and a call before each
read."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class RowReads:
    def _range(
        self,
        shard: str,
        low: str,
        high: str,
        select: list[str] | None = None,
        limit: int | None = None,
    ) -> Iterable[dict[str, Any]]:
        """The rows of partition ``shard`` with RowKey in ``[low, high)``, in key order."""
        raise NotImplementedError

    def _before_read(self, method: str) -> None:
        """Called before each read (the in-memory store injects faults here)."""
