"""What can happen to one record, whatever its kind: it succeeds, fails for good, is tried
again later, counts a failure, waits for its remote, waits for a paused agent, or stops.

Each move changes one record (and writes its history); none decides what the order does
next. That is ``core.course.advance``, which looks at every record after each
transition: a record's kind (``core.kinds``) and the evidence rules (``core.evidence``)
say what happened to a record, the course says what it means for the order.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from core.attempts import Attempt, GaveUp
from core.control_cache import hold_until
from core.history import Happened
from core.policy import RetryPolicy
from core.states import StepKind, StepState
from core.steps import StepRecord
from core.timefmt import iso

if TYPE_CHECKING:
    from core.model import Order

#: ``GaveUp.kind`` of a compensation whose step applied after it began (``overtaken``).
OVERTAKEN = "overtaken"


def complete(
    record: StepRecord,
    result: dict[str, Any],
    now: datetime,
    *,
    attempt: int | None = None,
    instance: str = "",
    late: bool = False,
) -> None:
    """The record succeeded with ``result``."""
    record.process_state = StepState.PROCESSED
    record.locked_by = ""
    record.waiting_for = None
    record.result = result
    record.last_error = None
    record.gave_up = None
    record.deferrals, record.deferred_since = 0, None
    record.record(
        now,
        Happened.SUCCEEDED,
        attempt=attempt,
        instance=instance or None,
        late=True if late else None,
    )


def fail(
    record: StepRecord,
    now: datetime,
    reason: str,
    ambiguous: bool,
    by_expiry_of: int | None = None,
) -> None:
    """The record will not be tried again: ``Error``, with its verdict (``ambiguous``: some
    attempt may have applied). What that means for the order is the course's decision,
    once nothing else of its group runs (``core.course``)."""
    record.process_state = StepState.ERROR
    record.locked_by = ""
    record.waiting_for = None
    record.gave_up = GaveUp(now, ambiguous, by_expiry_of, reason=reason)
    if not record.last_error:  # an event refused or not come, a function that raised
        record.last_error = reason
    record.record(
        now,
        Happened.ERROR,
        reason=reason,
        applied="maybe" if ambiguous else "no",
        failureCount=record.failure_count,
    )


def stop(record: StepRecord, now: datetime, note: str, *, cancelled: bool) -> None:
    """Stopped before it applied anything (its group failed, or the order was cancelled):
    nothing to undo. Stored ``Compensated`` with no ``undone_by`` (a stopped step)."""
    record.process_state = StepState.COMPENSATED
    record.locked_by = ""
    record.waiting_for = None
    record.record(now, Happened.CANCELLED if cancelled else Happened.HALTED, note=note)


def retry_at(
    order: Order, record: StepRecord, due: datetime, now: datetime, deferral: int | None = None
) -> None:
    """Pending again, to run at ``due``. A compensation whose step applied after it began
    is not retried under the same key (it may have answered for a state without the
    effect): it is overtaken, and an operator runs it again as a new effect."""
    if record.kind is StepKind.COMPENSATION:
        target = order.find(record.compensates or "")
        if target is not None and target.applied_after_undo is not None:
            overtaken(order, record, now)
            return
    record.process_state = StepState.PENDING
    record.locked_by = ""
    record.waiting_for = None
    record.complete_by = due
    record.record(
        now,
        Happened.RETRY_SCHEDULED,
        notBefore=iso(due),
        failureCount=record.failure_count,
        deferral=deferral,
    )


def overtaken(order: Order, undo: StepRecord, now: datetime) -> None:
    """``undo``'s step applied after ``undo`` began: it may have missed that effect. The
    undo ends (``Error``, kind ``overtaken``) and its step is to be undone again; the
    course tells an operator once nothing else of the unwinding runs."""
    target = order.find(undo.compensates or "")
    assert target is not None and target.applied_after_undo is not None
    undo.process_state = StepState.ERROR
    undo.locked_by = ""
    undo.gave_up = GaveUp(now, False, kind=OVERTAKEN)
    target.process_state = StepState.COMPENSATING
    target.undone_by = None
    target.changed = True
    undo.record(now, Happened.ERROR, reason=f"{target.step} applied after this began", applied="no")
    order.note(now, Happened.OVERTAKEN, step=target.step, undo=undo.step)


def count_failure(
    order: Order,
    record: StepRecord,
    attempt: Attempt,
    now: datetime,
    policy: RetryPolicy,
    *,
    event: Happened,
    instance: str,
    error: str,
    reported: bool,
    blamed: bool = False,
    seen: datetime | None = None,
) -> None:
    """An attempt that reached for the remote and failed: ``FailureCount`` + 1, and the next
    attempt paced in time (docs/contracts.md §3.11). ``blamed``: the agent counted the
    failure as the order's own; ``seen``, when it saw the evidence that did (the blame
    ages from it, never from the order's own failures: ``StepRecord.single_out``)."""
    record.failure_count += 1
    attempt.counted = True
    record.deferrals, record.deferred_since = 0, None
    if blamed:
        record.single_out(seen, now)
    record.last_error = error
    record.record(
        now,
        event,
        attempt=attempt.number,
        instance=instance or None,
        error=error,
        applied=str(attempt.applied),
        failureCount=record.failure_count,
    )
    since = record.budget_since or attempt.claimed_at
    if policy.gives_up(record.failure_count):
        spent_at = policy.budget_floor(since, policy.max_failure_count, record.timeout_seconds)
        if now < spent_at:
            # The count is spent before the time is: the step stays Processing (its
            # attempt decided) and the supervisor makes it final at the floor.
            record.complete_by = max(record.complete_by, spent_at)
            record.record(now, Happened.GIVE_UP_HELD, until=iso(record.complete_by))
            return
        record.locked_by = ""
        fail(
            record,
            now,
            f"{record.step} failed in {record.failure_count} attempts (last: {error})",
            record.may_have_applied,
            by_expiry_of=attempt.number if event is Happened.EXPIRED else None,
        )
        return
    record.locked_by = ""
    wait = (policy.paced if reported else policy.backoff)(record.failure_count, order.order_id)
    floor = policy.budget_floor(since, record.failure_count, record.timeout_seconds)
    retry_at(order, record, max(now + wait, floor), now)


