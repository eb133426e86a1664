"""What the console's pages show, computed from an order: pure functions, no I/O.

``timeline`` lays the attempts of every step on one time axis (an SVG drawn by the
detail template); ``why`` says in one sentence why the order is in its state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from admin.service import attempts_of
from core.events import Event
from core.messages import idempotency_key
from core.model import CancelPreview, Order, StepRecord
from core.states import OrderStatus, StepKind, StepState
from core.timefmt import iso, parse_iso

#: The drawing: a label column, then the time axis; one row per step record.
LABEL_WIDTH = 170
AXIS_WIDTH = 760
ROW_HEIGHT = 26
TOP = 24


@dataclass(frozen=True)
class Bar:
    step: str
    attempt: int
    outcome: str  # succeeded, refused, transient, deferred, expired, not-sent, or running
    x: float
    width: float
    title: str
    open_ended: bool  # still running: drawn to its deadline


@dataclass(frozen=True)
class Gap:
    x1: float
    x2: float
    title: str


@dataclass
class Row:
    step: str
    label: str
    compensation: bool
    y: int
    bars: list[Bar] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)


@dataclass(frozen=True)
class Timeline:
    rows: list[Row]
    width: int
    height: int
    start: str
    end: str
    ticks: list[tuple[float, str]]


def _when(text: Any) -> datetime | None:
    try:
        return parse_iso(text) if isinstance(text, str) else None
    except ValueError:
        return None


def timeline(order: Order, now: datetime) -> Timeline:
    """Every attempt of every step as a bar from its start to its end (or, still running,
    to its deadline), and the waits between attempts as gaps."""
    spans: list[tuple[StepRecord, dict[str, Any], datetime, datetime, bool]] = []
    for step in sorted(order.steps, key=lambda s: s.seq):
        for entry in attempts_of(step):
            start = _when(entry.get("claimedAt"))
            if start is None:
                continue
            end = _when(entry.get("endedAt"))
            running = end is None
            if end is None:
                deadline = _when(entry.get("completeBy")) or now
                end = deadline if step.process_state is StepState.PROCESSING else start
            spans.append((step, entry, start, max(end, start), running))
    begin = order.created_at
    finish = max([now if not order.status.terminal else order.updated_at, order.updated_at])
    finish = max([finish, *(end for *_, end, _ in spans)])
    total = max((finish - begin).total_seconds(), 1.0)

    def x(at: datetime) -> float:
        return round(LABEL_WIDTH + (at - begin).total_seconds() / total * AXIS_WIDTH, 1)

    rows: list[Row] = []
    by_step: dict[int, Row] = {}
    for step in sorted(order.steps, key=lambda s: s.seq):
        compensation = step.kind is StepKind.COMPENSATION
        label = f"{step.step} (undoes {step.compensates})" if compensation else step.step
        row = Row(step.step, label, compensation, TOP + len(rows) * ROW_HEIGHT)
        rows.append(row)
        by_step[step.seq] = row
    previous_end: dict[int, datetime] = {}
    for step, entry, start, end, running in spans:
        row = by_step[step.seq]
        outcome = "running" if running else str(entry.get("outcome", "running"))
        parts = [f"{step.step} attempt {entry['attempt']}: {outcome}", f"started {iso(start)}"]
        parts.append(f"deadline {entry.get('completeBy')}" if running else f"ended {iso(end)}")
        if entry.get("instance"):
            parts.append(f"on {entry['instance']}")
        if entry.get("error"):
            parts.append(str(entry["error"]))
        row.bars.append(
            Bar(
                step.step,
                int(entry["attempt"]),
                outcome,
                x(start),
                max(x(end) - x(start), 3.0),
                "; ".join(parts),
                running,
            )
        )
        last = previous_end.get(step.seq)
        if last is not None and start > last:
            waited = (start - last).total_seconds()
            row.gaps.append(Gap(x(last), x(start), f"waited {waited:.1f} s before the next try"))
        previous_end[step.seq] = end
    ticks = [
        (round(LABEL_WIDTH + AXIS_WIDTH * n / 4, 1), f"+{total * n / 4:.1f} s") for n in range(5)
    ]
    return Timeline(
        rows,
        LABEL_WIDTH + AXIS_WIDTH + 50,  # room for the last tick's label
        TOP + max(len(rows), 1) * ROW_HEIGHT + 20,
        iso(begin),
        iso(finish),
        ticks,
    )


def why(order: Order, paused: dict[str, Any] | None = None) -> str:
    """One sentence: why the order is in its state, and what happens next. ``paused``:
    the order waits for a paused agent (``admin.service.paused_view``)."""
    status = order.status
    active = order.active_step()
    if paused is not None and active is not None:
        agent = paused["agent"]
        if active.process_state is StepState.PROCESSING:
            return (
                f"Attempt {active.attempt} of step {active.step} was running when agent {agent} "
                "was paused and finishes; the next attempt waits for the resume."
            )
        return (
            f"Waiting for agent {agent} to be resumed: step {active.step} runs then; nothing is "
            "counted against it meanwhile."
        )
    failed = [s for s in order.steps if s.process_state is StepState.ERROR]
    alerts = [h for h in order.history if h.get("event") == Event.ALERTED]
    if status is OrderStatus.ERROR and failed:
        step = max(failed, key=lambda s: s.seq)
        told = f" The operator was told: {alerts[-1]['reason']}" if alerts else ""
        return (
            f"Step {step.step} failed for good after {step.failure_count} counted failure(s); "
            f"last error: {(step.last_error or 'none recorded').rstrip('.')}.{told}"
        )
    if status is OrderStatus.COMPLETED:
        return "Every step succeeded."
    if status is OrderStatus.COMPENSATED:
        return "A step failed without effect, and every completed step was undone."
    if status is OrderStatus.CANCELLED:
        return "Cancelled, and every completed step was undone."
    if active is None:
        return f"The order is {status}; no step is active."
    doing = "undoing" if active.kind is StepKind.COMPENSATION else "at"
    if active.process_state is StepState.PROCESSING:
        return (
            f"{doing.capitalize()} step {active.step}: attempt {active.attempt} is running on "
            f"{active.locked_by or 'an agent'}, deadline {iso(active.complete_by)}."
        )
    extra = f" Last error: {active.last_error.rstrip('.')}." if active.last_error else ""
    if active.deferrals:
        extra += f" Deferred {active.deferrals} time(s): its remote service is not answering."
    cancel = " A cancel was requested." if order.cancel_requested else ""
    return (
        f"{doing.capitalize()} step {active.step}: waiting to run (attempt "
        f"{active.attempt + 1}) not before {iso(active.complete_by)}, "
        f"{active.failure_count} counted failure(s) so far.{extra}{cancel}"
    )


@dataclass(frozen=True)
class Doubt:
    """A step that may have applied and cannot be undone: what the operator must check
    before stating, with a cancel, that it did not happen."""

    step: str
    agent: str | None
    key: str
    attempts: tuple[int, ...]


def doubt_of(order: Order, preview: CancelPreview) -> Doubt | None:
    if preview.doubtful is None:
        return None
    try:
        agent = order.plan.agent_of(preview.doubtful)
    except KeyError:  # pragma: no cover - every record is a step of its plan
        agent = None
    return Doubt(
        preview.doubtful,
        agent,
        idempotency_key(order.order_id, preview.doubtful),
        preview.doubtful_attempts,
    )


def can_resubmit(order: Order) -> bool:
    return order.status is OrderStatus.ERROR


def can_cancel(order: Order) -> bool:
    return not order.status.finished
