"""What a workflow can say (docs/contracts.md §3.13), on the pure model with a fake clock:
results that flow, parallel steps, conditions, events and callbacks, delays, pinned plans.

The workflows are the tests' own (``tests/fixtures/flows.py``), installed for each test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.errors import InvalidEvent, TransitionRefused
from core.inbox import check_event
from core.messages import AgentReply
from core.model import Order
from core.order_message import decode_order
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from core.workflows import WORKFLOWS, Plan
from tests.fixtures.flows import NOON
from tests.support import declarations

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=600)


@pytest.fixture(autouse=True)
def flows() -> Iterator[None]:
    with declarations():
        yield


def new(workflow: str, **data: Any) -> Order:
    body = {"orderId": "o-1", "workflow": workflow, "replyTo": "app-status", **data}
    return Order.accept(decode_order(json.dumps(body)), Plan.of(WORKFLOWS[workflow], 30), T0)


def report(
    order: Order,
    step: str,
    outcome: Outcome = Outcome.SUCCEEDED,
    result: dict[str, Any] | None = None,
    **kw: Any,
) -> AgentReply:
    record = order.find(step)
    assert record is not None and record.attempt >= 1, f"{step} was never claimed"
    attempt = kw.pop("attempt", record.attempt)
    succeeded = outcome is Outcome.SUCCEEDED
    return AgentReply(
        order.order_id,
        step,
        attempt,
        record.complete_by,
        outcome,
        result=(result if result is not None else {"ok": True}) if succeeded else None,
        error=None if succeeded else kw.pop("error", "declined"),
        applied=None if succeeded else kw.pop("applied", "no"),
        token=record.token_for(attempt),
        **kw,
    )


def claim_all(order: Order, now: datetime) -> list[str]:
    """Claim every due Pending step, as the scheduler does."""
    names = [s.step for s in order.active_steps() if s.process_state is StepState.PENDING]
    for name in names:
        order.claim("i", now, step=name)
    return names


def status(order: Order) -> OrderStatus:
    """The order's status now (a call: read afresh after each transition)."""
    return order.status


def state_of(order: Order, step: str) -> StepState:
    record = order.find(step)
    assert record is not None, step
    return record.process_state


def state(order: Order) -> dict[str, str]:
    return {s.step: str(s.process_state) for s in order.steps}


def alerts(order: Order) -> list[dict[str, Any]]:
    return [json.loads(n.body) for n in order.outbox if n.kind == "alert"]


# --- results flow ---------------------------------------------------------------------------


def test_a_steps_result_is_the_next_steps_input() -> None:
    order = new("returns", items=["boots"])
    claim_all(order, T0)
    order.apply_reply(report(order, "receive-return", result={"rma": "RMA-9"}), T0, POLICY)
    restock = order.find("restock")
    assert restock is not None and restock.process_state is StepState.PENDING
    assert restock.input == {"rma": "RMA-9", "items": ["boots"]}  # decided once, recorded
    assert any(h["event"] == "decided" for h in restock.history)


def test_a_compensation_gets_what_the_step_it_undoes_returned() -> None:
    order = new("trip")
    assert claim_all(order, T0) == ["book-flight", "book-hotel"]
    order.apply_reply(report(order, "book-flight", result={"booking": "F-7"}), T0, POLICY)
    order.apply_reply(report(order, "book-hotel", result={"booking": "H-2"}), T0, POLICY)
    claim_all(order, T0)
    order.apply_reply(report(order, "charge", Outcome.REFUSED, error="card declined"), T0, POLICY)
    assert status(order) is OrderStatus.COMPENSATING
    refund = order.active_step()  # nothing to refund: the charge was refused; hotel first
    assert refund is not None and refund.step == "cancel-hotel"
    claim_all(order, T0)
    order.apply_reply(report(order, "cancel-hotel"), T0, POLICY)
    cancel = order.active_step()
    assert cancel is not None and cancel.step == "cancel-flight"
    assert cancel.input == {"booking": "F-7"}
    claim_all(order, T0)
    order.apply_reply(report(order, "cancel-flight"), T0, POLICY)
    assert status(order) is OrderStatus.COMPENSATED


