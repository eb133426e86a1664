"""The order aggregate: one order record and one state record per step.

All of an order's records live in one Table partition and change together in one
conditional transaction, so the aggregate is the unit of consistency. The transitions
below are pure: they take ``now``, change the records in memory, and queue the notices
to send (status messages, operator alerts) in ``outbox``. The store writes the changed
records with If-Match on their ETags and the outbox in the same transaction; nothing
here does I/O.

Invariant: at most one step record is ``Pending`` or ``Processing`` (the active step).
Records are created when the workflow reaches them, so every record that exists has a
meaningful state.

Failure semantics (docs/contracts.md §3.11). Every attempt ends in one of:
``succeeded``; ``refused`` (a permanent 4xx: nothing applied by that try); ``failed``
(transient failures until time ran out, counted in ``FailureCount``); ``deferred``
(not called, or the remote down for everyone: not counted, the step waits);
``expired`` (no report by the deadline: counted); ``not-sent`` (its request never left:
not counted). What each attempt may have done is typed state (``core.attempts``), and
every decision reads that, never the history: a report that says "maybe" counts
whenever it arrives, and only the remote's own answer for the key (or an operator's
statement) settles it. How the workflow unwinds, and how the operator's actions change
an order, is ``core.unwinding``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from core.attempts import Applied, Attempt, Ending
from core.cancel import CancelPreview
from core.control_cache import hold_until
from core.errors import UnboundMessage
from core.events import Event
from core.evidence import Evidence, ReplyEffect, applied_of
from core.messages import AgentReply, ReplyOutcome
from core.order_message import OrderMessage
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.timefmt import ensure_utc, iso
from core.unwinding import IN_FLIGHT_GRACE, Notice
from core.workflows import Plan

__all__ = [
    "DEFAULT_POLICY",
    "IN_FLIGHT_GRACE",
    "CancelPreview",
    "Notice",
    "Order",
    "ReplyEffect",
    "StepRecord",
]

DEFAULT_POLICY: Final = RetryPolicy()
#: Stuck episodes an order remembers having alerted (the latest ones).
MAX_STUCK_EPISODES: Final = 10


@dataclass
class Order(Evidence):
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
    #: by whom, and the step that took it (none yet: kept for its step).
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Not stored: times a transition wants the order looked at again (a delay that
    #: began), for the dispatcher to queue after the save (the sweeps are the safety net).
    wakeups: list[datetime] = field(default_factory=list)

    # --- creation ---------------------------------------------------------------

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
        )
        order._event(now, Event.RECEIVED, workflow=plan.workflow)
        order._notify("received", now)
        order._start_group(plan.groups()[0], now)
        return order

    # --- transitions: attempts --------------------------------------------------------

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
        record = self._claimable(now, step, resumed=resumed)
        return self._claim(record, instance, now, skew)

    def _claim(self, step: StepRecord, instance: str, now: datetime, skew: timedelta) -> StepRecord:
        step.end_pause(now, "claimed")
        step.process_state = StepState.PROCESSING
        step.locked_by = instance
        step.attempt += 1
        step.ensure_secret(step.attempt)
        if step.round_began_at is None:
            step.round_began_at = now
        step.complete_by = now + timedelta(seconds=step.timeout_seconds)
        step.attempts.add(
            Attempt(
                step.attempt,
                now,
                step.complete_by,
                instance,
                skew_seconds=skew.total_seconds(),
            )
        )
        if step.budget_since is None:
            step.budget_since = now
        step.record(
            now,
            Event.CLAIMED,
            attempt=step.attempt,
            instance=instance,
            completeBy=iso(step.complete_by),
        )
        if step.kind is StepKind.ACTION and self.status is OrderStatus.PENDING:
            self._set_status(OrderStatus.PROCESSING, now)
        self._touch(now)
        return step

    def _claimable(
        self, now: datetime, name: str | None = None, *, resumed: bool = False
    ) -> StepRecord:
        if self.status.terminal:
            raise self._refuse("order-not-running", f"the order is {self.status}")
        tasks = [s for s in self.active_steps() if not self.waits(s)]
        if name is not None:
            tasks = [s for s in tasks if s.step == name]
        pending = [s for s in tasks if s.process_state is StepState.PENDING]
        if not tasks:
            raise self._refuse("no-active-step", "the order has no step waiting to run", name)
        step = (pending or tasks)[0]
        if step.process_state is StepState.PROCESSING:
            raise self._refuse(
                "already-claimed",
                f"step {step.step} is held by {step.locked_by} until {iso(step.complete_by)}",
                step.step,
            )
        if step.complete_by > now and not (resumed and step.paused_for):
            raise self._refuse(
                "not-due", f"step {step.step} may run again at {iso(step.complete_by)}", step.step
            )
        return step

    # --- transitions: an agent paused at runtime (core.controls) ------------------------

    def hold_for_pause(
        self, agent: str, now: datetime, until: datetime, step: str | None = None
    ) -> StepRecord:
        """The scheduler's move on a due Pending step whose agent an operator paused: it
        is not claimed (no attempt, nothing counted, no deferral window spent, no alert);
        it stays Pending, to be looked at again at ``until``, or sooner after a resume."""
        record = self._claimable(now, step)
        self._hold(record, agent, now, until)
        self._touch(now)
        return record

    def _hold(self, step: StepRecord, agent: str, now: datetime, until: datetime) -> None:
        if step.paused_for != agent:
            step.paused_for, step.paused_since = agent, now
            step.record(now, Event.AGENT_PAUSED, agent=agent, until=iso(until))
        step.process_state = StepState.PENDING
        step.locked_by = ""
        step.complete_by = until
        step.changed = True

    def apply_reply(
        self, reply: AgentReply, now: datetime, policy: RetryPolicy = DEFAULT_POLICY
    ) -> ReplyEffect:
        """Apply an agent's report.

        A success is evidence whenever it arrives (late, or for an earlier attempt): it
        completes the step unless the step is finished or its workflow is unwinding. The
        first report of the attempt in flight decides it; any later report (another copy
        of the attempt, a report after its expiry) adds its evidence (``_late_report``).
        A report that adds nothing is refused (``TransitionRefused``: nothing to save).
        """
        step = self.bound_step(reply.step, reply.attempt, reply.token)
        attempt = step.attempts.get(reply.attempt)
        if reply.outcome is ReplyOutcome.SUCCEEDED:
            effect = self._success_evidence(step, attempt, reply, now)
        elif (
            attempt is not None
            and attempt.in_flight
            and step.process_state is StepState.PROCESSING
            and step.attempt == reply.attempt
        ):
            self._decide(step, attempt, reply, now, policy)
            effect = ReplyEffect.APPLIED
        else:
            effect = self._late_report(step, attempt, reply, now, policy)
        self._touch(now)
        return effect

    def bound_step(self, name: str, attempt: int, token: str) -> StepRecord:
        """The step record a request or report of attempt ``attempt`` speaks for, if its
        ``token`` is that attempt's own (``StepRecord.binds``); else ``UnboundMessage``:
        forged, or for an attempt never claimed. Its compensation's records are searched
        too (a compensation is a step of its own name)."""
        step = self.find(name)
        if step is None:
            raise UnboundMessage(
                f"the order has no step {name!r}: no claim speaks for this message",
                order_id=self.order_id,
                step=name[:64],
            )
        if not step.binds(attempt, token):
            why = (
                f"attempt {attempt} was never claimed (the step has had {step.attempt})"
                if not 1 <= attempt <= step.attempt
                else "its token is not that attempt's"
                if token
                else "it carries no token"
            )
            raise UnboundMessage(
                f"a message for attempt {attempt} of step {name} that no claim speaks for: {why}",
                order_id=self.order_id,
                step=name,
            )
        return step

    def resendable(self, name: str, attempt: int) -> bool:
        """Whether a duplicate delivery of the order may send this request again: attempt 1
        of a step of the plan's first group (``Scheduler._duplicate``: its first delivery
        may have died between the save that claimed it and the send). No other request is
        ever sent twice."""
        record = self.find(name)
        if record is None or attempt != 1 or record.kind is not StepKind.ACTION:
            return False
        try:
            return self.planned(name).group == self.plan.groups()[0]
        except (KeyError, ValueError, IndexError):
            return False

    def take(self, name: str, attempt: int, copy: str) -> Literal["took", "held", "other"]:
        """An agent takes attempt ``attempt`` of step ``name`` with one copy of its request
        (``copy``: the Storage queue message's id; that transport has no duplicate
        detection, and a redelivered order sends attempt 1's request again while it may
        be in flight). ``took``: the first copy, recorded (save it before calling);
        ``held``: this copy took it before (a redelivery of the same message: it may call
        again, as after a crash); ``other``: another copy holds it, and calls nothing."""
        record = self.find(name)
        found = record.attempts.get(attempt) if record is not None else None
        if record is None or found is None:
            return "other"  # compacted: long ended, so no copy of it is to call
        if found.taken_by == copy:
            return "held"
        if found.taken_by:
            return "other"
        found.taken_by = copy
        record.changed = True
        return "took"

    def mark_stuck(self, step: str, reason: str, now: datetime) -> StepRecord:
        """The stuck check's alert (supervisor/aggregator.py): the active step ``step`` has
        been in its state far longer than it usually takes. One alert per stuck episode (a
        step and its attempt): a second call for the same one is refused, and so is one
        for a step that has moved on; a later episode (another step, a later attempt) is
        alerted again."""
        active = self.find(step)
        if active is None or not active.is_active:
            raise self._refuse("moved-on", f"step {step} is no longer active", step)
        episode = f"{step}:{active.attempt}"
        alerted = [e for e in self.stuck_alerted.split(",") if e]
        if episode in alerted:
            raise self._refuse("stuck-alerted", f"already alerted: {episode}", step)
        self.stuck_alerted = ",".join([*alerted, episode][-MAX_STUCK_EPISODES:])
        self._alert(active, reason, now)
        self._touch(now)
        return active

    def expire(
        self,
        now: datetime,
        policy: RetryPolicy,
        grace: timedelta = timedelta(0),
        step: str | None = None,
    ) -> StepRecord:
        """The supervisor's move on a Processing step (``step``, or the first) whose
        CompleteBy has passed.

        No report came, so the attempt counts as a failure that may have applied (a
        late report may still correct that). ``grace`` absorbs clock skew between
        instances: a step counts as expired only once ``now`` is past ``CompleteBy +
        grace``. A step held at its last counted failure (``StepRecord.held``) gives up
        now: its time budget is spent. A delay whose time has come is over (``Processed``);
        an event that did not come in time fails the step for good, not applied.
        """
        processing = [
            s
            for s in self.active_steps()
            if s.process_state is StepState.PROCESSING and (step is None or s.step == step)
        ]
        if not processing:
            raise self._refuse("not-processing", "no step of the order is Processing", step)
        expired = [s for s in processing if s.complete_by + grace <= now]
        if not expired:
            first = processing[0]
            raise self._refuse(
                "not-expired", f"step {first.step} has until {iso(first.complete_by)}", first.step
            )
        record = expired[0]
        kind = self.kind_of(record)
        if kind == "delay":
            self._end_delay(record, now)
            self._touch(now)
            return record
        if kind == "event":
            waited = record.waiting_for or {}
            self._fail_for_good(
                record,
                now,
                f"{record.step}: no event {waited.get('event', record.step)} within "
                f"{record.timeout_seconds} s (nothing to retry)",
                False,
            )
            self._touch(now)
            return record
        return self._expire_attempt(record, now, policy)

    def _expire_attempt(self, step: StepRecord, now: datetime, policy: RetryPolicy) -> StepRecord:
        attempt = step.current
        if attempt is not None and not attempt.in_flight:
            step.locked_by = ""
            if self._halting() and step.kind is StepKind.ACTION:
                self._stop_for_cancel(step, now, f"{step.step} had not succeeded when cancelled")
            elif not policy.gives_up(step.failure_count):  # pragma: no cover - a refund un-holds
                self._retry_at(step, now, now)
            else:
                spent = int((now - (step.budget_since or attempt.claimed_at)).total_seconds())
                self._fail_for_good(
                    step,
                    now,
                    f"{step.step} failed in {step.failure_count} attempts over {spent} s "
                    f"(last: {step.last_error})",
                    step.may_have_applied,
                )
            self._touch(now)
            return step
        if attempt is None:  # pragma: no cover - the latest attempt is always kept
            attempt = Attempt(
                step.attempt,
                step.complete_by - timedelta(seconds=step.timeout_seconds),
                step.complete_by,
                step.locked_by,
            )
            step.attempts.add(attempt)
        error = f"no reply within {step.timeout_seconds} s (attempt {step.attempt})"
        attempt.end(Ending.EXPIRED, now, error)
        self._count_failure(
            step,
            attempt,
            now,
            policy,
            event=Event.EXPIRED,
            instance=step.locked_by,
            error=error,
            reported=False,
            singled_out=False,
        )
        self._touch(now)
        return step

    def unsent(
        self, step_name: str, number: int, reason: str, now: datetime, policy: RetryPolicy
    ) -> StepRecord:
        """The request of a claim never left (the send failed, or the transport refused
        it): no try, so no failure and no doubt; the step waits a little and runs again."""
        step = self.find(step_name)
        attempt = step.attempts.get(number) if step is not None else None
        if (
            step is None
            or attempt is None
            or not attempt.in_flight
            or attempt.reports
            or step.process_state is not StepState.PROCESSING
            or step.attempt != number
        ):
            raise self._refuse(
                "not-in-flight",
                f"attempt {number} of step {step_name} is not in flight with no report",
                step_name,
            )
        attempt.end(Ending.NOT_SENT, now, reason)
        attempt.sent = False
        attempt.applied = Applied.NO
        step.last_error = reason
        step.locked_by = ""
        step.record(now, Event.NOT_SENT, attempt=number, reason=reason)
        self._wait(step, now, policy, None, reason, cause="could not send its request")
        self._touch(now)
        return step

    # --- attempts (private) --------------------------------------------------------------

    def _decide(
        self,
        step: StepRecord,
        attempt: Attempt,
        reply: AgentReply,
        now: datetime,
        policy: RetryPolicy,
    ) -> None:
        """The first report of the attempt in flight: it decides how the attempt ended."""
        instance = step.locked_by
        attempt.report(applied_of(reply), reply.running_until, reply.runner or "", reply.run_ended)
        if reply.running_until is not None:
            step.record(
                now, Event.HANDLER_RUNNING, attempt=attempt.number, until=iso(reply.running_until)
            )
        if reply.outcome is ReplyOutcome.REFUSED:
            attempt.end(Ending.REFUSED, now, reply.error)
            attempt.counted = True
            step.failure_count += 1
            step.last_error = reply.error
            step.locked_by = ""
            settled: list[int] = []
            if reply.settled:
                # The service looked the key up and holds no effect for it: that settles
                # earlier attempts' doubt; not that of a try in this same attempt, whose
                # call may still be running at the service.
                settled = step.attempts.settle(
                    f"the service refused attempt {attempt.number} after looking the key up "
                    f"({(reply.error or '')[:120]})",
                    now,
                    before=attempt.number,
                )
            step.record(
                now,
                Event.REFUSED,
                attempt=attempt.number,
                instance=instance,
                error=reply.error,
                applied=str(attempt.applied),
                settled=settled or None,
                failureCount=step.failure_count,
            )
            self._fail_for_good(
                step,
                now,
                f"{step.step} was refused by its service: {reply.error}",
                step.may_have_applied,
            )
        elif reply.outcome is ReplyOutcome.TRANSIENT:
            attempt.end(Ending.TRANSIENT, now, reply.error)
            self._count_failure(
                step,
                attempt,
                now,
                policy,
                event=Event.TRANSIENT,
                instance=instance,
                error=reply.error or "transient failure",
                reported=True,
                singled_out=True,
                seen=reply.evidence_at,
            )
        else:
            attempt.end(Ending.DEFERRED, now, reply.error)
            step.last_error = reply.error
            step.locked_by = ""
            step.record(
                now,
                Event.DEFERRED,
                attempt=attempt.number,
                instance=instance or None,
                reason=reply.error,
                notBefore=iso(reply.not_before) if reply.not_before else None,
                applied=str(attempt.applied),
                paused=True if reply.paused else None,
            )
            if not reply.paused:
                self._wait(step, now, policy, reply.not_before, reply.error or "deferred")
            elif self._halting() and step.kind is StepKind.ACTION:
                self._stop_for_cancel(step, now, f"{step.step} had not run when cancelled")
            else:
                # Its agent is paused: the step waits for the resume, not for the remote,
                # so none of its deferral window is spent (a pause may last any time).
                until = max(reply.not_before or now, hold_until(now, step.paused_since))
                self._hold(step, self.plan.agent_of(step.step), now, until)

    def _count_failure(
        self,
        step: StepRecord,
        attempt: Attempt,
        now: datetime,
        policy: RetryPolicy,
        *,
        event: Event,
        instance: str,
        error: str,
        reported: bool,
        singled_out: bool,
        seen: datetime | None = None,
    ) -> None:
        """An attempt that reached for the remote and failed: FailureCount + 1, and the next
        attempt paced in time (docs/contracts.md §3.11)."""
        step.failure_count += 1
        attempt.counted = True
        step.deferrals, step.deferred_since = 0, None
        if singled_out:
            step.single_out(seen, now)  # ages from its evidence (``seen``), never renewed
        step.last_error = error
        step.record(
            now,
            event,
            attempt=attempt.number,
            instance=instance or None,
            error=error,
            applied=str(attempt.applied),
            failureCount=step.failure_count,
        )
        if self._halting() and step.kind is StepKind.ACTION:
            step.locked_by = ""
            self._stop_for_cancel(step, now, f"{step.step} had not succeeded when cancelled")
            return
        since = step.budget_since or attempt.claimed_at
        if policy.gives_up(step.failure_count):
            spent_at = policy.budget_floor(since, policy.max_failure_count, step.timeout_seconds)
            if now < spent_at:
                # The count is spent before the time is: the step stays Processing (its
                # attempt decided) and the supervisor makes it final at the floor.
                step.complete_by = max(step.complete_by, spent_at)
                step.record(now, Event.GIVE_UP_HELD, until=iso(step.complete_by))
                return
            step.locked_by = ""
            self._fail_for_good(
                step,
                now,
                f"{step.step} failed in {step.failure_count} attempts (last: {error})",
                step.may_have_applied,
                by_expiry_of=attempt.number if event is Event.EXPIRED else None,
            )
            return
        step.locked_by = ""
        wait = (policy.paced if reported else policy.backoff)(step.failure_count, self.order_id)
        floor = policy.budget_floor(since, step.failure_count, step.timeout_seconds)
        self._retry_at(step, max(now + wait, floor), now)

    def _wait(
        self,
        step: StepRecord,
        now: datetime,
        policy: RetryPolicy,
        not_before: datetime | None,
        why: str,
        *,
        cause: str = "could not reach its service",
    ) -> None:
        """Not called (or the remote is down for everyone, or the request never left):
        wait, without a failure, at most for the deferral window."""
        step.deferrals += 1
        if step.deferred_since is None:
            step.deferred_since = now
        window_end = step.deferred_since + policy.deferral_window
        if self._halting() and step.kind is StepKind.ACTION:
            self._stop_for_cancel(step, now, f"{step.step} had not run when cancelled")
        elif now >= window_end:
            waited = int((now - step.deferred_since).total_seconds())
            self._fail_for_good(
                step,
                now,
                f"{step.step} {cause} for {waited} s (the deferral window; last: {why})",
                step.may_have_applied,
            )
        elif not_before is not None and not_before > window_end:
            self._fail_for_good(
                step,
                now,
                f"{step.step}'s service asked not to be called before {iso(not_before)}, past "
                f"the deferral window (it ends {iso(window_end)}; last: {why})",
                step.may_have_applied,
            )
        else:
            due = max(not_before or now, now + policy.deferral_delay(step.deferrals, self.order_id))
            self._retry_at(step, due, now, deferral=step.deferrals)
