"""How an order moves on once a step is decided: the next step, completion, failing
for good, unwinding (compensation in reverse), and the operator's actions (resubmit,
cancel). ``core.model.Order`` is this plus the attempts' transitions.

Cancel never undoes around a doubt (docs/contracts.md §3.11): a step that may have
applied and cannot be compensated blocks a cancel that would compensate the steps
before it, unless the operator states, with the cancel, that the step did not happen
(``not_applied``); the history records who said so. ``cancel_preview`` says exactly
what a cancel would undo, leave, or wait for, so the console can show it before
anyone confirms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from core.attempts import GaveUp
from core.cancel import CancelPreview, preview_cancel
from core.errors import TransitionRefused
from core.events import Event
from core.messages import (
    MAX_KEY_ROUND,
    AgentReply,
    alert_message,
    idempotency_key,
    status_message,
)
from core.patches import apply_patch, history_of
from core.progress import Progress, StepFunctionFailed, json_object
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.text import visible_details
from core.timefmt import iso
from core.workflows import Plan, PlannedStep

#: After an attempt's deadline, how long its last remote call may still be running
#: somewhere (agents stop before the deadline; this covers clock skew). A compensation
#: of a step that may have applied is not dispatched before then (it must not race it).
IN_FLIGHT_GRACE: Final = timedelta(seconds=2)
#: ``GaveUp.kind`` of a compensation whose step applied after it began (``_overtaken``).
OVERTAKEN: Final = "overtaken"


@dataclass(frozen=True)
class Notice:
    """A message to send once the transition is stored (transactional outbox)."""

    kind: str  # "status" (to the order's replyTo) or "alert" (to operator-alerts)
    body: str
    queue: str | None = None  # the replyTo queue for a status notice


class Unwinding(Progress):
    """Unwinding and operator actions of ``core.model.Order`` (its fields are declared
    there); going forward, group by group, is ``core.progress``."""

    order_id: str
    plan: Plan
    status: OrderStatus
    steps: list[StepRecord]
    cancel_requested: bool
    history: list[dict[str, Any]]
    reply_to: str | None
    outbox: list[Notice]
    updated_at: datetime

    # --- queries ----------------------------------------------------------------

    @property
    def workflow(self) -> str:
        return self.plan.workflow

    def find(self, step: str) -> StepRecord | None:
        """The latest record of the named step (a resubmitted step keeps its record)."""
        matches = [s for s in self.steps if s.step == step]
        return max(matches, key=lambda s: s.seq) if matches else None

    def planned(self, step: str) -> PlannedStep:
        return self.plan.steps[self.plan.index_of(step)]

    def undo_of(self, step: StepRecord) -> StepRecord | None:
        """The latest record of the compensation that undoes ``step`` (None: not begun)."""
        undos = [
            s for s in self.steps if s.kind is StepKind.COMPENSATION and s.compensates == step.step
        ]
        return max(undos, key=lambda s: s.seq) if undos else None

    # --- operator actions ------------------------------------------------------------

    def resubmit(self, now: datetime, by: str, reason: str = "", patch: Any = None) -> StepRecord:
        """Operator: put an ``error`` order back to work at the step that failed.

        ``patch`` (docs/contracts.md §3.14): a JSON merge patch of the order's data, for a
        failed step known not to have applied. The data becomes the patched data; the step
        (and the others of its group that go back to work) decide their ``input`` again
        and run under a new idempotency key, since what they send changed; the steps
        already done keep their results. ``InvalidPatch`` for a patch refused, and a
        refusal (``doubt``) where a step that goes back to work may have applied."""
        if self.status is not OrderStatus.ERROR:
            raise self._refuse(
                "not-in-error",
                f"only an order in error can be resubmitted; this one is {self.status}",
            )
        step = self.failed_step()
        if patch is not None:
            self._patch(step, patch, now, by, reason)
        if self.cancel_requested and step.kind is StepKind.ACTION:
            # The operator sends the step back to work: the order is to go on, not to be
            # undone (cancel it again for that). Its attempts get the usual retries.
            self.cancel_requested = False
            self._event(now, Event.CANCEL_WITHDRAWN, by=by, step=step.step)
        why = reason or None
        if step.kind is StepKind.ACTION:
            # The group goes back to work: the step that failed, the others of its group
            # that failed or were stopped because it did (the ones done stay done).
            for record in self.group_records():
                if record is not step and (
                    record.process_state is StepState.ERROR
                    or (record.process_state is StepState.COMPENSATED and not record.undone_by)
                ):
                    self._restart(record, now)
                    record.record(now, Event.RESUBMITTED, by=by, reason=why, note="its group")
        self._restart(step, now)
        step.record(now, Event.RESUBMITTED, by=by, reason=why)
        self._event(now, Event.RESUBMITTED, by=by, step=step.step, reason=why)
        if step.kind is StepKind.ACTION:
            self._group_progress(now)  # a wait that starts over may end at once
        self._touch(now)
        return step

    def _patch(self, step: StepRecord, patch: Any, now: datetime, by: str, reason: str) -> None:
        again = [step]
        if step.kind is StepKind.ACTION:
            again += [
                r
                for r in self.group_records()
                if r is not step
                and (
                    r.process_state is StepState.ERROR
                    or (r.process_state is StepState.COMPENSATED and not r.undone_by)
                )
            ]
        doubtful = next((r for r in again if r.may_have_applied), None)
        if doubtful is not None:
            numbers = ", ".join(map(str, doubtful.maybe_applied))
            raise self._refuse(
                "doubt",
                f"{doubtful.step} may have been applied (attempt(s) {numbers} may have reached "
                "it): its data cannot change under it. Ask its service whether "
                f"{doubtful.idempotency_key} happened; then resubmit without a patch to "
                "retry it as it was, or cancel, stating it did not happen",
                step=doubtful.step,
            )
        patched, changed = apply_patch(self.body, patch)
        self.body = patched
        if changed:
            for record in again:
                record.decided.pop("input", None)
                record.input = None
                if record.attempt and record.key_round < MAX_KEY_ROUND:
                    record.key_round += 1
                    record.record(now, Event.NEW_KEY, key=record.idempotency_key, why="patched")
        self._event(now, Event.PATCHED, by=by, reason=reason or None, **history_of(changed))

    def cancel(
        self, now: datetime, by: str, reason: str = "", not_applied: str | None = None
    ) -> None:
        """Operator or app: stop an unfinished order and undo what it did.

        A step in flight finishes first (its reply or its deadline decides whether there
        is something to undo); a non-compensable step that succeeds makes the cancel too
        late. Completed steps are compensated in reverse order and the order ends
        ``cancelled``. On an order in ``error``: a failed compensation is retried (the
        unwinding goes on); a failed action is left as it is and the completed steps are
        undone — unless it may have applied and cannot be undone: then ``not_applied``
        must name it (the operator states it did not happen), or the cancel is refused.
        """
        preview = self.cancel_preview(now, not_applied)
        if not preview.allowed:
            reason_code = (
                "finished"
                if self.status.finished
                else "doubt"
                if preview.doubtful
                else "already-cancelling"
                if self.cancel_requested
                else "already-unwinding"
            )
            raise self._refuse(reason_code, preview.refusal or "the order cannot be cancelled")
        self.cancel_requested = True
        self._event(
            now,
            Event.CANCEL_REQUESTED,
            by=by,
            reason=reason or None,
            notApplied=not_applied or None,
        )
        if preview.doubtful:
            doubtful = self.find(preview.doubtful)
            assert doubtful is not None
            self._state_not_applied(doubtful, now, by, reason)
        if self.status is OrderStatus.ERROR:
            failed = self.failed_step()
            if failed.kind is StepKind.COMPENSATION and not_applied == failed.compensates:
                self._not_needed(failed, now, by, reason)
            elif failed.kind is StepKind.COMPENSATION:
                self._restart(failed, now)
                failed.record(now, Event.RESUBMITTED, by=by, note="cancel: retry the unwinding")
            elif failed.may_have_applied:  # and it can be undone (else: refused above)
                if failed.gave_up is not None:
                    failed.gave_up.operator = by
                failed.record(
                    now, Event.CANCELLED, by=by, note="it may have been applied: undoing it too"
                )
                self._start_unwinding(now, failed)
            else:
                if failed.gave_up is not None:
                    failed.gave_up.operator = by
                failed.record(
                    now,
                    Event.CANCELLED,
                    by=by,
                    note="left as it is (not applied); undoing the completed steps",
                )
                self._start_unwinding(now, None)
            self._touch(now)
            return
        for step in self.active_steps():
            if not step.is_active or step.kind is not StepKind.ACTION:
                continue  # stopped meanwhile (its group settled), or a compensation
            if self.waits(step):
                # An event or a delay applies nothing: it stops at once.
                step.waiting_for = None
                step.process_state = StepState.COMPENSATED
                step.record(now, Event.CANCELLED, note="waited; nothing to undo")
            elif step.held:
                # Its attempt has ended; only the count's final decision was waiting.
                step.locked_by = ""
                self._stop_for_cancel(step, now, f"{step.step} had not succeeded when cancelled")
            elif step.process_state is StepState.PENDING and step.attempt == 0:
                step.process_state = StepState.COMPENSATED
                step.record(now, Event.CANCELLED, note="never ran: nothing to undo")
            elif step.process_state is StepState.PENDING:
                self._stop_for_cancel(
                    step, now, f"{step.step} was waiting for another attempt when cancelled"
                )
            # Processing: in flight; its reply or its expiry decides.
        self._group_progress(now)
        self._touch(now)

    def cancel_preview(self, now: datetime, not_applied: str | None = None) -> CancelPreview:
        """What a cancel would do now, and why it would be refused (``core.cancel``)."""
        return preview_cancel(self, now, not_applied)

    def _not_needed(self, undo: StepRecord, now: datetime, by: str, reason: str) -> None:
        """The operator states that the step ``undo`` would undo did not happen (its
        service refused the undo for good: "no charge to refund"): the undo is not needed,
        and the unwinding goes on past it. Who said so, and why, is kept."""
        target = self.find(undo.compensates or "")
        assert target is not None
        self._state_not_applied(target, now, by, reason)
        undo.process_state = StepState.SKIPPED
        undo.gave_up = None
        undo.record(now, Event.NOT_NEEDED, by=by, reason=reason or None)
        target.process_state = StepState.COMPENSATED
        target.record(now, Event.NOT_NEEDED, by=by, reason=reason or None, undo=undo.step)
        self._set_status(OrderStatus.COMPENSATING, now)
        self._continue_unwinding(now)

    def _state_not_applied(self, step: StepRecord, now: datetime, by: str, reason: str) -> None:
        """The operator's statement that ``step`` did not happen settles its doubt."""
        why = f" ({reason})" if reason else ""
        settled = step.attempts.settle(f"operator {by}: stated it did not happen{why}", now)
        step.record(now, Event.STATED_NOT_APPLIED, by=by, reason=reason or None, attempts=settled)
        self._event(now, Event.STATED_NOT_APPLIED, step=step.step, by=by, reason=reason or None)

    # --- workflow progress (private) -------------------------------------------------

    def failed_step(self) -> StepRecord:
        failed = [s for s in self.steps if s.process_state is StepState.ERROR]
        if not failed:  # pragma: no cover - an error order always has an Error step
            raise self._refuse("no-failed-step", "the order has no step in Error")
        return max(failed, key=lambda s: s.seq)

    def _restart(self, step: StepRecord, now: datetime) -> None:
        if step.kind is StepKind.COMPENSATION:
            self._new_round_if_overtaken(step, now)
        self._set_status(
            OrderStatus.COMPENSATING
            if step.kind is StepKind.COMPENSATION
            else OrderStatus.PROCESSING,
            now,
        )
        if step.kind is StepKind.ACTION:
            # An event it took (or refused) was this run's: the next run takes a new one.
            planned = self.planned(step.step)
            for name in (planned.name if planned.kind == "event" else None, planned.completes_on):
                if name and self.events.get(name, {}).get("taken"):
                    del self.events[name]
            self._start_again(step, now)
            return
        step.process_state = StepState.PENDING
        step.reset_for_retry()
        step.complete_by = now
        self._decide_compensation_input(step, now)

    def _complete(
        self, step: StepRecord, reply: AgentReply, now: datetime, instance: str, *, late: bool
    ) -> None:
        self._complete_with(
            step, reply.result or {}, now, attempt=reply.attempt, instance=instance, late=late
        )

    def _complete_with(
        self,
        step: StepRecord,
        result: dict[str, Any],
        now: datetime,
        *,
        attempt: int | None,
        instance: str,
        late: bool,
    ) -> None:
        step.process_state = StepState.PROCESSED
        step.locked_by = ""
        step.waiting_for = None
        step.result = result
        step.last_error = None
        step.deferrals, step.deferred_since = 0, None
        step.record(
            now,
            Event.SUCCEEDED,
            attempt=attempt,
            instance=instance or None,
            late=True if late else None,
        )
        self._after_success(step, now)

    def _after_success(self, step: StepRecord, now: datetime) -> None:
        if step.kind is StepKind.COMPENSATION:
            target = self.find(step.compensates or "")
            if target is not None and target.applied_after_undo is not None:
                self._overtaken(step, now)  # its step applied after it began: it may have missed it
                return
            if target is not None:
                target.process_state = StepState.COMPENSATED
                target.undone_by = step.step
                target.record(now, Event.COMPENSATED, by=step.step)
            self._continue_unwinding(now)
            return
        # Going forward: the group moves on once all of it is done (or settles: a cancel,
        # a step of it that failed; a cancel that came too late, ``core.progress``).
        self._group_progress(now)

    def _stop_for_cancel(self, step: StepRecord, now: datetime, why: str) -> None:
        """An action of a cancelled order (or of a group that failed) that has not succeeded
        gets no further attempt."""
        if not self.cancel_requested:
            why = why.replace("when cancelled", "when its group failed")
        if step.may_have_applied:
            self._fail_for_good(step, now, f"{why}; an attempt may have applied it", True)
            return
        step.process_state = StepState.COMPENSATED
        step.locked_by = ""
        step.record(
            now,
            Event.CANCELLED if self.cancel_requested else Event.HALTED,
            note="not applied: nothing to undo",
        )
        self._group_progress(now)

    def _fail_for_good(
        self,
        step: StepRecord,
        now: datetime,
        reason: str,
        ambiguous: bool,
        by_expiry_of: int | None = None,
    ) -> None:
        """A step will not be tried again. What happens depends on what it may have done.

        Not applied (every try refused, throttled, unavailable, or never sent; or its
        doubt settled by the service): the workflow unwinds, or, with nothing to
        compensate, the step is Error with an alert that says it is safe to resubmit.
        May have applied: it is compensated itself when it can be (after its last call
        can no longer be running); otherwise nobody can know what happened, and the
        order waits for an operator — nothing before it is undone.
        """
        step.process_state = StepState.ERROR
        step.locked_by = ""
        step.waiting_for = None
        step.gave_up = GaveUp(now, ambiguous, by_expiry_of, reason=reason)
        if not step.last_error:  # an event refused or not come, a function that raised
            step.last_error = reason
        verdict = "it was not applied"
        if ambiguous:
            numbers = ", ".join(map(str, step.maybe_applied))
            verdict = f"it may have been applied (attempt(s) {numbers} may have reached it)"
        step.record(
            now,
            Event.ERROR,
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
        # The group decides, once none of it is active (``core.progress._settle``): the
        # other steps of a Parallel finish their attempt first.
        self._group_progress(now)

    def _tell_ambiguous(self, step: StepRecord, now: datetime) -> None:
        """A step that may have applied and cannot be undone failed for good: nothing is
        undone around it; an operator is told what to check."""
        numbers = ", ".join(map(str, step.maybe_applied))
        verdict = f"it may have been applied (attempt(s) {numbers} may have reached it)"
        reason = step.gave_up.reason if step.gave_up is not None else step.last_error or ""
        key = idempotency_key(self.order_id, step.step)
        advice = (
            "it cannot be compensated, so the cancel stops here: ask its service whether "
            f"{key} happened, then resubmit (if it was applied, the same idempotency key "
            "returns its result and the order completes) or cancel again, stating it did "
            "not happen, to undo the other steps"
            if self.cancel_requested
            else f"it has no compensation: ask its service whether {key} happened, then "
            "resubmit to retry it with the same idempotency key (safe either way), or "
            "cancel, stating it did not happen, to undo the completed steps"
        )
        self._alert(step, f"{reason}; {verdict}, and {advice}", now)

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
        """The latest action still to undo: one that succeeded, or one of a group that
        failed for good as "may have applied" and can be undone (the group's other steps
        finished first)."""
        candidates = [
            s
            for s in self.steps
            if s.kind is StepKind.ACTION
            and self.planned(s.step).compensation
            and (
                s.process_state is StepState.PROCESSED
                or (
                    s.process_state is StepState.ERROR
                    and s.gave_up is not None
                    and s.gave_up.ambiguous
                    and s.gave_up.operator is None
                )
            )
        ]
        return max(candidates, key=lambda s: s.seq) if candidates else None

    def _continue_unwinding(self, now: datetime) -> None:
        target = self._next_to_compensate()
        if target is not None and target.process_state is StepState.ERROR:
            # It may have applied: not before its last call can no longer be running.
            self._set_status(OrderStatus.COMPENSATING, now)
            self._begin_compensation(
                target, now, not_before=target.last_deadline() + IN_FLIGHT_GRACE
            )
            return
        overtaken = [
            s
            for s in self.steps
            if s.process_state is StepState.ERROR
            and s.gave_up is not None
            and s.gave_up.kind == OVERTAKEN
        ]
        if target is None and overtaken:
            self._tell_overtaken(max(overtaken, key=lambda s: s.seq), now)
        elif target is None:
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
        running = target.attempts.running_until(now)
        if running is not None:
            # A handler of the step still runs (it may apply yet): its undo waits until it
            # cannot be running any more, on any instance's clock.
            held = (target.last_deadline() or running) + IN_FLIGHT_GRACE
            not_before = max(not_before or now, held)
        target.process_state = StepState.COMPENSATING
        target.record(now, Event.COMPENSATING, by=planned.compensation)
        record = self._add_record(
            step=planned.compensation,
            path=planned.compensation_path or planned.compensation,
            timeout=planned.compensation_timeout_seconds or planned.timeout_seconds,
            kind=StepKind.COMPENSATION,
            compensates=target.step,
            now=now,
            due=max(now, not_before) if not_before else now,
        )
        self._decide_compensation_input(record, now)

    def _decide_compensation_input(self, record: StepRecord, now: datetime) -> None:
        """A compensation's ``input``, decided once (one that raised is called again when it
        runs again); a bug in a declaration never reaches a remote: the unwinding stops."""
        planned = self.planned(record.compensates or "")
        if "input" not in planned.compensation_uses or "input" in record.decided:
            return
        try:
            record.input = json_object(self._call(record.step, "input"), f"input of {record.step}")
            record.decided["input"] = True
            record.record(now, Event.DECIDED, input=True)
        except StepFunctionFailed as exc:
            self._fail_for_good(record, now, str(exc), False)

    def _overtaken(self, undo: StepRecord, now: datetime) -> None:
        """``undo``'s step applied after ``undo`` began: it may have missed that effect. The
        order is ``error``, with an alert that says what happened; a resubmit runs the undo
        again as a new effect (``_new_round_if_overtaken``: a new idempotency key)."""
        target = self.find(undo.compensates or "")
        assert target is not None and target.applied_after_undo is not None
        undo.process_state = StepState.ERROR
        undo.locked_by = ""
        undo.gave_up = GaveUp(now, False, kind=OVERTAKEN)
        target.process_state = StepState.COMPENSATING
        target.undone_by = None
        undo.record(
            now, Event.ERROR, reason=f"{target.step} applied after this began", applied="no"
        )
        self._event(now, Event.OVERTAKEN, step=target.step, undo=undo.step)
        if any(s.is_active for s in self.steps):
            # Another compensation is under way: it finishes first (one step at a time);
            # the unwinding then stops here and tells (``_continue_unwinding``).
            return
        self._tell_overtaken(undo, now)

    def _tell_overtaken(self, undo: StepRecord, now: datetime) -> None:
        target = self.find(undo.compensates or "")
        assert target is not None and target.applied_after_undo is not None
        began = undo.round_began()
        next_key = idempotency_key(self.order_id, undo.step, undo.key_round + 1)
        reason = (
            f"{target.step} applied at {iso(target.applied_after_undo)}, after {undo.step} began "
            f"undoing it at {iso(began) if began else 'an earlier time'}: {undo.step} may have "
            f"missed it, so its effect may stand. Undo it: resubmit the order to run "
            f"{undo.step} again as a new effect (idempotency key {next_key}); if its service "
            f"shows the effect already undone, it will answer that"
        )
        self._alert(undo, reason, now)
        self._set_status(OrderStatus.ERROR, now)

    def _new_round_if_overtaken(self, undo: StepRecord, now: datetime) -> None:
        """Before an undo whose step applied after it began runs again: a new key round, so
        the service sees a new request (``<orderId>:<undo>:<round>``), not a repeat of the
        one it answered before the effect existed."""
        target = self.find(undo.compensates or "")
        if target is None or target.applied_after_undo is None:
            return
        if undo.key_round >= MAX_KEY_ROUND:
            raise self._refuse(
                "key-rounds-spent",
                f"{undo.step} has run under {MAX_KEY_ROUND} idempotency keys: undo the effect "
                "by hand",
                undo.step,
            )
        undo.key_round += 1
        undo.round_began_at = None
        target.applied_after_undo = None
        target.process_state = StepState.COMPENSATING
        undo.record(now, Event.NEW_KEY, key=undo.idempotency_key)

    def _hold_compensation(self, step: StepRecord, now: datetime) -> None:
        """A Python handler of ``step`` runs on (or has ended): its compensation, while
        Pending, waits until the handler can no longer be running (docs/contracts.md §3.11:
        no compensation of a step while its handler runs on a live instance). One already
        claimed cannot be stopped: the operator is told."""
        if step.process_state is not StepState.COMPENSATING:
            return
        for record in self.steps:
            if record.kind is not StepKind.COMPENSATION or record.compensates != step.step:
                continue
            running = step.attempts.running_until(now)
            if record.process_state is StepState.PENDING:
                due = max(now, step.last_deadline() + IN_FLIGHT_GRACE)
                if due != record.complete_by:
                    record.end_pause(now, "held for its step's handler")  # looked at when due
                    record.complete_by = due
                    record.record(now, Event.RETRY_SCHEDULED, notBefore=iso(due), note="held")
            elif record.process_state is StepState.PROCESSING and running is not None:
                self._alert(
                    step,
                    f"{step.step}'s handler reports it still runs (until {iso(running)}) while "
                    f"its compensation {record.step} is already running: check both when they end",
                    now,
                )

    def _retry_at(
        self, step: StepRecord, due: datetime, now: datetime, deferral: int | None = None
    ) -> None:
        if step.kind is StepKind.COMPENSATION:
            target = self.find(step.compensates or "")
            if target is not None and target.applied_after_undo is not None:
                # Its step applied after this undo began: no retry under the same key (it
                # may already have answered for a state without the effect); an operator
                # runs it again as a new effect.
                self._overtaken(step, now)
                return
        step.process_state = StepState.PENDING
        step.locked_by = ""
        step.complete_by = due
        step.record(
            now,
            Event.RETRY_SCHEDULED,
            notBefore=iso(due),
            failureCount=step.failure_count,
            deferral=deferral,
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
            Event.CREATED,
            compensates=compensates,
            notBefore=iso(due) if due and due > now else None,
        )
        self.steps.append(record)
        return record

    # --- notices and history (private) ---------------------------------------------------

    def _set_status(self, status: OrderStatus, now: datetime) -> None:
        if status is self.status:
            return
        self.status = status
        self._event(now, Event.STATUS, status=str(status))
        self._notify(str(status), now)

    def _notify(self, status: str, now: datetime) -> None:
        if self.reply_to:
            self.outbox.append(
                Notice("status", status_message(self.order_id, status, now), self.reply_to)
            )

    def _alert(self, step: StepRecord, reason: str, now: datetime) -> None:
        # A reason from a remote or a handler ends a sentence; the alert goes on after it.
        reason = _CLAUSE_END.sub(r"\1", reason)
        self._event(now, Event.ALERTED, step=step.step, reason=reason)
        self.outbox.append(
            Notice(
                "alert", alert_message(self.order_id, step.step, reason, step.failure_count, now)
            )
        )

    def _event(self, now: datetime, event: Event, **details: Any) -> None:
        entry: dict[str, Any] = {"at": iso(now), "event": str(event)}
        # Outside text (a remote's error, an operator's reason) shown as it is: visible.
        entry.update({k: visible_details(v) for k, v in details.items() if v is not None})
        self.history.append(entry)
        if len(self.history) > MAX_ORDER_HISTORY:
            self.history = self.history[:1] + self.history[-(MAX_ORDER_HISTORY - 1) :]

    def _touch(self, now: datetime) -> None:
        self.updated_at = now

    def _refuse(self, reason: str, message: str, step: str | None = None) -> TransitionRefused:
        return TransitionRefused(reason, message, order_id=self.order_id, step=step)


MAX_ORDER_HISTORY: Final = 100
#: A full stop before the "; " or ", " that joins the next clause of an alert.
_CLAUSE_END: Final = re.compile(r"\.([;,] )")
