"""Retention: archive finished orders to Blob Storage, then delete them from the table
(docs/contracts.md §3.12); bring one back on request.

A run, timer or ``python -m admin purge``:
1. reads, per status a rule names, the orders created before that status's shortest
   retention (``stores.retention_rows``: the end of the status index, oldest orders only);
2. reads each one's rows and keeps it when its own rule (by workflow) says it is due,
   it is still in that status, and every notice it committed has been sent;
3. writes the due orders to the archive, one create-only blob per workflow and day they
   finished (``stores.archive``);
4. only then deletes each order's rows (order, steps, index; one transaction, each row
   only if unchanged since step 2) and leaves its tombstone, naming the blob.

The same run archives the messages kept for an operator (``stores/kept.py``: orders and
agent messages too large to quote in their record or alert) once they are older than
``KEPT_DAYS``: written to ``_kept/<yyyy>/<mm>/<dd>/<run>-<n>.jsonl.gz`` in the same
container (one line each, the text whole), then deleted, each only if unchanged.

Bounded: at most ``limit`` orders (and ``limit`` kept messages) per run, written
``BLOB_ORDERS`` (``BLOB_KEPT``) at a time; a run
that stops (killed, time's up, storage gone) loses nothing and the next one resumes
where it stopped, because what was deleted is out of the index and what was not is
still due. Archived but not deleted (killed between 3 and 4): archived again next
time, in a new blob; the tombstone names the copy whose deletion won.
"""

from __future__ import annotations

import secrets
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from admin.service import OrderAdmin, order_view
from core.errors import CorruptOrder, OrderAlreadyExists, OrderNotFound, StorageUnavailable
from core.ports import Clock
from core.retention import DEFAULT_KEPT_DAYS, Retention, archive_path, kept_archive_path
from core.states import OrderStatus
from core.timefmt import iso
from observability.failpoints import hit
from observability.logs import get_logger
from stores import entities
from stores.archive import FORMAT, BlobArchive, row_from_json, row_to_json
from stores.kept import KeptMessage, KeptMessages, archived_line
from stores.retention_rows import StoredOrder, TableRetention

log = get_logger(__name__)

#: Orders per archive blob at most (a blob is written whole before its orders go).
BLOB_ORDERS: Final = 200
#: Kept messages per archive blob at most (each up to ~1 MiB of text).
BLOB_KEPT: Final = 50
#: How many order ids a report names (the counts are always whole).
SAMPLE: Final = 20


@dataclass
class PurgeReport:
    dry_run: bool
    rules: str
    archived: int = 0
    #: would go (dry run), or went (a real run), by "workflow/status"
    by_kind: Counter[str] = field(default_factory=Counter)
    sample: list[str] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)
    #: read and kept, by reason
    kept: Counter[str] = field(default_factory=Counter)
    examined: int = 0
    #: rows left by orders archived more than ARCHIVE_DAYS ago (their blobs are gone)
    tombstones_expired: int = 0
    #: messages kept for an operator past KEPT_DAYS: archived (or, dry run, would be)
    kept_messages: int = 0
    complete: bool = True
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "dryRun": self.dry_run,
            "rules": self.rules,
            "archived" if not self.dry_run else "wouldArchive": self.archived,
            "byKind": dict(sorted(self.by_kind.items())),
            "sample": self.sample,
            "blobs": self.blobs,
            "kept": dict(sorted(self.kept.items())),
            "examined": self.examined,
            "tombstonesExpired": self.tombstones_expired,
            "keptMessagesArchived" if not self.dry_run else "keptMessagesWouldArchive": (
                self.kept_messages
            ),
            "complete": self.complete,
            "errors": self.errors,
        }