@pytest.mark.parametrize(
    ("workflow", "phrase"),
    [
        ("broken-input", "input of explode raised ZeroDivisionError: division by zero"),
        ("bad-input", "input of listy returned list, not a JSON object"),
    ],
)
def test_an_input_that_raises_fails_the_step_for_good_and_nothing_is_called(
    workflow: str, phrase: str
) -> None:
    order = new(workflow)
    [step] = order.steps
    assert step.process_state is StepState.ERROR and step.attempt == 0  # never claimed
    assert status(order) is OrderStatus.ERROR
    [alert] = alerts(order)
    assert phrase in alert["reason"] and "was not applied" in alert["reason"]


# --- parallel steps ---------------------------------------------------------------------------


def test_the_steps_of_a_parallel_run_at_once_and_the_workflow_waits_for_all() -> None:
    order = new("trip")
    assert [s.step for s in order.active_steps()] == ["book-flight", "book-hotel"]
    claim_all(order, T0)
    flight, hotel = order.find("book-flight"), order.find("book-hotel")
    assert flight is not None and hotel is not None
    assert flight.process_state is hotel.process_state is StepState.PROCESSING
    assert flight.complete_by == hotel.complete_by == T0 + timedelta(seconds=30)
    order.apply_reply(report(order, "book-hotel"), T0 + timedelta(seconds=1), POLICY)
    assert order.find("charge") is None  # the flight is still out
    order.apply_reply(report(order, "book-flight"), T0 + timedelta(seconds=2), POLICY)
    charge = order.find("charge")
    assert charge is not None and charge.process_state is StepState.PENDING


def test_each_parallel_step_has_its_own_retries_and_supervision() -> None:
    order = new("trip")
    claim_all(order, T0)
    order.apply_reply(report(order, "book-flight"), T0, POLICY)
    later = T0 + timedelta(seconds=31)
    hotel = order.expire(later, POLICY, step="book-hotel")
    assert hotel.step == "book-hotel" and hotel.failure_count == 1
    assert hotel.process_state is StepState.PENDING
    flight = order.find("book-flight")
    assert flight is not None and flight.process_state is StepState.PROCESSED


def test_a_parallel_step_that_fails_lets_the_other_finish_then_both_are_undone() -> None:
    """book-hotel is refused while book-flight is in flight: the flight's attempt finishes
    (it succeeds), then what succeeded is compensated; the order ends compensated."""
    order = new("trip")
    claim_all(order, T0)
    order.apply_reply(report(order, "book-hotel", Outcome.REFUSED, error="no rooms"), T0, POLICY)
    assert status(order) is OrderStatus.PROCESSING  # waits for the flight
    assert state(order)["book-flight"] == "Processing"
    order.apply_reply(report(order, "book-flight", result={"booking": "F-1"}), T0, POLICY)
    assert status(order) is OrderStatus.COMPENSATING
    cancel = order.active_step()
    assert cancel is not None and cancel.step == "cancel-flight"
    assert cancel.input == {"booking": "F-1"}
    claim_all(order, T0)
    order.apply_reply(report(order, "cancel-flight"), T0, POLICY)
    assert status(order) is OrderStatus.COMPENSATED
    assert order.find("cancel-hotel") is None  # never applied: nothing to undo


def test_a_failure_stops_a_parallel_step_waiting_for_its_next_attempt() -> None:
    order = new("trip")
    claim_all(order, T0)
    order.apply_reply(report(order, "book-flight", Outcome.TRANSIENT, error="HTTP 503"), T0, POLICY)
    assert state(order)["book-flight"] == "Pending"
    order.apply_reply(report(order, "book-hotel", Outcome.REFUSED, error="no rooms"), T0, POLICY)
    assert state(order)["book-flight"] == "Compensated"  # stopped: it had applied nothing
    assert status(order) is OrderStatus.COMPENSATED
    assert not any(s.kind is StepKind.COMPENSATION for s in order.steps)


def test_a_parallel_step_that_may_have_applied_and_cannot_be_undone_undoes_nothing() -> None:
    """dispatch (no compensation) fails for good in doubt; bill succeeded: the order is
    error and the bill is not undone around the doubt (docs/contracts.md §3.11)."""
    order = new("ship-and-bill")
    claim_all(order, T0)
    order.apply_reply(report(order, "bill"), T0, POLICY)
    now = T0
    for _ in range(3):
        now += timedelta(seconds=31)
        order.expire(now, POLICY, step="dispatch")
        if order.find("dispatch").process_state is StepState.PENDING:  # type: ignore[union-attr]
            now = max(now, order.find("dispatch").complete_by)  # type: ignore[union-attr]
            order.claim("i", now, step="dispatch")
    assert status(order) is OrderStatus.ERROR
    assert not any(s.kind is StepKind.COMPENSATION for s in order.steps)
    [alert] = alerts(order)
    assert alert["step"] == "dispatch" and "may have been applied" in alert["reason"]


