"""The operator's decisions, each taken over all of an order's records (docs/contracts.md
§3.11, §3.14, §3.15): cancel (and what it would do), resubmit, fix-and-resubmit, and "not
needed" (a cancel that states the step a failed undo would undo never happened).

Doubt is per record: while any step that cannot be undone may have applied, wherever it
stands (failed for good, waiting for its next attempt, first or second in a group), a
decision that could undo or redo around it is refused with ``doubt``, naming every such
step, unless the operator states for each that it did not apply (recorded with who and
why). A resubmit restarts only what failed or was stopped; a delay that has ended stays
ended, and the resubmit alerts nobody by itself. ``core.course.advance`` runs after each.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from core import course, inbox, kinds, moves
from core.cancel import CancelPreview, blocking, preview_cancel
from core.course import standing
from core.evidence import unwinding_began
from core.history import Happened
from core.messages import MAX_KEY_ROUND
from core.patches import apply_patch, history_of
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.telling import in_doubt

if TYPE_CHECKING:
    from core.model import Order


def statement(not_applied: str | Iterable[str] | None) -> frozenset[str]:
    """The steps an operator states did not happen: one name, or several."""
    if not_applied is None:
        return frozenset()
    if isinstance(not_applied, str):
        return frozenset({not_applied}) if not_applied else frozenset()
    return frozenset(n for n in not_applied if n)


def preview(
    order: Order, now: datetime, not_applied: str | Iterable[str] | None = None
) -> CancelPreview:
    return preview_cancel(order, now, statement(not_applied))


# --- cancel ------------------------------------------------------------------------------------


def cancel(
    order: Order,
    now: datetime,
    by: str,
    reason: str = "",
    not_applied: str | Iterable[str] | None = None,
) -> None:
    """Stop an unfinished order and undo what it did.

    A step in flight finishes first (its reply or its deadline decides whether there is
    something to undo); a step that cannot be undone and succeeds makes the cancel too
    late. On an order in ``error``: a failed compensation is retried (or, where the
    operator states its step did not happen, not needed); failed actions are left as
    they are, those that may have applied and can be undone are undone too. An order
    already undone around an effect that stands has nothing left to cancel (refused)."""
    stated = statement(not_applied)
    seen = preview_cancel(order, now, stated)
    if not seen.allowed:
        code = (
            "finished"
            if order.status.finished
            else "doubt"
            if seen.doubts
            else "already-cancelling"
            if order.cancel_requested
            else "already-unwinding"
        )
        raise order.refuse(code, seen.refusal or "the order cannot be cancelled")
    order.cancel_requested = True
    order.note(
        now,
        Happened.CANCEL_REQUESTED,
        by=by,
        reason=reason or None,
        notApplied=sorted(stated) or None,
    )
    for record in blocking(order):
        if record.step in stated:
            state_not_applied(order, record, now, by, reason)
    if order.status is not OrderStatus.ERROR:
        return  # going forward: the group halts (``core.course``)
    undos = [u for u in order.latest_undos() if u.process_state is StepState.ERROR]
    for undo in [u for u in undos if u.compensates in stated]:
        _not_needed(order, undo, now, by, reason)
    retry = [u for u in undos if u.compensates not in stated]
    if retry:  # one at a time, latest step first (another failed waits for its turn)
        undo = max(retry, key=lambda u: _target_seq(order, u))
        _restart_undo(order, undo, now)
        undo.record(now, Happened.RESUBMITTED, by=by, note="cancel: retry the unwinding")
    for record in order.latest_actions():
        if record.process_state is not StepState.ERROR:
            continue
        if in_doubt(record) and order.planned(record.step).compensation:
            record.record(
                now, Happened.CANCELLED, by=by, note="it may have been applied: undoing it too"
            )
            continue
        if record.gave_up is not None:
            record.gave_up.operator = by
        record.record(
            now,
            Happened.CANCELLED,
            by=by,
            note="left as is (not applied); undoing the completed steps",
        )
    course.enter(order, OrderStatus.COMPENSATING, now)


def state_not_applied(
    order: Order, record: StepRecord, now: datetime, by: str, reason: str
) -> None:
    """The operator's statement that ``record`` did not happen settles its doubt."""
    why = f" ({reason})" if reason else ""
    settled = record.attempts.settle(f"operator {by}: stated it did not happen{why}", now)
    record.record(now, Happened.STATED_NOT_APPLIED, by=by, reason=reason or None, attempts=settled)
    order.note(now, Happened.STATED_NOT_APPLIED, step=record.step, by=by, reason=reason or None)


def _not_needed(order: Order, undo: StepRecord, now: datetime, by: str, reason: str) -> None:
    """The operator states that the step ``undo`` would undo did not happen (its service
    refused the undo for good: "no charge to refund"): the undo is not needed, and the
    unwinding goes on past it. Who said so, and why, is kept."""
    target = order.find(undo.compensates or "")
    assert target is not None
    state_not_applied(order, target, now, by, reason)
    undo.process_state = StepState.SKIPPED
    undo.gave_up = None
    undo.record(now, Happened.NOT_NEEDED, by=by, reason=reason or None)
    target.process_state = StepState.COMPENSATED
    target.record(now, Happened.NOT_NEEDED, by=by, reason=reason or None, undo=undo.step)


# --- resubmit ----------------------------------------------------------------------------------


