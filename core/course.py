"""The order's course: one decision over all of its records (docs/contracts.md §3.15).

After every transition (a report, an expiry, an event, an operator's action) the order
calls ``advance``, which looks at every record and decides what the order does next. A
plan is a line of groups: a group is one step, or the steps of one ``Parallel``.

- **Going forward**, the current group runs until every step of it has succeeded, been
  skipped, or failed for good where it is declared ``on_failure="continue"`` (recorded on
  the step, told only if its declaration raised: §3.17); then the next group starts, or
  the order is ``completed``. When another step of the group fails for good, or the order
  is cancelled, the group halts: what has not started (a step waiting for its next
  attempt, an event, a delay) stops at once, and what is in flight finishes its attempt
  first (§3.11).
- **Settling** a group that failed (or a cancel) is decided over every record, wherever
  it stands: while any step that cannot be undone may have applied (its doubt unsettled,
  no operator's statement), nothing is undone — the order is ``error``, with one alert
  naming every such step. A step declared ``on_failure="hold"`` holds the order in
  ``error``, told, until an operator resubmits (the step runs again) or cancels (the order
  unwinds). Otherwise the order unwinds (or, in a workflow with nothing to compensate, is
  ``error``, safe to resubmit).
- **Unwinding** compensates, one at a time and latest first, every step that applied (or
  may have, where it can be undone), never before its last call can no longer run. New
  doubt about a step that cannot be undone stops it; so does a compensation that fails
  for good. At its end, an effect that stands (a step without a compensation that
  applied, not declared ``may_stand``) is told: the order is ``error``, one alert; else it
  is ``compensated``, or ``cancelled``.

Nothing here is called by a kind or an evidence rule: they change records; this decides.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Final

from core import kinds, moves, turns
from core.history import Happened
from core.items import compensation_of, decided, heads, items_of, unreached
from core.messages import MAX_KEY_ROUND
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.telling import (
    in_doubt,
    is_bug,
    tell_bugs,
    tell_doubt,
    tell_failed_undo,
    tell_held,
    tell_not_applied,
    tell_overtaken,
    tell_standing,
)

if TYPE_CHECKING:
    from core.model import Order

#: After an attempt's deadline, how long its last remote call may still be running
#: somewhere (agents stop before the deadline; this covers clock skew). A compensation
#: of a step that may have applied is not dispatched before then (it must not race it).
IN_FLIGHT_GRACE: Final = timedelta(seconds=2)


def advance(order: Order, now: datetime) -> None:
    """Decide what the order does next from all of its records (see the module)."""
    if turns.waits(order) and not order.cancel_requested:
        return  # nothing started: it waits for its key's slot (core.turns)
    for _ in range(len(order.plan.steps) + 2):  # each round may start the next group
        if order.status.finished or order.status is OrderStatus.ERROR:
            return
        if order.status is OrderStatus.COMPENSATING:
            _unwind(order, now)
            return
        if not _forward(order, now):
            return


# --- going forward ------------------------------------------------------------------------


def _forward(order: Order, now: datetime) -> bool:
    """One look at the current group; True if the next group started (look again)."""
    group = order.group_records()
    _go_on(order, group, now)
    if not halting(order) and _top_up(order, now):
        group = order.group_records()
    if halting(order):
        for record in [r for r in group if r.is_active]:
            _halt(order, record, now)
        _go_on(order, group, now)  # one the halt failed in doubt is gone past too
    if any(r.is_active for r in group):
        return False
    done = not unreached(order) and all(
        r.process_state in (StepState.PROCESSED, StepState.SKIPPED) or r.continued for r in group
    )
    if done and not order.cancel_requested:
        current = order.current_group()
        following = order.plan.next_group(current) if current is not None else None
        if following is None:
            order.set_status(OrderStatus.COMPLETED, now)
            return False
        start_group(order, following, now)
        return True
    return _settle(order, now)


def start_first(order: Order, now: datetime) -> None:
    """The first group, unless the order waits for its key's slot (``core.turns``)."""
    if not turns.waits(order):
        start_group(order, order.plan.groups()[0], now)


def start_group(order: Order, group: int, now: datetime) -> None:
    """Every step of ``group``: records first, then what each decides when it starts."""
    steps = [p for p in order.plan.group(group) if not p.name.endswith("[]")]  # items: later
    created = [(order.new_action(p, now), p) for p in steps]
    for record, planned in created:
        kinds.begin(order, record, planned, now)