def test_a_definite_failure_waits_for_the_step_in_flight_then_undoes_it() -> None:
    order = new("ship-and-bill")
    claim_all(order, T0)
    order.apply_reply(report(order, "dispatch", Outcome.REFUSED, error="HTTP 400"), T0, POLICY)
    assert status(order) is OrderStatus.PROCESSING and alerts(order) == []  # bill is out
    order.apply_reply(report(order, "bill"), T0, POLICY)
    assert status(order) is OrderStatus.COMPENSATING
    unbill = order.active_step()
    assert unbill is not None and unbill.step == "unbill"


def test_a_resubmit_runs_the_failed_parallel_step_again_and_keeps_the_others() -> None:
    order = new("ship-and-bill")
    claim_all(order, T0)
    order.apply_reply(report(order, "bill"), T0, POLICY)
    order.apply_reply(
        report(order, "dispatch", Outcome.TRANSIENT, error="HTTP 500", applied="maybe"),
        T0,
        POLICY,
    )
    dispatch = order.find("dispatch")
    assert dispatch is not None
    now = T0
    while status(order) is not OrderStatus.ERROR:
        now = max(now + timedelta(seconds=31), dispatch.complete_by)
        if dispatch.process_state is StepState.PENDING:
            order.claim("i", now, step="dispatch")
        order.expire(now + timedelta(seconds=31), POLICY, step="dispatch")
    order.resubmit(now, "ops", "the carrier says it never got it")
    assert status(order) is OrderStatus.PROCESSING
    assert state(order) == {"bill": "Processed", "dispatch": "Pending"}
    order.claim("i", now, step="dispatch")
    order.apply_reply(report(order, "dispatch"), now, POLICY)
    assert status(order) is OrderStatus.COMPLETED


# --- conditions -------------------------------------------------------------------------------


def test_a_step_whose_when_is_false_is_skipped_and_the_order_goes_on() -> None:
    order = new("approval", amount=50)
    claim_all(order, T0)
    order.apply_reply(report(order, "reserve"), T0, POLICY)
    approved, hold = order.find("approved"), order.find("hold")
    assert approved is not None and approved.process_state is StepState.SKIPPED
    assert hold is not None and hold.process_state is StepState.PROCESSING
    assert hold.waiting_for == {"until": "2026-11-22T10:10:00.000Z"}


def test_a_skipped_step_is_never_compensated() -> None:
    order = new("approval", amount=50)
    claim_all(order, T0)
    order.apply_reply(report(order, "reserve"), T0, POLICY)
    order.cancel(T0 + timedelta(seconds=1), "ops")  # during the delay: it stops at once
    assert state(order)["hold"] == "Compensated"
    release = order.active_step()
    assert release is not None and release.step == "release"
    assert state(order)["approved"] == "Skipped"


# --- events -------------------------------------------------------------------------------------


def waiting_for_approval() -> Order:
    order = new("approval", amount=5000)
    claim_all(order, T0)
    order.apply_reply(report(order, "reserve"), T0, POLICY)
    return order


def test_an_event_step_waits_and_takes_its_event_with_its_result() -> None:
    order = waiting_for_approval()
    approved = order.find("approved")
    assert approved is not None and state_of(order, "approved") is StepState.PROCESSING
    assert approved.waiting_for == {"event": "approved"}
    effect = order.deliver_event("approved", {"result": {"by": "maria"}}, T0, "ops", "ok")
    assert effect == "taken"
    assert state_of(order, "approved") is StepState.PROCESSED
    assert approved.result == {"by": "maria"}
    assert state(order)["hold"] == "Processing"
    assert order.context().results["approved"] == {"by": "maria"}


def test_a_refused_event_fails_its_step_not_applied_and_the_workflow_unwinds() -> None:
    order = waiting_for_approval()
    order.deliver_event("approved", {"refused": "too risky"}, T0, "ops")
    approved = order.find("approved")
    assert approved is not None and approved.process_state is StepState.ERROR
    assert approved.gave_up is not None and not approved.gave_up.ambiguous
    assert status(order) is OrderStatus.COMPENSATING  # release the reservation
    assert order.active_step().step == "release"  # type: ignore[union-attr]


