"""docs/contracts.md §3.15, "one decision over all records": regression tests for issue 39.

3.11 and 3.13 hold for every record of an order wherever it stands: first, alone, or
anywhere in a ``Parallel``. A review of the engine found the places where a decision read
one record (the first active one, the failed one, the latest event) instead of all of
them. Each test here is one such place, written as the behaviour §3.15 asks for; each
failed on the engine of the time for the reason its docstring gives.

Most run on the pure model with a fake clock (``Order.accept``, ``claim``,
``apply_reply``, ``expire``, ``deliver_event``, ``cancel``, ``resubmit``); the two whose
contract is "recorded in the history" of a refused delivery run on the whole service
stack (``test_services_in_memory.build``), so the history is read from the stored order.
The workflows are ``tests/fixtures/decisions.py``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.errors import TransitionRefused
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.order_message import decode_order
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepState
from core.steps import StepRecord
from core.timefmt import parse_iso
from core.workflows import WORKFLOWS, Plan, Workflow
from supervisor.service import SKEW_GRACE
from tests.fixtures.decisions import may_stand_workflow
from tests.support import callback_token, declarations
from tests.unit.test_services_in_memory import TIMEOUT, Services, build, reply_to, stored

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=600)
SECOND = timedelta(seconds=1)


@pytest.fixture(autouse=True)
def decisions() -> Iterator[None]:
    with declarations("tests.fixtures.decisions"):
        yield


# --- the pure model --------------------------------------------------------------------------


def new(workflow: str | Workflow, order_id: str = "o-1", **data: Any) -> Order:
    """An order of ``workflow`` (a declared name, or a ``Workflow`` built by the test),
    accepted at T0, its status messages going to ``app-status``."""
    declared = WORKFLOWS[workflow] if isinstance(workflow, str) else workflow
    body = {"orderId": order_id, "workflow": declared.name, "replyTo": "app-status", **data}
    return Order.accept(decode_order(json.dumps(body)), Plan.of(declared, 30), T0)


def record(order: Order, step: str) -> StepRecord:
    found = order.find(step)
    assert found is not None, f"the order has no record of {step}"
    return found


def report(
    order: Order,
    step: str,
    outcome: Outcome = Outcome.SUCCEEDED,
    *,
    attempt: int | None = None,
    result: dict[str, Any] | None = None,
    error: str = "declined",
    applied: str = "no",
) -> AgentReply:
    """The agent's report of ``step``'s latest attempt (or of ``attempt``), with its token."""
    found = record(order, step)
    number = found.attempt if attempt is None else attempt
    assert number >= 1, f"{step} was never claimed"
    succeeded = outcome is Outcome.SUCCEEDED
    return AgentReply(
        order.order_id,
        step,
        number,
        found.complete_by,
        outcome,
        result=(result if result is not None else {"ok": True}) if succeeded else None,
        error=None if succeeded else error,
        applied=None if succeeded else applied,  # type: ignore[arg-type]
        token=found.token_for(number),
    )


def claim(order: Order, step: str, now: datetime) -> datetime:
    """Claim ``step`` as soon as it is due (not before ``now``); returns the claim's time."""
    found = record(order, step)
    assert found.process_state is StepState.PENDING, f"{step} is {found.process_state}"
    at = max(now, found.complete_by)
    order.claim("i-1", at, step=step)
    return at


def claim_all(order: Order, now: datetime) -> list[str]:
    """Claim every Pending step, as the scheduler does when a group starts."""
    names = [s.step for s in order.active_steps() if s.process_state is StepState.PENDING]
    for name in names:
        order.claim("i-1", now, step=name)
    return names


def succeed(order: Order, step: str, now: datetime) -> datetime:
    """Claim ``step`` when due and report success a second later; returns the time after."""
    at = claim(order, step, now)
    order.apply_reply(report(order, step), at + SECOND, POLICY)
    return at + 2 * SECOND


