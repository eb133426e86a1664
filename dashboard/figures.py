"""The live dashboard's figures, pure: what one event adds to a time bucket, how buckets
merge, percentiles from fixed log-scale histograms, and the stuck-step rule.

An ``Activity`` is one thing an order did (it started; an attempt of a step ended; it
finished; an alert went out) or one poisoned message, as the store writes it in the
same transaction as the transition (``stores/activity.py``). The aggregator
(``supervisor/aggregator.py``) folds activities into ``Figures`` per minute and per hour;
both are the same shape, so an hour is the sum of its minutes and any range of buckets
merges by addition. Durations are histograms over fixed buckets, a quarter of a doubling
wide (19 %), so a percentile read from merged buckets is within 19 % of the true value
and never below it (the bucket's upper bound is reported).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from core.item_names import declared_name
from core.outages import PAST_DAYS, Outage
from core.timefmt import iso

#: Histogram buckets: bucket ``i`` holds durations in [2^(i/4), 2^((i+1)/4)) ms; bucket 0
#: also holds everything under 1 ms, the last one everything over 2^26 ms (18.6 h).
PER_DOUBLING: Final = 4
LAST_BUCKET: Final = 26 * PER_DOUBLING

#: How an attempt that did not succeed ended, in the typed attempt state's words
#: (``core.attempts.Outcome`` and ``Applied``): the failure kinds the dashboard counts.
REFUSED: Final = "refused"
NOT_APPLIED: Final = "not applied"
MAYBE_APPLIED: Final = "may have applied"
DEFERRED: Final = "deferred"
FAILURE_KINDS: Final = (REFUSED, NOT_APPLIED, MAYBE_APPLIED, DEFERRED)

STARTED: Final = "started"
FINISHED: Final = "finished"
ATTEMPT: Final = "attempt"
ALERT: Final = "alert"
POISON: Final = "poison"
KINDS: Final = frozenset({STARTED, FINISHED, ATTEMPT, ALERT, POISON})


def bucket_of(millis: float) -> int:
    if millis < 1:
        return 0
    return min(math.floor(math.log2(millis) * PER_DOUBLING), LAST_BUCKET)


def bucket_upper(index: int) -> float:
    """The upper bound of a bucket, in ms."""
    return float(2 ** ((index + 1) / PER_DOUBLING))


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0 < q <= 1) of a histogram, as its bucket's upper bound in ms
    (None when it is empty): at least ``q`` of the durations are at or below it."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            return bucket_upper(index)
    return bucket_upper(max(histogram))  # pragma: no cover - rank <= total


def answer_kind(ending: str, applied: str) -> str | None:
    """The failure kind of an attempt's ending (None: it succeeded). ``transient``,
    ``expired`` and ``not-sent`` attempts are told apart by what may have applied."""
    if ending == "succeeded":
        return None
    if ending == "refused":
        return REFUSED
    if ending == "deferred":
        return DEFERRED
    return NOT_APPLIED if applied == "no" else MAYBE_APPLIED


@dataclass(frozen=True)
class Activity:
    at: datetime
    kind: str
    order_id: str = ""
    workflow: str = ""
    step: str = ""
    agent: str = ""
    #: an attempt's ending and what it may have applied (``core.attempts``)
    ending: str = ""
    applied: str = ""
    #: an attempt's duration, claimed to ended
    millis: int = 0
    #: a finished order's status
    status: str = ""


def _add(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


@dataclass
class Figures:
    """What happened in one time bucket."""

    started: dict[str, int] = field(default_factory=dict)  # workflow -> orders
    finished: dict[str, int] = field(default_factory=dict)  # "workflow|status" -> orders
    durations: dict[str, dict[int, int]] = field(default_factory=dict)  # "step|agent" -> hist
    failures: dict[str, int] = field(default_factory=dict)  # "agent|kind" -> attempts
    attempts: dict[str, int] = field(default_factory=dict)  # "step|agent" -> attempts ended
    alerts: int = 0
    poison: int = 0

    def add(self, activity: Activity) -> None:
        if activity.kind == STARTED:
            _add(self.started, activity.workflow)
        elif activity.kind == FINISHED:
            _add(self.finished, f"{activity.workflow}|{activity.status}")
        elif activity.kind == ATTEMPT:
            key = f"{activity.step}|{activity.agent}"
            _add(self.attempts, key)
            kind = answer_kind(activity.ending, activity.applied)
            if kind is None:
                hist = self.durations.setdefault(key, {})
                b = bucket_of(activity.millis)
                hist[b] = hist.get(b, 0) + 1
            else:
                _add(self.failures, f"{activity.agent}|{kind}")
        elif activity.kind == ALERT:
            self.alerts += 1
        elif activity.kind == POISON:
            self.poison += 1

    def merge(self, other: Figures) -> None:
        for mine, theirs in (
            (self.started, other.started),
            (self.finished, other.finished),
            (self.failures, other.failures),
            (self.attempts, other.attempts),
        ):
            for key, n in theirs.items():
                _add(mine, key, n)
        for key, hist in other.durations.items():
            into = self.durations.setdefault(key, {})
            for b, n in hist.items():
                into[b] = into.get(b, 0) + n
        self.alerts += other.alerts
        self.poison += other.poison

    @property
    def empty(self) -> bool:
        return self == Figures()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("started", "finished", "failures", "attempts"):
            if getattr(self, name):
                out[name] = dict(sorted(getattr(self, name).items()))
        if self.durations:
            out["durations"] = {
                key: {str(b): n for b, n in sorted(hist.items())}
                for key, hist in sorted(self.durations.items())
            }
        if self.alerts:
            out["alerts"] = self.alerts
        if self.poison:
            out["poison"] = self.poison
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Figures:
        return cls(
            started={str(k): int(v) for k, v in (raw.get("started") or {}).items()},
            finished={str(k): int(v) for k, v in (raw.get("finished") or {}).items()},
            durations={
                str(key): {int(b): int(n) for b, n in hist.items()}
                for key, hist in (raw.get("durations") or {}).items()
            },
            failures={str(k): int(v) for k, v in (raw.get("failures") or {}).items()},
            attempts={str(k): int(v) for k, v in (raw.get("attempts") or {}).items()},
            alerts=int(raw.get("alerts", 0)),
            poison=int(raw.get("poison", 0)),
        )


def merged(figures: Iterable[Figures]) -> Figures:
    total = Figures()
    for f in figures:
        total.merge(f)
    return total


# --- buckets ------------------------------------------------------------------------------

MINUTE_PREFIX: Final = "min|"
HOUR_PREFIX: Final = "hour|"
CURSOR_PREFIX: Final = "cursor|"
#: The stuck steps the last check found (the console shows them).
STUCK_ROW: Final = "stuck|now"


def minute_row(at: datetime) -> str:
    return MINUTE_PREFIX + at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def hour_row(at: datetime) -> str:
    return HOUR_PREFIX + at.astimezone(UTC).strftime("%Y-%m-%dT%H")


def time_of_row(row: str) -> datetime:
    """The start of a minute or hour bucket."""
    kind, text = row.split("|", 1)
    fmt = "%Y-%m-%dT%H:%M" if kind + "|" == MINUTE_PREFIX else "%Y-%m-%dT%H"
    return datetime.strptime(text, fmt).replace(tzinfo=UTC)


@dataclass
class Fold:
    """What one shard's activity rows add: the figures per bucket row, the rows it took
    (counted, or already counted by a run that could not delete them: to delete), and how
    many it counted."""

    deltas: dict[str, Figures] = field(default_factory=dict)
    taken: list[str] = field(default_factory=list)
    counted: int = 0
    skipped: int = 0
    through: datetime | None = None


def fold(
    rows: Iterable[tuple[str, Activity | None]], already: Iterable[str], max_buckets: int
) -> Fold:
    """Fold a shard's activity rows (in key order) into minute and hour buckets. A row in
    ``already`` was counted by an earlier run whose deletes did not finish: taken (to
    delete), never counted twice. A malformed row (None) is taken and skipped. It stops
    before a row that would make the buckets touched more than ``max_buckets`` (one
    transaction holds them all); the next run goes on from there."""
    done = set(already)
    out = Fold()
    for key, activity in rows:
        if key in done or activity is None:
            out.taken.append(key)
            out.skipped += activity is None and key not in done
            continue
        buckets = (minute_row(activity.at), hour_row(activity.at))
        new = sum(1 for b in buckets if b not in out.deltas)
        if len(out.deltas) + new > max_buckets:
            break
        for b in buckets:
            out.deltas.setdefault(b, Figures()).add(activity)
        out.taken.append(key)
        out.counted += 1
        if out.through is None or activity.at > out.through:
            out.through = activity.at
    return out


# --- what a page shows ----------------------------------------------------------------------

PERCENTILES: Final = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class DurationRow:
    step: str
    agent: str
    hour: tuple[float | None, ...]  # p50, p90, p99 in ms over the last hour
    day: tuple[float | None, ...]
    hour_count: int
    day_count: int


def split_key(key: str) -> tuple[str, str]:
    first, _, second = key.partition("|")
    return first, second


def duration_rows(hour: Figures, day: Figures) -> list[DurationRow]:
    rows = []
    for key in sorted(set(hour.durations) | set(day.durations)):
        h, d = hour.durations.get(key, {}), day.durations.get(key, {})
        step, agent = split_key(key)
        rows.append(
            DurationRow(
                step,
                agent,
                tuple(percentile(h, q) for q in PERCENTILES),
                tuple(percentile(d, q) for q in PERCENTILES),
                sum(h.values()),
                sum(d.values()),
            )
        )
    return rows


def p99_by_step(day: Figures) -> dict[str, float]:
    """Each step's p99 duration over the day (ms), by step name, over its agents."""
    by_step: dict[str, dict[int, int]] = {}
    for key, hist in day.durations.items():
        into = by_step.setdefault(split_key(key)[0], {})
        for b, n in hist.items():
            into[b] = into.get(b, 0) + n
    out = {}
    for step, hist in by_step.items():
        p = percentile(hist, 0.99)
        if p is not None:
            out[step] = p
    return out


