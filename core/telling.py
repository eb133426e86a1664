"""What an order tells an operator when it stops for one (docs/contracts.md §3.11, §3.15,
§3.17): one alert per episode, naming what failed or may have applied, what stands, and
what to do. ``core.course`` decides; this says it."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from core import kinds
from core.messages import idempotency_key
from core.states import StepState
from core.steps import StepRecord
from core.timefmt import iso

if TYPE_CHECKING:
    from core.model import Order


def in_doubt(record: StepRecord) -> bool:
    """Some attempt of ``record`` may have applied and nothing settled it, and it is not
    known to have applied (one key, one effect: a success settles every attempt)."""
    return record.may_have_applied and not record.applied


def is_bug(record: StepRecord) -> bool:
    return record.gave_up is not None and record.gave_up.kind == kinds.DECLARATION_BUG


def tell_doubt(order: Order, records: list[StepRecord], now: datetime) -> None:
    """One alert for the episode, naming every step that may have applied and cannot be
    undone: nothing is undone around them; what to check, and what to do then."""
    parts = []
    for record in records:
        numbers = ", ".join(map(str, record.maybe_applied))
        reason = record.gave_up.reason if record.gave_up is not None else record.last_error or ""
        parts.append(
            f"{reason or record.step}; it may have been applied (attempt(s) {numbers} may have "
            "reached it)"
        )
    keys = ", ".join(idempotency_key(order.order_id, r.step, r.key_round) for r in records)
    names = ", ".join(r.step for r in records)
    one = len(records) == 1
    if order.cancel_requested:
        advice = (
            f"{'it cannot' if one else 'they cannot'} be compensated, so the cancel stops here: "
            f"ask {'its service' if one else 'their services'} whether {keys} happened, then "
            "resubmit (if it was applied, the same idempotency key returns its result and the "
            "order completes) or cancel again, stating it did not happen, to undo the other "
            "steps"
        )
    else:
        advice = (
            f"{'it has' if one else 'they have'} no compensation: ask "
            f"{'its service' if one else 'their services'} whether {keys} happened, then "
            "resubmit to retry with the same idempotency key (safe either way), or cancel, "
            "stating it did not happen, to undo the completed steps"
        )
    reason = "; and ".join(parts) if one else f"{names} may have been applied: " + "; ".join(parts)
    order.alert(records[0], f"{reason}, and {advice}", now)


def tell_not_applied(order: Order, failed: list[StepRecord], now: datetime) -> None:
    if not failed:  # pragma: no cover - a group that settles without a failure unwinds
        return
    reasons = [r.failure_reason for r in failed]
    verdict = "it was not applied" if len(failed) == 1 else "none of them was applied"
    order.alert(
        failed[0],
        f"{'; '.join(reasons)}; {verdict}: it is safe to resubmit once the cause is fixed",
        now,
    )


def tell_held(
    order: Order, held: list[StepRecord], failed: list[StepRecord], now: datetime
) -> None:
    """A step declared ``on_failure="hold"`` failed for good: nothing is undone until an
    operator decides; one alert says what failed and what to do (§3.17)."""
    parts = []
    for record in failed:
        if in_doubt(record):
            numbers = ", ".join(map(str, record.maybe_applied))
            verdict = f"it may have been applied (attempt(s) {numbers} may have reached it)"
        elif is_bug(record):
            verdict = "a bug in the workflow's declaration; nothing was sent for it"
        else:
            verdict = "it was not applied"
        parts.append(f"{record.failure_reason}; {verdict}")
    names = ", ".join(r.step for r in held)
    order.alert(
        held[0],
        f"{'; and '.join(parts)}. Nothing was undone: {names} holds the order for you "
        '(on_failure="hold"). Fix the cause and resubmit the order (with a patch of its data '
        "if the data was wrong) to run it again, or cancel it to undo the completed steps",
        now,
    )


def tell_bugs(order: Order, bugs: list[StepRecord], now: datetime) -> None:
    """A declaration's function raised: told, even though the order unwinds (§3.17)."""
    reasons = "; ".join(r.gave_up.reason for r in bugs if r.gave_up is not None)
    order.alert(
        bugs[0],
        f"{reasons}: a bug in the workflow's declaration; nothing was sent for it, and the "
        "order is being undone. Fix the declaration; new orders will use it",
        now,
    )


def tell_failed_undo(order: Order, undo: StepRecord, now: datetime) -> None:
    gave_up = undo.gave_up
    reason = gave_up.reason if gave_up is not None else undo.last_error or ""
    verdict = "it was not applied"
    if gave_up is not None and gave_up.ambiguous:
        numbers = ", ".join(map(str, undo.maybe_applied))
        verdict = f"it may have been applied (attempt(s) {numbers} may have reached it)"
    order.alert(
        undo,
        f"compensation {reason}; {verdict}. The unwinding stopped at {undo.step} (undoing "
        f"{undo.compensates}): fix the cause, then resubmit the order (or cancel it again) to "
        "retry it",
        now,
    )


def tell_overtaken(order: Order, undo: StepRecord, now: datetime) -> None:
    target = order.find(undo.compensates or "")
    assert target is not None and target.applied_after_undo is not None
    began = undo.round_began()
    next_key = idempotency_key(order.order_id, undo.step, undo.key_round + 1)
    order.alert(
        undo,
        f"{target.step} applied at {iso(target.applied_after_undo)}, after {undo.step} began "
        f"undoing it at {iso(began) if began else 'an earlier time'}: {undo.step} may have "
        f"missed it, so its effect may stand. Undo it: resubmit the order to run "
        f"{undo.step} again as a new effect (idempotency key {next_key}); if its service "
        f"shows the effect already undone, it will answer that",
        now,
    )


def tell_standing(order: Order, records: list[StepRecord], now: datetime) -> None:
    """An unwinding that ends with an effect that stands is not ``compensated``: one alert
    names the effect and what was undone (docs/contracts.md §3.15)."""
    undone = [
        f"{r.step} (by {r.undone_by})"
        for r in order.latest_actions()
        if r.process_state is StepState.COMPENSATED and r.undone_by
    ]
    names = ", ".join(r.step for r in records)
    verb = "applies" if len(records) == 1 else "apply"
    order.alert(
        records[0],
        f"{names} applied and cannot be undone (no compensation): its effect stands, while "
        f"the order was undone ({', '.join(undone) or 'nothing else to undo'}). {names} "
        f"{verb} for {idempotency_key(order.order_id, records[0].step, records[0].key_round)}; "
        "undo it by hand if it must not stand. The order stays in error, the record of it: "
        "nothing is left for the workflow to undo",
        now,
    )
