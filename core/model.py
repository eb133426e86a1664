"""The order aggregate: one order record and one state record per step.

All of an order's records live in one Table partition and change together in
one conditional transaction, so the aggregate is the unit of consistency. The
transitions below are pure: they take ``now``, change the records in memory,
and queue the notices to send (status messages, operator alerts) in
``outbox``. The store writes the changed records with If-Match on their ETags
and the outbox in the same transaction; nothing here does I/O.

Invariant: at most one step record is ``Pending`` or ``Processing`` (the
active step). Records are created when the workflow reaches them, so every
record that exists has a meaningful state.

This module is longer than most here on purpose: the whole state machine of
an order (claim, reply, expiry, failure, unwinding, resubmit, cancel) reads
in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from core.errors import TransitionRefused
from core.messages import AgentReply, alert_message, status_message
from core.orders import OrderMessage
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from core.timefmt import ensure_utc, iso
from core.workflows import Plan, PlannedStep

MAX_HISTORY: Final = 100


@dataclass(frozen=True)
class Notice:
    """A message to send once the transition is stored (transactional outbox)."""

    kind: str  # "status" (to the order's replyTo) or "alert" (to operator-alerts)
    body: str
    queue: str | None = None  # the replyTo queue for a status notice


@dataclass
class StepRecord:
    order_id: str
    step: str
    seq: int
    kind: StepKind
    path: str
    timeout_seconds: int
    process_state: StepState
    locked_by: str
    complete_by: datetime
    failure_count: int = 0
    attempt: int = 0
    compensates: str | None = None
    result: dict[str, Any] | None = None
    last_error: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    history_dropped: int = 0
    etag: str | None = None
    changed: bool = False

    def record(self, now: datetime, event: str, **details: Any) -> None:
        entry: dict[str, Any] = {"at": iso(now), "event": event}
        entry.update({k: v for k, v in details.items() if v is not None})
        self.history.append(entry)
        if len(self.history) > MAX_HISTORY:
            # Keep the first entry (how it began) and the most recent ones.
            drop = len(self.history) - MAX_HISTORY
            self.history = self.history[:1] + self.history[1 + drop :]
            self.history_dropped += drop
        self.changed = True

    @property
    def is_active(self) -> bool:
        return self.process_state in (StepState.PENDING, StepState.PROCESSING)


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
    history: list[dict[str, Any]] = field(default_factory=list)
    #: W3C trace context of the span that accepted the order: every later step of the
    #: order continues this trace (one order, one trace).
    trace: dict[str, str] = field(default_factory=dict)
    version: int = 0
    etag: str | None = None
    outbox: list[Notice] = field(default_factory=list)
    #: Whatever the store needs to remember between load and save (opaque here).
    store_meta: dict[str, Any] = field(default_factory=dict)

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
        order._event(now, "received", workflow=plan.workflow)
        order._notify("received", now)
        order._add_step(plan.steps[0], StepKind.ACTION, now)
        return order

    # --- queries ----------------------------------------------------------------

    @property
    def workflow(self) -> str:
        return self.plan.workflow

    def active_step(self) -> StepRecord | None:
        active = [s for s in self.steps if s.is_active]
        if len(active) > 1:  # pragma: no cover - guarded by every transition below
            raise AssertionError(f"order {self.order_id} has {len(active)} active steps")
        return active[0] if active else None

    def find(self, step: str) -> StepRecord | None:
        """The latest record of the named step (a resubmitted step keeps its record)."""
        matches = [s for s in self.steps if s.step == step]
        return max(matches, key=lambda s: s.seq) if matches else None

    def planned(self, step: str) -> PlannedStep:
        return self.plan.steps[self.plan.index_of(step)]

    # --- transitions --------------------------------------------------------------

    def claim(self, instance: str, now: datetime) -> StepRecord:
        """Take the active Pending step: Processing, locked, with a new deadline and attempt."""
        step = self._claimable(now)
        step.process_state = StepState.PROCESSING
        step.locked_by = instance
        step.attempt += 1
        step.complete_by = now + timedelta(seconds=step.timeout_seconds)
        step.record(
            now,
            "claimed",
            attempt=step.attempt,
            instance=instance,
            completeBy=iso(step.complete_by),
        )
        if step.kind is StepKind.ACTION and self.status is OrderStatus.PENDING:
            self._set_status(OrderStatus.PROCESSING, now)
        self._touch(now)
        return step

    def _claimable(self, now: datetime) -> StepRecord:
        if self.status.terminal:
            raise self._refuse("order-not-running", f"the order is {self.status}")
        step = self.active_step()
        if step is None:
            raise self._refuse("no-active-step", "the order has no step waiting to run")
        if step.process_state is StepState.PROCESSING:
            raise self._refuse(
                "already-claimed",
                f"step {step.step} is held by {step.locked_by} until {iso(step.complete_by)}",
                step.step,
            )
        if step.complete_by > now:
            raise self._refuse(
                "not-due", f"step {step.step} may run again at {iso(step.complete_by)}", step.step
            )
        return step

    def apply_reply(self, reply: AgentReply, now: datetime) -> StepRecord:
        """Apply an agent's reply, fenced: same attempt, still Processing, deadline not passed."""
        step = self.find(reply.step)
        if step is None:
            raise self._refuse("unknown-step", f"the order has no step {reply.step}", reply.step)
        if step.process_state is not StepState.PROCESSING:
            raise self._refuse(
                "not-processing",
                f"reply for attempt {reply.attempt} but step {step.step} is {step.process_state}",
                step.step,
            )
        if step.attempt != reply.attempt:
            raise self._refuse(
                "stale-attempt",
                f"reply for attempt {reply.attempt} but step {step.step} is on attempt "
                f"{step.attempt}",
                step.step,
            )
        if now >= step.complete_by:
            raise self._refuse(
                "deadline-passed",
                f"reply for attempt {reply.attempt} arrived at {iso(now)}, after the deadline "
                f"{iso(step.complete_by)}",
                step.step,
            )
        instance = step.locked_by
        step.locked_by = ""
        if reply.outcome == "succeeded":
            step.process_state = StepState.PROCESSED
            step.result = reply.result
            step.last_error = None
            step.record(now, "succeeded", attempt=step.attempt, instance=instance)
            self._after_success(step, now)
        else:
            step.failure_count += 1
            step.last_error = reply.error
            step.record(now, "failed", attempt=step.attempt, instance=instance, error=reply.error)
            self._fail_for_good(
                step, now, f"{step.step} failed permanently: {reply.error}", ambiguous=False
            )
        self._touch(now)
        return step

    def expire(
        self, now: datetime, policy: RetryPolicy, grace: timedelta = timedelta(0)
    ) -> StepRecord:
        """The supervisor's move on a Processing step whose CompleteBy has passed.

        ``grace`` absorbs clock skew between instances: a step counts as expired
        only once ``now`` is past ``CompleteBy + grace``. (Skew cannot break
        correctness anyway: a late reply is fenced by its attempt number.)
        """
        step = self.active_step()
        if step is None or step.process_state is not StepState.PROCESSING:
            raise self._refuse("not-processing", "no step of the order is Processing")
        if step.complete_by + grace > now:
            raise self._refuse(
                "not-expired", f"step {step.step} has until {iso(step.complete_by)}", step.step
            )
        step.failure_count += 1
        step.record(
            now,
            "expired",
            attempt=step.attempt,
            instance=step.locked_by,
            failureCount=step.failure_count,
        )
        step.locked_by = ""
        step.last_error = f"no reply within {step.timeout_seconds} s (attempt {step.attempt})"
        if self.cancel_requested:
            self._fail_for_good(
                step,
                now,
                f"{step.step} gave no reply after the order was cancelled "
                f"(attempt {step.attempt}); it may or may not have been applied",
                ambiguous=True,
            )
        elif policy.gives_up(step.failure_count):
            self._fail_for_good(
                step,
                now,
                f"{step.step} gave no reply in {step.failure_count} attempts of "
                f"{step.timeout_seconds} s; it may or may not have been applied",
                ambiguous=True,
            )
        else:
            step.process_state = StepState.PENDING
            step.complete_by = now + policy.backoff(step.failure_count, self.order_id)
            step.record(
                now,
                "retry-scheduled",
                notBefore=iso(step.complete_by),
                failureCount=step.failure_count,
            )
        self._touch(now)
        return step

    def resubmit(self, now: datetime, by: str) -> StepRecord:
        """Operator: put an ``error`` order back to work at the step that failed."""
        if self.status is not OrderStatus.ERROR:
            raise self._refuse(
                "not-in-error",
                f"only an order in error can be resubmitted; this one is {self.status}",
            )
        failed = [s for s in self.steps if s.process_state is StepState.ERROR]
        if not failed:  # pragma: no cover - an error order always has an Error step
            raise self._refuse("no-failed-step", "the order has no step in Error")
        step = max(failed, key=lambda s: s.seq)
        step.process_state = StepState.PENDING
        step.failure_count = 0
        step.locked_by = ""
        step.complete_by = now
        step.record(now, "resubmitted", by=by)
        self._event(now, "resubmitted", by=by, step=step.step)
        self._set_status(
            OrderStatus.COMPENSATING
            if step.kind is StepKind.COMPENSATION
            else OrderStatus.PROCESSING,
            now,
        )
        self._touch(now)
        return step

    def cancel(self, now: datetime, by: str, reason: str = "") -> None:
        """Operator or app: stop an unfinished order and undo what it did.

        A step in flight finishes first (its reply or its deadline decides
        whether there is something to undo); then completed steps are
        compensated in reverse order and the order ends ``cancelled``.
        """
        if self.status.finished:
            raise self._refuse("finished", f"the order is already {self.status}")
        if self.status is OrderStatus.COMPENSATING or self.cancel_requested:
            raise self._refuse("already-unwinding", "the order is already being undone")
        if any(
            s.kind is StepKind.COMPENSATION and s.process_state is StepState.ERROR
            for s in self.steps
        ):
            raise self._refuse(
                "compensation-failed",
                "a compensation failed and the unwinding stopped there: resubmit the order to "
                "retry that compensation",
            )
        self.cancel_requested = True
        self._event(now, "cancel-requested", by=by, reason=reason or None)
        step = self.active_step()
        if step is not None and step.process_state is StepState.PENDING:
            if step.attempt == 0 or step.kind is StepKind.COMPENSATION:
                # Never called: nothing to undo.
                step.process_state = StepState.COMPENSATED
                step.record(now, "cancelled", note="never ran: nothing to undo")
                self._start_unwinding(now, None)
            else:
                # Called before, no reply: it may have been applied.
                step.record(now, "cancelled", note="earlier attempts got no reply")
                self._fail_for_good(
                    step,
                    now,
                    f"{step.step} was cancelled after {step.attempt} attempt(s) without a reply; "
                    "it may or may not have been applied",
                    ambiguous=True,
                )
        elif step is None:  # an error order: undo what completed
            self._start_unwinding(now, None)
        self._touch(now)

    # --- workflow progress (private) -------------------------------------------------

    def _after_success(self, step: StepRecord, now: datetime) -> None:
        if step.kind is StepKind.COMPENSATION:
            target = self.find(step.compensates or "")
            if target is not None:
                target.process_state = StepState.COMPENSATED
                target.record(now, "compensated", by=step.step)
            self._continue_unwinding(now)
            return
        if self.cancel_requested:
            self._start_unwinding(now, None)
            return
        index = self.plan.index_of(step.step)
        if index + 1 < len(self.plan.steps):
            self._add_step(self.plan.steps[index + 1], StepKind.ACTION, now)
        else:
            self._set_status(OrderStatus.COMPLETED, now)

    def _fail_for_good(
        self, step: StepRecord, now: datetime, reason: str, *, ambiguous: bool
    ) -> None:
        """A step failed for good: Error and an alert, then unwind or wait for an operator.

        ``ambiguous``: the remote service never answered, so its effect may
        exist. Such a step is compensated itself when it can be; when it cannot,
        nobody can know what happened and the order waits for an operator.
        """
        step.process_state = StepState.ERROR
        step.locked_by = ""
        step.record(now, "error", reason=reason, failureCount=step.failure_count)
        if step.kind is StepKind.COMPENSATION:
            self._alert(
                step, f"compensation {reason}; unwinding stopped, the operator decides", now
            )
            self._set_status(OrderStatus.ERROR, now)
            return
        planned = self.planned(step.step)
        if ambiguous and planned.compensation is None:
            self._alert(step, f"{reason}; it has no compensation, the operator decides", now)
            self._set_status(OrderStatus.ERROR, now)
            return
        if not self.plan.compensates and not self.cancel_requested:
            self._alert(step, reason, now)
            self._set_status(OrderStatus.ERROR, now)
            return
        self._alert(step, f"{reason}; undoing the completed steps", now)
        self._start_unwinding(now, step if ambiguous else None)

    def _start_unwinding(self, now: datetime, ambiguous: StepRecord | None) -> None:
        if ambiguous is not None:
            self._set_status(OrderStatus.COMPENSATING, now)
            self._begin_compensation(ambiguous, now)
            return
        if self._next_to_compensate() is None:
            self._finish_unwinding(now)
            return
        self._set_status(OrderStatus.COMPENSATING, now)
        self._continue_unwinding(now)

    def _next_to_compensate(self) -> StepRecord | None:
        candidates = [
            s
            for s in self.steps
            if s.kind is StepKind.ACTION
            and s.process_state is StepState.PROCESSED
            and self.planned(s.step).compensation
        ]
        return max(candidates, key=lambda s: s.seq) if candidates else None

    def _continue_unwinding(self, now: datetime) -> None:
        target = self._next_to_compensate()
        if target is None:
            self._finish_unwinding(now)
        else:
            self._begin_compensation(target, now)

    def _finish_unwinding(self, now: datetime) -> None:
        self._set_status(
            OrderStatus.CANCELLED if self.cancel_requested else OrderStatus.COMPENSATED, now
        )

    def _begin_compensation(self, target: StepRecord, now: datetime) -> None:
        planned = self.planned(target.step)
        assert planned.compensation is not None
        target.process_state = StepState.COMPENSATING
        target.record(now, "compensating", by=planned.compensation)
        self._add_record(
            step=planned.compensation,
            path=planned.compensation_path or planned.compensation,
            timeout=planned.compensation_timeout_seconds or planned.timeout_seconds,
            kind=StepKind.COMPENSATION,
            compensates=target.step,
            now=now,
        )

    def _add_step(self, planned: PlannedStep, kind: StepKind, now: datetime) -> None:
        self._add_record(
            step=planned.name,
            path=planned.path,
            timeout=planned.timeout_seconds,
            kind=kind,
            compensates=None,
            now=now,
        )

    def _add_record(
        self,
        *,
        step: str,
        path: str,
        timeout: int,
        kind: StepKind,
        compensates: str | None,
        now: datetime,
    ) -> None:
        if self.active_step() is not None:  # pragma: no cover - guarded by the callers
            raise AssertionError(f"order {self.order_id}: a step is already active")
        record = StepRecord(
            order_id=self.order_id,
            step=step,
            seq=max((s.seq for s in self.steps), default=-1) + 1,
            kind=kind,
            path=path,
            timeout_seconds=timeout,
            process_state=StepState.PENDING,
            locked_by="",
            complete_by=now,
            compensates=compensates,
            changed=True,
        )
        record.record(now, "created", compensates=compensates)
        self.steps.append(record)

    def _set_status(self, status: OrderStatus, now: datetime) -> None:
        if status is self.status:
            return
        self.status = status
        self._event(now, "status", status=str(status))
        self._notify(str(status), now)

    def _notify(self, status: str, now: datetime) -> None:
        if self.reply_to:
            self.outbox.append(
                Notice("status", status_message(self.order_id, status, now), self.reply_to)
            )

    def _alert(self, step: StepRecord, reason: str, now: datetime) -> None:
        self.outbox.append(
            Notice(
                "alert", alert_message(self.order_id, step.step, reason, step.failure_count, now)
            )
        )

    def _event(self, now: datetime, event: str, **details: Any) -> None:
        entry: dict[str, Any] = {"at": iso(now), "event": event}
        entry.update({k: v for k, v in details.items() if v is not None})
        self.history.append(entry)
        if len(self.history) > MAX_HISTORY:
            self.history = self.history[:1] + self.history[-(MAX_HISTORY - 1) :]

    def _touch(self, now: datetime) -> None:
        self.updated_at = now

    def _refuse(self, reason: str, message: str, step: str | None = None) -> TransitionRefused:
        return TransitionRefused(reason, message, order_id=self.order_id, step=step)
