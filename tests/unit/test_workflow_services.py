"""What a workflow can say (docs/contracts.md §3.13) through the scheduler, the supervisor and
the operator's admin, on the in-memory store and a fake clock: parallel steps claimed and
requested at once, bodies that carry results, events that move the order on at once, a
delay that wakes it, and the supervisor's tick over waiting orders.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from core.errors import InvalidEvent, OrderNotFound, TransitionRefused
from core.messages import AgentRequest
from core.outcome import Outcome
from core.states import OrderStatus
from scheduler.service import Handled
from supervisor.service import SKEW_GRACE
from tests.support import callback_token, declarations
from tests.unit.test_services_in_memory import T0, Services, build, reply_to, stored


@pytest.fixture
def s() -> Iterator[Services]:
    services = build()  # (the bootstrap puts the settings' declarations to use: then ours)
    with declarations():
        yield services


def submit(s: Services, order_id: str, workflow: str, **data: Any) -> Handled:
    body = {"orderId": order_id, "workflow": workflow, **data}
    return s.scheduler.submit(json.dumps(body).encode())


def requests(s: Services, order_id: str) -> list[AgentRequest]:
    return [r for r in s.transport.requests if r.order_id == order_id]


def test_a_parallel_group_is_claimed_and_requested_at_once_in_one_save(s: Services) -> None:
    submit(s, "t-1", "trip")
    assert [(r.step, r.attempt) for r in requests(s, "t-1")] == [
        ("book-flight", 1),
        ("book-hotel", 1),
    ]
    order = stored(s, "t-1")
    assert order.version == 1  # accepted and both claimed in the one create
    flight, hotel = requests(s, "t-1")
    s.scheduler.apply_reply(reply_to(flight, result={"booking": "F-1"}))
    assert [r.step for r in requests(s, "t-1")] == ["book-flight", "book-hotel"]
    s.scheduler.apply_reply(reply_to(hotel, result={"booking": "H-1"}))
    assert [r.step for r in requests(s, "t-1")][-1] == "charge"  # claimed at once


def test_a_request_carries_the_body_its_input_decided(s: Services) -> None:
    submit(s, "r-1", "returns", items=["boots"])
    [desk] = requests(s, "r-1")
    s.scheduler.apply_reply(reply_to(desk, result={"rma": "RMA-r-1"}))
    restock = requests(s, "r-1")[-1]
    assert restock.step == "restock" and restock.order == {"rma": "RMA-r-1", "items": ["boots"]}


def test_an_event_moves_the_order_on_in_the_same_call(s: Services) -> None:
    """Over HTTP the event is delivered through the scheduler's own dispatch: the next step
    is claimed and requested before the answer (bootstrap ``events``)."""
    submit(s, "e-1", "event-first")
    assert requests(s, "e-1") == []  # it waits for the event first
    effect, view = s.events.deliver_event("e-1", "go-ahead", {"result": {"ok": 1}}, "ops")
    assert effect == "taken" and view["status"] == "processing"
    [after] = requests(s, "e-1")
    assert after.step == "after" and after.attempt == 1


def test_the_cli_path_queues_the_next_step_on_order_dispatch(s: Services) -> None:
    submit(s, "e-2", "event-first")
    effect, _ = s.admin.deliver_event("e-2", "go-ahead", {"result": {}}, "ops")
    assert effect == "taken"
    assert [
        json.loads(m.body)["orderId"] for m in s.queues.sent if m.queue == s.names.order_dispatch
    ] == ["e-2"]


def test_the_events_answers(s: Services) -> None:
    submit(s, "e-3", "approval", amount=5000)
    assert s.admin.deliver_event("e-3", "approved", {"result": {"by": "ann"}}, "ops")[0] == "kept"
    assert s.admin.deliver_event("e-3", "approved", {"result": {"by": "ann"}}, "ops")[0] == "same"
    with pytest.raises(TransitionRefused):
        s.admin.deliver_event("e-3", "approved", {"result": {"by": "bob"}}, "ops")
    with pytest.raises(InvalidEvent):
        s.admin.deliver_event("e-3", "nope", {"result": {}}, "ops")
    with pytest.raises(InvalidEvent):
        s.admin.deliver_event("e-3", "approved", {"bogus": 1}, "ops")
    with pytest.raises(OrderNotFound):
        s.admin.deliver_event("missing", "approved", {"result": {}}, "ops")
    history = stored(s, "e-3").history
    assert any(h["event"] == "event-kept" and h.get("by") == "ops" for h in history)


def test_a_delay_is_woken_by_a_dispatch_message_at_its_time(s: Services) -> None:
    submit(s, "d-1", "approval", amount=50)
    [reserve] = requests(s, "d-1")
    s.scheduler.apply_reply(reply_to(reserve))
    wakeups = [m for m in s.queues.sent if m.queue == s.names.order_dispatch]
    assert [round(m.delay_seconds) for m in wakeups] == [600]
    s.clock.advance(599)
    assert s.scheduler.dispatch("d-1") is Handled.NOT_DUE
    s.clock.advance(1)
    assert s.scheduler.dispatch("d-1") is Handled.DISPATCHED
    capture = requests(s, "d-1")[-1]
    assert capture.step == "capture"


def test_the_supervisor_reads_only_the_waits_whose_time_has_passed(s: Services) -> None:
    for n in range(20):
        submit(s, f"w-{n}", "event-first")
    submit(s, "w-late", "event-first")
    order = stored(s, "w-late")
    assert len(list(s.store.expired_processing(T0 + timedelta(seconds=59)))) == 0
    s.clock.advance(61 + SKEW_GRACE.total_seconds())
    report = s.supervisor.run()
    assert report.examined == 21  # every one of them timed out at once here
    assert stored(s, "w-late").status is OrderStatus.ERROR
    assert order.status is OrderStatus.PROCESSING  # (the copy read before)


def test_a_refused_callback_through_the_admin_unwinds(s: Services) -> None:
    submit(s, "c-1", "approval", amount=50)
    [reserve] = requests(s, "c-1")
    s.scheduler.apply_reply(reply_to(reserve))
    s.clock.advance(600)
    s.scheduler.dispatch("c-1")
    capture = requests(s, "c-1")[-1]
    s.scheduler.apply_reply(reply_to(capture))  # the bank accepted it
    assert stored(s, "c-1").status is OrderStatus.PROCESSING
    s.admin.deliver_event(
        "c-1",
        "captured",
        {"refused": "insufficient funds"},
        "bank",
        token=callback_token(stored(s, "c-1"), "captured"),
    )
    assert stored(s, "c-1").status is OrderStatus.COMPENSATING
    s.scheduler.dispatch("c-1")
    release = requests(s, "c-1")[-1]
    assert release.step == "release"
    s.scheduler.apply_reply(reply_to(release))
    assert stored(s, "c-1").status is OrderStatus.COMPENSATED


def test_a_transient_parallel_step_is_retried_on_its_own(s: Services) -> None:
    submit(s, "t-2", "trip")
    flight, hotel = requests(s, "t-2")
    s.scheduler.apply_reply(reply_to(flight, result={"booking": "F"}))
    s.scheduler.apply_reply(reply_to(hotel, Outcome.TRANSIENT, error="HTTP 503", applied="no"))
    order = stored(s, "t-2")
    hotel_record = order.find("book-hotel")
    assert hotel_record is not None and hotel_record.failure_count == 1
    s.clock.advance(60)
    s.scheduler.dispatch("t-2")
    assert [(r.step, r.attempt) for r in requests(s, "t-2")][-1] == ("book-hotel", 2)