# --- stuck steps ----------------------------------------------------------------------------


@dataclass(frozen=True)
class InFlight:
    """An active step as the sweep index shows it: Pending since it became due, or
    Processing since its attempt was claimed."""

    order_id: str
    step: str
    agent: str
    state: str  # "Pending" or "Processing"
    since: datetime
    #: the paused agent a Pending step is held for ("": not held): an operator's choice,
    #: shown on the Agents page and the order, never stuck
    paused_for: str = ""


@dataclass(frozen=True)
class Stuck:
    order_id: str
    step: str
    agent: str
    state: str
    since: datetime
    age_seconds: float
    threshold_seconds: float


def stuck_threshold(step: str, p99_ms: Mapping[str, float], floor: timedelta) -> float:
    """Seconds a step may stay in one state before it is stuck: its p99 over the last
    day, but never less than the floor."""
    return max(floor.total_seconds(), p99_ms.get(step, 0.0) / 1000)


def stuck_steps(
    in_flight: Iterable[InFlight], p99_ms: Mapping[str, float], floor: timedelta, now: datetime
) -> list[Stuck]:
    """The active steps that have been in their state longer than their threshold, oldest
    first."""
    out = []
    for entry in in_flight:
        if entry.paused_for:
            continue
        age = (now - entry.since).total_seconds()
        limit = stuck_threshold(declared_name(entry.step), p99_ms, floor)
        if age > limit:
            out.append(
                Stuck(
                    entry.order_id,
                    entry.step,
                    entry.agent,
                    entry.state,
                    entry.since,
                    age,
                    limit,
                )
            )
    return sorted(out, key=lambda s: (s.since, s.order_id))


