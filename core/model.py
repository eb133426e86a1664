"""The order aggregate: one order record and one state record per step.

All of an order's records live in one Table partition and change together in one
conditional transaction, so the aggregate is the unit of consistency. Its transitions
are pure: they take ``now``, change the records in memory, and queue the notices to send
(status messages, operator alerts) in ``outbox``; the store writes the changed records
with If-Match on their ETags and the outbox in the same transaction.

The order holds its records and hands each transition to the record's kind
(``core.kinds``: a call, a call answered by callback, an event, a delay) or to the
evidence rules (``core.evidence``: what a late or duplicate report says); then one
decision over all of its records says what the order does next (``core.course.advance``).
The operator's actions are decided over all records too (``core.operator``), and so are
events delivered (``core.inbox``). Records are created when the workflow reaches them;
any number may be active at once (the steps of a ``Parallel``).

Failure semantics: docs/contracts.md §3.11 and §3.15 (how attempts end: ``core.outcome``;
what each may have done: ``core.attempts``, which every decision reads, never the history).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Final, Literal

from core import course, evidence, inbox, items, kinds, moves, operator
from core.cancel import CancelPreview
from core.errors import TransitionRefused, UnboundMessage
from core.evidence import ReplyEffect
from core.flow import Context
from core.history import Happened
from core.item_names import item_name
from core.messages import AgentReply, alert_message, status_message
from core.order_message import OrderMessage
from core.outcome import Outcome
from core.plans import PlannedStep
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.text import visible_details
from core.timefmt import ensure_utc, iso
from core.workflows import Plan

__all__ = ["DEFAULT_POLICY", "IN_FLIGHT_GRACE", "CancelPreview", "Notice", "Order"]
__all__ += ["ReplyEffect", "StepRecord"]

DEFAULT_POLICY: Final = RetryPolicy()
IN_FLIGHT_GRACE: Final = course.IN_FLIGHT_GRACE
#: Stuck episodes an order remembers having alerted (the latest ones).
MAX_STUCK_EPISODES: Final = 10
MAX_ORDER_HISTORY: Final = 100
#: A full stop before the "; " or ", " that joins the next clause of an alert.
_CLAUSE_END: Final = re.compile(r"\.([;,] )")
#: The states of an action that succeeded (and may be being undone since).
_SUCCEEDED: Final = frozenset({StepState.PROCESSED, StepState.COMPENSATING, StepState.COMPENSATED})


@dataclass(frozen=True)
class Notice:
    """A message to send once the transition is stored (transactional outbox)."""

    kind: str  # "status" (to the order's replyTo) or "alert" (to operator-alerts)
    body: str
    queue: str | None = None  # the replyTo queue for a status notice


@dataclass
class Order:
    order_id: str
    plan: Plan
    body: dict[str, Any]
    content_hash: str
    reply_to: str | None
    status: OrderStatus
    created_at: datetime
    updated_at: datetime
    steps: list[StepRecord] = field(default_factory=list)
    cancel_requested: bool = False
    #: The step the stuck check alerted about ("<step>:<attempt>"; "" never): one alert per
    #: order, however many sweeps see it stuck (``mark_stuck``).
    stuck_alerted: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    #: W3C trace context of the span that accepted the order: every later step of the
    #: order continues this trace (one order, one trace).
    trace: dict[str, str] = field(default_factory=dict)
    version: int = 0
    etag: str | None = None
    outbox: list[Notice] = field(default_factory=list)
    #: Whatever the store needs to remember between load and save (opaque here).
    store_meta: dict[str, Any] = field(default_factory=dict)
    #: Events delivered to the order (docs/contracts.md §3.13), by name: the payload, when,
    #: by whom, the run it answered, the step that took it (none yet: kept for its step),
    #: and what earlier runs were answered (``core.inbox``).
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The key of its events' capability tokens (``core.inbox.capability``): never shown.
    event_key: str = field(default="", repr=False)
    #: Its unwinding is over (``core.course``): what could be undone was; an ``error`` order
    #: then has an effect that stands, and nothing is left to cancel or resubmit.
    unwound: bool = False
    #: Not stored: times a transition wants the order looked at again (a delay that
    #: began), for the dispatcher to queue after the save (the sweeps are the safety net).
    wakeups: list[datetime] = field(default_factory=list)
    #: Not stored: the status the app was last told, while a transition passes silently
    #: through another (``pass_through``); None otherwise.
    told: OrderStatus | None = field(default=None, repr=False, compare=False)

    # --- creation ---------------------------------------------------------------------

    @classmethod
    def accept(cls, message: OrderMessage, plan: Plan, now: datetime) -> Order:
        now = ensure_utc(now)
        order = cls(
            order_id=message.order_id,
            plan=plan,
            body=message.body,
            content_hash=message.content_hash,
            reply_to=message.reply_to,
            status=OrderStatus.PENDING,
            created_at=now,
            updated_at=now,
            event_key=inbox.new_event_key(),
        )
        order.note(now, Happened.RECEIVED, workflow=plan.workflow)
        order._notify("received", now)
        course.start_first(order, now)  # unless it waits for its turn (core.turns)
        course.advance(order, now)
        return order

    # --- transitions: attempts ------------------------------------------------------------

    def claim(
        self,
        instance: str,
        now: datetime,
        *,
        step: str | None = None,
        resumed: bool = False,
        skew: timedelta = DEFAULT_POLICY.skew,
    ) -> StepRecord:
        """Take a Pending step (``step``, or the first active one): Processing, locked, with
        a new deadline and attempt. ``resumed``: its agent's pause is over, so a step that
        waited only for that may go before the time it was to be looked at again.
        ``skew``: how far other instances' clocks may be from this one's
        (``MAX_CLOCK_SKEW_SECONDS``), kept with the attempt so that no instance undoes the
        step while this attempt may still reach its remote."""
        record = kinds.claimable(self, now, step, resumed=resumed)
        kinds.CALL.claim(self, record, instance, now, skew)
        self.touch(now)
        return record

    def hold_for_pause(
        self, agent: str, now: datetime, until: datetime, step: str | None = None
    ) -> StepRecord:
        """The scheduler's move on a due Pending step whose agent an operator paused: it
        is not claimed (no attempt, nothing counted, no deferral window spent, no alert);
        it stays Pending, to be looked at again at ``until``, or sooner after a resume."""
        record = kinds.claimable(self, now, step)
        moves.hold(record, agent, now, until)
        self.touch(now)
        return record

    def apply_reply(
        self, reply: AgentReply, now: datetime, policy: RetryPolicy = DEFAULT_POLICY
    ) -> ReplyEffect:
        """Apply an agent's report. A success is evidence whenever it arrives
        (``core.evidence``). The first report of the attempt in flight decides it (its
        kind's ``decide``); any later report (another copy of the attempt, a report after
        its expiry) adds its evidence. One that adds nothing is refused (nothing to save)."""
        record = self.bound_step(reply.step, reply.attempt, reply.token)
        attempt = record.attempts.get(reply.attempt)
        if reply.outcome is Outcome.SUCCEEDED:
            effect = evidence.success_reply(self, record, attempt, reply, now)
        elif (
            attempt is not None
            and attempt.in_flight
            and record.process_state is StepState.PROCESSING
            and record.attempt == reply.attempt
        ):
            kinds.CALL.decide(self, record, attempt, reply, now, policy)
            effect = ReplyEffect.APPLIED
        else:
            effect = evidence.late_report(self, record, attempt, reply, now, policy)
        course.advance(self, now)
        self.touch(now)
        return effect

    def bound_step(self, name: str, attempt: int, token: str) -> StepRecord:
        """The step record a request or report of attempt ``attempt`` speaks for, if its
        ``token`` is that attempt's own (``StepRecord.binds``); else ``UnboundMessage``:
        forged, or for an attempt never claimed. A compensation is a step of its own
        name."""
        record = self.find(name)
        if record is None:
            raise UnboundMessage(
                f"the order has no step {name!r}: no claim speaks for this message",
                order_id=self.order_id,
                step=name[:64],
            )
        if not record.binds(attempt, token):
            why = (
                f"attempt {attempt} was never claimed (the step has had {record.attempt})"
                if not 1 <= attempt <= record.attempt
                else "its token is not that attempt's"
                if token
                else "it carries no token"
            )
            raise UnboundMessage(
                f"a message for attempt {attempt} of step {name} that no claim speaks for: {why}",
                order_id=self.order_id,
                step=name,
            )
        return record

    def resendable(self, name: str, attempt: int) -> bool:
        """Whether a redelivered order may send this request again: attempt 1 of a step
        claimed in the save that accepted the order (``Scheduler._duplicate``: that delivery
        may have died before its send). A later claim (a ``ForEach``'s later lines, a turn
        taken) was sent by its claimer, or expires: only these are sent twice, and taken."""
        record = self.find(name)
        first = record.attempts.get(1) if record is not None else None
        if record is None or first is None or attempt != 1 or record.kind is not StepKind.ACTION:
            return False
        try:
            first_group = self.planned(name).group == self.plan.groups()[0]
        except (KeyError, ValueError, IndexError):
            return False
        return first_group and first.claimed_at <= self.created_at

    def take(self, name: str, attempt: int, copy: str) -> Literal["took", "held", "other"]:
        """An agent takes attempt ``attempt`` of step ``name`` with one copy of its request
        (``kinds.Call.take``: Storage queues detect no duplicates)."""
        return kinds.CALL.take_copy(self, name, attempt, copy)

    def mark_stuck(self, step: str, reason: str, now: datetime) -> StepRecord:
        """The stuck check's alert (supervisor/aggregator.py): the active step ``step`` has
        been in its state far longer than it usually takes. One alert per stuck episode (a
        step and its attempt): a second call for the same one is refused, and so is one
        for a step that has moved on; a later episode is alerted again."""
        active = self.find(step)
        if active is None or not active.is_active:
            raise self.refuse("moved-on", f"step {step} is no longer active", step)
        episode = f"{step}:{active.attempt}"
        alerted = [e for e in self.stuck_alerted.split(",") if e]
        if episode in alerted:
            raise self.refuse("stuck-alerted", f"already alerted: {episode}", step)
        self.stuck_alerted = ",".join([*alerted, episode][-MAX_STUCK_EPISODES:])
        self.alert(active, reason, now)
        self.touch(now)
        return active

    def expire(
        self,
        now: datetime,
        policy: RetryPolicy,
        grace: timedelta = timedelta(0),
        step: str | None = None,
    ) -> StepRecord:
        """The supervisor's move on a Processing step (``step``, or the first) whose
        CompleteBy has passed (``grace`` absorbs clock skew between instances): its kind
        says what that means (a call's attempt counts as a failure that may have applied;
        a delay is over; an event that did not come fails the step, not applied)."""
        processing = [
            s
            for s in self.active_steps()
            if s.process_state is StepState.PROCESSING and (step is None or s.step == step)
        ]
        if not processing:
            raise self.refuse("not-processing", "no step of the order is Processing", step)
        expired = [s for s in processing if s.complete_by + grace <= now]
        if not expired:
            first = processing[0]
            raise self.refuse(
                "not-expired", f"step {first.step} has until {iso(first.complete_by)}", first.step
            )
        record = expired[0]
        self.kind(record).expire(self, record, now, policy)
        course.advance(self, now)
        self.touch(now)
        return record

    def unsent(
        self, step_name: str, number: int, reason: str, now: datetime, policy: RetryPolicy
    ) -> StepRecord:
        """The request of a claim never left (the send failed, or the transport refused
        it): no try, so no failure and no doubt; the step waits a little and runs again."""
        record = kinds.CALL.unsent(self, step_name, number, reason, now, policy)
        course.advance(self, now)
        self.touch(now)
        return record

    # --- transitions: events and the operator ------------------------------------------------

    def deliver_event(
        self,
        name: str,
        payload: dict[str, Any],
        now: datetime,
        by: str,
        reason: str = "",
        *,
        run: int | None = None,
    ) -> str:
        """The event ``name`` delivered to the order (``core.inbox``): ``"taken"``,
        ``"kept"``, ``"same"`` or ``"noted"``; ``InvalidEvent`` for a name the workflow does
        not declare; ``TransitionRefused`` for what it refuses (``stale``, ``too-late``,
        ``event-delivered``, ``finished``...)."""
        effect = inbox.deliver(self, name, payload, now, by, reason, run=run)
        course.advance(self, now)
        self.touch(now)
        return effect

    def cancel(
        self,
        now: datetime,
        by: str,
        reason: str = "",
        not_applied: str | Iterable[str] | None = None,
    ) -> None:
        """Operator or app: stop an unfinished order and undo what it did (``core.operator``):
        refused with ``doubt`` while any step that cannot be undone may have applied,
        unless ``not_applied`` names each (the operator states it did not happen)."""
        operator.cancel(self, now, by, reason, not_applied)
        course.advance(self, now)
        self.touch(now)

    def cancel_preview(
        self, now: datetime, not_applied: str | Iterable[str] | None = None
    ) -> CancelPreview:
        """What a cancel would do now, and why it would be refused (``core.cancel``)."""
        return operator.preview(self, now, not_applied)

    def resubmit(self, now: datetime, by: str, reason: str = "", patch: Any = None) -> StepRecord:
        """Operator: put an ``error`` order back to work at what failed or stopped
        (``core.operator``); ``patch``, a JSON merge patch of its data (§3.14)."""
        first = operator.resubmit(self, now, by, reason, patch)
        course.advance(self, now)
        self.touch(now)
        return first

    # --- queries ------------------------------------------------------------------------

    @property
    def workflow(self) -> str:
        return self.plan.workflow

    def find(self, step: str) -> StepRecord | None:
        """The latest record of the named step (a resubmitted step keeps its record)."""
        found: StepRecord | None = None
        for record in self.steps:
            if record.step == step and (found is None or record.seq > found.seq):
                found = record
        return found

    def planned(self, step: str) -> PlannedStep:
        return self.plan.steps[self.plan.index_of(step)]

    def kind(self, record: StepRecord) -> kinds.Kind:
        """The kind of ``record`` (``core.kinds``)."""
        if record.kind is StepKind.COMPENSATION:
            return kinds.CALL
        try:
            return kinds.kind_of(record, self.planned(record.step))
        except KeyError:  # pragma: no cover - a record its plan does not name
            return kinds.CALL

    def kind_of(self, record: StepRecord) -> str:
        """``task``, ``event`` or ``delay`` for an action; ``task`` for a compensation."""
        return self.kind(record).name

    def waits(self, record: StepRecord) -> bool:
        """An event or a delay: no agent, no attempt."""
        return self.kind(record).waits

    def latest_actions(self) -> list[StepRecord]:
        """The latest record of each action the order has reached, in plan order."""
        return [r for planned in self.plan.steps for r in items.records_of(self, planned)]

    def latest_undos(self) -> list[StepRecord]:
        """The latest record of each compensation that has begun."""
        names = {s.step for s in self.steps if s.kind is StepKind.COMPENSATION}
        return [r for r in (self.find(n) for n in sorted(names)) if r is not None]

    def undo_of(self, record: StepRecord) -> StepRecord | None:
        """The latest record of the compensation that undoes ``record`` (None: not begun)."""
        found: StepRecord | None = None
        for s in self.steps:
            undoes = s.kind is StepKind.COMPENSATION and s.compensates == record.step
            if undoes and (found is None or s.seq > found.seq):
                found = s
        return found

    def active_steps(self) -> list[StepRecord]:
        """The records Pending or Processing: one, or several (a ``Parallel``'s)."""
        return [s for s in self.steps if s.is_active]

    def active_step(self) -> StepRecord | None:
        """The active record when there is one; the first (by record) of several."""
        active = self.active_steps()
        return active[0] if active else None

    def failed_step(self) -> StepRecord:
        """The latest record in Error (what an order in ``error`` failed at, latest); one
        the order went on past (``continued``) only if no other failed."""
        errors = [s for s in self.steps if s.process_state is StepState.ERROR]
        failed = [s for s in errors if not s.continued] or errors
        if not failed:
            raise self.refuse("no-failed-step", "the order has no step in Error")
        return max(failed, key=lambda s: s.seq)

    def awaited_events(self) -> list[str]:
        """The events the order waits for now (for the inbox: ``waitingFor`` events)."""
        return [
            s.waiting_for["event"]
            for s in self.active_steps()
            if s.waiting_for and "event" in s.waiting_for
        ]

    def next_due(self) -> datetime | None:
        """When the scheduler should look at the order next: the earliest due time of a
        Pending step, or the end of a delay that waits."""
        times = [s.not_before for s in self.active_steps() if s.process_state is StepState.PENDING]
        times += [
            s.complete_by
            for s in self.active_steps()
            if s.process_state is StepState.PROCESSING and self.kind_of(s) == "delay"
        ]
        times += self.wakeups
        return min(times) if times else None

    def context(self, record: StepRecord | None = None) -> Context:
        """What a step's functions see: the order, every succeeded step's result (a
        ``ForEach``'s: its items', once all ended), each reason of a failure gone past
        (§3.17); for ``record`` of a ``ForEach``'s item, its item and index (§3.16)."""
        results: dict[str, Any] = {}
        failures: dict[str, str] = {}
        for done in sorted(self.steps, key=lambda s: s.seq):
            if done.kind is not StepKind.ACTION:
                continue
            if self.kind_of(done) == "items":
                listed = items.items_result(self, done.step)
                if listed is not None:
                    results[done.step] = listed
            elif done.result is not None and done.process_state in _SUCCEEDED:
                results[done.step] = copy.deepcopy(done.result)
            elif done.continued:
                failures[done.step] = done.failure_reason
        item, index = items.item_for(self, record) if record is not None else (None, None)
        return Context(
            self.order_id,
            copy.deepcopy(self.body),
            MappingProxyType(results),
            MappingProxyType(failures),
            item,
            index,
        )

    def current_group(self) -> int | None:
        """The group the order is at going forward: that of its latest action record."""
        actions = [s for s in self.steps if s.kind is StepKind.ACTION]
        if not actions:
            return None
        latest = max(actions, key=lambda s: s.seq)
        try:
            return self.planned(latest.step).group
        except KeyError:  # pragma: no cover - a record its plan does not name
            return None

    def group_records(self, group: int | None = None) -> list[StepRecord]:
        """The latest record of each action of ``group`` (default: the current one)."""
        group = self.current_group() if group is None else group
        if group is None:
            return []
        return [r for p in self.plan.group(group) for r in items.records_of(self, p)]

    # --- what the order's parts use --------------------------------------------------------

    def call_function(self, record: StepRecord, name: str) -> Any:
        """Call ``record``'s function ``name`` (``input``, ``when``, ``until``) from today's
        declarations with the order's context; ``StepFunctionFailed`` if it raises or is
        no longer declared."""
        from core.links import running_for
        from core.workflows import function_of

        fn = function_of(self.plan.workflow, record.step, name)
        if fn is None:
            raise kinds.StepFunctionFailed(
                f"the declarations no longer give step {record.step} of workflow "
                f"{self.plan.workflow} its {name} function (python -m admin deploy-check "
                "refuses such a deployment)"
            )
        try:
            with running_for(self, record):
                return fn(self.context(record))
        except Exception as exc:  # noqa: BLE001 - a bug in a declaration fails its step only
            text = f"{type(exc).__name__}: {exc}"
            raise kinds.StepFunctionFailed(f"{name} of {record.step} raised {text[:500]}") from None

    def new_action(self, planned: PlannedStep, now: datetime, i: int | None = None) -> StepRecord:
        """The first record of ``planned`` (of its item ``i``, for a ForEach's step)."""
        return self.add_record(
            step=planned.name if i is None else item_name(planned.name[:-2], i),
            path=planned.path,
            timeout=planned.timeout_seconds,
            kind=StepKind.ACTION,
            compensates=None,
            now=now,
        )

    def add_record(
        self,
        *,
        step: str,
        path: str,
        timeout: int,
        kind: StepKind,
        compensates: str | None,
        now: datetime,
        due: datetime | None = None,
    ) -> StepRecord:
        if any(s.is_active and s.step == step for s in self.steps):  # pragma: no cover
            raise AssertionError(f"order {self.order_id}: step {step} is already active")
        record = StepRecord(
            order_id=self.order_id,
            step=step,
            seq=max((s.seq for s in self.steps), default=-1) + 1,
            kind=kind,
            path=path,
            timeout_seconds=timeout,
            process_state=StepState.PENDING,
            locked_by="",
            complete_by=due or now,
            compensates=compensates,
            changed=True,
        )
        record.record(
            now,
            Happened.CREATED,
            compensates=compensates,
            notBefore=iso(due) if due and due > now else None,
        )
        self.steps.append(record)
        return record

    def take_kept_event(self, record: StepRecord, name: str, now: datetime) -> None:
        inbox.take_kept(self, record, name, now)

    def started(self, now: datetime) -> None:
        """A step of the order began to work: a pending order is processing."""
        if self.status is OrderStatus.PENDING:
            self.set_status(OrderStatus.PROCESSING, now)

    def set_status(self, status: OrderStatus, now: datetime, **extra: Any) -> None:
        if status is self.status:
            return
        self.status = status
        told, self.told = self.told, None
        if status is told:
            return  # back where the app was last told, after a silent pass
        self.note(now, Happened.STATUS, status=str(status))
        self._notify(str(status), now, **extra)

    def pass_through(self, status: OrderStatus) -> None:
        """In ``status`` unannounced: the decision that follows takes it elsewhere."""
        if self.told is None:
            self.told = self.status
        self.status = status

    def _notify(self, status: str, now: datetime, **extra: Any) -> None:
        if self.reply_to:
            fields = {k: v for k, v in extra.items() if v is not None}
            body = status_message(self.order_id, status, now, **fields)
            self.outbox.append(Notice("status", body, self.reply_to))

    def alert(self, record: StepRecord, reason: str, now: datetime) -> None:
        # A reason from a remote or a handler ends a sentence; the alert goes on after it.
        reason = _CLAUSE_END.sub(r"\1", reason)
        self.note(now, Happened.ALERTED, step=record.step, reason=reason)
        body = alert_message(self.order_id, record.step, reason, record.failure_count, now)
        self.outbox.append(Notice("alert", body))

    def note(self, now: datetime, event: Happened, **details: Any) -> None:
        """An entry in the order's own history (for people: no decision reads it)."""
        entry: dict[str, Any] = {"at": iso(now), "event": str(event)}
        # Outside text (a remote's error, an operator's reason) shown as it is: visible.
        entry.update({k: visible_details(v) for k, v in details.items() if v is not None})
        self.history.append(entry)
        if len(self.history) > MAX_ORDER_HISTORY:
            self.history = self.history[:1] + self.history[-(MAX_ORDER_HISTORY - 1) :]

    def touch(self, now: datetime) -> None:
        self.updated_at = now

    def refuse(self, reason: str, message: str, step: str | None = None) -> TransitionRefused:
        return TransitionRefused(reason, message, order_id=self.order_id, step=step)