def _top_up(order: Order, now: datetime) -> bool:
    """A ``ForEach`` of the current group whose items are decided starts its next items,
    in item order, while fewer than its ``max_concurrency`` are in flight (§3.16). An item
    is a record like any other from then on. True if one started."""
    started = False
    for planned in heads(order):
        items = decided(order, planned.name)
        if items is None:
            continue
        template = order.plan.planned(planned.template or "")
        reached = items_of(order, planned.name)
        running = sum(1 for r in reached if r.is_active)
        for index in range(len(reached), len(items)):
            if running >= (planned.max_concurrency or 1):
                break
            record = order.new_action(template, now, index)
            kinds.begin(order, record, template, now)
            started = True
            _go_on(order, order.group_records(), now)
            if halting(order):
                return True  # its when or input raised: the group halts
            running += record.is_active
    return started


def halting(order: Order) -> bool:
    """The current group stops what has not started: a step of it failed for good (one
    the workflow does not go on past), or the order is being cancelled."""
    if order.cancel_requested:
        return True
    return any(
        s.process_state is StepState.ERROR and not s.continued for s in order.group_records()
    )


def _go_on(order: Order, group: list[StepRecord], now: datetime) -> None:
    """A step declared ``on_failure="continue"`` that failed for good (not applied, or in
    doubt) is recorded as such and the workflow goes on past it: nothing is undone and
    nobody is told, unless its declaration raised (a bug is always told, §3.17)."""
    if order.cancel_requested:
        return  # the order does not go on: its failure is the unwinding's to weigh
    for record in group:
        if record.continued or record.process_state is not StepState.ERROR:
            continue
        if not goes_on(order, record):
            continue
        record.continued = True
        reason = record.failure_reason
        record.record(now, Happened.CONTINUED, reason=reason)
        order.note(now, Happened.CONTINUED, step=record.step, reason=reason)
        if is_bug(record):
            order.alert(
                record,
                f"{reason}: a bug in the workflow's declaration; nothing was sent for it, and "
                'the order went on without it (on_failure="continue"). Fix the declaration; '
                "new orders will use it",
                now,
            )


def goes_on(order: Order, record: StepRecord) -> bool:
    """``record``'s step is declared ``on_failure="continue"``: its failure, in doubt too,
    is no reason to stop or to keep the order from being undone (it may stand)."""
    return record.kind is StepKind.ACTION and order.planned(record.step).on_failure == "continue"


def _halt(order: Order, record: StepRecord, now: datetime) -> None:
    """A step of a halting group that has not started (or only waits) stops now; one in
    flight finishes its attempt first (its report or its deadline)."""
    cancelled = order.cancel_requested
    why = "the order was cancelled" if cancelled else "another step of its group failed for good"
    if order.waits(record):
        moves.stop(record, now, f"{record.step} waited; stopped: {why}", cancelled=cancelled)
    elif record.process_state is StepState.PENDING or record.held:
        if record.attempt == 0 or not record.may_have_applied:
            moves.stop(
                record, now, f"{record.step} had not applied; stopped: {why}", cancelled=cancelled
            )
        else:
            moves.fail(
                record,
                now,
                f"{record.step} had not succeeded when stopped ({why}); an attempt may have "
                "applied it",
                True,
            )


def _settle(order: Order, now: datetime) -> bool:
    """Nothing of the current group is active and it failed (or the order is being
    cancelled): the verdict, over every record of the order. True if the order goes on
    after all (a cancel too late): look again."""
    group = order.group_records()
    failed = [r for r in group if r.process_state is StepState.ERROR and not r.continued]
    if not failed and order.cancel_requested:
        ran = [
            r
            for r in group
            if r.process_state is StepState.PROCESSED
            and r.attempt
            and order.planned(r.step).compensation is None
        ]
        if ran:
            _cancel_too_late(order, ran[0], now)
            return True
    doubt = doubtful(order)
    if doubt:
        tell_doubt(order, doubt, now)
        order.set_status(OrderStatus.ERROR, now)
        return False
    held = [r for r in failed if order.planned(r.step).on_failure == "hold"]
    if held and not order.cancel_requested:
        tell_held(order, held, failed, now)
        order.set_status(OrderStatus.ERROR, now)
        return False
    bugs = [r for r in failed if is_bug(r)]
    if order.cancel_requested or order.plan.compensates or _undoable(order):
        if bugs:
            tell_bugs(order, bugs, now)
        if _undoable(order):
            order.set_status(OrderStatus.COMPENSATING, now)
        _unwind(order, now)  # nothing to undo: it ends at once (compensated, or told)
        return False
    tell_not_applied(order, failed, now)
    order.set_status(OrderStatus.ERROR, now)
    return False