def unwind_to_the_end(order: Order, now: datetime) -> datetime:
    """Run every compensation the order asks for, each succeeding, until none is active."""
    for _ in range(10):
        active = order.active_step()
        if active is None:
            return now
        now = succeed(order, active.step, now)
    raise AssertionError(f"the unwinding never ended: {status(order)}")


def status(order: Order) -> OrderStatus:
    """The order's status now (a call: read afresh after each transition, which a type
    checker's narrowing of ``order.status`` would not)."""
    return order.status


def alerts(order: Order) -> list[dict[str, Any]]:
    return [json.loads(n.body) for n in order.outbox if n.kind == "alert"]


def statuses(order: Order) -> list[str]:
    """The status messages the app's ``replyTo`` queue gets, in order."""
    return [json.loads(n.body)["status"] for n in order.outbox if n.kind == "status"]


def said(alert: dict[str, Any]) -> str:
    """An alert's step and reason, as one text to look for names in."""
    return f"{alert.get('step', '')}: {alert.get('reason', '')}"


def history_since(order: Order, since: datetime) -> list[dict[str, Any]]:
    """The entries of the order's history and of its records' histories at or after
    ``since``."""
    entries = list(order.history)
    for step in order.steps:
        entries += step.history
    return [h for h in entries if parse_iso(str(h["at"])) >= since]


def names(entry: dict[str, Any], *words: str) -> bool:
    text = json.dumps(entry)
    return all(word in text for word in words)


# --- the whole stack -------------------------------------------------------------------------


@pytest.fixture
def s() -> Iterator[Services]:
    """Every service on the in-memory store and a fake clock at T0 (the bootstrap puts the
    settings' declarations to use: then ours again)."""
    services = build()
    with declarations("tests.fixtures.decisions"):
        yield services


def submit(s: Services, order_id: str, workflow: str, **data: Any) -> None:
    body = {"orderId": order_id, "workflow": workflow, "replyTo": "app-status", **data}
    s.scheduler.submit(json.dumps(body).encode())


def requests(s: Services, order_id: str, step: str | None = None) -> list[AgentRequest]:
    return [
        r
        for r in s.transport.requests
        if r.order_id == order_id and (step is None or r.step == step)
    ]


def operator_alerts(s: Services, order_id: str) -> list[dict[str, Any]]:
    return [a for a in s.queues.on(s.names.operator_alerts) if a.get("orderId") == order_id]


def let_deadlines_pass(s: Services, order_id: str) -> None:
    """No answer comes any more: the supervisor expires each attempt and the scheduler
    claims the next, until the order is no longer being worked on."""
    for _ in range(20):
        if stored(s, order_id).status is not OrderStatus.PROCESSING:
            return
        s.clock.advance(TIMEOUT + SKEW_GRACE.total_seconds() + 1)
        s.supervisor.run()
        s.scheduler.dispatch(order_id)
    raise AssertionError(f"order {order_id} is still {stored(s, order_id).status}")


# --- 1. an answer belongs to its run ----------------------------------------------------------


