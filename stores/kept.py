"""Messages kept for an operator: messages too large to travel inside the record or alert
that reports them. A Storage queue message holds 64 KiB (65,536 bytes of UTF-8), and a
record that quotes a message (JSON-escaped, with its reason) can be larger than the
message itself, so:

- a poisoned or dead-lettered message too large for its alert (``supervisor/poison.py``),
- a rejected order too large for its record on ``orders-rejected`` (``Scheduler.reject``),
- a malformed agent message too large for its record on ``<queue>-poison``
  (``messaging/quarantine.py``)

is kept here, and the alert or record carries ``messagePreview`` and ``keptAs`` (the row
key) instead. ``python -m admin kept`` lists, shows and deletes them. They do not stay
for ever: the retention run archives those older than ``KEPT_DAYS`` (default 30) to the
``_kept/`` blobs of ``orders-archive``, then deletes them (``admin/archiving.py``).

They live in the state table under the partition ``kept`` (sweeps never read it), one
entity per message: the text split over ``Text``, ``Text1`` ... (at most 30,000 UTF-16
units each, cut between code points, so the parts join back to the exact text), with
where it came from, why, and when. Text that was not UTF-8 is kept as the base64 of its
exact bytes (``encoding`` ``base64``). An entity holds 1 MiB: a text longer than
``MAX_KEPT_UNITS`` (only a Service Bus premium message can be) keeps its beginning and
says so (``truncated``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final, Literal, Protocol

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient

from core.errors import StorageUnavailable
from core.names import Names
from core.redact import base64_without_tokens, without_tokens
from core.timefmt import iso, sortable
from stores.entities import split_utf16

PARTITION: Final = "kept"
PART_UNITS: Final = 30_000
#: 15 parts: 900,000 bytes of UTF-16 text, under the entity's 1 MiB with the other fields.
MAX_PARTS: Final = 15
MAX_KEPT_UNITS: Final = PART_UNITS * MAX_PARTS
#: What a record or alert sent to a Storage queue may weigh, as UTF-8 bytes: the queue
#: takes 65,536; the margin covers the service's own accounting.
MAX_RECORD_BYTES: Final = 60_000
#: How much of a kept message its record or alert still shows (``messagePreview``).
PREVIEW_CHARS: Final = 2_000
#: Kept messages read per page by retention (each up to ~1 MiB).
PAGE: Final = 20
MAX_REASON_CHARS: Final = 4_000
#: Row keys this module writes: safe in a URL, a shell and a table key.
_ROW = re.compile(r"[A-Za-z0-9._-]{1,255}")

Encoding = Literal["text", "base64"]


class Keeper(Protocol):
    """Where a message too large for its record or alert is kept; returns its row key."""

    def keep(
        self, queue: str, text: str, reason: str, at: datetime, *, encoding: Encoding = "text"
    ) -> str: ...


def is_kept_row(row: str) -> bool:
    """Whether ``row`` has the form of a key this module writes."""
    return bool(_ROW.fullmatch(row))


def utf8_size(text: str) -> int:
    """Bytes of ``text`` on the wire (what the queue service counts)."""
    return len(text.encode("utf-8", "surrogatepass"))


def fits_a_queue_message(body: str) -> bool:
    return utf8_size(body) <= MAX_RECORD_BYTES


@dataclass(frozen=True)
class KeptMessage:
    row: str
    queue: str
    reason: str
    text: str  # the whole message (its base64 when encoding is "base64")
    at: datetime
    encoding: str = "text"
    truncated: bool = False
    length: int = 0  # characters of the original text (before any truncation)

    def without_tokens(self) -> KeptMessage:
        """The message as an operator is shown it: every token value replaced
        (``core/redact.py``), its exact bytes too when it is kept as base64."""
        redact = base64_without_tokens if self.encoding == "base64" else without_tokens
        return replace(self, text=redact(self.text))


@dataclass(frozen=True)
class KeptSummary:
    row: str
    queue: str
    reason: str
    at: datetime
    encoding: str
    length: int
    preview: str

    def without_tokens(self) -> KeptSummary:
        return replace(self, preview=without_tokens(self.preview))


def as_shown[Kept: (KeptMessage, KeptSummary)](kept: Kept, names: Names) -> Kept:
    """A kept message (or its summary) as an operator is shown it: an agent message
    without its tokens (``core/redact.py``), an order's data as it came."""
    return kept if names.holds_orders(kept.queue) else kept.without_tokens()


def _name(n: int) -> str:
    return "Text" if n == 0 else f"Text{n}"


def _slug(queue: str) -> str:
    return re.sub(r"[^A-Za-z0-9-]+", "-", queue).strip("-")[:100] or "queue"


def _text(e: Any) -> str:
    return "".join(e.get(_name(n), "") for n in range(int(e.get("Parts", 1))))


def _message(e: Any) -> KeptMessage:
    text = _text(e)
    return KeptMessage(
        e["RowKey"],
        e["Queue"],
        e.get("Reason", ""),
        text,
        e["At"],
        e.get("Encoding", "text"),
        bool(e.get("Truncated", False)),
        int(e.get("Length", len(text))),
    )


