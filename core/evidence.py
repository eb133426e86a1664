"""Evidence: what a report says a step's key did, whenever and however it arrives
(docs/contracts.md §3.11, §3.15).

- **A success is evidence**, late or not, by a 2xx reply or by a callback's ``result``:
  it completes an active step; it settles a step that failed for good; a step that
  unwinds or was stopped turns out to have applied, so it is undone (or, without a
  compensation, its effect stands and is told); and a success that lands after its
  step's undo began may have been missed by that undo: the order is ``error`` with an
  alert, and a resubmit runs the undo again as a new effect (``applied_after_undo``).
- **Doubt is kept until the remote settles it**: a report that says an attempt may have
  applied counts whichever copy sends it and whenever it arrives; only a success, the
  service's own refusal after looking the key up, or an operator's statement settles it.
- **A report that adds no evidence of an effect changes nothing on a step that has
  ended**: a late deferral or "not called" is noted, never a reason to run the step
  again; the first report of an attempt may still say what that attempt did (an expiry
  assumed it may have applied).

Each function changes records; ``core.course.advance`` (called by the order after it)
decides what that means for the order.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from core import moves
from core.attempts import Attempt
from core.course import doubtful, enter, lands_in
from core.errors import TransitionRefused
from core.history import Happened
from core.kinds import CALLBACK, begin, kind_of
from core.messages import AgentReply, idempotency_key
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.telling import in_doubt, tell_overtaken
from core.timefmt import iso

if TYPE_CHECKING:
    from core.model import Order


class ReplyEffect(StrEnum):
    """What applying a reply did (a reply that changes nothing raises TransitionRefused)."""

    APPLIED = "applied"  # it decided the step's attempt
    NOTED = "noted"  # late evidence: recorded (and maybe acted on), the step had moved on


def applied_of(reply: AgentReply) -> Applied:
    """What a report says of its attempt's effect."""
    if reply.outcome is Outcome.SUCCEEDED:
        return Applied.YES
    return Applied.MAYBE if reply.may_have_applied else Applied.NO


#: States of an action whose undo has been started.
_UNDONE = frozenset({StepState.COMPENSATING, StepState.COMPENSATED})


# --- a success ----------------------------------------------------------------------------------


def success_reply(
    order: Order, record: StepRecord, attempt: Attempt | None, reply: AgentReply, now: datetime
) -> ReplyEffect:
    """A 2xx reply (or a Python handler's return), on time or not."""
    if attempt is not None and attempt.key_round < record.key_round:
        return _earlier_run(order, record, attempt, reply, now)
    planned = order.plan.planned(record.step) if record.kind is StepKind.ACTION else None
    if kind_of(record, planned) is CALLBACK:
        return _acceptance(order, record, attempt, reply, now)
    return success(
        order,
        record,
        attempt,
        reply.result or {},
        now,
        number=reply.attempt,
        answered_at=reply.answered_at,
        runner=reply.runner or "",
        run_ended=reply.run_ended,
    )


def success(
    order: Order,
    record: StepRecord,
    attempt: Attempt | None,
    result: dict[str, Any],
    now: datetime,
    *,
    number: int | None,
    answered_at: datetime | None,
    runner: str = "",
    run_ended: bool = False,
    by_callback: bool = False,
) -> ReplyEffect:
    """The key of ``record`` applied (``attempt``, if it names one; a callback names none:
    then its answer time is its arrival, the latest it can have applied)."""
    state = record.process_state
    undo = order.undo_of(record) if state in _UNDONE else None
    # A step already known applied has one effect, whichever attempt reports it (one
    # idempotency key): its undo began after it, so covers it.
    if undo is not None and not record.applied:
        _mark_applied(record, attempt, now, runner, run_ended, by_callback=by_callback)
        skew = attempt.skew if attempt is not None else _skew_of(record)
        answered = answered_at or now
        if undo.attempt == 0 or _before_undo(answered, undo, skew):
            # Its undo has not begun, or began after the effect existed: the undo covers
            # it. A handler that ran on has ended: the undo waits no longer.
            record.record(now, Happened.LATE_SUCCESS, attempt=number, note="being undone")
            hold_compensation(order, record, now)
            return ReplyEffect.NOTED
        _applied_after_undo(order, record, undo, result, answered, number, now)
        return ReplyEffect.NOTED
    if (
        state in (StepState.PROCESSED, StepState.COMPENSATING)
        or (state is StepState.COMPENSATED and record.undone_by is not None)
        or (state is StepState.COMPENSATED and record.kind is StepKind.COMPENSATION)
    ):
        raise order.refuse(
            "already-settled",
            f"success for attempt {number} but step {record.step} is {state}",
            record.step,
        )
    if attempt is not None and attempt.applied is Applied.YES and not record.is_active:
        raise order.refuse("already-settled", f"success for attempt {number} was noted before")
    on_time = (
        state is StepState.PROCESSING
        and attempt is not None
        and record.attempt == attempt.number
        and attempt.in_flight
        and now < record.complete_by
    )
    _mark_applied(record, attempt, now, runner, run_ended, by_callback=by_callback)
    if record.gave_up is not None and record.gave_up.kind == moves.OVERTAKEN:
        # An undo its step overtook: whatever it did, it may have missed the effect; it
        # runs again as a new effect (the operator was told). Kept as evidence, no more.
        record.record(now, Happened.LATE_SUCCESS, attempt=number, note="overtaken by its step")
        return ReplyEffect.NOTED
    if record.is_active:
        instance = record.locked_by
        moves.complete(record, result, now, attempt=number, instance=instance, late=not on_time)
        return ReplyEffect.APPLIED if on_time else ReplyEffect.NOTED
    _ended_applied(order, record, result, number, now)
    return ReplyEffect.NOTED


