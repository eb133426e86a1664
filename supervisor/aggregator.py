"""The dashboard's timer (``aggregate_dashboard``): fold the activity rows that orders
wrote into per-minute and per-hour figures, and look for stuck steps.

**Counting each event once.** Every transition writes its activity rows in its own
transaction (``stores/activity.py``). A run reads each shard's ``activity|`` range up to
``LAG`` before now, at most ``batch`` rows a round and ``rounds`` rounds (bounded reads,
whatever the history), adds them to the minute and hour rows and, in the same
transaction in the dashboard partition, records them in the shard's cursor row (If-Match:
two aggregators cannot both count a shard's rows). Then it deletes them. A run killed
between its commit and its deletes leaves rows behind that the cursor names: the next
run deletes them without counting them again. A row that commits late (its time already
behind rows counted) is simply counted by the next run, into its own minute.

**Stuck steps.** A step that has been in one state longer than its step's p99 over the
last day, and longer than ``floor``, is stuck: Pending counted from when it became due,
Processing from its claim. The check reads only the ``pending|``/``processing|`` index
ranges (work in flight) and raises one operator alert per order (``Order.mark_stuck``:
a marker on the order, saved with the alert's outbox row, so the next run does not
alert again). The list is kept in the dashboard partition (``stuck|now``) for the
console.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from core.errors import ConcurrencyConflict, TransitionRefused
from core.ports import Clock
from core.timefmt import iso
from core.unit_of_work import OrderChanges
from dashboard.figures import (
    CURSOR_PREFIX,
    HOUR_PREFIX,
    MINUTE_PREFIX,
    STUCK_ROW,
    Figures,
    Fold,
    Stuck,
    fold,
    hour_row,
    merged,
    minute_row,
    p99_by_step,
    stuck_steps,
    time_of_row,
)
from dashboard.ports import DashboardStore, RowWrite, StoredRow
from observability import failpoints
from observability.logs import get_logger

log = get_logger(__name__)

#: How far behind now a run reads: a transition's rows carry the time it decided, and
#: commit a moment later. (Rows later than this are still counted, by the next run.)
LAG: Final = timedelta(seconds=5)
#: Activity rows per shard per round: the cursor names them all in one string property
#: (at most 32K characters; a key is at most about 110).
BATCH: Final = 250
ROUNDS: Final = 4
#: Buckets one shard's round may touch (one transaction: 100 operations).
MAX_BUCKETS: Final = 90
MINUTES_KEPT: Final = timedelta(hours=3)
HOURS_KEPT: Final = timedelta(days=8)
SHARDS: Final = [f"shard-{i:02d}" for i in range(16)]
#: Stuck steps kept in that row at most (the oldest first).
STUCK_SHOWN: Final = 100


@dataclass
class AggregationReport:
    counted: int = 0
    deleted: int = 0
    skipped: int = 0
    conflicts: int = 0
    transactions: int = 0
    reads: int = 0
    pruned: int = 0
    stuck: list[Stuck] = field(default_factory=list)
    alerted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def figures_of(row: StoredRow | None) -> Figures:
    if row is None:
        return Figures()
    return Figures.from_json(json.loads(str(row.value.get("Figures") or "{}")))


class DashboardAggregator:
    def __init__(
        self,
        store: DashboardStore,
        clock: Clock,
        *,
        shards: list[str] | None = None,
        batch: int = BATCH,
        rounds: int = ROUNDS,
        lag: timedelta = LAG,
        after_commit: Callable[[str], None] | None = None,
        changes: OrderChanges | None = None,
        floor: timedelta = timedelta(minutes=5),
    ):
        """``changes`` raises the stuck alerts (None: the stuck list is kept, nobody
        alerted); ``floor`` is the least time in one state that counts as stuck."""
        self._store = store
        self._changes = changes
        self._floor = floor
        self._clock = clock
        self._shards = shards or SHARDS
        self._batch = batch
        self._rounds = rounds
        self._lag = lag
        self._after_commit = after_commit or (
            lambda shard: failpoints.hit("dashboard-after-commit")
        )

    def run(self) -> AggregationReport:
        report = AggregationReport()
        now = self._clock()
        before = now - self._lag
        report.reads += 1
        cursors = {r.row: r for r in self._store.dashboard_rows(CURSOR_PREFIX, CURSOR_PREFIX + "~")}
        buckets: dict[str, StoredRow | None] = {}
        for shard in self._shards:
            try:
                for _ in range(self._rounds):
                    more = self._round(shard, before, now, cursors, buckets, report)
                    if not more:
                        break
            except ConcurrencyConflict:
                # Another aggregator is counting: its run does the work; ours stops here.
                report.conflicts += 1
                log.info("dashboard: another run is counting (%s); stopping", shard)
                return report
        self._prune(now, report)
        self._check_stuck(now, report)
        if report.counted or report.deleted:
            log.info(
                "dashboard: counted %d activity rows, deleted %d, %d transactions",
                report.counted,
                report.deleted,
                report.transactions,
            )
        return report

    def _round(
        self,
        shard: str,
        before: datetime,
        now: datetime,
        cursors: dict[str, StoredRow],
        buckets: dict[str, StoredRow | None],
        report: AggregationReport,
    ) -> bool:
        """One bounded page of a shard; True if a full page was taken (more may wait)."""
        report.reads += 1
        rows = self._store.activity(shard, before, self._batch)
        if not rows:
            return False
        cursor = cursors.get(CURSOR_PREFIX + shard)
        already = json.loads(str(cursor.value.get("Counted") or "[]")) if cursor else []
        folded = fold(rows, already, MAX_BUCKETS)
        if not folded.taken:
            return False
        self._load(folded, buckets, report)
        writes = []
        values: dict[str, dict[str, Any]] = {}
        for row, delta in sorted(folded.deltas.items()):
            stored = buckets.get(row)
            figures = figures_of(stored)
            figures.merge(delta)
            values[row] = {"Figures": json.dumps(figures.to_json()), "Start": time_of_row(row)}
            writes.append(RowWrite(row, values[row], stored.etag if stored else None))
        through = cursor.value.get("Through") if cursor else None
        if folded.through is not None and (through is None or folded.through > through):
            through = folded.through
        cursor_value: dict[str, Any] = {"Counted": json.dumps(folded.taken), "UpdatedAt": now}
        if through is not None:
            cursor_value["Through"] = through
        cursor_row = CURSOR_PREFIX + shard
        writes.append(RowWrite(cursor_row, cursor_value, cursor.etag if cursor else None))
        try:
            etags = self._store.write_dashboard(writes)
        except ConcurrencyConflict:
            buckets.clear()  # our copies may be stale
            raise
        report.transactions += 1
        for row, value in values.items():
            buckets[row] = StoredRow(row, value, etags[row])
        cursors[cursor_row] = StoredRow(cursor_row, cursor_value, etags[cursor_row])
        report.counted += folded.counted
        report.skipped += folded.skipped
        self._after_commit(shard)
        self._store.delete_activity(shard, folded.taken)
        report.deleted += len(folded.taken)
        return len(rows) >= self._batch

    def _load(
        self, folded: Fold, buckets: dict[str, StoredRow | None], report: AggregationReport
    ) -> None:
        """Read the bucket rows this round adds to that are not in hand yet (one range
        query per kind: the rows between the earliest and the latest)."""
        missing = sorted(b for b in folded.deltas if b not in buckets)
        for prefix in (MINUTE_PREFIX, HOUR_PREFIX):
            wanted = [b for b in missing if b.startswith(prefix)]
            if not wanted:
                continue
            report.reads += 1
            found = {r.row: r for r in self._store.dashboard_rows(wanted[0], wanted[-1] + "~")}
            for b in wanted:
                buckets[b] = found.get(b)

    def _prune(self, now: datetime, report: AggregationReport) -> None:
        """Delete minute rows older than ``MINUTES_KEPT`` and hour rows older than
        ``HOURS_KEPT`` (at most 99 of each a run)."""
        for low, high in (
            (MINUTE_PREFIX, minute_row(now - MINUTES_KEPT)),
            (HOUR_PREFIX, hour_row(now - HOURS_KEPT)),
        ):
            report.reads += 1
            old = self._store.dashboard_rows(low, high, 99)
            if not old:
                continue
            try:
                self._store.write_dashboard([RowWrite(r.row, None, r.etag) for r in old])
            except ConcurrencyConflict:
                continue  # another run is at it
            report.transactions += 1
            report.pruned += len(old)

    # --- stuck steps ----------------------------------------------------------------------

    def _check_stuck(self, now: datetime, report: AggregationReport) -> None:
        report.reads += 2
        day = merged(
            figures_of(r)
            for r in self._store.dashboard_rows(
                hour_row(now - timedelta(hours=23)), HOUR_PREFIX + "~"
            )
        )
        previous = self._store.dashboard_rows(STUCK_ROW, STUCK_ROW + "~")
        alerted_before = set()
        if previous:
            for entry in json.loads(str(previous[0].value.get("Steps") or "[]")):
                if entry.get("alerted"):
                    alerted_before.add((entry["orderId"], entry["step"], entry["since"]))
        report.reads += 32
        found = stuck_steps(self._store.in_flight(), p99_by_step(day), self._floor, now)
        report.stuck = found
        listed = []
        for s in found[:STUCK_SHOWN]:
            key = (s.order_id, s.step, iso(s.since))
            alerted = key in alerted_before or self._alert(s, now, report)
            listed.append(
                {
                    "orderId": s.order_id,
                    "step": s.step,
                    "agent": s.agent,
                    "state": s.state,
                    "since": iso(s.since),
                    "ageSeconds": round(s.age_seconds, 1),
                    "thresholdSeconds": round(s.threshold_seconds, 1),
                    "alerted": alerted,
                }
            )
        value = {"Steps": json.dumps(listed), "CheckedAt": now, "Count": len(found)}
        etag = previous[0].etag if previous else None
        try:
            self._store.write_dashboard([RowWrite(STUCK_ROW, value, etag)])
            report.transactions += 1
        except ConcurrencyConflict:
            pass  # another run wrote it just now

    def _alert(self, s: Stuck, now: datetime, report: AggregationReport) -> bool:
        """One operator alert for the order (its marker refuses a second); True once the
        order carries the marker."""
        if self._changes is None:
            return False
        reason = (
            f"step {s.step} (agent {s.agent or '?'}) has been {s.state} for "
            f"{s.age_seconds:.0f} s, since {iso(s.since)}: longer than it usually takes "
            f"({s.threshold_seconds:.0f} s: its p99 over the last day, at least "
            f"STUCK_FLOOR_SECONDS). Look at the order and at agent {s.agent or '?'}"
        )
        try:
            changed = self._changes.change(
                s.order_id, lambda o: o.mark_stuck(s.step, reason, now), attempts=2
            )
        except TransitionRefused as exc:
            return exc.reason == "stuck-alerted"
        except ConcurrencyConflict:
            return False  # it is moving: the next run looks again
        except Exception as exc:  # noqa: BLE001 - one order must not stop the check
            report.errors.append(f"{s.order_id}: {type(exc).__name__}: {exc}")
            log.error("stuck check: could not alert order %s: %s", s.order_id, exc)
            return False
        if changed is None:
            return False
        report.alerted.append(s.order_id)
        log.warning("stuck: order %s step %s: %s", s.order_id, s.step, reason)
        return True
