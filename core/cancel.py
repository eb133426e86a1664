"""What a cancel of an order would do now (docs/contracts.md §3.11, §3.15): the steps it
would undo and in which order, those it would leave as they are, those in flight, and
every step that may have applied and cannot be undone, for each of which the operator's
statement is needed ("a cancel never undoes around a doubt", over all of the order's
records, wherever each stands). The console shows it before anyone confirms;
``core.operator.cancel`` refuses what it refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from core.course import standing
from core.messages import idempotency_key
from core.states import OrderStatus, StepState
from core.steps import StepRecord
from core.telling import in_doubt
from core.timefmt import iso

if TYPE_CHECKING:
    from core.model import Order


@dataclass(frozen=True)
class Doubt:
    """A step that may have applied and cannot be undone: what to ask its service."""

    step: str
    attempts: tuple[int, ...]
    key: str
    agent: str


@dataclass(frozen=True)
class CancelPreview:
    """What a cancel of the order would do now (``Order.cancel_preview``)."""

    allowed: bool
    refusal: str | None = None
    #: (step, the compensation that undoes it), in the order they would run
    undo: tuple[tuple[str, str], ...] = ()
    #: completed steps nothing can undo: they stay as they are
    left_as_is: tuple[str, ...] = ()
    #: the steps in flight: they finish first (if one succeeds and cannot be undone, the
    #: cancel comes too late and the order goes on)
    in_flight: tuple[str, ...] = ()
    #: the steps that may have applied and cannot be undone (each needs the statement)
    doubts: tuple[Doubt, ...] = ()
    not_started: tuple[str, ...] = ()

    @property
    def doubtful(self) -> tuple[str, ...]:
        return tuple(d.step for d in self.doubts)


def _undone_around_a_standing_effect(order: Order) -> bool:
    """The unwinding is over (``Order.unwound``) and an effect stands."""
    return order.unwound and bool(standing(order))


def blocking(order: Order) -> list[StepRecord]:
    """Every action that may have applied (an attempt decided, or one waiting for its next
    try, with its doubt unsettled), cannot be undone and may not stand: a cancel, a fix or
    a "not needed" would undo or redo around it. A step whose attempt is in flight is
    not among them: it finishes first."""
    out = []
    for record in order.latest_actions():
        planned = order.planned(record.step)
        if planned.compensation or planned.may_stand or order.waits(record):
            continue
        if planned.on_failure == "continue":
            continue  # its failure, in doubt too, may stand (§3.17)
        current = record.current
        in_flight = (
            record.process_state is StepState.PROCESSING
            and current is not None
            and current.in_flight
        )
        if in_doubt(record) and not in_flight:
            out.append(record)
    return out


def preview_cancel(order: Order, now: datetime, stated: frozenset[str]) -> CancelPreview:
    """What a cancel would do now, and why it would be refused (a doubt needs the
    statement, in ``stated``, that the step did not happen)."""
    reached = {s.step for s in order.steps}
    not_started = tuple(p.name for p in order.plan.steps if p.name not in reached)
    if order.status.finished:
        return CancelPreview(False, f"the order is already {order.status}")
    error = order.status is OrderStatus.ERROR
    if order.cancel_requested and not error:
        return CancelPreview(False, "a cancel of this order is under way")
    if order.status is OrderStatus.COMPENSATING:
        return CancelPreview(False, "the order failed and is already being undone")
    if error and _undone_around_a_standing_effect(order):
        names = ", ".join(r.step for r in standing(order))
        return CancelPreview(
            False,
            f"the order was undone and the effect of {names} stands (it cannot be undone): "
            "nothing is left to cancel; it stays in error, the record of it",
        )
    doubtful = blocking(order)
    undo = [
        (s.step, order.planned(s.step).compensation or "")
        for s in sorted(order.latest_actions(), key=lambda s: -s.seq)
        if order.planned(s.step).compensation
        and (
            s.process_state is StepState.PROCESSED
            or (s.attempt > 0 and in_doubt(s) and s.process_state is not StepState.COMPENSATED)
        )
    ]
    left = tuple(
        s.step
        for s in order.latest_actions()
        if s.process_state is StepState.PROCESSED
        and not order.planned(s.step).compensation
        and not order.waits(s)
    )
    in_flight = tuple(
        s.step
        for s in order.active_steps()
        if s.process_state is StepState.PROCESSING and not s.held and not order.waits(s)
    )
    doubts = tuple(
        Doubt(
            r.step,
            tuple(r.maybe_applied),
            idempotency_key(order.order_id, r.step, r.key_round),
            order.plan.agent_of(r.step),
        )
        for r in doubtful
    )
    refusal = _refusal(order, doubtful, doubts, undo, stated, now)
    return CancelPreview(
        refusal is None, refusal, tuple(undo), left, in_flight, doubts, not_started
    )


def _refusal(
    order: Order,
    doubtful: list[StepRecord],
    doubts: tuple[Doubt, ...],
    undo: list[tuple[str, str]],
    stated: frozenset[str],
    now: datetime,
) -> str | None:
    for record in doubtful:
        running = record.attempts.running_until(now)
        if running is not None:
            return (
                f"{record.step} may have been applied and cannot be undone, and its handler "
                f"still runs on an instance until {iso(running)}: wait for its outcome, then "
                "look again"
            )
    known = [
        r.step
        for r in order.latest_actions()
        if r.step in stated and r.applied and r.process_state is not StepState.COMPENSATED
    ] + [
        r.step
        for r in order.latest_actions()
        if r.step in stated
        and r.applied
        and r.process_state is StepState.COMPENSATED
        and r.undone_by is None
    ]
    if known:
        return (
            f"{', '.join(known)} is known to have applied (an attempt succeeded): it cannot be "
            "stated not to have happened. Undo it (fix what stops its compensation, then "
            "resubmit or cancel again), or by hand"
        )
    missing = [d for d in doubts if d.step not in stated]
    if not missing:
        return None
    undone = ", ".join(f"{s} (by {c})" for s, c in undo) or "nothing"
    asks = []
    for doubt in missing:
        who = f"the {doubt.agent} service" if doubt.agent else "its service"
        asks.append(
            f"{doubt.step} may have been applied (attempt(s) "
            f"{', '.join(map(str, doubt.attempts)) or 'earlier'} reached for it and no answer "
            f"settled it) and cannot be undone: ask {who} whether the request with "
            f"idempotency key {doubt.key} happened"
        )
    names = [d.step for d in missing]
    statement = repr(names[0]) if len(names) == 1 else repr(names)
    return (
        f"{'; '.join(asks)}. Cancelling would undo {undone} around "
        f"{'it' if len(names) == 1 else 'them'}. If it did not happen, cancel again stating "
        f"so (notApplied: {statement}); if it did, resubmit: the same key returns its result "
        "and the order goes on"
    )