def _earlier_run(
    order: Order, record: StepRecord, attempt: Attempt, reply: AgentReply, now: datetime
) -> ReplyEffect:
    """A success for an attempt of an earlier run (a fix ran the step again under a new key,
    on the word that the earlier key had not applied): the evidence is kept on that
    attempt and told, never applied to the new run (docs/contracts.md §3.15, "an answer
    belongs to its run")."""
    if attempt.applied is Applied.YES:
        raise stale(order, record, reply)
    attempt.report(Applied.YES, None, reply.runner or "", reply.run_ended)
    if attempt.in_flight:
        attempt.end(Outcome.SUCCEEDED, now)
    old = idempotency_key(order.order_id, record.step, attempt.key_round)
    new = idempotency_key(order.order_id, record.step, record.key_round)
    record.record(
        now,
        Happened.LATE_SUCCESS,
        attempt=attempt.number,
        note=f"for run {attempt.key_round} ({old}), which a fix replaced: not applied to run "
        f"{record.key_round}",
    )
    order.alert(
        record,
        f"{record.step} reported success for attempt {attempt.number} under {old}, after a fix "
        f"ran it again under {new} on the word that {old} had not applied: both may have "
        f"applied. Ask its service about {old}, and undo it by hand if it stands",
        now,
    )
    return ReplyEffect.NOTED


def _mark_applied(
    record: StepRecord,
    attempt: Attempt | None,
    now: datetime,
    runner: str,
    run_ended: bool,
    *,
    by_callback: bool,
) -> None:
    if by_callback:
        # The remote's own word that the key's effect happened: every attempt it accepted
        # is it; none accepted (its 202 lost), those of the key that may have reached it
        # (one key, one effect), so that no doubt about the key outlives its answer.
        run = [a for a in record.attempts.items if a.key_round == record.key_round]
        for accepted in [a for a in run if a.accepted] or [
            a for a in run if a.applied is not Applied.NO
        ]:
            accepted.report(Applied.YES)
            if accepted.in_flight:
                accepted.end(Outcome.SUCCEEDED, now)
        return
    if attempt is not None:
        attempt.report(Applied.YES, None, runner, run_ended)
        if attempt.in_flight:
            attempt.end(Outcome.SUCCEEDED, now)


def _skew_of(record: StepRecord) -> timedelta:
    skews = [a.skew for a in record.attempts.items]
    return max(skews) if skews else timedelta(0)


def _before_undo(answered: datetime, undo: StepRecord, skew: timedelta) -> bool:
    """Whether the success existed before ``undo``'s first claim of this key round began, on
    every clock: then the undo's call met the effect."""
    began = undo.round_began()
    return began is not None and answered + skew < began