def resubmit(
    order: Order, now: datetime, by: str, reason: str = "", patch: Any = None
) -> StepRecord:
    """Put an ``error`` order back to work at what failed or was stopped.

    Going forward: the failed and stopped steps of the group run again (those done stay
    done, a delay that ended stays ended). Unwinding: the failed compensations run again
    (one whose step applied after it began, as a new effect under a new key), and a step
    that may have applied and cannot be undone is asked again with the same key.

    ``patch`` (docs/contracts.md §3.14): a JSON merge patch of the order's data, for
    steps known not to have applied; the steps that run again decide their ``input``
    again and run under a new key where what they send changed. Refused (``doubt``) while
    any step that cannot be undone may have applied, and for an order being undone."""
    if order.status is not OrderStatus.ERROR:
        raise order.refuse(
            "not-in-error",
            f"only an order in error can be resubmitted; this one is {order.status}",
        )
    unwinding = unwinding_began(order)
    again = _again(order, unwinding)
    if not again:
        stands = ", ".join(r.step for r in standing(order)) or "nothing"
        raise order.refuse(
            "nothing-failed",
            f"nothing of the order failed: the effect of {stands} stands, which a resubmit "
            "cannot undo. Undo it by hand if it must not stand; the order stays in error, "
            "the record of it",
        )
    if patch is not None:
        _patch(order, again, patch, now, by, reason, unwinding)
    if order.cancel_requested and not unwinding:
        # The operator sends the order back to work: it is to go on, not to be undone
        # (cancel it again for that). Its attempts get the usual retries.
        order.cancel_requested = False
        order.note(now, Happened.CANCEL_WITHDRAWN, by=by, step=again[0].step)
    why = reason or None
    order.set_status(OrderStatus.COMPENSATING if unwinding else OrderStatus.PROCESSING, now)
    for record in again:
        if record.kind is StepKind.COMPENSATION:
            _restart_undo(order, record, now)
        else:
            inbox.forget_run(order, record)
            moves.restart(record, now)
        record.record(now, Happened.RESUBMITTED, by=by, reason=why)
    for record in again:
        if record.kind is StepKind.ACTION:
            kinds.begin(order, record, order.planned(record.step), now)
    order.note(now, Happened.RESUBMITTED, by=by, step=", ".join(r.step for r in again), reason=why)
    return again[0]


def _again(order: Order, unwinding: bool) -> list[StepRecord]:
    """What a resubmit runs again (see ``resubmit``), first what failed."""
    if unwinding:
        # One thing at a time, as the unwinding goes: the failed compensation of the
        # latest step (another one failed waits for its turn), else a step in doubt.
        undos = [u for u in order.latest_undos() if u.process_state is StepState.ERROR]
        if undos:
            return [max(undos, key=lambda u: _target_seq(order, u))]
        return [r for r in blocking(order) if r.process_state is StepState.ERROR][:1]
    group = order.group_records()
    failed = [r for r in group if r.process_state is StepState.ERROR and not r.continued]
    stopped = [
        r
        for r in group
        if r.process_state is StepState.COMPENSATED and r.undone_by is None and r not in failed
    ]
    return failed + stopped


def _target_seq(order: Order, undo: StepRecord) -> int:
    target = order.find(undo.compensates or "")
    return target.seq if target is not None else -1


def _restart_undo(order: Order, undo: StepRecord, now: datetime) -> None:
    _new_round_if_overtaken(order, undo, now)
    moves.restart(undo, now)
    kinds.decide_compensation_input(order, undo, now)


def _new_round_if_overtaken(order: Order, undo: StepRecord, now: datetime) -> None:
    """Before an undo whose step applied after it began runs again: a new key round, so
    the service sees a new request (``<orderId>:<undo>:<round>``), not a repeat of the
    one it answered before the effect existed."""
    target = order.find(undo.compensates or "")
    if target is None or target.applied_after_undo is None:
        return
    if undo.key_round >= MAX_KEY_ROUND:
        raise order.refuse(
            "key-rounds-spent",
            f"{undo.step} has run under {MAX_KEY_ROUND} idempotency keys: undo the effect by hand",
            undo.step,
        )
    undo.key_round += 1
    undo.round_began_at = None
    target.applied_after_undo = None
    target.changed = True
    target.process_state = StepState.COMPENSATING
    undo.record(now, Happened.NEW_KEY, key=undo.idempotency_key)


def _patch(
    order: Order,
    again: list[StepRecord],
    patch: Any,
    now: datetime,
    by: str,
    reason: str,
    unwinding: bool,
) -> None:
    if unwinding:
        failed = ", ".join(r.step for r in again)
        raise order.refuse(
            "unwinding",
            f"the order is being undone ({failed} failed): its data cannot change under a "
            "compensation, which must undo what the step did with the data it had. "
            "Resubmit without a patch to retry it as it was",
            step=again[0].step,
        )
    doubtful = [r for r in again if r.attempt and in_doubt(r)]
    doubtful += [r for r in blocking(order) if r not in doubtful]
    if doubtful:
        names = ", ".join(r.step for r in doubtful)
        keys = ", ".join(r.idempotency_key for r in doubtful)
        raise order.refuse(
            "doubt",
            f"{names} may have been applied (attempts {_attempts(doubtful)} may have reached "
            f"it): its data cannot change under it. Ask its service whether {keys} happened; "
            "then resubmit without a patch to retry it as it was, or cancel, stating it did "
            "not happen",
            step=doubtful[0].step,
        )
    patched, changed = apply_patch(order.body, patch)
    order.body = patched
    if changed:
        for record in again:
            record.decided.pop("input", None)
            record.input = None
            if record.attempt and record.key_round < MAX_KEY_ROUND:
                record.key_round += 1
                record.round_began_at = None
                record.record(now, Happened.NEW_KEY, key=record.idempotency_key, why="patched")
    order.note(now, Happened.PATCHED, by=by, reason=reason or None, **history_of(changed))


def _attempts(records: list[StepRecord]) -> str:
    return "; ".join(f"{r.step}: {', '.join(map(str, r.maybe_applied))}" for r in records)
