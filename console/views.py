"""What the console's pages show, computed from an order: pure functions, no I/O.

``timeline`` lays the attempts of every step on one time axis (an SVG drawn by the
detail template), the waits of event and delay steps as bars of their own, and marks
the rows of one ``Parallel`` as a band; ``why`` says in one sentence why the order is in
its state (``console.layout`` lays the steps out as the workflow declares them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from admin.item_views import item_counts
from admin.service import attempts_of
from core import items, turns
from core.history import Happened
from core.item_names import item_of
from core.model import CancelPreview, Order, StepRecord
from core.plans import PlannedStep
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
    #: succeeded, refused, transient, deferred, expired, not-sent; with no ending: running,
    #: accepted (by a remote that calls back), unreported (its record ended without it)
    outcome: str
    x: float
    width: float
    title: str
    open_ended: bool  # still running: drawn to its deadline


@dataclass(frozen=True)
class Gap:
    x1: float
    x2: float
    title: str


@dataclass(frozen=True)
class Wait:
    """An event or a delay step's wait: from when it began to when it ended, or (still
    waiting) to now. Not an attempt: no agent runs it."""

    step: str
    kind: str  # event or delay
    outcome: str  # waiting, succeeded, refused (refused or timed out), stopped
    x: float
    width: float
    title: str
    open_ended: bool


@dataclass
class Row:
    step: str
    label: str
    compensation: bool
    y: int
    kind: str = "task"  # task, event or delay
    state: str = ""  # the record's ProcessState
    #: the element of the workflow it belongs to (actions only); rows of one Parallel
    #: share it and are drawn inside one band
    group: int | None = None
    parallel: bool = False
    bars: list[Bar] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    #: where "skipped" is written (the time its ``when`` said no), for a Skipped step
    skipped_x: float | None = None
    #: the ForEach it belongs to (its head, or one of its items; actions only)
    for_each: str | None = None


@dataclass(frozen=True)
class Band:
    """The rows of one Parallel group (or of a ForEach's items), drawn behind them: they
    ran at once."""

    group: int
    y: int
    height: int
    for_each: str | None = None


@dataclass(frozen=True)
class Timeline:
    rows: list[Row]
    width: int
    height: int
    start: str
    end: str
    ticks: list[tuple[float, str]]
    bands: list[Band] = field(default_factory=list)


def _when(text: Any) -> datetime | None:
    try:
        return parse_iso(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _wait_span(step: StepRecord, now: datetime) -> tuple[datetime, datetime, bool] | None:
    """When an event or delay step began to wait and when that ended (still waiting: now,
    open): from its history, where the wait's start is written (``waiting``) and the entry
    after it is how the wait ended (taken, ended, failed, stopped by a cancel)."""
    began = [i for i, h in enumerate(step.history) if h.get("event") == Happened.WAITING]
    if not began:
        return None
    start = _when(step.history[began[-1]].get("at"))
    if start is None:
        return None
    if step.waiting_for is not None and step.is_active:
        return start, max(now, start), True
    later = step.history[began[-1] + 1 :]
    end = _when(later[0].get("at")) if later else None
    return start, max(end or start, start), False


def _wait_title(step: StepRecord, kind: str, start: datetime, end: datetime, open_: bool) -> str:
    waited = step.waiting_for or next(
        (h["waitingFor"] for h in step.history if isinstance(h.get("waitingFor"), dict)), {}
    )
    what = f"until {waited['until']}" if "until" in waited else f"for event {waited.get('event')}"
    if open_:
        deadline = iso(step.complete_by)
        return f"{step.step} ({kind}): waiting {what} since {iso(start)}; deadline {deadline}"
    parts = [f"{step.step} ({kind}): waited {what} from {iso(start)} to {iso(end)}"]
    taken = [h for h in step.history if h.get("event") == Happened.EVENT_TAKEN]
    if taken:
        note = f": {taken[-1]['reason']}" if taken[-1].get("reason") else ""
        parts.append(f"event taken, sent by {taken[-1].get('by', 'someone')}{note}")
    parts.append(f"now {step.process_state}")
    return "; ".join(parts)


def _wait_outcome(step: StepRecord, open_: bool) -> str:
    if open_:
        return "waiting"
    return {
        StepState.PROCESSED: "succeeded",
        StepState.ERROR: "refused",
    }.get(step.process_state, "stopped")


def timeline(order: Order, now: datetime) -> Timeline:
    """Every attempt of every step as a bar from its start to its end (or, still running,
    to its deadline), the waits between attempts as gaps, and each event or delay step's
    wait as a bar from its start to its end (still waiting: to now, not to its deadline,
    which may be days away and would squash every other bar)."""
    spans: list[tuple[StepRecord, dict[str, Any], datetime, datetime, bool]] = []
    waits: list[tuple[StepRecord, str, datetime, datetime, bool]] = []
    for step in order.steps:
        kind = order.kind_of(step)
        span = _wait_span(step, now) if kind != "task" else None
        if span is not None:
            waits.append((step, kind, *span))
    for step in sorted(order.steps, key=lambda s: s.seq):
        for entry in attempts_of(step):
            start = _when(entry.get("claimedAt"))
            if start is None:
                continue
            end = _when(entry.get("endedAt"))
            # open (drawn to its deadline) only while its record is at work: an attempt
            # its record no longer waits for is not running, whatever it lacks
            running = end is None and step.process_state is StepState.PROCESSING
            if end is None:
                end = (_when(entry.get("completeBy")) or now) if running else start
            spans.append((step, entry, start, max(end, start), running))
    begin = order.created_at
    finish = max([now if not order.status.terminal else order.updated_at, order.updated_at])
    finish = max([finish, *(end for *_, end, _ in spans), *(end for *_, end, _ in waits)])
    total = max((finish - begin).total_seconds(), 1.0)

    def x(at: datetime) -> float:
        return round(LABEL_WIDTH + (at - begin).total_seconds() / total * AXIS_WIDTH, 1)

    rows: list[Row] = []
    by_step: dict[int, Row] = {}
    for step in sorted(order.steps, key=lambda s: s.seq):
        row = _row(order, step, TOP + len(rows) * ROW_HEIGHT)
        if step.process_state is StepState.SKIPPED:
            skipped = [h for h in step.history if h.get("event") == Happened.SKIPPED]
            at = _when(skipped[-1].get("at")) if skipped else None
            row.skipped_x = x(at or begin)
        rows.append(row)
        by_step[step.seq] = row
    for step, kind, start, end, open_ in waits:
        by_step[step.seq].waits.append(
            Wait(
                step.step,
                kind,
                _wait_outcome(step, open_),
                x(start),
                max(x(end) - x(start), 3.0),
                _wait_title(step, kind, start, end, open_),
                open_,
            )
        )
    previous_end: dict[int, datetime] = {}
    for step, entry, start, end, running in spans:
        row = by_step[step.seq]
        outcome = attempt_outcome(step, entry)
        parts = [f"{step.step} attempt {entry['attempt']}: {_OUTCOME_WORDS.get(outcome, outcome)}"]
        parts.append(f"started {iso(start)}")
        if running:
            parts.append(f"deadline {entry.get('completeBy')}")
        elif "endedAt" in entry:
            parts.append(f"ended {iso(end)}")
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
        _bands(rows),
    )


#: What an attempt's outcome means, where its one word needs more.
_OUTCOME_WORDS = {
    "accepted": "accepted by its remote, which calls back; the step waits for the callback",
    "unreported": "no report of it; its step ended without one",
}


def attempt_outcome(step: StepRecord, entry: dict[str, Any]) -> str:
    """An attempt's outcome as a page says it (``entry``: ``admin.service.attempts_of``'s):
    how it ended; with no ending, ``running`` only while its record is at work
    (``accepted`` once a remote that calls back accepted it), else ``unreported``: its
    record ended without a report of it, so it runs no more."""
    if entry.get("outcome"):
        return str(entry["outcome"])
    if step.process_state is not StepState.PROCESSING:
        return "unreported"
    return "accepted" if entry.get("accepted") else "running"


def _row(order: Order, step: StepRecord, y: int) -> Row:
    compensation = step.kind is StepKind.COMPENSATION
    kind = order.kind_of(step)
    label = f"{step.step} (undoes {step.compensates})" if compensation else step.step
    if kind != "task":
        label = f"{step.step} ({kind})"
    group = _group_of(order, step)
    return Row(
        step.step,
        label,
        compensation,
        y,
        kind=kind,
        state=str(step.process_state),
        group=group,
        parallel=group is not None and len(order.plan.group(group)) > 1,
        for_each=_for_each_of(order, step) if group is not None else None,
    )


def _for_each_of(order: Order, step: StepRecord) -> str | None:
    """The ForEach an action's record belongs to: its head's, or an item's."""
    found = item_of(step.step)
    if found is not None:
        return found[0]
    return step.step if order.kind_of(step) == "items" else None