# --- outages --------------------------------------------------------------------------------

#: Past outages the dashboard lists at most (newest first).
PAST_OUTAGES_SHOWN: Final = 20


@dataclass(frozen=True)
class OutageRow:
    """An agent's outage as the dashboard lists it (docs/contracts.md §3.14): current (its
    remote still failing: ``until`` None), or past."""

    agent: str
    since: datetime
    until: datetime | None
    last_failure: datetime | None
    #: orders held, counted when its alert went (None: not alerted yet, or not counted)
    waiting: int | None
    reason: str
    #: told to operators: failing for OUTAGE_ALERT_SECONDS (a streak shorter than that is
    #: listed as failing, not yet an outage)
    alerted: bool

    @property
    def shown(self) -> dict[str, str]:
        """Its times as the page shows them (ISO 8601 UTC; "-" for none)."""
        return {
            "since": iso(self.since),
            "until": iso(self.until) if self.until else "-",
            "lastFailure": iso(self.last_failure) if self.last_failure else "-",
        }


def outage_rows(
    outages: Iterable[Outage], now: datetime
) -> tuple[list[OutageRow], list[OutageRow]]:
    """The agents failing now (earliest first), and the outages that ended within
    ``PAST_DAYS`` (newest first), from the agents' shared outage records."""
    current, past = [], []
    for o in outages:
        if o.failing and o.since is not None:
            current.append(
                OutageRow(o.agent, o.since, None, o.last_failure_at, o.waiting, o.reason, o.alerted)
            )
        past += [
            OutageRow(o.agent, p.since, p.until, None, p.waiting, p.reason, True)
            for p in o.past
            if p.until >= now - PAST_DAYS
        ]
    current.sort(key=lambda r: (r.since, r.agent))
    past.sort(key=lambda r: (r.until or r.since, r.agent), reverse=True)
    return current, past[:PAST_OUTAGES_SHOWN]
