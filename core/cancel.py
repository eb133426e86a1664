"""What a cancel of an order would do now (docs/contracts.md §3.11, "a cancel never undoes
around a doubt"): the steps it would undo and in which order, those it would leave as
they are, the one in flight, and the step that may have applied and cannot be undone,
for which the operator's statement is needed. The console shows it before anyone
confirms; ``Unwinding.cancel`` refuses what it refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from core.messages import idempotency_key
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.timefmt import iso

if TYPE_CHECKING:
    from core.unwinding import Unwinding


@dataclass(frozen=True)
class CancelPreview:
    """What a cancel of the order would do now (``Unwinding.cancel_preview``)."""

    allowed: bool
    refusal: str | None = None
    #: (step, the compensation that undoes it), in the order they would run
    undo: tuple[tuple[str, str], ...] = ()
    #: completed steps nothing can undo: they stay as they are
    left_as_is: tuple[str, ...] = ()
    #: the step in flight: it finishes first (if it succeeds and cannot be undone, the
    #: cancel comes too late and the order goes on)
    in_flight: str | None = None
    #: the step that may have applied and cannot be undone (needs the statement)
    doubtful: str | None = None
    #: its attempts that may have applied
    doubtful_attempts: tuple[int, ...] = ()
    not_started: tuple[str, ...] = ()


def preview_cancel(
    order: Unwinding, now: datetime, not_applied: str | None = None
) -> CancelPreview:
    """What a cancel would do now, and why it would be refused (a doubt needs the
    statement ``not_applied``)."""
    reached = {s.step for s in order.steps}
    not_started = tuple(p.name for p in order.plan.steps if p.name not in reached)
    if order.status.finished:
        return CancelPreview(False, f"the order is already {order.status}")
    error = order.status is OrderStatus.ERROR
    if order.cancel_requested and not error:
        return CancelPreview(False, "a cancel of this order is under way")
    if order.status is OrderStatus.COMPENSATING:
        return CancelPreview(False, "the order failed and is already being undone")
    active = order.active_step()
    candidate = order.failed_step() if error else active
    doubtful: StepRecord | None = None
    first_undo: list[tuple[str, str]] = []
    if (
        candidate is not None
        and candidate.kind is StepKind.ACTION
        and (candidate.process_state in (StepState.ERROR, StepState.PENDING) or candidate.held)
        and candidate.attempt > 0
        and candidate.may_have_applied
    ):
        compensation = order.planned(candidate.step).compensation
        if compensation is None:
            doubtful = candidate
        else:
            first_undo.append((candidate.step, compensation))
    undo = first_undo + [
        (s.step, order.planned(s.step).compensation or "")
        for s in sorted(order.steps, key=lambda s: -s.seq)
        if s.kind is StepKind.ACTION
        and s.process_state is StepState.PROCESSED
        and order.planned(s.step).compensation
    ]
    left = tuple(
        s.step
        for s in order.steps
        if s.kind is StepKind.ACTION
        and s.process_state is StepState.PROCESSED
        and not order.planned(s.step).compensation
    )
    in_flight = (
        active.step
        if active is not None and active.process_state is StepState.PROCESSING and not active.held
        else None
    )
    preview = CancelPreview(
        True,
        undo=tuple(undo),
        left_as_is=left,
        in_flight=in_flight,
        not_started=not_started,
    )
    if doubtful is None:
        return preview
    numbers = tuple(doubtful.maybe_applied)
    running = doubtful.attempts.running_until(now)
    key = idempotency_key(order.order_id, doubtful.step)
    undone = ", ".join(f"{s} (by {c})" for s, c in undo) or "nothing"
    if running is not None:
        refusal = (
            f"{doubtful.step} may have been applied and cannot be undone, and its handler "
            f"still runs on an instance until {iso(running)}: wait for its outcome, then "
            "look again"
        )
    elif not_applied != doubtful.step:
        agent = order.plan.agent_of(doubtful.step)
        who = f"the {agent} service" if agent else "its service"
        refusal = (
            f"{doubtful.step} may have been applied (attempt(s) "
            f"{', '.join(map(str, numbers)) or 'earlier'} reached for it and no answer "
            f"settled it) and cannot be undone, so cancelling would undo {undone} around "
            f"it. Ask {who} whether the request with idempotency key {key} happened. If it "
            f"did not, cancel again stating so (notApplied: {doubtful.step!r}); if it did, "
            "resubmit: the same key returns its result and the order goes on"
        )
    else:
        refusal = None
    return CancelPreview(
        refusal is None,
        refusal,
        preview.undo,
        preview.left_as_is,
        preview.in_flight,
        doubtful.step,
        numbers,
        preview.not_started,
    )