class Retainer:
    """Runs retention and restores: the table side, the archive and the rules."""

    def __init__(
        self,
        table: TableRetention,
        archive: BlobArchive,
        rules: Retention,
        clock: Clock,
        *,
        limit: int = 1000,
        archive_days: int = 730,
        kept: KeptMessages | None = None,
        kept_days: int = DEFAULT_KEPT_DAYS,
        before_delete: Callable[[], None] = lambda: hit("purge-after-archive"),
    ):
        """``kept``: the messages kept for an operator, archived once ``kept_days`` old
        (None: this retainer leaves them alone)."""
        self._table = table
        self._archive = archive
        self.rules = rules
        self._clock = clock
        self.limit = limit
        self.archive_days = archive_days
        self._kept = kept
        self.kept_days = kept_days
        self._before_delete = before_delete

    # --- purge -------------------------------------------------------------------------

    def purge(
        self,
        *,
        dry_run: bool = False,
        rules: Retention | None = None,
        limit: int | None = None,
        kept_messages: bool = True,
    ) -> PurgeReport:
        """``kept_messages``: also archive the messages kept past ``KEPT_DAYS`` (the timer
        does; ``admin purge`` narrowed to a status, workflow or age does not)."""
        rules = rules if rules is not None else self.rules
        limit = limit if limit is not None else self.limit
        now = self._clock()
        report = PurgeReport(dry_run, str(rules))
        due: list[StoredOrder] = []
        for status in rules.statuses():
            cutoff = now - rules.widest(status)
            for candidate in self._table.candidates(status, cutoff):
                if report.archived >= limit:
                    report.complete = False
                    break
                keep = rules.keep_for(candidate.workflow, status)
                if keep is None or candidate.created_at > now - keep:
                    # Told by its index row alone: its workflow keeps it for ever, or
                    # longer than it has existed.
                    report.kept["its workflow keeps it longer"] += 1
                    continue
                report.examined += 1
                stored = self._read(candidate.order_id, report)
                if stored is None:
                    continue
                reason = self._keep_reason(stored, status, rules, now)
                if reason:
                    report.kept[reason] += 1
                    continue
                report.archived += 1
                report.by_kind[f"{stored.workflow}/{stored.status}"] += 1
                if len(report.sample) < SAMPLE:
                    report.sample.append(stored.order_id)
                if dry_run:
                    continue
                due.append(stored)
                if len(due) >= BLOB_ORDERS:
                    self._archive_and_delete(due, now, report)
                    due = []
        if due:
            self._archive_and_delete(due, now, report)
        if not dry_run:
            expired_before = now - timedelta(days=self.archive_days)
            report.tombstones_expired = self._table.expire(expired_before, limit)
        if kept_messages and self._kept is not None:
            self._purge_kept(self._kept, now, report, limit)
        log.info(
            "retention %s: %d orders %s, %d examined, kept %s; %d kept messages %s",
            "dry run" if dry_run else "run",
            report.archived,
            "would go" if dry_run else "archived",
            report.examined,
            dict(report.kept),
            report.kept_messages,
            "would go" if dry_run else "archived",
        )
        return report

    def _purge_kept(
        self, kept: KeptMessages, now: datetime, report: PurgeReport, limit: int
    ) -> None:
        """Archive, then delete, the messages kept before ``now - kept_days``."""
        before = now - timedelta(days=self.kept_days)
        if report.dry_run:  # counted by their keys: a page of ~1 MiB rows is not read
            report.kept_messages = kept.count_before(before, limit + 1)
            if report.kept_messages > limit:
                report.kept_messages = limit
                report.complete = False
            return
        batch: list[tuple[KeptMessage, str]] = []
        for message, etag in kept.kept_before(before):
            if report.kept_messages >= limit:
                report.complete = False
                break
            report.kept_messages += 1
            batch.append((message, etag))
            if len(batch) >= BLOB_KEPT:
                self._archive_kept(kept, batch, now, report)
                batch = []
        if batch:
            self._archive_kept(kept, batch, now, report)

    def _archive_kept(
        self,
        kept: KeptMessages,
        batch: list[tuple[KeptMessage, str]],
        now: datetime,
        report: PurgeReport,
    ) -> None:
        run = f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
        days: dict[str, list[tuple[KeptMessage, str]]] = defaultdict(list)
        for message, etag in batch:
            days[f"{message.at:%Y%m%d}"].append((message, etag))
        for part, (_, group) in enumerate(sorted(days.items())):
            path = kept_archive_path(group[0][0].at, run, part)
            self._archive.write(path, [archived_line(message, now) for message, _ in group])
            report.blobs.append(f"{self._archive.container}/{path}")
            self._before_delete()
            for message, etag in group:
                if not kept.remove(message.row, etag):
                    report.kept_messages -= 1  # deleted or changed meanwhile: looked at again

    def _read(self, order_id: str, report: PurgeReport) -> StoredOrder | None:
        try:
            return self._table.read(order_id)
        except CorruptOrder as exc:
            report.kept["records cannot be read"] += 1
            report.errors.append(f"{order_id}: {exc}")
            return None

    @staticmethod
    def _keep_reason(
        stored: StoredOrder, status: OrderStatus, rules: Retention, now: datetime
    ) -> str | None:
        if stored.status is not status:
            return "changed status since indexed"
        if not rules.due(stored.workflow, stored.status, stored.finished_at, now):
            return "not due (finished recently, or its workflow keeps it longer)"
        if stored.unsent_notices:
            return "notices not yet sent"
        return None

    def _archive_and_delete(
        self, orders: list[StoredOrder], now: datetime, report: PurgeReport
    ) -> None:
        run = f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
        groups: dict[tuple[str, str], list[StoredOrder]] = defaultdict(list)
        for stored in orders:
            groups[(stored.workflow, f"{stored.finished_at:%Y%m%d}")].append(stored)
        for part, ((workflow, _), group) in enumerate(sorted(groups.items())):
            path = archive_path(workflow, group[0].finished_at, run, part)
            self._archive.write(path, [self._line(s, now) for s in group])
            report.blobs.append(f"{self._archive.container}/{path}")
            self._before_delete()
            for stored in group:
                if not self._table.remove(stored, path, now):
                    report.archived -= 1
                    report.by_kind[f"{stored.workflow}/{stored.status}"] -= 1
                    report.kept["changed while archived (archived again next run)"] += 1

    @staticmethod
    def _line(stored: StoredOrder, now: datetime) -> dict[str, Any]:
        order = entities.parse_stored(stored.order_id, stored.rows)
        return {
            "format": FORMAT,
            "orderId": stored.order_id,
            "workflow": stored.workflow,
            "status": str(stored.status),
            "createdAt": iso(stored.created_at),
            "finishedAt": iso(stored.finished_at),
            "archivedAt": iso(now),
            "order": order_view(order) if order is not None else None,
            "rows": [row_to_json(dict(row)) for row in stored.rows],
        }

    # --- restore -----------------------------------------------------------------------

    def where(self, order_id: str) -> dict[str, Any] | None:
        """Where an archived order went (None: not archived, or restored since)."""
        tomb = self._table.tombstone(order_id)
        if tomb is None:
            return None
        return {
            "orderId": order_id,
            "archivedAt": iso(tomb.archived_at),
            "blob": f"{self._archive.container}/{tomb.blob}",
            "workflow": tomb.workflow,
            "status": tomb.status,
        }

    def restore(self, order_id: str) -> dict[str, Any]:
        """Put an archived order back as it was archived (readable by the API and the
        console; kept again for its retention from now)."""
        tomb = self._table.tombstone(order_id)
        if tomb is None:
            if self._table.read(order_id) is not None:
                raise OrderAlreadyExists(
                    f"order {order_id} is in the table, not in the archive", order_id=order_id
                )
            raise OrderNotFound(f"order {order_id} was never archived here", order_id=order_id)
        line = self._find(tomb.blob, order_id)
        if line.get("format") != FORMAT:
            raise StorageUnavailable(
                f"archive blob {tomb.blob} has format {line.get('format')!r}; this version "
                f"reads {FORMAT}",
                order_id=order_id,
            )
        rows = [row_from_json(row) for row in line["rows"]]
        self._table.put_back(tomb, rows, self._clock())
        return {
            "orderId": order_id,
            "restored": True,
            "from": f"{self._archive.container}/{tomb.blob}",
        }

    def _find(self, blob: str, order_id: str) -> dict[str, Any]:
        try:
            lines: Iterable[dict[str, Any]] = self._archive.read(blob)
            for line in lines:
                if line.get("orderId") == order_id:
                    return line
        except KeyError:
            pass
        raise StorageUnavailable(
            f"order {order_id}'s archive blob {self._archive.container}/{blob} is gone or does "
            "not hold it (the archive's lifecycle rule may have deleted it)",
            order_id=order_id,
        )


def show_or_where(admin: OrderAdmin, retainer: Retainer, order_id: str) -> dict[str, Any]:
    """An order as the API shows it; not found, but archived: a 404 that says where."""
    try:
        return admin.show(order_id)
    except OrderNotFound as exc:
        raise archived_or(exc, retainer, order_id) from None


def archived_or(exc: OrderNotFound, retainer: Retainer, order_id: str) -> OrderNotFound:
    """``exc``, or, when the order was archived, one that says where it went."""
    where = retainer.where(order_id)
    if where is None:
        return exc
    return OrderNotFound(
        f"order {order_id} was archived on {where['archivedAt']} to {where['blob']}: "
        f"python -m admin restore {order_id} brings it back",
        order_id=order_id,
    )
