"""Rows written before typed attempt state: rebuild it from the step's history, once, when
the row is read (the next save writes ``AttemptState``; nothing else changes).

Those versions kept the decision state in ``MaybeApplied`` (the attempts that may have
applied) and ``Deferrals``/``DeferredSince``/``SingledOut``, and read everything else
from ``History``. The rebuild replays the history with the event names of
``core.history`` and takes ``MaybeApplied`` as the authority on doubt: an attempt it
names stays in doubt even when its history entry was truncated away (folded), and an
ended attempt it does not name had its doubt settled then. This is the only place
outside people-facing views that reads a history to decide anything.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from core.attempts import Attempt, AttemptLog, GaveUp
from core.history import Happened
from core.outcome import Applied, Outcome
from core.states import StepState
from core.steps import StepRecord
from core.timefmt import parse_iso

_ENDINGS = {
    Happened.SUCCEEDED: Outcome.SUCCEEDED,
    Happened.REFUSED: Outcome.REFUSED,
    Happened.TRANSIENT: Outcome.TRANSIENT,
    Happened.DEFERRED: Outcome.DEFERRED,
    Happened.EXPIRED: Outcome.EXPIRED,
}
_COUNTED = (Outcome.REFUSED, Outcome.TRANSIENT, Outcome.EXPIRED)
MIGRATED = "settled before typed attempt state (not in MaybeApplied)"


def _time(value: Any) -> datetime | None:
    try:
        return parse_iso(value) if isinstance(value, str) else None
    except ValueError:
        return None


def rebuild(step: StepRecord, maybe_applied: list[int]) -> None:
    """Fill ``step``'s typed decision state from its history and ``MaybeApplied``."""
    attempts, budget_since, gave_up, undone_by = _replay(step)
    doubt = set(maybe_applied)
    for attempt in attempts.values():
        if attempt.number in doubt and not attempt.applied.doubtful:
            attempt.applied = Applied.MAYBE
        elif attempt.number not in doubt and attempt.doubtful and attempt.ending is not None:
            attempt.settled_by = MIGRATED
    if step.process_state is StepState.PROCESSING and step.attempt and step.attempt not in attempts:
        attempts[step.attempt] = Attempt(
            step.attempt,
            step.complete_by - timedelta(seconds=step.timeout_seconds),
            step.complete_by,
            step.locked_by,
        )
    log = AttemptLog(
        items=[attempts[n] for n in sorted(attempts)],
        compacted=sum(1 for n in range(1, step.attempt + 1) if n not in attempts),
        folded_doubt=sorted(n for n in doubt if n not in attempts),
    )
    log.compact()
    step.attempts = log
    step.budget_since = budget_since
    step.gave_up = gave_up if step.process_state is StepState.ERROR else None
    step.undone_by = undone_by if step.process_state is StepState.COMPENSATED else None


def _replay(
    step: StepRecord,
) -> tuple[dict[int, Attempt], datetime | None, GaveUp | None, str | None]:
    """The attempts, the budget's start, the final failure and the undoing compensation,
    as the history tells them."""
    attempts: dict[int, Attempt] = {}
    budget_since: datetime | None = None
    gave_up: GaveUp | None = None
    undone_by: str | None = None
    last_expiry: int | None = None  # an expiry with no claim since
    for entry in step.history:
        at = _time(entry.get("at"))
        number = entry.get("attempt")
        try:
            event = Happened(str(entry.get("event")))
        except ValueError:
            continue
        if at is None:
            continue
        attempt = attempts.get(number) if isinstance(number, int) else None
        if event is Happened.CLAIMED and isinstance(number, int):
            deadline = _time(entry.get("completeBy")) or at + timedelta(
                seconds=step.timeout_seconds
            )
            attempts[number] = Attempt(number, at, deadline, str(entry.get("instance") or ""))
            budget_since = budget_since or at
            last_expiry = None
        elif event in _ENDINGS and attempt is not None:
            ending = _ENDINGS[event]
            if attempt.ending is None:
                attempt.end(ending, at, entry.get("error") or entry.get("reason"))
            if ending is Outcome.SUCCEEDED:
                attempt.applied = Applied.YES
            elif ending is not Outcome.EXPIRED and entry.get("applied") in ("no", "maybe"):
                attempt.report(Applied(entry["applied"]))
            if ending in _COUNTED:
                attempt.counted = True
            last_expiry = attempt.number if ending is Outcome.EXPIRED else None
        elif event is Happened.LATE_REPORT and attempt is not None:
            if entry.get("applied") in ("no", "maybe"):
                attempt.report(Applied(entry["applied"]))
            if entry.get("refunded"):
                attempt.counted = False
        elif event is Happened.LATE_SUCCESS and attempt is not None:
            attempt.applied = Applied.YES
        elif event is Happened.RESUBMITTED:
            budget_since, gave_up = None, None
        elif event is Happened.ERROR and entry.get("reason") != "not applied after all":
            gave_up = GaveUp(at, entry.get("applied") == "maybe", last_expiry)
        elif event is Happened.ERROR and gave_up is not None:
            gave_up.ambiguous = False
        elif event is Happened.CANCELLED and gave_up is not None:
            gave_up.operator = str(entry.get("by") or "operator")
        elif event is Happened.COMPENSATED:
            undone_by = str(entry.get("by") or "") or None
    return attempts, budget_since, gave_up, undone_by
