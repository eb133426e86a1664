"""What each attempt of a step did, as typed state: the facts every decision reads
(docs/contracts.md §3.11, "decisions read state, not the log").

One ``Attempt`` per claim: when it was claimed and by whom, its deadline, whether its
request left, how it ended for the step, and what is known of its effect:

- ``Applied.UNKNOWN``: no report yet (in flight, or expired with no report). For a
  verdict it counts as "may have applied"; the first report replaces it.
- ``Applied.NO``: a report says no try of it can have applied.
- ``Applied.MAYBE``: a report says a try may have reached the remote.
- ``Applied.YES``: the remote answered success.

Evidence only grows: once a report says MAYBE, a later report that says NO (another
copy of the same attempt, run after a redelivery) does not take it back. Only the
remote's own answer for the same idempotency key settles a doubt — a success, or a
refusal after it looked the key up (400, 422: ``settle``) — or an operator's statement
that the step did not happen. Settling never reaches an attempt whose Python handler
still runs (``running``: each run of it that reported, until when; a run's own end
report removes it, any other report only ever extends it).

Bounded (``AttemptLog.MAX_KEPT``): attempts are bounded by ``MAX_FAILURE_COUNT`` plus
deferrals, and deferrals repeat. Quiet attempts — ended, not counted, known to have
applied nothing — are compacted beyond the last ``QUIET_KEPT`` (only their number is
kept, in ``compacted``): a later report for one is read as for an attempt that applied
nothing. Past ``MAX_KEPT`` entries the oldest are folded: their number is kept in
``folded_doubt`` if they carried doubt, so no doubt is ever lost, only detail.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final

from core.outcome import Applied, Outcome
from core.text import visible
from core.timefmt import iso_exact, parse_iso

#: Characters of an attempt's error kept in its record (the history has more).
ERROR_CHARS: Final = 160


_STRENGTH: Final = {Applied.NO: 0, Applied.MAYBE: 1, Applied.YES: 2}


@dataclass
class Attempt:
    number: int
    claimed_at: datetime
    deadline: datetime
    instance: str = ""
    ending: Outcome | None = None
    ended_at: datetime | None = None
    applied: Applied = Applied.UNKNOWN
    #: agent reports received for it (several copies of one attempt may report)
    reports: int = 0
    #: counted in FailureCount (a late deferral gives the count back)
    counted: bool = False
    #: who settled its doubt: the remote's answer on a later attempt, or an operator
    settled_by: str | None = None
    #: Python handler runs of this attempt that reported they run on: runner -> until
    running: dict[str, datetime] = field(default_factory=dict)
    sent: bool = True
    error: str | None = None
    #: For a step that completes on an event: the remote answered 2xx, accepting the work
    #: (it may apply from then on; the event says when it did).
    accepted: bool = False
    #: Storage queues only (no duplicate detection): the message id of the request copy an
    #: agent took this attempt with; another copy of the same attempt calls nothing
    #: (``Order.take``). The same copy redelivered may call again.
    taken_by: str = ""
    #: How far apart the instances' clocks may be (``MAX_CLOCK_SKEW_SECONDS`` when it was
    #: claimed): a call of this attempt may still run until ``deadline + skew`` as another
    #: instance's clock reads it, and a handler run until its ``running`` time + skew.
    skew_seconds: float = 0.0
    #: The key round it ran under (``StepRecord.key_round``): a run of the step; what
    #: answers one run never settles another (docs/contracts.md §3.15).
    key_round: int = 1
    #: Its token binds the order and the run as well as the attempt (claimed since runs
    #: were bound: ``core.steps.StepRecord.token_for``).
    bound: bool = False

    @property
    def skew(self) -> timedelta:
        return timedelta(seconds=self.skew_seconds)

    @property
    def reach(self) -> datetime:
        """Until when, on any instance's clock, a call of this attempt may still run: its
        deadline (no agent calls after it, on the agent's own clock) or its handler runs'
        reported ends, plus the allowed skew."""
        return max([self.deadline, *self.running.values()]) + self.skew

    @property
    def in_flight(self) -> bool:
        return self.ending is None

    @property
    def doubtful(self) -> bool:
        """It may have applied with nothing to settle it: decided so, or accepted by a
        remote that calls back (it may apply from then on); another attempt in flight is
        not yet either."""
        return (
            (not self.in_flight or self.accepted)
            and self.applied.doubtful
            and self.settled_by is None
        )

    @property
    def running_until(self) -> datetime | None:
        return max(self.running.values()) if self.running else None

    def running_at(self, now: datetime) -> bool:
        until = self.running_until
        return until is not None and until > now

    @property
    def quiet(self) -> bool:
        """Ended, not counted, applied nothing, nothing running: pure repetition."""
        return (
            self.ending is not None
            and self.ending is not Outcome.SUCCEEDED
            and not self.counted
            and self.applied is Applied.NO
            and not self.running
        )

    def end(self, ending: Outcome, now: datetime, error: str | None = None) -> None:
        self.ending = ending
        self.ended_at = now
        if error:
            self.error = visible(error[:ERROR_CHARS])

    def report(
        self,
        applied: Applied,
        running_until: datetime | None = None,
        runner: str = "",
        run_ended: bool = False,
    ) -> bool:
        """Merge one agent report; True if it changed what is known. ``runner`` names the
        Python handler run the report speaks for: ``running_until`` extends its hold (a
        late or duplicate report never shortens it), ``run_ended`` removes it; a report
        without either leaves the runs as they are."""
        before = (self.applied, self.settled_by, dict(self.running))
        self.reports += 1
        if self.applied is Applied.UNKNOWN or _STRENGTH.get(applied, 0) > _STRENGTH[self.applied]:
            self.applied = applied
        if applied is Applied.MAYBE and self.settled_by is not None:
            # New evidence after a settlement: the doubt is back (conservative: the
            # report may come from a copy that ran after the settling answer).
            self.settled_by = None
        if run_ended:
            self.running.pop(runner, None)
        elif running_until is not None:
            held = self.running.get(runner)
            self.running[runner] = running_until if held is None else max(held, running_until)
        return (self.applied, self.settled_by, self.running) != before

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "n": self.number,
            "claimedAt": iso_exact(self.claimed_at),
            "deadline": iso_exact(self.deadline),
            "applied": str(self.applied),
        }
        if self.instance:
            out["instance"] = self.instance
        if self.ending is not None:
            out["ending"] = str(self.ending)
        if self.ended_at is not None:
            out["endedAt"] = iso_exact(self.ended_at)
        if self.reports:
            out["reports"] = self.reports
        if self.counted:
            out["counted"] = True
        if self.settled_by:
            out["settledBy"] = self.settled_by
        if self.running:
            out["running"] = {k: iso_exact(v) for k, v in sorted(self.running.items())}
        if not self.sent:
            out["sent"] = False
        if self.error:
            out["error"] = self.error
        if self.skew_seconds:
            out["skew"] = self.skew_seconds
        if self.accepted:
            out["accepted"] = True
        if self.taken_by:
            out["takenBy"] = self.taken_by
        if self.key_round != 1:
            out["round"] = self.key_round
        if self.bound:
            out["bound"] = True
        return out

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Attempt:
        ending = value.get("ending")
        ended = value.get("endedAt")
        return cls(
            number=int(value["n"]),
            claimed_at=parse_iso(value["claimedAt"]),
            deadline=parse_iso(value["deadline"]),
            instance=str(value.get("instance", "")),
            ending=Outcome(ending) if ending else None,
            ended_at=parse_iso(ended) if ended else None,
            applied=Applied(value.get("applied", "unknown")),
            reports=int(value.get("reports", 0)),
            counted=bool(value.get("counted", False)),
            settled_by=value.get("settledBy") or None,
            running={str(k): parse_iso(v) for k, v in (value.get("running") or {}).items()},
            sent=bool(value.get("sent", True)),
            error=value.get("error") or None,
            skew_seconds=float(value.get("skew", 0.0)),
            accepted=bool(value.get("accepted", False)),
            taken_by=str(value.get("takenBy") or ""),
            key_round=int(value.get("round", 1)),
            bound=bool(value.get("bound", False)),
        )


@dataclass
class GaveUp:
    """The step failed for good: when, with what verdict, and what decided it."""

    at: datetime
    ambiguous: bool
    #: the attempt whose expiry made it final (a late report of it may undo that)
    by_expiry_of: int | None = None
    #: an operator acted on this failure since (a cancel that left the step as it is)
    operator: str | None = None
    #: why, where it is not the attempts' own failure: ``"overtaken"`` for a compensation
    #: whose step applied after it began (its next run is a new effect, with a new key)
    kind: str = ""
    #: the sentence that says why it failed (an alert is built from it when the step's
    #: group is decided: the other steps of a ``Parallel`` finish first)
    reason: str = ""

    def __post_init__(self) -> None:
        self.reason = visible(self.reason)  # it quotes outside text (a remote's answer)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": iso_exact(self.at), "ambiguous": self.ambiguous}
        if self.kind:
            out["kind"] = self.kind
        if self.reason:
            out["reason"] = self.reason[:2000]
        if self.by_expiry_of is not None:
            out["byExpiryOf"] = self.by_expiry_of
        if self.operator:
            out["operator"] = self.operator
        return out

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> GaveUp:
        expiry = value.get("byExpiryOf")
        return cls(
            at=parse_iso(value["at"]),
            ambiguous=bool(value["ambiguous"]),
            by_expiry_of=int(expiry) if expiry is not None else None,
            operator=value.get("operator") or None,
            kind=str(value.get("kind") or ""),
            reason=str(value.get("reason") or ""),
        )


@dataclass
class AttemptLog:
    """A step's attempts, bounded (see the module's docstring)."""

    QUIET_KEPT: ClassVar[int] = 5
    MAX_KEPT: ClassVar[int] = 64

    items: list[Attempt] = field(default_factory=list)
    compacted: int = 0
    folded_doubt: list[int] = field(default_factory=list)

    def get(self, number: int) -> Attempt | None:
        for attempt in reversed(self.items):
            if attempt.number == number:
                return attempt
        return None

    @property
    def latest(self) -> Attempt | None:
        return self.items[-1] if self.items else None

    def add(self, attempt: Attempt) -> None:
        self.items.append(attempt)
        self.compact()

    def compact(self) -> None:
        quiet = [a for a in self.items[:-1] if a.quiet]
        for attempt in quiet[: max(len(quiet) - self.QUIET_KEPT, 0)]:
            self.items.remove(attempt)
            self.compacted += 1
        while len(self.items) > self.MAX_KEPT:
            # The oldest that only carries doubt (one in flight, still running or known
            # applied keeps its detail).
            foldable = [
                a
                for a in self.items[:-1]
                if not a.in_flight and not a.running and a.applied is not Applied.YES
            ]
            if not foldable:
                break
            oldest = foldable[0]
            self.items.remove(oldest)
            self.compacted += 1
            if oldest.doubtful and oldest.number not in self.folded_doubt:
                self.folded_doubt = sorted([*self.folded_doubt, oldest.number])

    # --- doubt ---------------------------------------------------------------------

    def doubtful(self) -> list[int]:
        """The attempts that may have applied, with nothing to settle it."""
        numbers = set(self.folded_doubt) | {a.number for a in self.items if a.doubtful}
        return sorted(numbers)

    @property
    def in_doubt(self) -> bool:
        return bool(self.folded_doubt) or any(a.doubtful for a in self.items)

    @property
    def applied(self) -> bool:
        return any(a.applied is Applied.YES for a in self.items)

    def applied_in(self, key_round: int) -> bool:
        """Whether an attempt of run ``key_round`` is known to have applied."""
        return any(a.applied is Applied.YES and a.key_round == key_round for a in self.items)

    def fold_doubt(self, number: int) -> bool:
        """Doubt for an attempt no longer kept in detail; True if it is new."""
        if number in self.folded_doubt:
            return False
        self.folded_doubt = sorted([*self.folded_doubt, number])
        return True

    def settle(
        self, by: str, now: datetime, before: int | None = None, key_round: int | None = None
    ) -> list[int]:
        """Settle the doubt of the attempts before ``before`` (all if None), of the run
        ``key_round`` (any if None), whose handler is not running; returns those settled."""
        settled: list[int] = []
        for attempt in self.items:
            if key_round is not None and attempt.key_round != key_round:
                continue
            if (before is None or attempt.number < before) and attempt.doubtful:
                if attempt.running_at(now):
                    continue
                attempt.settled_by = by
                settled.append(attempt.number)
        kept = [n for n in self.folded_doubt if before is not None and n >= before]
        settled += [n for n in self.folded_doubt if n not in kept]
        self.folded_doubt = kept
        return sorted(settled)

    def running_until(self, now: datetime) -> datetime | None:
        """The latest time a handler of any attempt is known to run until (if after now)."""
        times = [a.running_until for a in self.items if a.running_at(now)]
        return max(times) if times else None  # type: ignore[type-var]

    def last_deadline(self) -> datetime | None:
        """After this, no call of any attempt can still be running (as far as is known), on
        any instance's clock: each attempt's ``reach``."""
        times = [a.reach for a in self.items]
        return max(times) if times else None

    # --- storage ---------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"items": [a.to_json() for a in self.items]}
        if self.compacted:
            out["compacted"] = self.compacted
        if self.folded_doubt:
            out["foldedDoubt"] = self.folded_doubt
        return out

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> AttemptLog:
        return cls(
            items=[Attempt.from_json(a) for a in value.get("items", [])],
            compacted=int(value.get("compacted", 0)),
            folded_doubt=sorted(int(n) for n in value.get("foldedDoubt", [])),
        )