def _cancel_too_late(order: Order, record: StepRecord, now: datetime) -> None:
    """A step that cannot be undone succeeded after the cancel: nothing is undone and the
    order goes on; the steps of its group the cancel stopped run after all."""
    order.cancel_requested = False
    note = f"{record.step} succeeded after the cancel and cannot be undone: the order goes on"
    record.record(now, Happened.CANCEL_TOO_LATE, note=note)
    order.note(now, Happened.CANCEL_TOO_LATE, step=record.step, note=note)
    for stopped in order.group_records():
        if stopped.process_state is StepState.COMPENSATED and stopped.undone_by is None:
            moves.restart(stopped, now)
            kinds.begin(order, stopped, order.planned(stopped.step), now)


# --- doubt, over every record ----------------------------------------------------------------


def doubtful(order: Order) -> list[StepRecord]:
    """Every action that may have applied, cannot be undone and may not stand: while any
    is in doubt nothing is undone around it (docs/contracts.md §3.15)."""
    return [
        r
        for r in order.latest_actions()
        if not r.is_active
        and in_doubt(r)
        and not goes_on(order, r)
        and not order.planned(r.step).compensation
        and not order.planned(r.step).may_stand
    ]


def _undoable(order: Order) -> bool:
    return next_to_compensate(order) is not None


# --- unwinding ---------------------------------------------------------------------------------


def _unwind(order: Order, now: datetime) -> None:
    """One look at the unwinding: one compensation at a time, latest first. What is not
    sent yet is withdrawn at new doubt (§3.15), or at a step declared ``hold`` found to
    have failed meanwhile (a late report; §3.17: nothing undone until an operator says)."""
    undos = [s for s in order.steps if s.kind is StepKind.COMPENSATION]
    doubt, held = doubtful(order), _held(order)
    for undo in [u for u in undos if u.is_active and u.attempt == 0] if doubt or held else []:
        names = ", ".join(r.step for r in doubt or held)
        why = "may have applied after all" if doubt else 'failed, and holds the order ("hold")'
        moves.withdraw_undo(order, undo, now, f"{names} {why}")
    if any(s.is_active for s in order.steps):
        return  # one compensation at a time; a step asked again (a resubmit) first
    _reconcile_undos(order, now)
    failed = [u for u in undos if _gave_up(u, overtaken=False)]
    if failed:
        tell_failed_undo(order, max(failed, key=lambda s: s.seq), now)
        order.set_status(OrderStatus.ERROR, now)
        return
    doubt = doubtful(order)
    if doubt:
        tell_doubt(order, doubt, now)
        order.set_status(OrderStatus.ERROR, now)
        return
    if held:
        tell_held(order, held, held, now)
        order.set_status(OrderStatus.ERROR, now)
        return
    overtaken = [u for u in undos if _gave_up(u, overtaken=True)]
    if overtaken:
        # Its step applied after the undo began: the unwinding stops here, told.
        tell_overtaken(order, max(overtaken, key=lambda s: s.seq), now)
        order.set_status(OrderStatus.ERROR, now)
        return
    target = next_to_compensate(order)
    if target is not None:
        begin_compensation(order, target, now)
        return
    stands = standing(order)
    told = [r for r in stands if not order.planned(r.step).may_stand]
    order.unwound = True
    if told:
        tell_standing(order, told, now)
        order.set_status(OrderStatus.ERROR, now)
        return
    finish(order, now)


def _held(order: Order) -> list[StepRecord]:
    """Steps declared ``on_failure="hold"`` that failed, unless an operator cancelled."""
    return [
        r
        for r in order.latest_actions()
        if r.process_state is StepState.ERROR
        and not r.continued
        and not order.cancel_requested
        and order.planned(r.step).on_failure == "hold"
    ]


def _gave_up(undo: StepRecord, *, overtaken: bool) -> bool:
    given = undo.gave_up if undo.process_state is StepState.ERROR else None
    return given is not None and (given.kind == moves.OVERTAKEN) is overtaken


def finish(order: Order, now: datetime) -> None:
    """The unwinding is over: ``cancelled`` or ``compensated``; effects that may stand by
    declaration are said in the history and the status message."""
    stands = [r.step for r in standing(order)]
    if stands:
        order.note(now, Happened.EFFECT_STANDS, steps=stands, note="declared may_stand")
    order.set_status(
        OrderStatus.CANCELLED if order.cancel_requested else OrderStatus.COMPENSATED,
        now,
        effectsStanding=stands or None,
    )