def _ended_applied(
    order: Order, record: StepRecord, result: dict[str, Any], number: int | None, now: datetime
) -> None:
    """A step that had ended (failed for good, or stopped) applied after all."""
    was_failed = record.process_state is StepState.ERROR and not record.continued
    record.gave_up = None
    record.continued = False
    record.process_state = StepState.PROCESSED
    record.result = result
    record.last_error = None
    record.locked_by = ""
    record.record(now, Happened.SUCCEEDED, attempt=number, late=True, note="applied after all")
    if record.kind is StepKind.COMPENSATION:
        # An undo that applied after all: its step is undone (one an operator said was
        # not needed, too).
        target = order.find(record.compensates or "")
        if (
            target is not None
            and order.undo_of(target) is record
            and target.process_state is StepState.COMPENSATED
            and target.undone_by is None
        ):
            target.undone_by = record.step
            target.record(now, Happened.COMPENSATED, by=record.step, late=True)
        if order.status is OrderStatus.ERROR and was_failed and not blockers(order):
            _resume(order, OrderStatus.COMPENSATING, record, now)
        return
    if order.status is OrderStatus.ERROR:
        if was_failed and not blockers(order):
            # An operator was told about this step, and the evidence settles it.
            resumed = OrderStatus.COMPENSATING if unwinding_began(order) else OrderStatus.PROCESSING
            _resume(order, resumed, record, now)
        return
    if order.status in (OrderStatus.COMPENSATED, OrderStatus.CANCELLED):
        # Unwound as if it had not applied: the unwinding is not over after all.
        order.note(
            now, Happened.RESOLVED, step=record.step, note="applied after the order was undone"
        )
        reopen(order, now)
    elif order.status in (OrderStatus.PENDING, OrderStatus.PROCESSING) and (
        not order.cancel_requested and record in order.group_records()
    ):
        # Its group halted because it failed: what that stopped runs after all.
        for stopped in order.group_records():
            if stopped.process_state is StepState.COMPENSATED and stopped.undone_by is None:
                moves.restart(stopped, now)
                begin(order, stopped, order.planned(stopped.step), now)


def _resume(order: Order, status: OrderStatus, record: StepRecord, now: datetime) -> None:
    """An order in ``error`` goes back to work on evidence, unless that would only bring it
    back to ``error`` in the same transition (the app would see it leave and come back):
    then it stays, quietly, and the decision is the operator's as before."""
    if lands_in(order, status, now) is OrderStatus.ERROR:
        return
    order.note(now, Happened.RESOLVED, step=record.step, note="a success arrived after it failed")
    order.unwound = False
    order.set_status(status, now)


def reopen(order: Order, now: datetime) -> None:
    """An order that ended ``compensated`` or ``cancelled`` has more to undo (or to tell):
    ``compensating`` again, or straight to ``error`` where that is where it would end now
    (no status it would leave in the same transition)."""
    order.unwound = False
    enter(order, OrderStatus.COMPENSATING, now)


def blockers(order: Order) -> list[StepRecord]:
    """What keeps an order in ``error``: a compensation that failed for good (unwinding),
    a step of the current group that did (going forward), or doubt."""
    if unwinding_began(order):
        failed = [u for u in order.latest_undos() if u.process_state is StepState.ERROR]
    else:
        failed = [
            r
            for r in order.group_records()
            if r.process_state is StepState.ERROR and not r.continued
        ]
    return failed + [r for r in doubtful(order) if r not in failed]


def unwinding_began(order: Order) -> bool:
    return any(s.kind is StepKind.COMPENSATION for s in order.steps)


def _acceptance(
    order: Order, record: StepRecord, attempt: Attempt | None, reply: AgentReply, now: datetime
) -> ReplyEffect:
    """A 2xx for a step that completes on an event: the remote accepted the work; it may
    apply from then on. An event that came first is taken now."""
    if attempt is None or attempt.accepted:
        raise stale(order, record, reply)
    if CALLBACK.accepted(order, record, attempt, reply, now):
        name = order.planned(record.step).completes_on
        assert name is not None
        order.take_kept_event(record, name, now)
        return ReplyEffect.APPLIED
    if not record.is_active and record.process_state is StepState.ERROR:
        new_doubt(order, record, reply.attempt, now)
    return ReplyEffect.NOTED


def _applied_after_undo(
    order: Order,
    record: StepRecord,
    undo: StepRecord,
    result: dict[str, Any],
    answered: datetime,
    number: int | None,
    now: datetime,
) -> None:
    """The worst news the order can get (docs/contracts.md §3.11): ``record`` applied after
    its undo began, so the undo may have missed it and its effect may stand. Never
    swallowed: once no attempt of the undo is in flight, the order is ``error`` with an
    alert that says what happened, and a resubmit runs the undo again as a new effect,
    with the key ``<orderId>:<undo>:<round>``."""
    record.applied_after_undo = answered
    record.result = result
    record.record(
        now,
        Happened.LATE_SUCCESS,
        attempt=number,
        answeredAt=iso(answered),
        note=f"applied after its undo {undo.step} began",
    )
    current = undo.current
    if undo.process_state is StepState.PROCESSING and current is not None and current.in_flight:
        return  # decided when the undo's attempt ends (``core.course``)
    moves.overtaken(order, undo, now)
    if order.status is OrderStatus.ERROR:
        tell_overtaken(order, undo, now)  # news for the operator already at the order
    elif order.status in (OrderStatus.COMPENSATED, OrderStatus.CANCELLED):
        reopen(order, now)  # told once the unwinding stops