def _group_of(order: Order, step: StepRecord) -> int | None:
    if step.kind is not StepKind.ACTION:
        return None
    try:
        return order.plan.planned(step.step).group
    except KeyError:  # pragma: no cover - a record its plan does not name
        return None


def _bands(rows: list[Row]) -> list[Band]:
    """One band per run of rows of one Parallel group (its records are made together, so
    they are neighbours; a record made later, a rerun, starts a band of its own)."""
    bands: list[Band] = []
    run: list[Row] = []
    for row in [*rows, None]:
        if run and (row is None or not row.parallel or row.group != run[0].group):
            bands.append(Band(run[0].group or 0, run[0].y, len(run) * ROW_HEIGHT, run[0].for_each))
            run = []
        if row is not None and row.parallel:
            run.append(row)
    return bands


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
    errors = [s for s in order.steps if s.process_state is StepState.ERROR]
    failed = [s for s in errors if not s.continued] or errors
    alerts = [h for h in order.history if h.get("event") == Happened.ALERTED]
    if status is OrderStatus.ERROR and failed:
        step = max(failed, key=lambda s: s.seq)
        told = f" The operator was told: {alerts[-1]['reason']}" if alerts else ""
        # An event step has no attempt and so no last error: why it failed (refused, or no
        # event in time) is what it gave up with.
        error = step.last_error or (step.gave_up.reason if step.gave_up else None)
        return (
            f"Step {step.step} failed for good after {step.failure_count} counted failure(s); "
            f"last error: {(error or 'none recorded').rstrip('.')}.{told}"
        )
    if status is OrderStatus.COMPLETED:
        return "Every step succeeded."
    if status in (OrderStatus.COMPENSATED, OrderStatus.CANCELLED):
        return undo_summary(order)
    if turns.waits(order):
        return (
            f"Waiting for its turn on key {turns.key_of(order)!r}: at most "
            f"{order.plan.concurrency.limit if order.plan.concurrency else 1} order(s) of "
            "this key run at once; it starts when one of them ends."
        )
    if active is None:
        return f"The order is {status}; no step is active."
    waiting = _waits(order)
    if waiting:
        return waiting + (" A cancel was requested." if order.cancel_requested else "")
    doing = "undoing" if active.kind is StepKind.COMPENSATION else "at"
    side = [s.step for s in order.active_steps()]
    if len(side) > 1:
        doing = f"Steps {', '.join(side)} run side by side; {doing}"
    if active.kind is StepKind.ACTION:
        doing = _items_at_work(order) + doing
    if active.process_state is StepState.PROCESSING:
        return (
            f"{_first_upper(doing)} step {active.step}: attempt {active.attempt} is running on "
            f"{active.locked_by or 'an agent'}, deadline {iso(active.complete_by)}."
        )
    extra = f" Last error: {active.last_error.rstrip('.')}." if active.last_error else ""
    if active.deferrals:
        extra += f" Deferred {active.deferrals} time(s): its remote service is not answering."
    cancel = " A cancel was requested." if order.cancel_requested else ""
    return (
        f"{_first_upper(doing)} step {active.step}: waiting to run (attempt "
        f"{active.attempt + 1}) not before {iso(active.complete_by)}, "
        f"{active.failure_count} counted failure(s) so far.{extra}{cancel}"
    )


