"""What an unfinished order may still run: each step (action or compensation) that could
still be sent to an agent, with the agent and remote path its stored plan names.

The deploy guard (``python -m admin deploy-check``) compares this with the declarations
about to deploy: an agent a need names must still have its function and queue.

Everything here follows from the transitions (``core/course.py``, ``core/operator.py``,
``core/evidence.py``):

- A completed order runs nothing more. A compensated or cancelled one runs nothing more
  but for one thing: a step that ran and was undone, stopped or failed while nothing
  showed it applied may still report that it did (docs/contracts.md §3.11, §3.15); its
  undo then runs (again) (``Why.REDO``), or, for a step without one, the order is in
  ``error`` and a resubmit asks it again with its key (``Why.RETRY``).
- An order going **forward** (``pending``, ``processing``, or ``error`` at a failed
  action) runs its active or failed action again (a retry, an operator's resubmit, a
  late success that moves it on), then every later action; and, because a later failure
  or a cancel unwinds it, the compensation of every step done or still to come. With a
  cancel requested, an active step that has a compensation is undone if it succeeds, so
  the later actions are no longer needed; one without (``ship``) makes the cancel too
  late if it succeeds, and the order goes on.
- An order **unwinding** (``compensating``, or ``error`` at a failed compensation: a
  resubmit or a second cancel retries it) runs its active or failed compensation, then
  the compensations of the actions not undone yet that ran (a step that failed or was
  stopped may turn out to have applied); never an action again, but one that may have
  applied and cannot be undone, asked again with its key by a resubmit.

A step already undone, or done without a compensation, needs nothing. What a step needs
is read from the stored plan, never from the declarations: the scheduler routes a
request to ``plan.agent_of(step)`` and the remote path of its record, and an agent calls
whatever path a request names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from core import items
from core.item_names import template_of
from core.model import Order
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.workflows import PlannedStep


class Why(StrEnum):
    """Why an order may still run a step."""

    #: the active step (Pending or Processing): retried until it succeeds or fails for good
    RUNNING = "running"
    #: the step an ``error`` order failed at: a resubmit (or a second cancel) runs it again
    RETRY = "retry"
    #: an action the order has not reached yet
    LATER = "later"
    #: a compensation: runs if the order unwinds (a later failure, a cancel)
    UNDO = "undo"
    #: a compensation that ran: runs again if its step reports it applied after all
    REDO = "redo"


@dataclass(frozen=True)
class Need:
    step: str
    #: "" for an event or a delay (no agent runs them)
    agent: str
    path: str
    why: Why
    #: for a compensation: the action it undoes
    undoes: str | None = None
    #: the functions of today's declarations it will still call when it starts (``input``,
    #: ``when``, ``until``: docs/contracts.md §3.13): those not decided yet
    functions: tuple[str, ...] = ()


def still_needed(order: Order) -> tuple[Need, ...]:
    """Every step ``order`` may still run (send to an agent, or wait for), in the order it
    would run them (the compensations last, latest first), each once, with the functions
    of the declarations it will still call."""
    return tuple(_with_functions(order, n) for n in _needed(order))


def _with_functions(order: Order, need: Need) -> Need:
    """``need`` with the functions it will still call: those its plan names that its record
    (if it started) has not decided yet."""
    try:
        if need.undoes is not None:
            uses = order.plan.planned(need.undoes).compensation_uses
        else:
            uses = order.plan.planned(need.step).uses
    except KeyError:  # pragma: no cover - a record its plan does not name
        return need
    record = order.find(need.step)
    decided = record.decided if record is not None else {}
    left = tuple(u for u in uses if u not in decided)
    return replace(need, functions=left) if left else need


def _needed(order: Order) -> tuple[Need, ...]:
    if order.status.finished:
        return _redo(order)
    active = order.active_step()
    failed = _failed(order) if order.status is OrderStatus.ERROR else None
    current = active or failed
    if current is None:  # no step to go on from: records a person must look at
        return _everything(order)
    why = Why.RUNNING if current is active else Why.RETRY
    try:
        if current.kind is StepKind.COMPENSATION:
            needs = _unwinding(order, current, why)
        else:
            needs = _forward(order, current, why)
        named = {n.step for n in needs}
        return needs + tuple(n for n in _redo(order) if n.step not in named)
    except KeyError:  # a record its plan does not name: edited by hand
        return _everything(order)


def _failed(order: Order) -> StepRecord | None:
    errors = [s for s in order.steps if s.process_state is StepState.ERROR]
    failed = [s for s in errors if not s.continued] or errors
    return max(failed, key=lambda s: s.seq) if failed else None


def _forward(order: Order, current: StepRecord, why: Why) -> tuple[Need, ...]:
    plan = order.plan
    planned = plan.planned(current.step)
    group = plan.group(planned.group)
    needs = [Need(current.step, planned.agent, current.path, why)]
    # the other steps of its group (a Parallel) that may still run, or run again
    siblings = [
        s
        for s in group
        if s.name != current.step
        and (record := order.find(s.name)) is not None
        and record.process_state not in (StepState.PROCESSED, StepState.SKIPPED)
    ]
    needs += [Need(s.name, s.agent, s.path, why) for s in siblings]
    # the step of a ForEach's items not started yet (or not decided yet: its head failed)
    # runs for each of them; a cancel stops them before they start
    if not order.cancel_requested:
        needs += [Need(s.name, s.agent, s.path, Why.LATER) for s in _items_to_come(order, group)]
    cancel_undoes_it = (
        order.cancel_requested and why is Why.RUNNING and planned.compensation is not None
    )
    later = () if cancel_undoes_it else tuple(s for s in plan.steps if s.group > planned.group)
    needs += [Need(s.name, s.agent, s.path, Why.LATER) for s in later]
    done = {template_of(s.step) for s in order.steps if s.kind is StepKind.ACTION and _undoable(s)}
    before = [s for s in plan.steps if s.group < planned.group and s.name in done]
    may_undo = before + list(group) + list(later)
    needs += [_undo(s) for s in reversed(may_undo) if s.compensation]
    return tuple(needs)


def _items_to_come(order: Order, group: tuple[PlannedStep, ...]) -> list[PlannedStep]:
    """The step (``<name>[]``) of each ForEach of ``group`` with items that have no record
    yet: its list is longer than its items reached, or not decided (its ``items`` failed:
    a resubmit decides it)."""
    out: list[PlannedStep] = []
    for head in group:
        if head.template is None:
            continue
        listed = items.decided(order, head.name)
        if listed is None or len(items.items_of(order, head.name)) < len(listed):
            out += [s for s in group if s.name == head.template]
    return out


def _unwinding(order: Order, current: StepRecord, why: Why) -> tuple[Need, ...]:
    plan = order.plan
    agent = plan.agent_of(current.step)
    needs = [Need(current.step, agent, current.path, why, current.compensates)]
    # the action being undone is Compensating, the ones already undone Compensated
    still_done = [
        s for s in order.latest_actions() if _undoable(s) and s.step != current.compensates
    ]
    for record in sorted(still_done, key=lambda s: s.seq, reverse=True):
        planned = plan.steps[plan.index_of(record.step)]
        if planned.compensation:
            needs.append(_undo(planned))
    return tuple(needs)


def _redo(order: Order) -> tuple[Need, ...]:
    """A finished order: the undos that ran before their step was known applied (a success
    of it may still come, and overtake them)."""
    needs: list[Need] = []
    if order.status is OrderStatus.COMPLETED:
        return ()
    for record in sorted(order.latest_actions(), key=lambda s: s.seq, reverse=True):
        undone = record.process_state is StepState.COMPENSATED and record.undone_by is not None
        if record.attempt == 0 or (undone and record.applied):
            continue
        if record.process_state not in (StepState.COMPENSATED, StepState.ERROR):
            continue
        planned = order.plan.steps[order.plan.index_of(record.step)]
        if planned.compensation:
            needs.append(replace(_undo(planned), why=Why.REDO))
        elif not undone and not record.applied:
            # A report that it may have applied after all puts the order in error
            # (docs/contracts.md §3.15); a resubmit then asks it again, with its key.
            needs.append(Need(record.step, planned.agent, record.path, Why.RETRY))
    return tuple(needs)


def _undoable(step: StepRecord) -> bool:
    """Not undone yet, and it applied or may turn out to have (late evidence of a step that
    failed or was stopped after it ran reopens the unwinding: ``core.evidence``)."""
    if step.process_state in (StepState.PROCESSED, StepState.COMPENSATING):
        return True
    if step.attempt == 0:
        return False
    return step.process_state is StepState.ERROR or (
        step.process_state is StepState.COMPENSATED and step.undone_by is None
    )


def _undo(step: PlannedStep) -> Need:
    assert step.compensation is not None
    return Need(
        step.compensation,
        step.compensation_agent or step.agent,
        step.compensation_path or step.compensation,
        Why.UNDO,
        step.name,
    )


def _everything(order: Order) -> tuple[Need, ...]:
    """Records that name no step to go on from: every step of the plan, to be safe."""
    steps = order.plan.steps
    needs = [Need(s.name, s.agent, s.path, Why.LATER) for s in steps]
    return tuple(needs + [_undo(s) for s in reversed(steps) if s.compensation])