def _reconcile_undos(order: Order, now: datetime) -> None:
    """A compensation that succeeded undid its step (unless the step applied after it
    began: then it may have missed it, ``moves.overtaken``)."""
    for undo in order.steps:
        if undo.kind is not StepKind.COMPENSATION or undo.process_state is not StepState.PROCESSED:
            continue
        target = order.find(undo.compensates or "")
        if (
            target is None
            or target.process_state is not StepState.COMPENSATING
            or order.undo_of(target) is not undo
        ):
            continue
        if target.applied_after_undo is not None:
            moves.overtaken(order, undo, now)
            continue
        target.process_state = StepState.COMPENSATED
        target.undone_by = undo.step
        target.record(now, Happened.COMPENSATED, by=undo.step)


def standing(order: Order) -> list[StepRecord]:
    """Steps that applied, cannot be undone, and stand: calls without a compensation that
    succeeded (or are known to have applied)."""
    return [
        r
        for r in order.latest_actions()
        if not order.waits(r)
        and not order.planned(r.step).compensation
        and r.attempt
        and (r.process_state is StepState.PROCESSED or r.applied)
    ]


def next_to_compensate(order: Order) -> StepRecord | None:
    """The latest action still to undo: one that succeeded, or one that failed for good as
    "may have applied" and can be undone (no operator said it did not happen)."""
    candidates = [
        s
        for s in order.latest_actions()
        if order.planned(s.step).compensation
        and (
            s.process_state is StepState.PROCESSED
            or (
                s.process_state is StepState.ERROR
                and s.gave_up is not None
                and s.gave_up.ambiguous
                and s.gave_up.operator is None
            )
        )
    ]
    return max(candidates, key=lambda s: s.seq) if candidates else None


def begin_compensation(order: Order, target: StepRecord, now: datetime) -> None:
    """Start undoing ``target``; not before its last call can no longer run where it may
    have applied unreported, nor while a handler of it still runs (on any clock)."""
    planned = order.planned(target.step)
    assert planned.compensation is not None
    not_before: datetime | None = None
    if target.process_state is StepState.ERROR:
        not_before = moves.not_before_undo(target, IN_FLIGHT_GRACE)
    running = target.attempts.running_until(now)
    if running is not None:
        held = (target.last_deadline() or running) + IN_FLIGHT_GRACE
        not_before = max(not_before or now, held)
    target.process_state = StepState.COMPENSATING
    target.continued = False  # undone now: no longer a failure the order went past
    target.record(now, Happened.COMPENSATING, by=compensation_of(target.step, planned.compensation))
    due = max(now, not_before) if not_before else now
    record = order.undo_of(target)
    if record is not None and not record.is_active:
        # Undone once already (or found not needed), and now to undo again (it turned out
        # to have applied): the same record, as a new effect under a new key if it ran.
        moves.restart(record, now)
        record.complete_by = due
        if record.attempt and record.key_round < MAX_KEY_ROUND:
            record.key_round += 1
            record.round_began_at = None
            record.record(now, Happened.NEW_KEY, key=record.idempotency_key, why="undo again")
    else:
        record = order.add_record(
            step=compensation_of(target.step, planned.compensation),
            path=planned.compensation_path or planned.compensation,
            timeout=planned.compensation_timeout_seconds or planned.timeout_seconds,
            kind=StepKind.COMPENSATION,
            compensates=target.step,
            now=now,
            due=due,
        )
    kinds.decide_compensation_input(order, record, now)
    if record.process_state is StepState.ERROR:  # its input raised: the unwinding stops
        tell_failed_undo(order, record, now)
        order.set_status(OrderStatus.ERROR, now)


def lands_in(order: Order, status: OrderStatus, now: datetime) -> OrderStatus:
    """Where the order, put in ``status`` now, would be decided to at once (decided on a
    copy: nothing of it is kept)."""
    trial = copy.deepcopy(order)
    trial.status = status
    advance(trial, now)
    return trial.status


def enter(order: Order, status: OrderStatus, now: datetime) -> None:
    """``status``, announced; or, where the decision that follows would take the order
    straight elsewhere, passed through unannounced (a cancel with nothing left to undo,
    late doubt on an ended order that changes nothing, more to undo that cannot be): the
    app never sees a status the order leaves in the same transition."""
    if lands_in(order, status, now) is not status:
        order.pass_through(status)
    else:
        order.set_status(status, now)