def test_a_stale_callback_from_before_a_fix_never_settles_the_new_runs_doubt(s: Services) -> None:
    """Scenario: a capture that ``completes_on`` a callback is accepted (2xx); the callback
    refuses it; the order is ``error`` ("safe to resubmit": nothing compensates). An
    operator fixes the data and resubmits: the step runs again under a new idempotency key
    (``<orderId>:capture:2``) and the remote accepts it. Then the remote's webhook retries
    the first refusal, with the same body.

    §3.15 "An answer belongs to its run": that delivery answers the earlier run; it is
    answered 409 ``stale`` and recorded in the history, and never settles the new run's
    doubt. The new run stays in doubt; once its deadlines pass the order is ``error`` with
    an alert that it may have been applied, and a second fix is refused (``doubt``).
    (The engine took the retry as the new run's answer: 202 ``taken``, the step failed
    "not applied, safe to resubmit" with a second alert, though the remote had accepted
    the new key and nothing answered for it.)"""
    submit(s, "cb-1", "callback-fix", amount=10)
    [first] = requests(s, "cb-1")
    s.scheduler.apply_reply(reply_to(first))  # the bank accepted it
    s.clock.advance(5)
    refusal = {"refused": "card expired"}
    # the bank calls back on the URL the step gave it: the capability of run 1
    first_run = callback_token(stored(s, "cb-1"), "captured", run=1)
    s.admin.deliver_event("cb-1", "captured", refusal, "bank", token=first_run)
    assert stored(s, "cb-1").status is OrderStatus.ERROR
    s.clock.advance(60)
    s.admin.resubmit("cb-1", "ann", "the customer gave another card", {"amount": 12})
    s.scheduler.dispatch("cb-1")
    second = requests(s, "cb-1")[-1]
    assert (second.step, second.idempotency_key) == ("capture", "cb-1:capture:2")
    s.scheduler.apply_reply(reply_to(second))  # accepted again, under the new key
    alerts_before = len(operator_alerts(s, "cb-1"))
    s.clock.advance(5)
    delivered_at = s.clock()

    with pytest.raises(TransitionRefused) as refused:
        s.admin.deliver_event("cb-1", "captured", refusal, "bank", token=first_run)  # a retry

    assert refused.value.reason == "stale"
    order = stored(s, "cb-1")
    assert any(names(h, "captured") for h in history_since(order, delivered_at)), (
        "the refused delivery is not in the stored order's history"
    )
    capture = record(order, "capture")
    assert capture.key_round == 2
    # The new run's acceptance "may have applied from then on" (§3.13) and nothing settled
    # it: the record is in doubt while it waits for its callback, not only once it expired.
    assert capture.may_have_applied
    assert capture.process_state is StepState.PROCESSING
    assert status(order) is OrderStatus.PROCESSING

    let_deadlines_pass(s, "cb-1")
    order = stored(s, "cb-1")
    assert status(order) is OrderStatus.ERROR
    new_alerts = operator_alerts(s, "cb-1")[alerts_before:]
    assert len(new_alerts) == 1, new_alerts
    assert new_alerts[0]["step"] == "capture"
    assert "may have been applied" in new_alerts[0]["reason"]
    with pytest.raises(TransitionRefused) as again:
        s.admin.resubmit("cb-1", "ann", "yet another card", {"amount": 13})
    assert again.value.reason == "doubt"


# --- 2. evidence by callback is evidence ------------------------------------------------------


def capture_in_doubt_and_its_refund_claimed() -> tuple[Order, datetime]:
    """reserve succeeds; the bank accepts capture on every attempt and never calls back in
    time; capture fails for good in doubt, and its undo (refund) is claimed."""
    order = new("capture-undo")
    now = succeed(order, "reserve", T0)
    capture = record(order, "capture")
    for _ in range(10):
        if not capture.is_active:
            break
        if capture.process_state is StepState.PENDING:
            now = claim(order, "capture", now)
            order.apply_reply(report(order, "capture", result={"accepted": True}), now, POLICY)
        now = capture.complete_by + SECOND
        order.expire(now, POLICY, step="capture")
    assert capture.process_state is not StepState.PROCESSED and capture.failure_count == 3
    assert status(order) is OrderStatus.COMPENSATING
    now = claim(order, "refund", now)
    return order, now + SECOND