def defer(
    order: Order,
    record: StepRecord,
    now: datetime,
    policy: RetryPolicy,
    not_before: datetime | None,
    why: str,
    *,
    cause: str = "could not reach its service",
) -> None:
    """Not called (or the remote is down for everyone, or the request never left): wait,
    without a failure, at most for the deferral window."""
    record.deferrals += 1
    if record.deferred_since is None:
        record.deferred_since = now
    window_end = record.deferred_since + policy.deferral_window
    if now >= window_end:
        waited = int((now - record.deferred_since).total_seconds())
        fail(
            record,
            now,
            f"{record.step} {cause} for {waited} s (the deferral window; last: {why})",
            record.may_have_applied,
        )
    elif not_before is not None and not_before > window_end:
        fail(
            record,
            now,
            f"{record.step}'s service asked not to be called before {iso(not_before)}, past "
            f"the deferral window (it ends {iso(window_end)}; last: {why})",
            record.may_have_applied,
        )
    else:
        due = max(not_before or now, now + policy.deferral_delay(record.deferrals, order.order_id))
        retry_at(order, record, due, now, deferral=record.deferrals)


def hold(record: StepRecord, agent: str, now: datetime, until: datetime) -> None:
    """Pending because an operator paused its agent: not a deferral (no window spent), and
    a resume ends it at once."""
    if record.paused_for != agent:
        record.paused_for, record.paused_since = agent, now
        record.record(now, Happened.AGENT_PAUSED, agent=agent, until=iso(until))
    record.process_state = StepState.PENDING
    record.locked_by = ""
    record.complete_by = until
    record.changed = True


def hold_paused(
    order: Order, record: StepRecord, now: datetime, not_before: datetime | None
) -> None:
    """A deferral because the agent is paused: the step waits for the resume, not for the
    remote, so none of its deferral window is spent (a pause may last any time)."""
    until = max(not_before or now, hold_until(now, record.paused_since))
    hold(record, order.plan.agent_of(record.step), now, until)


def restart(record: StepRecord, now: datetime) -> None:
    """Back to work with a fresh failure budget (a resubmit): Pending, due now. What its
    functions decided stands (a wait starts over in its kind's ``start``)."""
    record.reset_for_retry()
    record.process_state = StepState.PENDING
    record.complete_by = now
    record.waiting_for = None
    record.changed = True


def not_before_undo(record: StepRecord, grace: timedelta) -> datetime:
    """When an undo of ``record`` may start: after every call of it can no longer run, on
    any instance's clock (its attempts' reach), plus ``grace``."""
    return record.last_deadline() + grace


def withdraw_undo(order: Order, undo: StepRecord, now: datetime, why: str) -> None:
    """A compensation begun but never sent (no attempt) while a doubt came back about a
    step that cannot be undone: it is not sent around the doubt (docs/contracts.md §3.15).
    Stopped, and its step back where it stood (succeeded, or failed for good as may have
    applied): a resubmit, once the doubt is settled, begins it again."""
    stop(undo, now, f"{undo.step} was not sent: {why}", cancelled=False)
    target = order.find(undo.compensates or "")
    if target is not None and target.process_state is StepState.COMPENSATING:
        target.process_state = (
            StepState.ERROR if target.gave_up is not None else StepState.PROCESSED
        )
        target.changed = True
        target.record(
            now, Happened.UNDO_WITHDRAWN, by=undo.step, back=str(target.process_state), why=why
        )