def test_an_event_that_beats_its_step_is_kept_and_taken_when_it_starts() -> None:
    order = new("approval", amount=5000)
    assert order.deliver_event("approved", {"result": {"early": True}}, T0, "webhook") == "kept"
    claim_all(order, T0)
    order.apply_reply(report(order, "reserve"), T0, POLICY)
    approved = order.find("approved")
    assert approved is not None and approved.process_state is StepState.PROCESSED
    assert approved.result == {"early": True}


def test_the_same_event_twice_changes_nothing_and_another_body_is_refused() -> None:
    order = waiting_for_approval()
    body = {"result": {"by": "maria"}}
    assert order.deliver_event("approved", body, T0, "ops") == "taken"
    assert order.deliver_event("approved", json.loads(json.dumps(body)), T0, "ops") == "same"
    with pytest.raises(TransitionRefused) as refused:
        order.deliver_event("approved", {"result": {"by": "someone else"}}, T0, "ops")
    assert refused.value.reason == "event-delivered"


def test_an_event_the_workflow_does_not_declare_is_invalid_whatever_the_state() -> None:
    order = waiting_for_approval()
    with pytest.raises(InvalidEvent, match=r"declares no event 'shipped'.*approved, captured"):
        order.deliver_event("shipped", {"result": {}}, T0, "ops")


def test_an_event_for_a_finished_order_is_refused() -> None:
    order = new("order")
    claim_all(order, T0)
    order.apply_reply(report(order, "process"), T0, POLICY)
    order.plan = replace(order.plan)  # (the plan declares no event: 400 comes first)
    with pytest.raises(InvalidEvent):
        order.deliver_event("approved", {"result": {}}, T0, "ops")
    done = waiting_for_approval()
    done.cancel(T0, "ops")
    claim_all(done, T0)
    done.apply_reply(report(done, "release"), T0, POLICY)
    assert status(done) is OrderStatus.CANCELLED
    with pytest.raises(TransitionRefused) as refused:
        done.deliver_event("captured", {"result": {}}, T0, "ops")
    assert refused.value.reason == "finished"


def test_an_event_step_whose_timeout_passes_fails_not_applied_and_unwinds() -> None:
    order = waiting_for_approval()
    order.expire(T0 + timedelta(seconds=3601), POLICY, step="approved")
    approved = order.find("approved")
    assert approved is not None and approved.process_state is StepState.ERROR
    assert "no event approved within 3600 s" in approved.history[-1]["reason"]
    assert status(order) is OrderStatus.COMPENSATING


@pytest.mark.parametrize(
    ("body", "phrase"),
    [
        ([], "JSON object"),
        ({}, "exactly one of"),
        ({"result": {}, "refused": "x"}, "exactly one of"),
        ({"result": [1]}, "not a JSON object"),
        ({"refused": ""}, "say why"),
        ({"refused": 7}, "say why"),
        ({"result": {}, "extra": 1}, r"not \['extra'\]"),
        ({"result": {"x": "y" * 70_000}}, "characters of JSON"),
        ({"refused": "no", "reason": 5}, "reason must be text"),
    ],
)
def test_an_event_body_that_is_neither_is_invalid(body: Any, phrase: str) -> None:
    with pytest.raises(InvalidEvent, match=phrase):
        check_event(body)


def test_a_workflow_can_start_with_an_event() -> None:
    order = new("event-first")
    [go] = order.steps
    assert go.process_state is StepState.PROCESSING and status(order) is OrderStatus.PROCESSING
    order.deliver_event("go-ahead", {"result": {}}, T0, "ops")
    after = order.find("after")
    assert after is not None and after.process_state is StepState.PENDING


# --- a remote that answers later ---------------------------------------------------------------


def capturing() -> tuple[Order, datetime]:
    order = new("approval", amount=50)
    claim_all(order, T0)
    order.apply_reply(report(order, "reserve"), T0, POLICY)
    now = T0 + timedelta(seconds=601)
    order.expire(now, POLICY, step="hold")
    claim_all(order, now)
    return order, now


def test_a_2xx_for_a_step_that_completes_on_an_event_is_only_acceptance() -> None:
    order, now = capturing()
    order.apply_reply(report(order, "capture", result={"accepted": True}), now, POLICY)
    capture = order.find("capture")
    assert capture is not None and state_of(order, "capture") is StepState.PROCESSING
    current = capture.current
    assert current is not None and current.accepted and current.applied == "maybe"
    assert order.deliver_event("captured", {"result": {"ref": "C-1"}}, now, "bank") == "taken"
    assert state_of(order, "capture") is StepState.PROCESSED and capture.result == {"ref": "C-1"}
    assert status(order) is OrderStatus.COMPLETED