@pytest.mark.parametrize("when", ["while-the-refund-runs", "after-the-order-is-compensated"])
def test_a_success_by_callback_after_its_undo_began_is_kept_and_told(when: str) -> None:
    """Scenario: capture (``completes_on="captured"``, compensated by refund) is accepted on
    every attempt and the bank never calls back in time: it fails for good in doubt and
    its undo begins (refund claimed). Then the bank's callback ``{"result": ...}`` comes:
    while the refund runs, or once the order is ``compensated``.

    §3.15 "Evidence by callback is evidence": a ``completes_on`` result is a success report
    like a 2xx; after its step's undo began it is a success after its undo (3.11): not
    refused, recorded, and once no undo attempt is in flight the order is ``error`` with
    one alert naming capture that says it applied after its undo began; a resubmit runs
    the refund again as a new effect (key ``<orderId>:refund:2``). (The engine answered
    409, ``not-waiting`` or ``finished``, and dropped the evidence.)"""
    order, now = capture_in_doubt_and_its_refund_claimed()
    if when == "after-the-order-is-compensated":
        order.apply_reply(report(order, "refund"), now, POLICY)
        now = unwind_to_the_end(order, now + SECOND)
        assert status(order) is OrderStatus.COMPENSATED
    order.outbox.clear()

    effect = order.deliver_event("captured", {"result": {"ref": "C-9"}}, now, "bank")

    assert effect == "noted"
    capture = record(order, "capture")
    assert capture.attempts.applied, "the callback's evidence that capture applied is lost"
    if when == "while-the-refund-runs":
        # the refund's attempt is in flight: it ends first, then the order is told
        assert status(order) is not OrderStatus.ERROR and alerts(order) == []
        order.apply_reply(report(order, "refund"), now + SECOND, POLICY)
    assert status(order) is OrderStatus.ERROR
    [alert] = alerts(order)
    assert "capture" in said(alert)
    assert "applied" in alert["reason"] and "after" in alert["reason"]

    order.resubmit(now + 60 * SECOND, "ops", "undo the capture again")
    claim(order, "refund", now + 60 * SECOND)
    assert record(order, "refund").idempotency_key == "o-1:refund:2"


# --- 3 and 4. a cancel never undoes around a doubt, wherever the doubt stands ------------------


def test_a_cancel_never_undoes_around_a_siblings_doubt() -> None:
    """Scenario: reserve (undone by release), then ``Parallel(dispatch, bill)``: dispatch
    (nothing undoes it) gets no answer and fails for good, may have applied; bill is
    refused (4xx). The order is ``error`` with an alert about dispatch. An operator cancels
    it without a statement.

    §3.15 "Doubt is per record": the cancel is decided over all records, not the latest
    failed one (bill, known not applied): refused ``doubt``, naming dispatch; nothing is
    compensated, and the preview says so before anyone confirms. With the statement that
    dispatch did not apply, the cancel is accepted. (The engine looked only at bill and
    released the reservation around dispatch's doubt.)"""
    order = new("reserve-dispatch-bill")
    now = succeed(order, "reserve", T0)
    assert claim_all(order, now) == ["dispatch", "bill"]
    order.apply_reply(
        report(order, "bill", Outcome.REFUSED, error="HTTP 422: card declined"),
        now + SECOND,
        POLICY,
    )
    now = record(order, "dispatch").complete_by + SECOND
    order.expire(now, POLICY, step="dispatch")  # no answer: it may have applied
    assert status(order) is OrderStatus.ERROR
    [alert] = alerts(order)
    assert alert["step"] == "dispatch" and "may have been applied" in alert["reason"]

    with pytest.raises(TransitionRefused) as refused:
        order.cancel(now, "ops", "the customer withdrew")

    assert refused.value.reason == "doubt"
    assert "dispatch" in refused.value.message
    assert order.find("release") is None, "the reservation was released around dispatch"
    assert status(order) is OrderStatus.ERROR
    preview = order.cancel_preview(now)
    assert not preview.allowed and "dispatch" in (preview.refusal or "")

    order.cancel(now, "ops", "the carrier has no record of it", not_applied="dispatch")
    assert order.find("release") is not None
    assert status(order) is OrderStatus.COMPENSATING


