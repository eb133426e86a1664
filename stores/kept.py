"""Messages kept for an operator: poisoned or dead-lettered messages too large to travel
inside their alert (an alert is a Storage queue message: 64 KiB).

They live in the state table under the partition ``kept`` (sweeps never read it), one
entity per message, the text split over ``Text``, ``Text1`` ... (32K UTF-16 units each;
an entity holds 1 MiB), with where it came from and why.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableClient

from core.errors import StorageUnavailable
from core.orders import utf16_units
from core.timefmt import sortable

PARTITION: Final = "kept"
PART_UNITS: Final = 30_000


@dataclass(frozen=True)
class KeptMessage:
    row: str
    queue: str
    reason: str
    text: str
    at: datetime


def _split(text: str) -> list[str]:
    """Consecutive parts of at most PART_UNITS UTF-16 units, cut between code points."""
    parts: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + PART_UNITS, len(text))
        while utf16_units(text[start:end]) > PART_UNITS:
            end -= 1
        parts.append(text[start:end])
        start = end
    return parts or [""]


def _name(n: int) -> str:
    return "Text" if n == 0 else f"Text{n}"


class KeptMessages:
    def __init__(self, table: TableClient):
        self._table = table

    def keep(self, queue: str, text: str, reason: str, at: datetime) -> str:
        """Store ``text``; returns its row key (quoted in the alert)."""
        row = f"{queue}|{sortable(at)}|{uuid.uuid4().hex[:12]}"
        parts = _split(text)
        entity: dict[str, Any] = {
            "PartitionKey": PARTITION,
            "RowKey": row,
            "Queue": queue,
            "Reason": reason[:4000],
            "At": at,
            "Parts": len(parts),
            **{_name(n): part for n, part in enumerate(parts)},
        }
        try:
            self._table.create_entity(entity)
        except AzureError as exc:
            raise StorageUnavailable(f"could not keep a message from {queue}: {exc}") from exc
        return row

    def get(self, row: str) -> KeptMessage | None:
        try:
            e = self._table.get_entity(PARTITION, row)
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise StorageUnavailable(f"could not read kept message {row}: {exc}") from exc
        text = "".join(e.get(_name(n), "") for n in range(int(e.get("Parts", 1))))
        return KeptMessage(row, e["Queue"], e.get("Reason", ""), text, e["At"])

    def list(self, limit: int = 100) -> list[KeptMessage]:
        try:
            rows = self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": PARTITION}, results_per_page=limit
            )
            out = []
            for e in rows:
                text = "".join(e.get(_name(n), "") for n in range(int(e.get("Parts", 1))))
                out.append(KeptMessage(e["RowKey"], e["Queue"], e.get("Reason", ""), text, e["At"]))
                if len(out) >= limit:
                    break
            return out
        except AzureError as exc:
            raise StorageUnavailable(f"could not list kept messages: {exc}") from exc

    def delete(self, row: str) -> None:
        try:
            self._table.delete_entity(PARTITION, row)
        except ResourceNotFoundError:
            pass
        except AzureError as exc:
            raise StorageUnavailable(f"could not delete kept message {row}: {exc}") from exc