def hold_compensation(order: Order, record: StepRecord, now: datetime) -> None:
    """A Python handler of ``record`` runs on (or has ended): its compensation, while
    Pending, waits until the handler can no longer be running (docs/contracts.md §3.11: no
    compensation of a step while its handler runs on a live instance). One already claimed
    cannot be stopped: the operator is told."""
    from core.course import IN_FLIGHT_GRACE

    if record.process_state is not StepState.COMPENSATING:
        return
    for undo in order.steps:
        if undo.kind is not StepKind.COMPENSATION or undo.compensates != record.step:
            continue
        running = record.attempts.running_until(now)
        if undo.process_state is StepState.PENDING:
            due = max(now, record.last_deadline() + IN_FLIGHT_GRACE)
            if due != undo.complete_by:
                undo.end_pause(now, "held for its step's handler")  # looked at when due
                undo.complete_by = due
                undo.record(now, Happened.RETRY_SCHEDULED, notBefore=iso(due), note="held")
        elif undo.process_state is StepState.PROCESSING and running is not None:
            order.alert(
                record,
                f"{record.step}'s handler reports it still runs (until {iso(running)}) while "
                f"its compensation {undo.step} is already running: check both when they end",
                now,
            )


# --- reports that come after their attempt was decided -------------------------------------------


def late_report(
    order: Order,
    record: StepRecord,
    attempt: Attempt | None,
    reply: AgentReply,
    now: datetime,
    policy: RetryPolicy,
) -> ReplyEffect:
    """A report (not a success) for an attempt already decided: by an earlier report, its
    expiry, or a failed send. A "maybe" is never dropped; the first report of an attempt
    that expired says what the expiry assumed (a "no" clears the doubt of no report; on a
    step still at work a deferral, unless a "maybe", also gives back the failure the
    expiry counted); on a step that has ended, nothing but evidence of an effect changes
    anything."""
    number = reply.attempt
    applied = applied_of(reply)
    if attempt is None:  # kept only as a number: it applied nothing, or was folded
        if applied is Applied.MAYBE and record.attempts.fold_doubt(number):
            note_report(record, reply, now)
            new_doubt(order, record, number, now)
            return ReplyEffect.NOTED
        raise stale(order, record, reply)
    was_in_doubt = in_doubt(record)
    first = attempt.reports == 0
    before = (attempt.applied, attempt.settled_by)
    running_before = dict(attempt.running)
    attempt.report(applied, reply.running_until, reply.runner or "", reply.run_ended)
    if reply.settled:
        # The service's own refusal of the key settles earlier attempts; a handler run's
        # refusal when it ends also settles its own attempt (nothing of it runs on).
        through = number + 1 if reply.run_ended and not attempt.running else number
        record.attempts.settle(
            f"the service refused attempt {number} after looking the key up "
            f"({(reply.error or '')[:120]})",
            now,
            before=through,
        )
    deferred = reply.outcome is Outcome.DEFERRED
    refunded = (
        first
        and record.is_active
        and attempt.ending is Outcome.EXPIRED
        and deferred
        # a deferral on a redelivery ("maybe": an earlier delivery may have called the
        # remote) does not say the attempt never reached for it: its failure stays counted
        and applied is not Applied.MAYBE
        and attempt.counted
        and record.failure_count > 0
        # counted in this budget (a resubmit since has reset the count)
        and (record.budget_since is None or attempt.claimed_at >= record.budget_since)
    )
    if refunded:
        attempt.counted = False
        record.failure_count -= 1
    evidence = (attempt.applied, attempt.settled_by) != before
    runs = attempt.running != running_before
    if not (evidence or refunded or first or runs):
        raise stale(order, record, reply)
    if evidence or refunded or first or reply.run_ended:
        note_report(record, reply, now, refunded=True if refunded else None)
    if runs:
        hold_compensation(order, record, now)
    if refunded and record.held and not policy.gives_up(record.failure_count):
        _unhold(order, record, attempt, now, policy)
        return ReplyEffect.NOTED
    if deferred and first and record.process_state is StepState.PENDING and reply.not_before:
        if record.complete_by < reply.not_before <= now + policy.deferral_window:
            moves.retry_at(order, record, reply.not_before, now)  # not before the time asked
        return ReplyEffect.NOTED
    if was_in_doubt and not in_doubt(record) and _told_in_doubt(order, record):
        _not_applied_after_all(order, record, number, now)
    elif not was_in_doubt and in_doubt(record):
        new_doubt(order, record, number, now)
    return ReplyEffect.NOTED


