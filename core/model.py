"""The order aggregate: one order record and one state record per step.

(Why one module of ~1,000 lines: it is one state machine; its transitions call each
other — a reply can end a step, start an unwinding and alert — and split across
modules each part would need the others' private state. The tests read it as one.)

All of an order's records live in one Table partition and change together in
one conditional transaction, so the aggregate is the unit of consistency. The
transitions below are pure: they take ``now``, change the records in memory,
and queue the notices to send (status messages, operator alerts) in
``outbox``. The store writes the changed records with If-Match on their ETags
and the outbox in the same transaction; nothing here does I/O.

Invariant: at most one step record is ``Pending`` or ``Processing`` (the
active step). Records are created when the workflow reaches them, so every
record that exists has a meaningful state.

Failure semantics (docs/contracts.md §3.11). Every attempt ends in one of:
``succeeded``; ``refused`` (a permanent 4xx: nothing applied); ``failed``
(transient failures until time ran out, counted in ``FailureCount``);
``deferred`` (not called, or the remote down for everyone: not counted, the
step waits); ``expired`` (no report by the deadline: counted, and it may
have applied). Whether any try *may have applied* is remembered per attempt
(``maybe_applied``), because the idempotency key is the same for every
attempt: one such attempt makes a final failure ambiguous. A success is
evidence whenever it arrives; a late report of an expired attempt corrects
what the expiry assumed.

This module is longer than most here on purpose: the whole state machine of
an order (claim, reply, expiry, deferral, failure, unwinding, resubmit,
cancel) reads in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from core.errors import TransitionRefused
from core.messages import AgentReply, alert_message, status_message
from core.orders import OrderMessage
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from core.timefmt import ensure_utc, iso, parse_iso
from core.workflows import Plan, PlannedStep

MAX_HISTORY: Final = 100
#: After an attempt's deadline, how long its last remote call may still be running
#: somewhere (agents stop before the deadline; this covers clock skew). A compensation
#: of a step that may have applied is not dispatched before then (it must not race it).
IN_FLIGHT_GRACE: Final = timedelta(seconds=2)
DEFAULT_POLICY: Final = RetryPolicy()


class ReplyEffect(StrEnum):
    """What applying a reply did (a reply that changes nothing raises TransitionRefused)."""

    APPLIED = "applied"  # it decided the step's attempt
    NOTED = "noted"  # late evidence: recorded (and maybe acted on), the step had moved on


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
    #: Attempts in which a call may have applied (sticky: the idempotency key is the same
    #: for every attempt, so one such attempt makes the step's failure ambiguous).
    maybe_applied: list[int] = field(default_factory=list)
    #: Deferrals in a row (the remote not called or down for everyone) and since when.
    deferrals: int = 0
    deferred_since: datetime | None = None
    #: An attempt failed while the remote served other orders: its failures are its own.
    singled_out: bool = False
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
    def not_before(self) -> datetime:
        """For a Pending step: the time it may run. The state record keeps it in
        ``CompleteBy`` (docs/contracts.md §3.2 has one time field: the deadline while Processing,
        the earliest start while Pending)."""
        return self.complete_by

    @property
    def is_active(self) -> bool:
        return self.process_state in (StepState.PENDING, StepState.PROCESSING)

    @property
    def may_have_applied(self) -> bool:
        return bool(self.maybe_applied)

    def mark_maybe_applied(self, attempt: int) -> None:
        if attempt not in self.maybe_applied:
            self.maybe_applied = sorted([*self.maybe_applied, attempt])

    def last_deadline(self) -> datetime:
        """The deadline of the latest attempt (after it, none of its calls can be running)."""
        deadlines = [
            parse_iso(h["completeBy"])
            for h in self.history
            if h.get("event") == "claimed" and isinstance(h.get("completeBy"), str)
        ]
        return max(deadlines, default=self.complete_by)

    def reset_for_retry(self) -> None:
        self.failure_count = 0
        self.deferrals = 0
        self.deferred_since = None
        self.singled_out = False
        self.locked_by = ""


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

    def apply_reply(
        self, reply: AgentReply, now: datetime, policy: RetryPolicy = DEFAULT_POLICY
    ) -> ReplyEffect:
        """Apply an agent's reply.

        A success is evidence whenever it arrives (late, or for an earlier attempt): it
        completes the step unless the step is finished or its workflow is unwinding.
        Any other reply decides only the attempt in flight (still Processing, same
        attempt, even past its deadline); for an attempt the supervisor already
        expired it corrects what the expiry assumed (``_late_report``).
        """
        step = self.find(reply.step)
        if step is None:
            raise self._refuse("unknown-step", f"the order has no step {reply.step}", reply.step)
        if reply.attempt > step.attempt:
            raise self._refuse(
                "stale-attempt",
                f"reply for attempt {reply.attempt} but step {step.step} has only had "
                f"{step.attempt}",
                step.step,
            )
        if reply.outcome == "succeeded":
            effect = self._success_evidence(step, reply, now)
        elif step.process_state is StepState.PROCESSING and step.attempt == reply.attempt:
            instance = step.locked_by
            if reply.outcome == "failed":
                step.failure_count += 1
                step.last_error = reply.error
                step.locked_by = ""
                if reply.may_have_applied:  # an earlier try of this attempt may have
                    step.mark_maybe_applied(step.attempt)
                step.record(
                    now,
                    "refused",
                    attempt=step.attempt,
                    instance=instance,
                    error=reply.error,
                    applied=reply.applied or "no",
                )
                # A refusal of the key says the service holds no effect for it (it would
                # answer with the stored result otherwise), so it settles the doubt of
                # earlier attempts; not that of a try in this same attempt, whose call
                # may still be running at the service ("in progress").
                self._fail_for_good(
                    step,
                    now,
                    f"{step.step} was refused by its service: {reply.error}",
                    reply.may_have_applied,
                )
            elif reply.outcome == "transient":
                self._count_failure(
                    step,
                    now,
                    policy,
                    event="failed",
                    instance=instance,
                    error=reply.error or "transient failure",
                    maybe=reply.may_have_applied,
                    singled_out=True,
                )
            else:
                self._defer(step, reply, now, policy, instance)
            effect = ReplyEffect.APPLIED
        else:
            effect = self._late_report(step, reply, now, policy)
        self._touch(now)
        return effect

    def expire(
        self, now: datetime, policy: RetryPolicy, grace: timedelta = timedelta(0)
    ) -> StepRecord:
        """The supervisor's move on a Processing step whose CompleteBy has passed.

        No report came, so the attempt counts as a failure that may have applied (a
        late report may still correct that). ``grace`` absorbs clock skew between
        instances: a step counts as expired only once ``now`` is past ``CompleteBy +
        grace``.
        """
        step = self.active_step()
        if step is None or step.process_state is not StepState.PROCESSING:
            raise self._refuse("not-processing", "no step of the order is Processing")
        if step.complete_by + grace > now:
            raise self._refuse(
                "not-expired", f"step {step.step} has until {iso(step.complete_by)}", step.step
            )
        self._count_failure(
            step,
            now,
            policy,
            event="expired",
            instance=step.locked_by,
            error=f"no reply within {step.timeout_seconds} s (attempt {step.attempt})",
            maybe=True,
            singled_out=False,
        )
        self._touch(now)
        return step

    def resubmit(self, now: datetime, by: str, reason: str = "") -> StepRecord:
        """Operator: put an ``error`` order back to work at the step that failed."""
        if self.status is not OrderStatus.ERROR:
            raise self._refuse(
                "not-in-error",
                f"only an order in error can be resubmitted; this one is {self.status}",
            )
        step = self._failed_step()
        if self.cancel_requested and step.kind is StepKind.ACTION:
            # The operator sends the step back to work: the order is to go on, not to be
            # undone (cancel it again for that). Its attempts get the usual retries.
            self.cancel_requested = False
            self._event(now, "cancel-withdrawn", by=by, step=step.step)
        self._restart(step, now)
        why = reason or None
        step.record(now, "resubmitted", by=by, reason=why)
        self._event(now, "resubmitted", by=by, step=step.step, reason=why)
        self._touch(now)
        return step

    def cancel(self, now: datetime, by: str, reason: str = "") -> None:
        """Operator or app: stop an unfinished order and undo what it did.

        A step in flight finishes first (its reply or its deadline decides whether
        there is something to undo); a non-compensable step that succeeds makes the
        cancel too late. Completed steps are compensated in reverse order and the
        order ends ``cancelled``. On an order in ``error``: a failed compensation is
        retried (the unwinding goes on); a failed action is left as it is and the
        completed steps are undone.
        """
        if self.status.finished:
            raise self._refuse("finished", f"the order is already {self.status}")
        if self.status is OrderStatus.ERROR:
            failed = self._failed_step()
            self.cancel_requested = True
            self._event(now, "cancel-requested", by=by, reason=reason or None)
            if failed.kind is StepKind.COMPENSATION:
                self._restart(failed, now)
                failed.record(now, "resubmitted", by=by, note="cancel: retry the unwinding")
            else:
                failed.record(
                    now,
                    "cancelled",
                    by=by,
                    note="left as it is ("
                    + ("it may have been applied" if failed.may_have_applied else "not applied")
                    + "); undoing the completed steps",
                )
                self._start_unwinding(now, None)
            self._touch(now)
            return
        if self.cancel_requested:
            raise self._refuse("already-cancelling", "a cancel of this order is under way")
        if self.status is OrderStatus.COMPENSATING:
            raise self._refuse("already-unwinding", "the order failed and is already being undone")
        self.cancel_requested = True
        self._event(now, "cancel-requested", by=by, reason=reason or None)
        step = self.active_step()
        if step is not None and step.process_state is StepState.PENDING:
            if step.attempt == 0:
                step.process_state = StepState.COMPENSATED
                step.record(now, "cancelled", note="never ran: nothing to undo")
                self._start_unwinding(now, None)
            else:
                self._stop_for_cancel(
                    step, now, f"{step.step} was waiting for another attempt when cancelled"
                )
        # Processing: in flight; its reply or its expiry decides.
        self._touch(now)

    # --- attempts (private) --------------------------------------------------------------

    def _count_failure(
        self,
        step: StepRecord,
        now: datetime,
        policy: RetryPolicy,
        *,
        event: str,
        instance: str,
        error: str,
        maybe: bool,
        singled_out: bool,
    ) -> None:
        """An attempt that reached for the remote and failed: FailureCount + 1."""
        step.failure_count += 1
        step.deferrals, step.deferred_since = 0, None
        if maybe:
            step.mark_maybe_applied(step.attempt)
        if singled_out:
            step.singled_out = True
        step.last_error = error
        step.locked_by = ""
        step.record(
            now,
            event,
            attempt=step.attempt,
            instance=instance or None,
            error=error,
            applied="maybe" if maybe else "no",
            failureCount=step.failure_count,
        )
        if self.cancel_requested and step.kind is StepKind.ACTION:
            self._stop_for_cancel(step, now, f"{step.step} had not succeeded when cancelled")
        elif policy.gives_up(step.failure_count):
            self._fail_for_good(
                step,
                now,
                f"{step.step} failed in {step.failure_count} attempts (last: {error})",
                step.may_have_applied,
            )
        else:
            self._retry_at(step, now + policy.backoff(step.failure_count, self.order_id), now)

    def _defer(
        self,
        step: StepRecord,
        reply: AgentReply,
        now: datetime,
        policy: RetryPolicy,
        instance: str,
    ) -> None:
        """Not called (or the remote is down for everyone): wait, without a failure."""
        if reply.may_have_applied:
            step.mark_maybe_applied(step.attempt)
        step.deferrals += 1
        if step.deferred_since is None:
            step.deferred_since = now
        step.last_error = reply.error
        step.locked_by = ""
        step.record(
            now,
            "deferred",
            attempt=step.attempt,
            instance=instance or None,
            reason=reply.error,
            notBefore=iso(reply.not_before) if reply.not_before else None,
            applied=reply.applied or "no",
        )
        if self.cancel_requested and step.kind is StepKind.ACTION:
            self._stop_for_cancel(step, now, f"{step.step} had not run when cancelled")
        elif now - step.deferred_since >= policy.deferral_window:
            waited = int((now - step.deferred_since).total_seconds())
            self._fail_for_good(
                step,
                now,
                f"{step.step} could not reach its service for {waited} s "
                f"(the deferral window; last: {reply.error})",
                step.may_have_applied,
            )
        else:
            due = max(
                reply.not_before or now,
                now + policy.deferral_delay(step.deferrals, self.order_id),
            )
            self._retry_at(step, due, now, deferral=step.deferrals)

    def _retry_at(
        self, step: StepRecord, due: datetime, now: datetime, deferral: int | None = None
    ) -> None:
        step.process_state = StepState.PENDING
        step.locked_by = ""
        step.complete_by = due
        step.record(
            now,
            "retry-scheduled",
            notBefore=iso(due),
            failureCount=step.failure_count,
            deferral=deferral,
        )

    def _success_evidence(self, step: StepRecord, reply: AgentReply, now: datetime) -> ReplyEffect:
        """A success reply, on time or not: the effect exists."""
        state = step.process_state
        undone = state is StepState.COMPENSATED and any(
            h.get("event") == "compensated" for h in step.history
        )
        if (
            state in (StepState.PROCESSED, StepState.COMPENSATING)
            or undone
            or (state is StepState.COMPENSATED and step.kind is StepKind.COMPENSATION)
        ):
            raise self._refuse(
                "already-settled",
                f"success for attempt {reply.attempt} but step {step.step} is {state}",
                step.step,
            )
        on_time = (
            state is StepState.PROCESSING
            and step.attempt == reply.attempt
            and now < step.complete_by
        )
        if step.is_active:
            self._complete(step, reply, now, step.locked_by, late=not on_time)
            return ReplyEffect.APPLIED if on_time else ReplyEffect.NOTED
        # The step failed for good, and yet it succeeded.
        if self.status is OrderStatus.ERROR and self._failed_step() is step:
            # An operator was alerted about this very step: the evidence settles it.
            self._event(now, "resolved", step=step.step, note="a success arrived after it failed")
            self._set_status(
                OrderStatus.COMPENSATING
                if step.kind is StepKind.COMPENSATION
                else OrderStatus.PROCESSING,
                now,
            )
            self._complete(step, reply, now, "", late=True)
            return ReplyEffect.NOTED
        compensation = (
            self.planned(step.step).compensation if step.kind is StepKind.ACTION else None
        )
        if self.status is OrderStatus.COMPENSATING and compensation is not None:
            # Being undone already: it was applied after all, so it is undone too.
            step.process_state = StepState.PROCESSED
            step.result = reply.result
            step.record(
                now, "succeeded", attempt=reply.attempt, late=True, note="applied after all"
            )
            if self.active_step() is None:
                self._continue_unwinding(now)
            return ReplyEffect.NOTED
        if any(
            h.get("event") == "late-success" and h.get("attempt") == reply.attempt
            for h in step.history
        ):
            raise self._refuse(
                "already-settled", f"success for attempt {reply.attempt} was noted before"
            )
        step.record(now, "late-success", attempt=reply.attempt)
        self._alert(
            step,
            f"{step.step} reported success after the order became {self.status}: its effect "
            + (f"stands; undo it with {compensation} if needed" if compensation else "stands"),
            now,
        )
        return ReplyEffect.NOTED

    def _late_report(
        self, step: StepRecord, reply: AgentReply, now: datetime, policy: RetryPolicy
    ) -> ReplyEffect:
        """A report for an attempt the supervisor expired: correct what it assumed.

        The expiry counted a failure that may have applied. A report that says nothing
        was applied removes that doubt; a deferral also gives the failure back (the
        remote was not reached, or was down for everyone), and its ``notBefore`` holds.
        Where the expiry was what made the step fail for good, the correction reaches
        that decision too.
        """
        number = reply.attempt
        expired = any(
            h.get("event") == "expired" and h.get("attempt") == number for h in step.history
        )
        settled = any(
            h.get("event") == "late-report" and h.get("attempt") == number for h in step.history
        )
        if not expired or settled:
            raise self._refuse(
                "stale-attempt",
                f"{reply.outcome} report for attempt {number}, but step {step.step} is "
                f"{step.process_state} on attempt {step.attempt}",
                step.step,
            )
        cleared = reply.applied == "no" and number in step.maybe_applied
        if cleared:
            step.maybe_applied = [n for n in step.maybe_applied if n != number]
        deferred = reply.outcome == "deferred"
        in_doubt = (  # failed for good as "may have been applied", and an operator was told
            step.process_state is StepState.ERROR
            and self.status is OrderStatus.ERROR
            and self._failed_step() is step
            and self._waiting_in_doubt(step)
        )
        waiting = in_doubt and self._decided_by_expiry(step, number)  # ... by this expiry
        refunded = deferred and step.failure_count > 0 and (step.is_active or waiting)
        if refunded:
            step.failure_count -= 1
        step.record(
            now,
            "late-report",
            attempt=number,
            outcome=reply.outcome,
            applied=reply.applied,
            error=reply.error,
            refunded=True if refunded else None,
        )
        if deferred and step.process_state is StepState.PENDING and reply.not_before:
            if reply.not_before > step.complete_by:  # not before the time it asked for
                self._retry_at(step, reply.not_before, now)
            return ReplyEffect.NOTED
        if not in_doubt or step.kind is not StepKind.ACTION:
            return ReplyEffect.NOTED
        if waiting and deferred and not self.cancel_requested:
            # The attempt that "failed" was never a failure: the step goes back to work.
            self._event(now, "resolved", step=step.step, note="a deferral, not a failure")
            self._set_status(OrderStatus.PROCESSING, now)
            step.deferrals += 1
            step.deferred_since = step.deferred_since or now
            self._retry_at(
                step,
                max(
                    reply.not_before or now,
                    now + policy.deferral_delay(step.deferrals, self.order_id),
                ),
                now,
                deferral=step.deferrals,
            )
            self._alert(
                step,
                f"update: {step.step} was not failing: attempt {number} was deferred "
                f"({reply.error}); it is back to work",
                now,
            )
            return ReplyEffect.NOTED
        if cleared and not step.may_have_applied:
            # It failed for good as "may have been applied" (this expiry, or an earlier one
            # whose report came after a later attempt gave up); now it is known it was not.
            step.record(now, "error", reason="not applied after all", applied="no")
            self._event(now, "reclassified", step=step.step, note="not applied after all")
            if self.cancel_requested or self.plan.compensates:
                self._alert(
                    step,
                    f"update: {step.step} was not applied after all (a late report of attempt "
                    f"{number}); undoing the completed steps",
                    now,
                )
                self._start_unwinding(now, None)
            else:
                self._alert(
                    step,
                    f"update: {step.step} was not applied after all (a late report of attempt "
                    f"{number}); it is safe to resubmit",
                    now,
                )
        return ReplyEffect.NOTED

    @staticmethod
    def _waiting_in_doubt(step: StepRecord) -> bool:
        """Whether the step's latest final failure was "may have been applied" and no
        operator action (a resubmit, a cancel that left it as it is) came after it."""
        last_error = max(
            (i for i, h in enumerate(step.history) if h.get("event") == "error"), default=-1
        )
        return (
            last_error >= 0
            and step.history[last_error].get("applied") == "maybe"
            and not any(
                h.get("event") in ("resubmitted", "cancelled")
                for h in step.history[last_error + 1 :]
            )
        )

    @staticmethod
    def _decided_by_expiry(step: StepRecord, attempt: int) -> bool:
        """Whether the step's latest final failure came from the expiry of ``attempt`` (and
        no operator action — a resubmit, a cancel that left it as it is — came after)."""
        last_error = max(
            (i for i, h in enumerate(step.history) if h.get("event") == "error"), default=-1
        )
        expiry = max(
            (
                i
                for i, h in enumerate(step.history)
                if h.get("event") == "expired" and h.get("attempt") == attempt
            ),
            default=-1,
        )
        if not 0 <= expiry < last_error:
            return False
        between = step.history[expiry + 1 : last_error]
        after = step.history[last_error + 1 :]
        return (
            not any(h.get("event") == "claimed" for h in between)
            and not any(h.get("event") in ("resubmitted", "cancelled") for h in after)
            and step.history[last_error].get("applied") == "maybe"
        )

    def _complete(
        self, step: StepRecord, reply: AgentReply, now: datetime, instance: str, *, late: bool
    ) -> None:
        step.process_state = StepState.PROCESSED
        step.locked_by = ""
        step.result = reply.result
        step.last_error = None
        step.deferrals, step.deferred_since = 0, None
        step.record(
            now,
            "succeeded",
            attempt=reply.attempt,
            instance=instance or None,
            late=True if late else None,
        )
        self._after_success(step, now)

    # --- workflow progress (private) -------------------------------------------------

    def _failed_step(self) -> StepRecord:
        failed = [s for s in self.steps if s.process_state is StepState.ERROR]
        if not failed:  # pragma: no cover - an error order always has an Error step
            raise self._refuse("no-failed-step", "the order has no step in Error")
        return max(failed, key=lambda s: s.seq)

    def _restart(self, step: StepRecord, now: datetime) -> None:
        step.process_state = StepState.PENDING
        step.reset_for_retry()
        step.complete_by = now
        self._set_status(
            OrderStatus.COMPENSATING
            if step.kind is StepKind.COMPENSATION
            else OrderStatus.PROCESSING,
            now,
        )

    def _after_success(self, step: StepRecord, now: datetime) -> None:
        if step.kind is StepKind.COMPENSATION:
            target = self.find(step.compensates or "")
            if target is not None:
                target.process_state = StepState.COMPENSATED
                target.record(now, "compensated", by=step.step)
            self._continue_unwinding(now)
            return
        if self.cancel_requested:
            if self.planned(step.step).compensation is not None:
                self._start_unwinding(now, None)
                return
            # Done, and nothing can undo it: the cancel came too late.
            self.cancel_requested = False
            note = f"{step.step} succeeded after the cancel and cannot be undone: the order goes on"
            step.record(now, "cancel-too-late", note=note)
            self._event(now, "cancel-too-late", step=step.step, note=note)
        index = self.plan.index_of(step.step)
        if index + 1 < len(self.plan.steps):
            self._add_step(self.plan.steps[index + 1], StepKind.ACTION, now)
        else:
            self._set_status(OrderStatus.COMPLETED, now)

    def _stop_for_cancel(self, step: StepRecord, now: datetime, why: str) -> None:
        """An action of a cancelled order that has not succeeded gets no further attempt."""
        if step.may_have_applied:
            self._fail_for_good(step, now, f"{why}; an attempt may have applied it", True)
            return
        step.process_state = StepState.COMPENSATED
        step.locked_by = ""
        step.record(now, "cancelled", note="not applied: nothing to undo")
        self._start_unwinding(now, None)

    def _fail_for_good(self, step: StepRecord, now: datetime, reason: str, ambiguous: bool) -> None:
        """A step will not be tried again. What happens depends on what it may have done.

        Not applied (every try refused, throttled, unavailable, or never sent): the
        workflow unwinds, or, with nothing to compensate, the step is Error with an alert
        that says it is safe to resubmit. May have applied: it is compensated itself when
        it can be (after its last call can no longer be running); otherwise nobody can
        know what happened, and the order waits for an operator.
        """
        step.process_state = StepState.ERROR
        step.locked_by = ""
        verdict = "it may have been applied" if ambiguous else "it was not applied"
        step.record(
            now,
            "error",
            reason=reason,
            applied="maybe" if ambiguous else "no",
            failureCount=step.failure_count,
        )
        if step.kind is StepKind.COMPENSATION:
            self._alert(
                step,
                f"compensation {reason}; {verdict}. The unwinding stopped at {step.step} "
                f"(undoing {step.compensates}): fix the cause, then resubmit the order (or "
                "cancel it again) to retry it",
                now,
            )
            self._set_status(OrderStatus.ERROR, now)
            return
        compensation = self.planned(step.step).compensation
        if ambiguous and compensation is not None:
            self._start_unwinding(now, step)
            return
        if ambiguous:
            advice = (
                "it cannot be compensated, so the cancel stops here: ask its service whether "
                "it happened, then resubmit (if it was applied, the same idempotency key "
                "returns its result and the order completes) or cancel again to undo the "
                "other steps"
                if self.cancel_requested
                else "it has no compensation: ask its service whether it happened, then "
                "resubmit to retry it with the same idempotency key (safe either way), or "
                "cancel to undo the completed steps"
            )
            self._alert(step, f"{reason}; {verdict}, and {advice}", now)
            self._set_status(OrderStatus.ERROR, now)
            return
        if self.cancel_requested or self.plan.compensates:
            self._start_unwinding(now, None)
            return
        self._alert(
            step, f"{reason}; {verdict}: it is safe to resubmit once the cause is fixed", now
        )
        self._set_status(OrderStatus.ERROR, now)

    def _start_unwinding(self, now: datetime, ambiguous: StepRecord | None) -> None:
        if ambiguous is not None:
            self._set_status(OrderStatus.COMPENSATING, now)
            # Not before its last call can no longer be running (it must not race it).
            self._begin_compensation(
                ambiguous, now, not_before=ambiguous.last_deadline() + IN_FLIGHT_GRACE
            )
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

    def _begin_compensation(
        self, target: StepRecord, now: datetime, not_before: datetime | None = None
    ) -> None:
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
            due=max(now, not_before) if not_before else now,
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
        due: datetime | None = None,
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
            complete_by=due or now,
            compensates=compensates,
            changed=True,
        )
        record.record(
            now,
            "created",
            compensates=compensates,
            notBefore=iso(due) if due and due > now else None,
        )
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
        self._event(now, "alerted", step=step.step, reason=reason)
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