@pytest.mark.parametrize(
    "workflow",
    [
        pytest.param("dispatch-then-bill", id="doubtful-step-declared-first"),
        pytest.param("bill-then-dispatch", id="doubtful-step-declared-second"),
    ],
)
def test_a_cancel_is_refused_while_any_step_of_the_group_waits_in_doubt(workflow: str) -> None:
    """Scenario: a ``Parallel`` of bill (undone by unbill) and dispatch (nothing undoes it).
    dispatch gets a 500 that may have applied and waits, ``Pending``, for its next
    attempt, while bill is still in flight. An operator cancels.

    §3.15 "Doubt is per record": whatever the order of declaration, the cancel is refused
    ``doubt``, naming dispatch. (The engine read the first active record only: refused
    when dispatch was declared first, accepted when it was declared second.)"""
    order = new(workflow)
    claim_all(order, T0)
    order.apply_reply(
        report(order, "dispatch", Outcome.TRANSIENT, error="HTTP 500", applied="maybe"),
        T0 + SECOND,
        POLICY,
    )
    dispatch = record(order, "dispatch")
    assert dispatch.process_state is StepState.PENDING and dispatch.may_have_applied
    assert record(order, "bill").process_state is StepState.PROCESSING

    with pytest.raises(TransitionRefused) as refused:
        order.cancel(T0 + 2 * SECOND, "ops", "the customer withdrew")

    assert refused.value.reason == "doubt"
    assert "dispatch" in refused.value.message
    assert status(order) is OrderStatus.PROCESSING
    assert dispatch.process_state is StepState.PENDING


# --- 5. a resubmit alerts nobody by itself ----------------------------------------------------


@pytest.mark.parametrize(
    "refused_at",
    [
        pytest.param(1, id="refused-while-the-delay-waited"),
        pytest.param(15, id="refused-after-its-time-before-the-sweep-ended-it"),
    ],
)
def test_a_resubmit_of_a_group_whose_delay_has_ended_raises_no_alert(refused_at: int) -> None:
    """Scenario: ``Parallel(Delay("cool-off", seconds=10), notify)``; notify is refused
    (4xx) before the cool-off was ended (the group halts: the delay is stopped); the order
    is ``error`` with one "safe to resubmit" alert. After the cool-off's time an operator
    resubmits.

    §3.15 "A resubmit alerts nobody by itself": resubmit restarts only the failed or
    stopped records, and a delay whose time has ended stays ended (``Processed``). The
    resubmit's own change raises no alert and the app gets exactly one status message,
    ``processing``, never an ``error`` between. (The engine restarted the delay before
    the failed step: the delay ended at once, the group settled on the still-failed step,
    a second alert went out, and the app saw processing -> error -> processing.)"""
    order = new("cool-off-beside")
    claim_all(order, T0)
    order.apply_reply(
        report(order, "notify", Outcome.REFUSED, error="HTTP 400: no such address"),
        T0 + refused_at * SECOND,
        POLICY,
    )
    assert status(order) is OrderStatus.ERROR
    assert len(alerts(order)) == 1
    order.outbox.clear()

    order.resubmit(T0 + 60 * SECOND, "ops", "fixed the address")

    assert alerts(order) == []
    assert statuses(order) == ["processing"]
    assert status(order) is OrderStatus.PROCESSING
    assert record(order, "cool-off").process_state is StepState.PROCESSED
    assert record(order, "notify").process_state is StepState.PENDING


# --- 6. too late is said ------------------------------------------------------------------------


def test_an_approval_after_its_event_timed_out_is_refused_too_late(s: Services) -> None:
    """Scenario: reserve (undone by release), then ``Event("approved", timeout_seconds=60)``.
    No approval comes in time: the event step fails for good and the order unwinds
    (``compensating``). Then the approval arrives.

    §3.15 "Too late is said": an event for an ``Event`` step that has failed (timed out)
    or whose order is unwinding is answered 409 ``too-late``, recorded in the history,
    never 202 ``kept``; only an event whose step has not started yet is kept. (The engine
    answered ``kept`` and kept it in the order's events, for a step that will never take
    it.)"""
    submit(s, "ap-1", "late-approval")
    [reserve] = requests(s, "ap-1")
    s.scheduler.apply_reply(reply_to(reserve))
    s.clock.advance(60 + SKEW_GRACE.total_seconds() + 1)
    s.supervisor.run()  # the approval did not come in time
    assert stored(s, "ap-1").status is OrderStatus.COMPENSATING
    s.clock.advance(5)
    delivered_at = s.clock()

    with pytest.raises(TransitionRefused) as refused:
        s.admin.deliver_event("ap-1", "approved", {"result": {"by": "ann"}}, "ann")

    assert refused.value.reason == "too-late"
    order = stored(s, "ap-1")
    assert "approved" not in order.events
    assert any(names(h, "approved") for h in history_since(order, delivered_at)), (
        "the refused delivery is not in the stored order's history"
    )
    assert status(order) is OrderStatus.COMPENSATING