def test_a_lost_callback_is_asked_for_again_with_the_same_key() -> None:
    order, now = capturing()
    order.apply_reply(report(order, "capture"), now, POLICY)
    capture = order.find("capture")
    assert capture is not None
    order.expire(capture.complete_by + timedelta(seconds=1), POLICY, step="capture")
    assert capture.process_state is StepState.PENDING and capture.failure_count == 1
    assert capture.idempotency_key == "o-1:capture"


def test_a_refused_callback_is_a_definite_failure() -> None:
    order, now = capturing()
    order.apply_reply(report(order, "capture"), now, POLICY)
    order.deliver_event("captured", {"refused": "card expired"}, now, "bank")
    capture = order.find("capture")
    assert capture is not None and capture.process_state is StepState.ERROR
    assert not capture.may_have_applied  # the remote said it will not happen
    assert status(order) is OrderStatus.COMPENSATING


def test_a_callback_before_the_2xx_is_taken_when_the_step_is_active() -> None:
    order, now = capturing()
    assert order.deliver_event("captured", {"result": {"ref": "C-2"}}, now, "bank") == "taken"
    assert status(order) is OrderStatus.COMPLETED


# --- delays -------------------------------------------------------------------------------------


def test_a_delay_ends_at_its_time_with_the_result_nothing() -> None:
    order = new("approval", amount=50)
    claim_all(order, T0)
    order.apply_reply(report(order, "reserve"), T0, POLICY)
    hold = order.find("hold")
    assert hold is not None and order.next_due() == T0 + timedelta(seconds=600)
    with pytest.raises(TransitionRefused):
        order.expire(T0 + timedelta(seconds=599), POLICY, step="hold")
    order.expire(T0 + timedelta(seconds=600), POLICY, step="hold")
    assert hold.process_state is StepState.PROCESSED and hold.result == {}


def test_a_delay_until_a_time_a_function_gives() -> None:
    order = new("wait-until", holdUntil=NOON)
    [wait] = order.steps
    assert wait.complete_by == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert order.wakeups == [wait.complete_by]


def test_a_parallel_of_waits() -> None:
    order = new("parallel-waits")
    assert {s.step: s.waiting_for for s in order.steps} == {
        "signed": {"event": "signed"},
        "cool-off": {"until": "2026-11-22T10:00:30.000Z"},
    }
    order.expire(T0 + timedelta(seconds=30), POLICY, step="cool-off")
    assert status(order) is OrderStatus.PROCESSING
    order.deliver_event("signed", {"result": {}}, T0 + timedelta(seconds=31), "x")
    assert status(order) is OrderStatus.COMPLETED


# --- pinned plans ---------------------------------------------------------------------------------


def test_a_plan_pins_groups_kinds_events_delays_and_functions() -> None:
    plan = Plan.of(WORKFLOWS["approval"], 30)
    raw = plan.to_json()
    assert [(s["name"], s["group"], s.get("kind", "task")) for s in raw["steps"]] == [
        ("reserve", 0, "task"),
        ("approved", 1, "event"),
        ("hold", 2, "delay"),
        ("capture", 3, "task"),
    ]
    assert raw["steps"][1]["uses"] == ["when"] and raw["steps"][2]["seconds"] == 600
    assert raw["steps"][3]["completesOn"] == "captured"
    assert Plan.from_json(json.loads(json.dumps(raw))) == plan
    assert plan.event_names() == ("approved", "captured")


def test_a_plan_from_before_groups_reads_as_a_line_of_tasks() -> None:
    old = {
        "workflow": "fulfilment",
        "steps": [
            {"name": "reserve-stock", "path": "reserve-stock", "timeout": 30, "agent": "inventory"},
            {"name": "ship", "path": "ship", "timeout": 30, "agent": "carrier"},
        ],
    }
    plan = Plan.from_json(old)
    assert [(s.group, s.kind) for s in plan.steps] == [(0, "task"), (1, "task")]


def test_an_event_step_that_failed_says_why_in_its_last_error() -> None:
    from admin.service import order_summary, step_view

    order = waiting_for_approval()
    order.expire(T0 + timedelta(seconds=3601), POLICY, step="approved")
    approved = order.find("approved")
    assert approved is not None and approved.gave_up is not None
    assert step_view(approved, None, order)["lastError"] == approved.gave_up.reason
    assert "no event approved" in str(order_summary(order)["lastError"])
