"""An agent's outage, told once however many instances run, and the gentle release after
it (docs/contracts.md §3.14). Pure: ``now`` is an argument and nothing is stored here.

**What an outage is.** Each instance knows only its own calls (``agents.health``). An
agent's *failing streak* is the time from a failed call (unanswered: a 5xx, 408/425/429,
no connection, a timeout) with no answer since, on any instance, to the next answer (a
2xx, or the 409 that says the remote holds the key). The streak is kept in one shared
record per agent (``Outage``): instances report to it only when their own view changes,
never per call (``agents.outage_watch``):

- *failing*: this instance's calls have failed, with no answer, for ``report_after``
  (10 s, at most half the alert time); then at most every ``heartbeat`` (60 s) while they
  still fail, and once when its failures reach ``alert_after`` past the shared ``since``;
- *answered*: the first answer after this instance reported failing, or after it saw the
  shared record failing.

``since`` is the earliest first failure reported, never before the last answer that
ended a streak. A streak whose calls have failed for ``alert_after``
(``OUTAGE_ALERT_SECONDS``: ``last_failure_at - since``) is an outage: the report that
makes it so owes ONE ``outage`` alert, and the answer that ends it ONE ``recovered``
alert. A streak with no failure reported for ``gap`` that was never alerted is over
(nobody calls: nothing is known to be down); an alerted one lasts until an answer.

**Told once.** Every change is a conditional write (If-Match the ETag read; the first
write creates the row, which must not exist yet), so of two instances deciding the same
alert one wins and the other decides again on what it wrote. The alert is owed in the
record itself (``owed``, a transactional outbox of at most two entries): the winner
sends it, then removes it; one owed longer than ``grace`` (the winner died, or the queue
did not take it) is sent by the supervisor's timer, which takes it on first (a
conditional write of ``taken_at``). At least once: a sender that dies between the send
and the removal makes the timer send it again (the same ``agent`` and ``since``: a
consumer can tell the copy). No alert is lost to a crash; two are sent only if a sender
dies, or takes longer than ``grace``, in that window.

**Gentle release.** Steps held by a pause or an outage go on at a rate that starts at one
call a second, per instance, and doubles every ``RAMP_DOUBLING`` until it reaches the
agent's rate limit (without one, ``RAMP_CALLS_PER_SLOT`` calls a second per concurrency
slot), counted from the release: the end of a streak (``ended_at``), or a resume once
every instance has read it (``core.control_cache``). Every instance reads both with the
controls, so all ramp from the same time.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from core.agent_spec import MAX_RATE
from core.controls import Limits
from core.messages import OUTAGE_ALERT, RECOVERED_ALERT
from core.text import visible
from core.timefmt import iso, iso_exact, parse_iso

#: The two alerts an outage owes.
OUTAGE: Final = OUTAGE_ALERT
RECOVERED: Final = RECOVERED_ALERT
#: Characters of the last failure's error an outage keeps.
MAX_REASON_CHARS: Final = 500
#: Past outages a record keeps for the dashboard, and for how long.
PAST_KEPT: Final = 10
PAST_DAYS: Final = timedelta(days=7)

#: The gentle release: one call a second at first, doubling every few seconds.
RAMP_START: Final = 1.0
RAMP_DOUBLING: Final = timedelta(seconds=3)
#: Without a rate limit, the ramp ends at this many calls a second per concurrency slot
#: (calls of 100 ms on every slot).
RAMP_CALLS_PER_SLOT: Final = 10
#: Past this a ramp is over whatever the limits (2^(600/3) calls a second): no overflow.
_RAMP_MAX_SECONDS: Final = 600.0


@dataclass(frozen=True)
class OutagePolicy:
    #: failed calls for this long, with no answer, make an outage (OUTAGE_ALERT_SECONDS)
    alert_after: timedelta = timedelta(seconds=300)
    #: an instance reports its failures once they have lasted this long (at most half of
    #: ``alert_after``), so a blip costs no write
    report_after: timedelta = timedelta(seconds=10)
    #: while its calls still fail, an instance reports again at most this often
    heartbeat: timedelta = timedelta(seconds=60)
    #: a streak with no failure reported for this long, never alerted, is over
    gap: timedelta = timedelta(minutes=5)
    #: an alert owed this long and still not sent is sent by the supervisor's timer
    grace: timedelta = timedelta(seconds=60)

    @classmethod
    def of(cls, alert_seconds: float) -> OutagePolicy:
        after = timedelta(seconds=alert_seconds)
        return cls(alert_after=after, report_after=min(cls.report_after, after / 2))


@dataclass(frozen=True)
class Owed:
    """An alert decided and not sent yet (removed once sent)."""

    kind: str  # OUTAGE or RECOVERED
    since: datetime  # the outage's first failure
    at: datetime  # when it was decided: the alert's ``at``
    reason: str  # the last failure's error
    #: when a sender last took it on (first: when it was decided); another sender leaves
    #: it alone until ``OutagePolicy.grace`` after this
    taken_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "since": iso_exact(self.since),
            "at": iso_exact(self.at),
            "reason": self.reason,
            "takenAt": iso_exact(self.taken_at),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Owed:
        return cls(
            str(raw["kind"]),
            parse_iso(raw["since"]),
            parse_iso(raw["at"]),
            str(raw.get("reason") or ""),
            parse_iso(raw["takenAt"]),
        )

    def same(self, other: Owed) -> bool:
        """The same alert (whoever took it on since)."""
        return (self.kind, self.since) == (other.kind, other.since)


@dataclass(frozen=True)
class PastOutage:
    since: datetime
    until: datetime
    waiting: int | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "since": iso_exact(self.since),
            "until": iso_exact(self.until),
            "waiting": self.waiting,
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PastOutage:
        waiting = raw.get("waiting")
        return cls(
            parse_iso(raw["since"]),
            parse_iso(raw["until"]),
            int(waiting) if isinstance(waiting, int) else None,
            str(raw.get("reason") or ""),
        )


@dataclass(frozen=True)
class Outage:
    """One agent's shared record: its current (or last) failing streak, the alerts it
    owes, and its past outages."""

    agent: str
    failing: bool = False
    since: datetime | None = None  # the streak's first failure
    last_failure_at: datetime | None = None  # the latest failure reported
    ended_at: datetime | None = None  # the answer that ended the last streak
    reason: str = ""  # the latest failure's error
    alerted: bool = False  # the streak is an outage: its alert is owed or sent
    waiting: int | None = None  # orders held, counted when its alert went
    owed: tuple[Owed, ...] = ()
    past: tuple[PastOutage, ...] = ()  # alerted outages that ended, newest first
    #: the stored row's ETag (None: no row yet); every write is conditional on it
    etag: str | None = None

    def failing_for(self) -> timedelta:
        if self.since is None or self.last_failure_at is None:
            return timedelta(0)
        return self.last_failure_at - self.since

    def owed_json(self) -> str:
        return json.dumps([o.to_json() for o in self.owed], separators=(",", ":"))

    def past_json(self) -> str:
        return json.dumps([p.to_json() for p in self.past], separators=(",", ":"))

    def view(self, now: datetime) -> dict[str, Any]:
        """What the dashboard shows of it."""
        return {
            "agent": self.agent,
            "failing": self.failing,
            "since": iso(self.since) if self.since else None,
            "lastFailureAt": iso(self.last_failure_at) if self.last_failure_at else None,
            "endedAt": iso(self.ended_at) if self.ended_at else None,
            "alerted": self.alerted,
            "waiting": self.waiting,
            "reason": self.reason,
            "owed": [o.kind for o in self.owed],
            "past": [
                {
                    "since": iso(p.since),
                    "until": iso(p.until),
                    "waiting": p.waiting,
                    "reason": p.reason,
                }
                for p in self.past
                if p.until >= now - PAST_DAYS
            ],
        }


def parse_owed(text: str) -> tuple[Owed, ...]:
    return tuple(Owed.from_json(o) for o in json.loads(text or "[]"))


def parse_past(text: str) -> tuple[PastOutage, ...]:
    return tuple(PastOutage.from_json(p) for p in json.loads(text or "[]"))


def _reason(text: str) -> str:
    text = visible(" ".join(text.split()))
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "\u2026"


# --- the reports -----------------------------------------------------------------------


def report_failing(
    outage: Outage,
    first: datetime,
    at: datetime,
    reason: str,
    now: datetime,
    policy: OutagePolicy,
) -> Outage | None:
    """An instance's calls have failed since ``first`` with no answer on it, the latest
    at ``at`` (with ``reason``). The record after it, or None if it changes nothing (an
    answer reported since then ended that streak)."""
    if outage.ended_at is not None and at <= outage.ended_at:
        return None
    start = first if outage.ended_at is None else max(first, outage.ended_at)
    reason = _reason(reason) or outage.reason
    over = (
        outage.failing
        and not outage.alerted
        and outage.last_failure_at is not None
        and start - outage.last_failure_at > policy.gap
    )
    if outage.failing and outage.since is not None and not over:
        last = outage.last_failure_at
        changed = replace(
            outage,
            since=min(outage.since, start),
            last_failure_at=at if last is None else max(last, at),
            reason=reason,
        )
    else:  # a new streak
        changed = replace(
            outage,
            failing=True,
            since=start,
            last_failure_at=at,
            reason=reason,
            alerted=False,
            waiting=None,
        )
    if not changed.alerted and changed.failing_for() >= policy.alert_after:
        assert changed.since is not None
        owed = Owed(OUTAGE, changed.since, now, changed.reason, now)
        changed = replace(changed, alerted=True, owed=(*changed.owed, owed))
    return None if changed == outage else changed


def report_answer(outage: Outage, at: datetime, now: datetime) -> Outage | None:
    """The remote answered an instance at ``at``: the streak ends (owing the recovered
    alert if it was an outage). None if there is nothing to end."""
    if not outage.failing or outage.since is None or at <= outage.since:
        return None
    ended = replace(outage, failing=False, ended_at=at)
    if not outage.alerted:
        return ended
    past = PastOutage(outage.since, at, outage.waiting, outage.reason)
    kept = tuple(p for p in (past, *outage.past) if p.until >= now - PAST_DAYS)
    owed = Owed(RECOVERED, outage.since, at, outage.reason, now)
    return replace(ended, past=kept[:PAST_KEPT], owed=(*outage.owed, owed))


# --- the owed alerts ------------------------------------------------------------------


def stale_owed(outage: Outage, now: datetime, policy: OutagePolicy) -> list[Owed]:
    """The alerts owed that nobody has taken on for ``grace``: the timer sends them."""
    return [o for o in outage.owed if o.taken_at <= now - policy.grace]


def take(outage: Outage, owed: Owed, now: datetime) -> Outage | None:
    """The record with ``owed`` taken on by a sender at ``now`` (None: no longer owed)."""
    if not any(o.same(owed) for o in outage.owed):
        return None
    return replace(
        outage,
        owed=tuple(replace(o, taken_at=now) if o.same(owed) else o for o in outage.owed),
    )


def sent(outage: Outage, owed: Owed, waiting: int | None) -> Outage | None:
    """The record once ``owed`` went out (None: it was no longer owed: another sender's).
    An outage alert's count of orders held is kept for the dashboard."""
    if not any(o.same(owed) for o in outage.owed):
        return None
    changed = replace(outage, owed=tuple(o for o in outage.owed if not o.same(owed)))
    if owed.kind == OUTAGE and outage.since == owed.since:
        changed = replace(changed, waiting=waiting)
        if not outage.failing and changed.past and changed.past[0].since == owed.since:
            first = replace(changed.past[0], waiting=waiting)
            changed = replace(changed, past=(first, *changed.past[1:]))
    return changed


# --- the gentle release --------------------------------------------------------------------


def ramp_cap(limits: Limits) -> float:
    """Where the ramp ends: the agent's rate limit, else ``RAMP_CALLS_PER_SLOT`` calls a
    second per concurrency slot."""
    if limits.rate is not None:
        return limits.rate
    return min(MAX_RATE, float(RAMP_CALLS_PER_SLOT * limits.concurrency))


def ramp_end(limits: Limits, released_at: datetime) -> datetime:
    cap = max(ramp_cap(limits), RAMP_START)
    return released_at + RAMP_DOUBLING * math.log2(cap / RAMP_START)


def ramp_rate(limits: Limits, released_at: datetime | None, now: datetime) -> float | None:
    """The call rate in force at ``now`` (calls a second, per instance; None: no limit):
    ``min(limit, 2^(t / RAMP_DOUBLING))`` for ``t`` seconds since the release, and the
    agent's own rate once that reaches its limits."""
    if released_at is None or now >= ramp_end(limits, released_at):
        return limits.rate
    elapsed = max((now - released_at) / RAMP_DOUBLING, 0.0)
    return RAMP_START * 2**elapsed


def ramp_rate_at(elapsed: float) -> float:
    """Calls a second the ramp allows ``elapsed`` seconds after the release (no cap)."""
    d = RAMP_DOUBLING.total_seconds()
    return float(RAMP_START * 2 ** (min(max(elapsed, 0.0), _RAMP_MAX_SECONDS) / d))


def ramp_calls(elapsed: float) -> float:
    """Calls the ramp allows in the ``elapsed`` seconds since the release (the first at
    once): ``1 + ∫ 2^(s/d) ds``, for ``d`` = ``RAMP_DOUBLING``."""
    d = RAMP_DOUBLING.total_seconds()
    grown = 2 ** (min(max(elapsed, 0.0), _RAMP_MAX_SECONDS) / d)
    return 1.0 + RAMP_START * d / math.log(2) * (grown - 1.0)


def ramp_call_at(call: float) -> float:
    """Seconds after the release when the ramp allows its ``call``-th call (from 1): the
    inverse of ``ramp_calls``."""
    d = RAMP_DOUBLING.total_seconds()
    return d * math.log2(1.0 + max(call - 1.0, 0.0) * math.log(2) / (RAMP_START * d))


def spread(key: str, at: datetime, over: timedelta = RAMP_DOUBLING) -> datetime:
    """``at``, or up to ``over`` later, the same for a key every time: orders told to come
    back during the ramp do not all come in the same instant (as ``agents.health`` spreads
    the breaker's returns)."""
    return at + over * (zlib.crc32(key.encode()) / 2**32)