def archived_line(message: KeptMessage, archived_at: datetime) -> dict[str, Any]:
    """A kept message as a line of the archive (``_kept/...`` blobs of ``orders-archive``)."""
    return {
        "format": 1,
        "kind": "kept",
        "row": message.row,
        "queue": message.queue,
        "reason": message.reason,
        "at": iso(message.at),
        "archivedAt": iso(archived_at),
        "encoding": message.encoding,
        "truncated": message.truncated,
        "length": message.length,
        "text": message.text,
    }


class KeptMessages:
    def __init__(self, table: TableClient):
        self._table = table

    def keep(
        self, queue: str, text: str, reason: str, at: datetime, *, encoding: Encoding = "text"
    ) -> str:
        """Store ``text`` (from ``queue``, given up on for ``reason``); returns its row key,
        ``<time>-<queue>-<random>``, which the record or alert quotes."""
        row = f"{sortable(at)}-{_slug(queue)}-{uuid.uuid4().hex[:12]}"
        parts = split_utf16(text, PART_UNITS) or [""]
        truncated = len(parts) > MAX_PARTS
        parts = parts[:MAX_PARTS]
        entity: dict[str, Any] = {
            "PartitionKey": PARTITION,
            "RowKey": row,
            "Queue": queue,
            "Reason": reason[:MAX_REASON_CHARS],
            "At": at,
            "Encoding": encoding,
            "Length": len(text),
            "Truncated": truncated,
            "Parts": len(parts),
            **{_name(n): part for n, part in enumerate(parts)},
        }
        try:
            self._table.create_entity(entity)
        except AzureError as exc:
            raise StorageUnavailable(f"could not keep a message from {queue}: {exc}") from exc
        return row

    def get(self, row: str) -> KeptMessage | None:
        if not is_kept_row(row):
            return None  # not a key this module wrote (and not one to put in a URL)
        try:
            e = self._table.get_entity(PARTITION, row)
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise StorageUnavailable(f"could not read kept message {row}: {exc}") from exc
        return _message(e)

    def kept_before(self, before: datetime) -> Iterator[tuple[KeptMessage, str]]:
        """The messages kept before ``before``, oldest first, each with its row's ETag
        (lazily, a page at a time: row keys start with the time, so this is one range)."""
        try:
            rows = self._table.query_entities(
                "PartitionKey eq @pk and RowKey lt @hi",
                parameters={"pk": PARTITION, "hi": sortable(before)},
                results_per_page=PAGE,
            )
            for e in rows:
                yield _message(e), str(e.metadata["etag"])
        except AzureError as exc:
            raise StorageUnavailable(f"could not list kept messages: {exc}") from exc

    def count_before(self, before: datetime, limit: int) -> int:
        """How many messages were kept before ``before`` (at most ``limit``), their keys
        only read: what a dry run reports."""
        try:
            rows = self._table.query_entities(
                "PartitionKey eq @pk and RowKey lt @hi",
                parameters={"pk": PARTITION, "hi": sortable(before)},
                select=["RowKey"],
                results_per_page=min(max(limit, 1), 1000),
            )
            count = 0
            for _ in rows:
                if count >= limit:
                    break
                count += 1
            return count
        except AzureError as exc:
            raise StorageUnavailable(f"could not count kept messages: {exc}") from exc

    def remove(self, row: str, etag: str) -> bool:
        """Delete a kept message if unchanged since read (``kept_before``); False when it
        was deleted or changed meanwhile."""
        try:
            self._table.delete_entity(
                PARTITION, row, etag=etag, match_condition=MatchConditions.IfNotModified
            )
        except (ResourceNotFoundError, ResourceModifiedError):
            return False
        except AzureError as exc:
            raise StorageUnavailable(f"could not delete kept message {row}: {exc}") from exc
        return True

    def summaries(self, limit: int = 100, preview_chars: int = 200) -> list[KeptSummary]:
        """The oldest ``limit`` kept messages, without their whole text."""
        fields = ["RowKey", "Queue", "Reason", "At", "Encoding", "Length", "Text"]
        try:
            rows = self._table.query_entities(
                "PartitionKey eq @pk",
                parameters={"pk": PARTITION},
                select=fields,
                results_per_page=min(max(limit, 1), 1000),
            )
            out: list[KeptSummary] = []
            for e in rows:
                if len(out) >= limit:
                    break
                first = e.get("Text") or ""
                out.append(
                    KeptSummary(
                        e["RowKey"],
                        e.get("Queue") or "",
                        e.get("Reason") or "",
                        e["At"],
                        e.get("Encoding") or "text",
                        int(e.get("Length") or len(first)),
                        first[:preview_chars],
                    )
                )
            return out
        except AzureError as exc:
            raise StorageUnavailable(f"could not list kept messages: {exc}") from exc

    def delete(self, row: str) -> bool:
        """Remove a kept message; False if there was none by that key."""
        if not is_kept_row(row):
            return False
        try:
            # delete_entity treats a missing entity as deleted: ask first, to tell the two apart
            self._table.get_entity(PARTITION, row, select=["RowKey"])
            self._table.delete_entity(PARTITION, row)
        except ResourceNotFoundError:
            return False
        except AzureError as exc:
            raise StorageUnavailable(f"could not delete kept message {row}: {exc}") from exc
        return True