# --- 7. an effect that stands is told -----------------------------------------------------------


def dispatched_beside_a_refused_bill(order: Order, how: str) -> datetime:
    """reserve succeeds; in the group, dispatch (nothing undoes it) succeeds and bill is
    refused; ``how`` is ``cancel``: an operator cancels while both are in flight. Then every
    compensation asked for succeeds. Returns the time after; the outbox holds what was
    sent since the group started."""
    now = succeed(order, "reserve", T0)
    claim_all(order, now)
    order.outbox.clear()
    if how == "cancel":
        order.cancel(now + SECOND, "ops", "the customer withdrew")
    order.apply_reply(report(order, "dispatch", result={"parcel": "P-1"}), now + SECOND, POLICY)
    order.apply_reply(
        report(order, "bill", Outcome.REFUSED, error="HTTP 422: card declined"),
        now + 2 * SECOND,
        POLICY,
    )
    return unwind_to_the_end(order, now + 3 * SECOND)


@pytest.mark.parametrize("how", ["failure", "cancel"])
def test_an_unwinding_around_an_effect_that_stands_ends_in_error_and_tells(how: str) -> None:
    """Scenario: reserve (undone by release), then ``Parallel(dispatch, bill)``: dispatch,
    which nothing undoes, succeeds; bill is refused (or: an operator cancels while both are
    in flight, then dispatch succeeds and bill is refused). The order unwinds: release.

    §3.15 "An effect that stands is told" (and I3): the order does not end ``compensated``
    or ``cancelled`` while dispatch's effect stands; it ends ``error`` with one alert
    naming dispatch and what was undone. (The engine ended it compensated / cancelled,
    in silence, with the parcel dispatched.)"""
    order = new("reserve-dispatch-bill")
    dispatched_beside_a_refused_bill(order, how)
    assert record(order, "dispatch").process_state is StepState.PROCESSED
    assert order.find("release") is not None  # what could be undone was

    assert status(order) is OrderStatus.ERROR
    [alert] = alerts(order)
    assert "dispatch" in said(alert)
    assert "reserve" in alert["reason"] or "release" in alert["reason"]
    # nothing is left for an operator's cancel or resubmit: each says so, and neither
    # points to the other
    later = order.updated_at + timedelta(minutes=1)
    assert not order.cancel_preview(later).allowed
    with pytest.raises(TransitionRefused) as refused:
        order.resubmit(later, "ops", "again")
    assert "dispatch" in str(refused.value) and "cancel" not in str(refused.value)


@pytest.mark.parametrize(
    ("how", "end"),
    [("failure", OrderStatus.COMPENSATED), ("cancel", OrderStatus.CANCELLED)],
)
def test_an_effect_declared_may_stand_ends_the_unwinding_quietly_with_a_note(
    how: str, end: OrderStatus
) -> None:
    """Scenario: as the test above, with dispatch declared ``StepSpec(..., may_stand=True)``.

    §3.15 "An effect that stands is told", its exception: a step whose effect may stand by
    declaration lets the order end ``compensated`` / ``cancelled`` with no alert; the
    history says that dispatch's effect stands. (On the engine of the time this fails
    first because ``StepSpec`` takes no ``may_stand``.)"""
    order = new(may_stand_workflow())
    dispatched_beside_a_refused_bill(order, how)

    assert status(order) is end
    assert alerts(order) == []
    notes = [
        h for h in [*order.history, *record(order, "dispatch").history] if "stand" in json.dumps(h)
    ]
    assert notes, "no history entry says dispatch's effect stands"