def _items_at_work(order: Order) -> str:
    """Where the items of each ForEach of the current group stand, a sentence each (""
    when the group has none)."""
    said = ""
    for head in items.heads(order):
        listed = items.decided(order, head.name)
        if listed is None:
            continue
        n = item_counts(order, head.name)
        said += (
            f"ForEach {head.name}: {n['running']} of {len(listed)} item(s) in flight (at most "
            f"{head.max_concurrency} at once), {n['done']} done, {n['waiting']} waiting"
            + (f", {n['failed']} failed" if n["failed"] else "")
            + ". "
        )
    return said


def undo_summary(order: Order) -> str:
    """What the unwinding of a ``compensated`` or ``cancelled`` order did, as its records
    say: the steps undone (and by what), those not undone (no compensation), those whose
    effect stands by declaration (``may_stand``), and those stopped before they started
    or while they waited (nothing to undo)."""
    undone, not_undone, stands, stopped = [], [], [], []
    # a failure the workflow went on after (``on_failure="continue"``, contract 3.17) did
    # not start the unwinding: it is named apart
    went_on = [r.step for r in order.latest_actions() if _continued(r)]
    failed = [r for r in order.latest_actions() if r.gave_up is not None and not _continued(r)]
    for record in order.latest_actions():
        state = record.process_state
        task = order.kind_of(record) == "task"
        if state is StepState.COMPENSATED:
            if record.undone_by:
                undone.append(f"{record.step} (by {record.undone_by})")
            else:
                stopped.append(record.step)
        elif task and record.attempt and (state is StepState.PROCESSED or record.applied):
            planned = _planned(order, record)
            if planned is not None and planned.may_stand:
                stands.append(record.step)
            elif planned is not None and planned.compensation:
                not_undone.append(record.step)
            else:
                not_undone.append(f"{record.step} (no compensation)")
    if order.status is OrderStatus.CANCELLED:
        parts = ["Cancelled."]
    elif failed:
        parts = [
            f"Step {r.step} failed"
            + (
                " and may have applied."
                if r.gave_up and r.gave_up.ambiguous
                else " without effect."
            )
            for r in failed
        ]
    else:
        parts = ["The order was undone."]
    if undone:
        parts.append(f"Undone: {', '.join(undone)}.")
    if not_undone:
        parts.append(f"Not undone: {', '.join(not_undone)}.")
    if stands:
        parts.append(f"Its effect stands, as declared (may_stand): {', '.join(stands)}.")
    if stopped:
        parts.append(f"Stopped before they applied anything: {', '.join(stopped)}.")
    if went_on:
        parts.append(f"Failed earlier, the order went on: {', '.join(went_on)}.")
    if not (undone or not_undone or stands):
        parts.append("Nothing had applied, so nothing was undone.")
    return " ".join(parts)


