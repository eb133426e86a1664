"""One step's state record (docs/contracts.md §3.2) and its typed decision state.

The contract's fields (``LockedBy``, ``CompleteBy``, ``ProcessState``, ``FailureCount``,
``Attempt``) and what decisions need besides them: the attempts (``core.attempts``),
the deferral streak, the start of the failure budget, and the final failure's verdict.
The history is for people (``record``): bounded, and never read by a decision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from core.attempts import Attempt, AttemptLog, GaveUp
from core.events import Event
from core.states import StepKind, StepState
from core.timefmt import iso, iso_exact, parse_iso

MAX_HISTORY: Final = 100


@dataclass
class StepRecord:
    order_id: str
    step: str
    seq: int
    kind: StepKind
    path: str
    timeout_seconds: int
    process_state: StepState
    locked_by: str
    complete_by: datetime
    failure_count: int = 0
    attempt: int = 0
    compensates: str | None = None
    result: dict[str, Any] | None = None
    last_error: str | None = None
    attempts: AttemptLog = field(default_factory=AttemptLog)
    #: Deferrals in a row (the remote not called or down for everyone) and since when.
    deferrals: int = 0
    deferred_since: datetime | None = None
    #: An attempt failed while the remote served other orders: its failures are its own.
    singled_out: bool = False
    #: When the first attempt since the failure count was last reset began (the time
    #: budget of docs/contracts.md §3.11 counts from it).
    budget_since: datetime | None = None
    #: Set when the step failed for good (cleared by a resubmit or a resolution).
    gave_up: GaveUp | None = None
    #: For an action: the compensation that undid it (it is then Compensated).
    undone_by: str | None = None
    #: Pending because an operator paused this agent (``core.controls``), since then: the
    #: wait is not a deferral (no window spent) and a resume ends it at once.
    paused_for: str = ""
    paused_since: datetime | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    history_dropped: int = 0
    etag: str | None = None
    changed: bool = False

    def record(self, now: datetime, event: Event, **details: Any) -> None:
        entry: dict[str, Any] = {"at": iso(now), "event": str(event)}
        entry.update({k: v for k, v in details.items() if v is not None})
        self.history.append(entry)
        if len(self.history) > MAX_HISTORY:
            # Keep the first entry (how it began) and the most recent ones.
            drop = len(self.history) - MAX_HISTORY
            self.history = self.history[:1] + self.history[1 + drop :]
            self.history_dropped += drop
        self.changed = True

    @property
    def not_before(self) -> datetime:
        """For a Pending step: the time it may run. The state record keeps it in
        ``CompleteBy`` (docs/contracts.md §3.2 has one time field: the deadline while
        Processing, the earliest start while Pending)."""
        return self.complete_by

    @property
    def is_active(self) -> bool:
        return self.process_state in (StepState.PENDING, StepState.PROCESSING)

    @property
    def current(self) -> Attempt | None:
        """The latest attempt, if it is still kept."""
        return self.attempts.get(self.attempt) if self.attempt else None

    @property
    def may_have_applied(self) -> bool:
        """Some attempt may have applied and nothing settled it (docs/contracts.md §3.11)."""
        return self.attempts.in_doubt

    @property
    def maybe_applied(self) -> list[int]:
        """The attempts that may have applied, unsettled (for people and tests)."""
        return self.attempts.doubtful()

    @property
    def held(self) -> bool:
        """Processing with its latest attempt already decided: the last counted failure
        came before the step's time budget was spent; the supervisor makes it final."""
        current = self.current
        return (
            self.process_state is StepState.PROCESSING
            and current is not None
            and not current.in_flight
        )

    def last_deadline(self) -> datetime:
        """After this none of its calls can be running, as far as is known: the latest
        deadline, or a Python handler's reported run, whichever is later."""
        return self.attempts.last_deadline() or self.complete_by

    def end_pause(self, now: datetime, why: str) -> None:
        """The wait for the agent's pause is over: a deferral streak that it interrupted
        goes on as if the pause had not been (the pause spends none of its window)."""
        if not self.paused_for:
            return
        since = self.paused_since or now
        if self.deferred_since is not None and since >= self.deferred_since:
            self.deferred_since = min(self.deferred_since + (now - since), now)
        self.record(now, Event.PAUSE_OVER, agent=self.paused_for, since=iso(since), why=why)
        self.paused_for, self.paused_since = "", None

    def reset_for_retry(self) -> None:
        self.failure_count = 0
        self.deferrals = 0
        self.deferred_since = None
        self.singled_out = False
        self.budget_since = None
        self.gave_up = None
        self.locked_by = ""

    # --- storage of the typed state ---------------------------------------------------

    def decision_state(self) -> dict[str, Any]:
        """What decisions read besides the contract's fields, as one JSON object."""
        out: dict[str, Any] = {"attempts": self.attempts.to_json()}
        if self.budget_since is not None:
            out["budgetSince"] = iso_exact(self.budget_since)
        if self.gave_up is not None:
            out["gaveUp"] = self.gave_up.to_json()
        if self.undone_by:
            out["undoneBy"] = self.undone_by
        if self.paused_for:
            out["pausedFor"] = self.paused_for
            if self.paused_since is not None:
                out["pausedSince"] = iso_exact(self.paused_since)
        return out

    def load_decision_state(self, value: dict[str, Any]) -> None:
        """The inverse of ``decision_state`` (the store reads it back)."""
        self.attempts = AttemptLog.from_json(value.get("attempts", {}))
        since = value.get("budgetSince")
        self.budget_since = parse_iso(since) if since else None
        gave_up = value.get("gaveUp")
        self.gave_up = GaveUp.from_json(gave_up) if gave_up else None
        self.undone_by = value.get("undoneBy") or None
        self.paused_for = str(value.get("pausedFor") or "")
        since = value.get("pausedSince")
        self.paused_since = parse_iso(since) if since else None