# --- 8 (issue item 10). a report that adds no evidence changes nothing on an ended step --------


def test_a_late_deferral_of_an_ended_steps_attempt_does_not_reopen_the_order() -> None:
    """Scenario: process fails for good after ``MAX_FAILURE_COUNT`` (3) counted failures in
    five attempts: 1, 3 and 5 expired with no report, 2 and 4 were deferred (so attempt
    numbers run above the failure count); it may have applied; the order is ``error``
    with its alert. Then a redelivered copy of attempt 5's request reaches an agent that
    reports ``deferred``: no time left to call before the deadline.

    §3.15 "Doubt is per record" / I4, I7: a report that adds no evidence of an effect
    changes nothing on a step that has ended: FailureCount stays 3, the step ``Error``, the
    order ``error``; no new alert, no status message (at most a history note). (The engine
    took it as a new deferral: it gave the failure back, put the step back to ``Pending``
    and the order to ``processing``, with an "update" alert.)"""
    order = new("order")
    process = record(order, "process")
    now = T0
    for number in range(1, 6):
        now = claim(order, "process", now)
        assert process.attempt == number
        if number % 2 == 0:
            order.apply_reply(
                report(
                    order,
                    "process",
                    Outcome.DEFERRED,
                    error="circuit open: not called",
                    applied="no",
                ),
                now + SECOND,
                POLICY,
            )
        else:
            now = process.complete_by + SECOND
            order.expire(now, POLICY, step="process")
        if not process.is_active:
            break
        if process.held:  # the count is spent before its time: final at the floor
            now = process.complete_by
            order.expire(now, POLICY, step="process")
    assert (process.attempt, process.failure_count) == (5, 3)
    assert process.process_state is StepState.ERROR and process.may_have_applied
    assert status(order) is OrderStatus.ERROR
    [alert] = alerts(order)
    assert "may have been applied" in alert["reason"]
    order.outbox.clear()

    late = report(
        order,
        "process",
        Outcome.DEFERRED,
        attempt=5,
        error="no time left to call before the deadline",
        applied="no",
    )
    with contextlib.suppress(TransitionRefused):  # refused as adding nothing: fine too
        order.apply_reply(late, now + 120 * SECOND, POLICY)

    assert process.failure_count == 3
    assert process.process_state is StepState.ERROR
    assert status(order) is OrderStatus.ERROR
    assert alerts(order) == []
    assert statuses(order) == []


# --- found by the model (tests/model): a cancel with nothing left to undo ---------------------


def test_a_cancel_with_nothing_to_undo_leaves_the_order_in_error_without_a_flap() -> None:
    """Found by ``python -m tests.model`` (I7-status-sequence@cancel). Scenario: ``notify``
    (no compensation) applied; ``process`` timed out twice, may have applied, and the order
    is ``error``. The operator cancels, stating process did not happen.

    Nothing is left to undo and notify's effect stands: the order stays ``error`` with an
    alert that says so, and the app is told nothing (the engine of the time sent
    ``compensating`` then ``error`` in the one transition: a status it left at once)."""
    order = new("notify-then-process")
    now = succeed(order, "notify", T0)
    for _ in range(POLICY.max_failure_count):
        now = claim(order, "process", now)
        now += timedelta(seconds=TIMEOUT + 1)
        order.expire(now, POLICY, step="process")
        if status(order) is OrderStatus.ERROR:
            break
    assert status(order) is OrderStatus.ERROR, order.history
    told = len(statuses(order))

    order.cancel(now + SECOND, by="ops@example.com", not_applied="process")

    assert status(order) is OrderStatus.ERROR
    assert statuses(order)[told:] == []
    assert any("stands" in said(a) and "notify" in said(a) for a in alerts(order)), alerts(order)