def _unhold(
    order: Order, record: StepRecord, attempt: Attempt, now: datetime, policy: RetryPolicy
) -> None:
    """Held at its last counted failure, and a failure given back: the count is not spent
    after all, so the step goes on (paced as after any counted failure)."""
    since = record.budget_since or attempt.claimed_at
    floor = policy.budget_floor(since, record.failure_count, record.timeout_seconds)
    wait = policy.paced(record.failure_count, order.order_id)
    record.record(now, Happened.RESOLVED, note="a late deferral: the count is not spent")
    moves.retry_at(order, record, max(now + wait, floor), now)


def stale(order: Order, record: StepRecord, reply: AgentReply) -> TransitionRefused:
    return order.refuse(
        "stale-attempt",
        f"{reply.outcome} report for attempt {reply.attempt} adds nothing: step "
        f"{record.step} is {record.process_state} on attempt {record.attempt}",
        record.step,
    )


def _told_in_doubt(order: Order, record: StepRecord) -> bool:
    """The step failed for good as "may have been applied" and an operator was told."""
    gave_up = record.gave_up
    return (
        gave_up is not None
        and gave_up.ambiguous
        and gave_up.operator is None
        and record.process_state is StepState.ERROR
        and not record.continued
        and order.status is OrderStatus.ERROR
    )


def _not_applied_after_all(order: Order, record: StepRecord, number: int, now: datetime) -> None:
    """It failed for good as "may have been applied"; its attempt's own report says it was
    not. Nothing is undone or run on that account: the operator, told, decides (cancel
    needs no statement for it now; a resubmit runs it again)."""
    if record.kind is not StepKind.ACTION:
        return
    if record.gave_up is not None:
        record.gave_up.ambiguous = False
    record.record(now, Happened.ERROR, reason="not applied after all", applied="no")
    order.note(now, Happened.RECLASSIFIED, step=record.step, note="not applied after all")
    late = f"{record.step} was not applied after all (a late report of attempt {number})"
    advice = (
        "cancel to undo the completed steps, or resubmit to run it again"
        if order.plan.compensates or order.cancel_requested
        else "it is safe to resubmit"
    )
    order.alert(record, f"update: {late}; {advice}", now)


def new_doubt(order: Order, record: StepRecord, number: int, now: datetime) -> None:
    """Evidence that the step may have applied, after decisions assumed it had not."""
    if record.is_active or record.kind is not StepKind.ACTION:
        return  # still running: its verdict will count it
    if record.applied:
        # One key, one effect, and it is known to have applied (and, if the step was
        # undone, undone): another attempt's "maybe" adds no doubt about anything.
        return
    key = idempotency_key(order.order_id, record.step, record.key_round)
    note = f"{record.step} may have been applied after all (a report of attempt {number})"
    order.note(now, Happened.RECLASSIFIED, step=record.step, note="may have been applied")
    if record.process_state is StepState.ERROR and record.gave_up is not None:
        record.gave_up.ambiguous = True
        record.record(now, Happened.ERROR, reason=note, applied="maybe")
    elif record.process_state is StepState.COMPENSATED and record.undone_by is None:
        # Stopped as if it had not applied: it may have. Failed, in doubt, so that the
        # decision over all records sees it (undone where it can be; told where not).
        moves.fail(record, now, note, True)
    if order.status is OrderStatus.ERROR and not record.continued:
        order.alert(
            record,
            f"update: {note}: it is no longer known to be safe to resubmit. Ask its service "
            f"whether {key} happened, then resubmit (the same idempotency key) or cancel, "
            "stating it did not happen",
            now,
        )
    elif order.status in (OrderStatus.COMPENSATED, OrderStatus.CANCELLED):
        reopen(order, now)


def note_report(record: StepRecord, reply: AgentReply, now: datetime, **extra: object) -> None:
    """A late report in the step's history (for people: decisions read the attempts)."""
    record.record(
        now,
        Happened.LATE_REPORT,
        attempt=reply.attempt,
        outcome=str(reply.outcome),
        applied=str(applied_of(reply)),
        error=reply.error,
        runningUntil=iso(reply.running_until) if reply.running_until else None,
        **extra,
    )