def _continued(record: StepRecord) -> bool:
    """The record failed and the workflow went on (``on_failure="continue"``)."""
    return record.continued


def _planned(order: Order, record: StepRecord) -> PlannedStep | None:
    try:
        return order.plan.planned(record.step)
    except KeyError:  # pragma: no cover - a record its plan does not name
        return None


@dataclass(frozen=True)
class StateLabel:
    """A step record's state as its page says it: ``css`` its badge's class, ``text`` its
    words, ``note`` what it means (empty: the state says it)."""

    css: str
    text: str
    note: str = ""


def state_label(order: Order, record: StepRecord) -> StateLabel:
    """A record's state in words that are true of it: a ``Compensated`` record that no
    compensation undid was stopped (its group failed, or the order was cancelled) before
    it applied anything: never called, or between attempts, or while it waited."""
    state = record.process_state
    if state is StepState.ERROR and _continued(record):
        return StateLabel("error", "Error", "failed, the order went on")
    if state is StepState.COMPENSATED and not record.undone_by:
        if order.kind_of(record) != "task":
            return StateLabel("stopped", "Stopped", "stopped while it waited: nothing to undo")
        if not record.attempt:
            return StateLabel("stopped", "Stopped, not started", "never called: nothing to undo")
        return StateLabel(
            "stopped", "Stopped", "stopped before its next attempt; none applied: nothing to undo"
        )
    if state is StepState.COMPENSATED:
        return StateLabel(state.lower(), str(state), f"undone by {record.undone_by}")
    return StateLabel(state.lower(), str(state))


def _first_upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _waits(order: Order) -> str:
    """What the order waits for from outside or from time, a sentence per wait; the other
    steps of its group that are still at work, named. Empty when nothing waits."""
    sentences: list[str] = []
    busy: list[str] = []
    for step in order.active_steps():
        waited = step.waiting_for
        if not waited or step.process_state is not StepState.PROCESSING:
            busy.append(step.step)
        elif "until" in waited:
            sentences.append(f"Step {step.step} waits until {waited['until']} (a delay).")
        elif order.kind_of(step) == "event":
            sentences.append(
                f"Step {step.step} waits for event {waited['event']}, at most until "
                f"{iso(step.complete_by)}; then it fails and the workflow unwinds."
            )
        else:
            sentences.append(
                f"Step {step.step} was accepted by its remote and waits for its callback, "
                f"event {waited['event']}, until {iso(step.complete_by)}; then the call is "
                "made again with the same idempotency key."
            )
    if sentences and busy:
        sentences.append(f"Beside it, still at work: {', '.join(busy)}.")
    return " ".join(sentences)


@dataclass(frozen=True)
class Doubt:
    """A step that may have applied and cannot be undone: what the operator must check
    before stating, with a cancel, that it did not happen."""

    step: str
    agent: str | None
    key: str
    attempts: tuple[int, ...]


def doubts_of(order: Order, preview: CancelPreview) -> list[Doubt]:
    """Every step that may have applied and cannot be undone, as the cancel page asks about
    each (docs/contracts.md §3.15)."""
    return [Doubt(d.step, d.agent or None, d.key, d.attempts) for d in preview.doubts]


def can_resubmit(order: Order) -> bool:
    return order.status is OrderStatus.ERROR


def can_cancel(order: Order) -> bool:
    return not order.status.finished
