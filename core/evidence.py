"""Evidence that arrives after its attempt was decided (docs/contracts.md §3.11).

Doubt is kept until the remote settles it: a report that says an attempt may have
applied counts whichever copy of the attempt sends it and whenever it arrives; a
success is evidence that the step applied, late or not; the first report of an attempt
that expired corrects what the expiry assumed; a Python handler that runs on past its
deadline holds its step's compensation. ``core.model.Order`` decides the attempt in
flight; this is everything that comes after, read from the typed attempt state.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from core.attempts import Applied, Attempt, Ending
from core.events import Event
from core.messages import AgentReply, ReplyOutcome, idempotency_key
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.timefmt import iso
from core.unwinding import Unwinding


class ReplyEffect(StrEnum):
    """What applying a reply did (a reply that changes nothing raises TransitionRefused)."""

    APPLIED = "applied"  # it decided the step's attempt
    NOTED = "noted"  # late evidence: recorded (and maybe acted on), the step had moved on


def applied_of(reply: AgentReply) -> Applied:
    """What a report says of its attempt's effect."""
    if reply.outcome is ReplyOutcome.SUCCEEDED:
        return Applied.YES
    return Applied.MAYBE if reply.may_have_applied else Applied.NO


class Evidence(Unwinding):
    """Late evidence, for ``core.model.Order``."""

    def _success_evidence(
        self, step: StepRecord, attempt: Attempt | None, reply: AgentReply, now: datetime
    ) -> ReplyEffect:
        """A success reply, on time or not: the effect exists (for a step that completes
        on an event, only the remote's acceptance: ``_accepted``)."""
        if step.kind is StepKind.ACTION and self.planned(step.step).completes_on:
            return self._accepted(step, attempt, reply, now)
        state = step.process_state
        undo = self.undo_of(step) if state in _UNDONE else None
        # A step already known applied has one effect, whichever attempt reports it (one
        # idempotency key): its undo began after it, so covers it.
        if undo is not None and not step.attempts.applied:
            if attempt is not None:
                attempt.report(Applied.YES, None, reply.runner or "", run_ended=reply.run_ended)
                if attempt.in_flight:  # pragma: no cover - an undone step's attempts ended
                    attempt.end(Ending.SUCCEEDED, now)
            skew = attempt.skew if attempt is not None else timedelta(0)
            if undo.attempt == 0 or self._before_undo(reply, undo, skew, now):
                # Its undo has not begun, or began after the effect existed: the undo
                # covers it. A handler that ran on has ended: the undo waits no longer.
                step.record(now, Event.LATE_SUCCESS, attempt=reply.attempt, note="being undone")
                self._hold_compensation(step, now)
                return ReplyEffect.NOTED
            return self._applied_after_undo(step, undo, reply, now)
        if (
            state in (StepState.PROCESSED, StepState.COMPENSATING)
            or (state is StepState.COMPENSATED and step.undone_by is not None)
            or (state is StepState.COMPENSATED and step.kind is StepKind.COMPENSATION)
        ):
            raise self._refuse(
                "already-settled",
                f"success for attempt {reply.attempt} but step {step.step} is {state}",
                step.step,
            )
        if attempt is not None and attempt.applied is Applied.YES and not step.is_active:
            raise self._refuse(
                "already-settled", f"success for attempt {reply.attempt} was noted before"
            )
        on_time = (
            state is StepState.PROCESSING
            and step.attempt == reply.attempt
            and attempt is not None
            and attempt.in_flight
            and now < step.complete_by
        )
        if attempt is not None:
            attempt.report(Applied.YES, None, reply.runner or "", reply.run_ended)
            if attempt.in_flight:
                attempt.end(Ending.SUCCEEDED, now)
        if step.is_active:
            self._complete(step, reply, now, step.locked_by, late=not on_time)
            return ReplyEffect.APPLIED if on_time else ReplyEffect.NOTED
        # The step failed for good, and yet it succeeded.
        if self.status is OrderStatus.ERROR and self.failed_step() is step:
            # An operator was alerted about this very step: the evidence settles it.
            self._event(
                now, Event.RESOLVED, step=step.step, note="a success arrived after it failed"
            )
            self._set_status(
                OrderStatus.COMPENSATING
                if step.kind is StepKind.COMPENSATION
                else OrderStatus.PROCESSING,
                now,
            )
            step.gave_up = None
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
                now, Event.SUCCEEDED, attempt=reply.attempt, late=True, note="applied after all"
            )
            if self.active_step() is None:
                self._continue_unwinding(now)
            return ReplyEffect.NOTED
        step.record(now, Event.LATE_SUCCESS, attempt=reply.attempt)
        self._alert(
            step,
            f"{step.step} reported success after the order became {self.status}: its effect "
            + (f"stands; undo it with {compensation} if needed" if compensation else "stands"),
            now,
        )
        return ReplyEffect.NOTED

    def _accepted(
        self, step: StepRecord, attempt: Attempt | None, reply: AgentReply, now: datetime
    ) -> ReplyEffect:
        """A 2xx for a step that ``completes_on`` an event: the remote accepted the work. It
        may apply from then on (doubt), and the step stays Processing until the event
        comes (or its deadline passes: the supervisor calls again, with the same key, so a
        lost callback is asked for again). An event that came first is taken now."""
        name = self.planned(step.step).completes_on
        assert name is not None
        if attempt is None or attempt.accepted:
            raise self._stale(step, reply)
        attempt.accepted = True
        attempt.report(Applied.MAYBE, None, reply.runner or "", reply.run_ended)
        on_time = (
            step.process_state is StepState.PROCESSING
            and step.attempt == reply.attempt
            and attempt.in_flight
        )
        step.record(
            now,
            Event.ACCEPTED,
            attempt=reply.attempt,
            waitingFor={"event": name},
            late=None if on_time else True,
        )
        if on_time:
            step.waiting_for = {"event": name}
            kept = self.events.get(name)
            if kept is not None and not kept.get("taken"):
                self._take_event(step, name, kept, now)
            return ReplyEffect.APPLIED
        if not step.is_active and step.process_state is StepState.ERROR:
            self._new_doubt(step, reply.attempt, now)
        return ReplyEffect.NOTED

    def _before_undo(
        self, reply: AgentReply, undo: StepRecord, skew: timedelta, now: datetime
    ) -> bool:
        """Whether the success existed before ``undo``'s first claim of this key round began,
        on every clock: then the undo's call met the effect. The success's own time is the
        agent's (``answeredAt``; its arrival, when the agent did not say), less the skew
        its attempt allowed."""
        began = undo.round_began()
        answered = reply.answered_at or now
        return began is not None and answered + skew < began

    def _applied_after_undo(
        self, step: StepRecord, undo: StepRecord, reply: AgentReply, now: datetime
    ) -> ReplyEffect:
        """The worst news the order can get (docs/contracts.md §3.11): ``step`` applied after
        its undo began, so the undo may have missed it and its effect may stand. Never
        swallowed: the step is being undone again; once no attempt of the undo is in
        flight the order is ``error`` with an alert that says what happened, and a resubmit
        (console, API, CLI) runs the undo again as a new effect, with the key
        ``<orderId>:<undo>:<round>``."""
        answered = reply.answered_at or now
        step.applied_after_undo = answered
        step.result = reply.result
        step.record(
            now,
            Event.LATE_SUCCESS,
            attempt=reply.attempt,
            answeredAt=iso(answered),
            note=f"applied after its undo {undo.step} began",
        )
        current = undo.current
        if undo.process_state is StepState.PROCESSING and current is not None and current.in_flight:
            return ReplyEffect.NOTED  # decided when the undo's attempt ends (``_overtaken``)
        self._overtaken(undo, now)
        return ReplyEffect.NOTED

    def _late_report(
        self,
        step: StepRecord,
        attempt: Attempt | None,
        reply: AgentReply,
        now: datetime,
        policy: RetryPolicy,
    ) -> ReplyEffect:
        """A report for an attempt already decided (by an earlier report, its expiry, or a
        failed send): its evidence counts, whenever it arrives.

        A "maybe" is never dropped (another copy of the attempt ran; a report came late).
        The first report of an attempt that expired corrects what the expiry assumed: a
        "no" clears the doubt of no report, a deferral also gives back the failure the
        expiry counted, and where the expiry made the step fail for good the correction
        reaches that decision too. A Python handler's report that it still runs (or has
        ended) moves the step's compensation accordingly.
        """
        number = reply.attempt
        applied = applied_of(reply)
        if attempt is None:  # kept only as a number: it applied nothing, or was folded
            if applied is Applied.MAYBE and step.attempts.fold_doubt(number):
                _note_report(step, reply, now)
                self._new_doubt(step, number, now)
                return ReplyEffect.NOTED
            raise self._stale(step, reply)
        was_in_doubt = step.may_have_applied
        first = attempt.reports == 0
        before = (attempt.applied, attempt.settled_by)
        running_before = dict(attempt.running)
        attempt.report(applied, reply.running_until, reply.runner or "", reply.run_ended)
        if reply.settled:
            # The service's own refusal of the key settles earlier attempts; a handler run's
            # refusal when it ends also settles its own attempt (nothing of it runs on).
            through = number + 1 if reply.run_ended and not attempt.running else number
            step.attempts.settle(
                f"the service refused attempt {number} after looking the key up "
                f"({(reply.error or '')[:120]})",
                now,
                before=through,
            )
        deferred = reply.outcome is ReplyOutcome.DEFERRED
        waiting = self._waiting_on(step, number)
        refunded = (
            first
            and attempt.ending is Ending.EXPIRED
            and deferred
            and attempt.counted
            and step.failure_count > 0
            # counted in this budget (a resubmit since has reset the count)
            and (step.budget_since is None or attempt.claimed_at >= step.budget_since)
            and (step.is_active or waiting)
        )
        if refunded:
            attempt.counted = False
            step.failure_count -= 1
        evidence = (attempt.applied, attempt.settled_by) != before
        runs = attempt.running != running_before
        if not (evidence or refunded or first or runs):
            raise self._stale(step, reply)
        if evidence or refunded or first or reply.run_ended:
            _note_report(step, reply, now, refunded=True if refunded else None)
        if runs:
            self._hold_compensation(step, now)
        if refunded and step.held and not policy.gives_up(step.failure_count):
            self._unhold(step, attempt, now, policy)
            return ReplyEffect.NOTED
        if deferred and first and step.process_state is StepState.PENDING and reply.not_before:
            if step.complete_by < reply.not_before <= now + policy.deferral_window:
                self._retry_at(step, reply.not_before, now)  # not before the time it asked for
            return ReplyEffect.NOTED
        if waiting and deferred and first and not self.cancel_requested:
            # The attempt that "failed" was never a failure: the step goes back to work.
            self._event(now, Event.RESOLVED, step=step.step, note="a deferral, not a failure")
            self._set_status(
                OrderStatus.COMPENSATING
                if step.kind is StepKind.COMPENSATION
                else OrderStatus.PROCESSING,
                now,
            )
            step.gave_up = None
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
        if was_in_doubt and not step.may_have_applied and self._alerted_in_doubt(step):
            self._not_applied_after_all(step, number, now)
        elif not was_in_doubt and step.may_have_applied:
            self._new_doubt(step, number, now)
        return ReplyEffect.NOTED

    def _unhold(
        self, step: StepRecord, attempt: Attempt, now: datetime, policy: RetryPolicy
    ) -> None:
        """Held at its last counted failure, and a failure given back: the count is not spent
        after all, so the step goes on (paced as after any counted failure)."""
        since = step.budget_since or attempt.claimed_at
        floor = policy.budget_floor(since, step.failure_count, step.timeout_seconds)
        wait = policy.paced(step.failure_count, self.order_id)
        step.record(now, Event.RESOLVED, note="a late deferral: the count is not spent")
        self._retry_at(step, max(now + wait, floor), now)

    def _stale(self, step: StepRecord, reply: AgentReply) -> Exception:
        return self._refuse(
            "stale-attempt",
            f"{reply.outcome} report for attempt {reply.attempt} adds nothing: step "
            f"{step.step} is {step.process_state} on attempt {step.attempt}",
            step.step,
        )

    def _alerted_in_doubt(self, step: StepRecord) -> bool:
        """The step failed for good as "may have been applied", an operator was told, and
        no operator acted on it since (a resubmit, a cancel that left it as it is)."""
        gave_up = step.gave_up
        return (
            gave_up is not None
            and gave_up.ambiguous
            and gave_up.operator is None
            and step.process_state is StepState.ERROR
            and self.status is OrderStatus.ERROR
            and self.failed_step() is step
        )

    def _waiting_on(self, step: StepRecord, number: int) -> bool:
        """... and that failure came from the expiry of attempt ``number``."""
        return (
            self._alerted_in_doubt(step)
            and step.gave_up is not None
            and step.gave_up.by_expiry_of == number
        )

    def _not_applied_after_all(self, step: StepRecord, number: int, now: datetime) -> None:
        """It failed for good as "may have been applied"; now it is known it was not."""
        if step.kind is not StepKind.ACTION:
            return
        if step.gave_up is not None:
            step.gave_up.ambiguous = False
        step.record(now, Event.ERROR, reason="not applied after all", applied="no")
        self._event(now, Event.RECLASSIFIED, step=step.step, note="not applied after all")
        late = f"{step.step} was not applied after all (a late report of attempt {number})"
        if self.cancel_requested or self.plan.compensates:
            self._alert(step, f"update: {late}; undoing the completed steps", now)
            self._start_unwinding(now, None)
        else:
            self._alert(step, f"update: {late}; it is safe to resubmit", now)

    def _new_doubt(self, step: StepRecord, number: int, now: datetime) -> None:
        """Evidence that the step may have applied, after decisions assumed it had not."""
        if step.is_active or step.kind is not StepKind.ACTION:
            return  # still running: its verdict will count it
        key = idempotency_key(self.order_id, step.step)
        note = f"{step.step} may have been applied after all (a report of attempt {number})"
        gave_up = step.gave_up
        if (
            gave_up is not None
            and not gave_up.ambiguous
            and self.status is OrderStatus.ERROR
            and self.failed_step() is step
        ):
            gave_up.ambiguous = True
            self._event(now, Event.RECLASSIFIED, step=step.step, note="may have been applied")
            self._alert(
                step,
                f"update: {note}: it is no longer known to be safe to resubmit. Ask its "
                f"service whether {key} happened, then resubmit (the same idempotency key) "
                "or cancel, stating it did not happen",
                now,
            )
            return
        if step.attempts.applied:
            # One key, one effect, and it is known to have applied (and, if the step was
            # undone, undone): another attempt's "maybe" adds no doubt about anything.
            return
        if step.process_state in (StepState.ERROR, StepState.COMPENSATED):
            self._event(now, Event.RECLASSIFIED, step=step.step, note="may have been applied")
            self._alert(
                step,
                f"update: {note}, although the order is {self.status} as if it had not. Ask "
                f"its service whether {key} happened, and undo it by hand if it did",
                now,
            )


#: States of an action whose undo has been started.
_UNDONE = frozenset({StepState.COMPENSATING, StepState.COMPENSATED})


def _note_report(step: StepRecord, reply: AgentReply, now: datetime, **extra: object) -> None:
    """A late report in the step's history (for people: decisions read the attempts)."""
    step.record(
        now,
        Event.LATE_REPORT,
        attempt=reply.attempt,
        outcome=str(reply.outcome),
        applied=str(applied_of(reply)),
        error=reply.error,
        runningUntil=iso(reply.running_until) if reply.running_until else None,
        **extra,
    )
