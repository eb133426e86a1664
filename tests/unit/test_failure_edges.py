"""docs/contracts.md §3.11 at its edges, one test per scenario of the failure-edges issue, on
the pure model with a fake clock (and the agent's client where the scenario starts there).

Each of these ended otherwise before typed attempt state: a refund of goods that may
have shipped, a "may have applied" dropped as a stale report, a handler's result that
reached nobody, a cancel that undid around a doubt, a request never sent counted as
"may have applied", a remote hammered by ``Retry-After: 0``, a budget spent in seconds.
(Names that older code lacks are imported inside the tests, so that this file runs, and
fails test by test, against it.)
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from agents.agent import AgentWorker
from agents.outcomes import CallOutcome
from core.errors import TransitionRefused
from core.messages import AgentReply, AgentRequest
from core.model import IN_FLIGHT_GRACE, Order
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from tests.support import unanswered
from tests.unit.test_agent_kinds import python_client
from tests.unit.test_failure_semantics import fail_until_given_up, reach
from tests.unit.test_model import T0, alerts, new_order, reply
from tests.unit.test_model import status as status_of
from tests.unit.test_remote_client import (
    FakeClock,
    RecordingTransport,
    make_client,
    make_request,
    remote,
    status,
)

POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=600)


def claim_due(order: Order, now: datetime) -> tuple[datetime, Any]:
    step = order.active_step()
    assert step is not None
    now = max(now, step.complete_by)
    return now, order.claim("i-1", now)


def not_compensated(order: Order) -> bool:
    return not any(s.kind is StepKind.COMPENSATION for s in order.steps)


# --- 1. a refusal settles only what the service itself says -------------------------------


def test_1_a_403_after_a_timeout_leaves_the_doubt_and_undoes_nothing() -> None:
    """ship attempt 1 got no answer (it may have shipped); attempt 2 is answered 403 by a
    gateway: nothing about the key. The order waits for an operator; no refund."""
    order = new_order("fulfilment")
    now = reach(order, "ship")
    now, ship = claim_due(order, now)
    order.expire(ship.complete_by + timedelta(seconds=1), POLICY)
    now, _ = claim_due(order, now)
    refused = reply(order, Outcome.REFUSED, error="ship: HTTP 403 forbidden")
    assert getattr(refused, "settled", False) is False  # a 403, as the agent reports it
    order.apply_reply(refused, now + timedelta(seconds=1), POLICY)
    assert order.status is OrderStatus.ERROR and ship.process_state is StepState.ERROR
    assert not_compensated(order)  # no refund, no release
    [alert] = alerts(order)
    assert "may have been applied" in alert["reason"] and alert["step"] == "ship"
    assert ship.maybe_applied == [1]


def test_1_a_422_after_a_timeout_settles_the_doubt_and_unwinds() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    now, ship = claim_due(order, now)
    order.expire(ship.complete_by + timedelta(seconds=1), POLICY)
    now, _ = claim_due(order, now)
    settling = replace(
        reply(order, Outcome.REFUSED, error="ship: HTTP 422 bad address"), settled=True
    )
    order.apply_reply(settling, now + timedelta(seconds=1), POLICY)
    assert order.status is OrderStatus.COMPENSATING and alerts(order) == []
    attempt = ship.attempts.get(1)
    assert attempt is not None and attempt.settled_by and "422" in attempt.settled_by


def test_1_a_409_is_a_try_that_may_have_applied() -> None:
    """409: the key is in use, the earlier call may still run: transient, "maybe"."""
    r = remote(FakeClock(), *[status(409, error="in progress")] * 50)
    client, _ = make_client(r)
    outcome = asyncio.run(client.call(make_request(seconds_left=10)))
    assert outcome.applied == "maybe" and outcome.kind != "refused"


# --- 2. every report that says "maybe" counts ----------------------------------------------


def test_2_a_second_copys_maybe_is_kept_and_the_charge_is_undone_not_left() -> None:
    """Two copies of charge-payment attempt 1: copy B reports "transient, not applied";
    copy A got a 500 after sending and reports "may have applied" later. Later attempts
    get 503. The failure is ambiguous, so the charge itself is refunded before the stock
    is released (before: a definite failure, stock released, the charge kept, no one told)."""
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    now, charge = claim_due(order, now)
    copy_b = reply(order, Outcome.TRANSIENT, error="HTTP 503", applied=Applied.NO)
    order.apply_reply(copy_b, now + timedelta(seconds=2), POLICY)
    copy_a = reply(
        order,
        Outcome.TRANSIENT,
        step="charge-payment",
        attempt=1,
        error="HTTP 500",
        applied=Applied.MAYBE,
    )
    order.apply_reply(copy_a, now + timedelta(seconds=3), POLICY)
    assert charge.maybe_applied == [1]
    fail_until_given_up(order, [Applied.NO, Applied.NO], now + timedelta(seconds=4))
    assert charge.process_state is StepState.COMPENSATING  # being undone itself
    active = order.active_step()
    assert active is not None and active.step == "refund-payment"


def test_2_a_duplicate_report_that_adds_nothing_is_refused_but_one_that_adds_is_kept() -> None:
    order = new_order()
    order.claim("i", T0)
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, applied=Applied.NO, error="503"), T0 + timedelta(seconds=1)
    )
    same = reply(order, Outcome.TRANSIENT, attempt=1, applied=Applied.NO, error="503")
    with pytest.raises(TransitionRefused):
        order.apply_reply(same, T0 + timedelta(seconds=2))
    more = reply(order, Outcome.TRANSIENT, attempt=1, applied=Applied.MAYBE, error="500")
    order.apply_reply(more, T0 + timedelta(seconds=3))
    assert order.steps[0].maybe_applied == [1]


def test_2_a_redelivered_request_reports_maybe_unless_the_remote_settles_it() -> None:
    """An earlier delivery of the same request may have called the remote and died."""
    clock = FakeClock()
    r = remote(clock, status(503), status(503), status(503), status(503))
    client, _ = make_client(r)
    transport = RecordingTransport()
    asyncio.run(
        AgentWorker(client, transport, clock, sleep=clock.sleep).handle(make_request(3), None, 2)
    )
    ((sent, _),) = transport.replies
    assert sent.applied == "maybe" and "delivery 2" in (sent.error or "")
    r = remote(clock, status(422, error="invalid"))
    client, _ = make_client(r)
    transport = RecordingTransport()
    asyncio.run(
        AgentWorker(client, transport, clock, sleep=clock.sleep).handle(make_request(3), None, 2)
    )
    ((sent, _),) = transport.replies
    assert (sent.applied, sent.settled) == ("no", True)


# --- 3. a Python agent's late outcome counts ---------------------------------------------


def test_3_a_handler_running_on_holds_its_steps_compensation_until_it_ends() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    now, charge = claim_due(order, now)
    running = now + timedelta(seconds=60)
    overran = replace(
        reply(
            order, Outcome.TRANSIENT, applied=Applied.MAYBE, error="the handler is still running"
        ),
        running_until=running,
        runner="host-1:run-1",
    )
    order.apply_reply(overran, now + timedelta(seconds=20), POLICY)
    fail_until_given_up(order, [Applied.NO, Applied.NO], now + timedelta(seconds=21))
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    skew = POLICY.skew  # the clocks of other instances may be this far off (the claim's)
    # Not before the handler can no longer be running (and its attempts' deadlines).
    assert refund.not_before >= running + skew + IN_FLIGHT_GRACE
    # A renewal moves the compensation on; the handler's end lets it go.
    later = running + timedelta(seconds=45)
    heartbeat = replace(
        reply(order, Outcome.TRANSIENT, step="charge-payment", attempt=1, applied=Applied.MAYBE),
        running_until=later,
        runner="host-1:run-1",
    )
    order.apply_reply(heartbeat, running - timedelta(seconds=5), POLICY)
    assert refund.not_before == later + skew + IN_FLIGHT_GRACE

    # another copy's report, or a stale duplicate of the first: it shortens nothing
    other = reply(order, Outcome.TRANSIENT, step="charge-payment", attempt=1, applied=Applied.MAYBE)
    with pytest.raises(TransitionRefused):
        order.apply_reply(other, running, POLICY)
    assert refund.not_before == later + skew + IN_FLIGHT_GRACE
    ended = replace(
        reply(order, step="charge-payment", attempt=1), runner="host-1:run-1", run_ended=True
    )  # the handler's success
    order.apply_reply(ended, running, POLICY)
    attempt = charge.attempts.get(1)
    assert attempt is not None and attempt.applied is Applied.YES and not attempt.running_until
    # no longer held for it (the refund undoes it): only the attempts' deadlines hold it
    assert refund.not_before == max(running, charge.last_deadline() + IN_FLIGHT_GRACE)
    assert refund.not_before < later + skew + IN_FLIGHT_GRACE


class SignallingTransport(RecordingTransport):
    """The reply queue, telling a waiting test when a run's renewal and its end arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.renewed = threading.Event()
        self.run_ended = threading.Event()

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        sent = super().send_reply(reply, reply_to)
        if reply.run_ended:
            self.run_ended.set()
        elif len(self.replies) > 1 and reply.running_until is not None:
            self.renewed.set()
        return sent


def test_3_the_agent_reports_a_handler_that_outlives_its_attempt_and_its_outcome() -> None:
    release = threading.Event()

    def slow(order: dict[str, Any], **call: Any) -> dict[str, Any]:
        release.wait(10)
        return {"charged": True}

    client = python_client(slow, max_try_seconds=0.2)
    client.kind.lease_seconds = 0.3
    clock = FakeClock()
    transport = SignallingTransport()
    request = make_request(2)
    asyncio.run(AgentWorker(client, transport, clock, sleep=clock.sleep).handle(request))
    first = transport.replies[0][0]
    assert first.applied == "maybe" and first.running_until is not None
    assert transport.renewed.wait(10), "no renewal while the handler ran"
    assert not transport.run_ended.is_set()  # the handler is still held by release
    release.set()
    assert transport.run_ended.wait(10), "the handler's end was not reported"
    outcomes = [(r.outcome, r.running_until is not None) for r, _ in transport.replies]
    assert ("transient", True) in outcomes[1:-1]  # the renewal
    runner = first.runner
    assert runner and all(r.runner == runner for r, _ in transport.replies)
    assert unanswered(transport.replies[-1][0]) == replace(
        request.succeeded({"charged": True}), runner=runner, run_ended=True
    )
    assert transport.replies[-1][0].answered_at is not None  # when the handler ended


# --- 4. a cancel never undoes around a doubt ---------------------------------------------


def ambiguous_ship() -> tuple[Order, datetime]:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    for _ in range(3):
        now, ship = claim_due(order, now)
        now = ship.complete_by + timedelta(seconds=1)
        order.expire(now, POLICY)
    assert order.status is OrderStatus.ERROR
    return order, now


def test_4_cancel_of_an_ambiguous_ship_is_refused_without_the_statement() -> None:
    order, now = ambiguous_ship()
    preview = order.cancel_preview(now)
    assert not preview.allowed and preview.doubtful == ("ship",)
    assert preview.undo == (
        ("charge-payment", "refund-payment"),
        ("reserve-stock", "release-stock"),
    )
    with pytest.raises(TransitionRefused) as refused:
        order.cancel(now, "alice", "customer asked")
    assert refused.value.reason == "doubt"
    assert "o-1:ship" in refused.value.message and "notApplied" in refused.value.message
    assert order.status is OrderStatus.ERROR and not order.cancel_requested


def test_4_cancel_with_the_statement_undoes_the_rest_and_records_who_said_so() -> None:
    order, now = ambiguous_ship()
    with pytest.raises(TransitionRefused):  # naming another step states nothing
        order.cancel(now, "alice", "carrier: not shipped", not_applied="charge-payment")
    order.cancel(now, "alice", "carrier: not shipped", not_applied="ship")
    assert order.status is OrderStatus.COMPENSATING
    ship = order.find("ship")
    assert ship is not None and not ship.may_have_applied
    from core.history import Happened

    said = [h for h in ship.history if h["event"] == Happened.STATED_NOT_APPLIED]
    assert said and said[0]["by"] == "alice"
    assert all("alice" in (a.settled_by or "") for a in ship.attempts.items)
    # a late success of ship after that: the undo goes on, and at its end the effect that
    # stands is told, with what was undone (docs/contracts.md §3.15)
    order.apply_reply(reply(order, step="ship", attempt=2), now + timedelta(seconds=1), POLICY)
    assert order.status is OrderStatus.COMPENSATING
    later = now + timedelta(seconds=2)
    while status_of(order) is OrderStatus.COMPENSATING:
        undo = order.active_step()
        assert undo is not None and undo.kind is StepKind.COMPENSATION
        later = max(later, undo.complete_by)
        order.claim("i", later, step=undo.step)
        order.apply_reply(reply(order, step=undo.step), later, POLICY)
    assert status_of(order) is OrderStatus.ERROR
    told = alerts(order)[-1]["reason"]
    assert "ship applied and cannot be undone" in told and "refund-payment" in told


def test_4_cancel_of_a_pending_step_in_doubt_is_refused_too() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    now, ship = claim_due(order, now)
    order.expire(ship.complete_by + timedelta(seconds=1), POLICY)  # Pending, in doubt
    with pytest.raises(TransitionRefused):
        order.cancel(now, "app")
    order.cancel(now, "ops", not_applied="ship")
    assert ship.process_state is StepState.COMPENSATED  # not applied: nothing to undo


# --- 5. a request never sent is no try -----------------------------------------------------


def test_5_an_unsent_request_is_not_counted_and_never_in_doubt() -> None:
    from core.outcome import Applied, Outcome

    order = new_order()
    step = order.claim("i", T0)
    order.unsent("process", 1, "the request queue did not answer", T0, POLICY)
    assert (step.process_state, step.failure_count, step.maybe_applied) == (
        StepState.PENDING,
        0,
        [],
    )
    attempt = step.attempts.get(1)
    assert attempt is not None and attempt.ending is Outcome.NOT_SENT and not attempt.sent
    # a report of it after all (the send had gone through): its evidence still counts
    order.claim("i", step.not_before)
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, attempt=1, applied=Applied.MAYBE, error="500"),
        step.not_before,
    )
    assert step.maybe_applied == [1]


def test_5_an_expired_unread_service_bus_request_is_reported_as_not_called() -> None:
    from supervisor.expired import ExpiredRequests

    transport = RecordingTransport()
    clock = FakeClock()
    request = make_request(30)
    assert ExpiredRequests(transport, clock).report(request.encode().encode(), 1) == "reported"
    ((sent, _),) = transport.replies
    assert (sent.outcome, sent.applied) == ("deferred", "no")
    # delivered before (an agent may have called; or the trigger's own run failed): no
    # report at all, so the attempt keeps its doubt and the alert says why (the cases:
    # tests/unit/test_expired_requests.py)
    assert ExpiredRequests(transport, clock).report(request.encode().encode(), 2) == "maybe read"
    assert len(transport.replies) == 1
    assert ExpiredRequests(transport, clock).report(b"not a request", 1) == "no request"
    # ... which gives back the failure an expiry counted, and the doubt
    order = new_order()
    order.claim("i", T0)
    order.expire(T0 + timedelta(seconds=31), POLICY)
    late = AgentReply(
        "o-1",
        "process",
        1,
        T0,
        Outcome.DEFERRED,
        error="not called",
        applied=Applied.NO,
        not_before=T0,
        token=order.steps[0].token_for(1),
    )
    order.apply_reply(late, T0 + timedelta(seconds=32), POLICY)
    assert order.steps[0].failure_count == 0 and order.steps[0].maybe_applied == []


def test_5_a_storage_request_outlives_its_deadline_so_a_late_agent_can_answer() -> None:
    from messaging.storage_queues import REQUEST_LATE_SECONDS, StorageQueueTransport

    sent: list[tuple[str, int | None]] = []

    class Queues:
        def send(self, queue: str, body: str, **kw: Any) -> None:
            sent.append((queue, kw.get("ttl_seconds")))

    from core.names import Names

    StorageQueueTransport(Queues(), Names(), lambda: T0).send_request(  # type: ignore[arg-type]
        AgentRequest("o-1", "process", 1, T0 + timedelta(seconds=30), "process", {}, agent="orders")
    )
    assert sent[0][1] == 30 + REQUEST_LATE_SECONDS


# --- 6. Retry-After never makes tries faster than the backoff ----------------------------


@pytest.mark.parametrize("value", ["0", "-1", "Tue, 01 Jan 2030 11:00:00 GMT"])
def test_6_retry_after_zero_does_not_hammer_the_remote(value: str) -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls > 500:  # before the fix: thousands of calls a second
            raise AssertionError("hammered")
        return httpx.Response(429, headers={"Retry-After": value})

    client, _ = make_client(
        remote(FakeClock(), handler), backoff_initial_seconds=0.2, backoff_max_seconds=5
    )
    asyncio.run(client.call(make_request(seconds_left=30)))
    # 25 s of tries at 0.1-0.2, 0.2-0.4 ... 2.5-5 s: a dozen or so, never hundreds
    assert calls <= 20


# --- 7. the failure budget is paced in time ----------------------------------------------


def test_7_a_stall_shorter_than_the_budget_cannot_spend_it() -> None:
    """STEP_TIMEOUT 3 s, MAX_FAILURE_COUNT 3; the agent reports "no answer, maybe" 2.4 s
    into each attempt while the remote stalls (7.5 s). Before: three attempts ended by
    7.4 s and the order went to an operator. Now the next attempt waits its pace and the
    budget's floor (a timeout per counted failure), and the third runs past the stall."""
    policy = RetryPolicy(max_failure_count=3)
    order = Order.accept(new_order_message(), plan_with_timeout(3), T0)  # a 3-s step
    stall_ends = T0 + timedelta(seconds=7.5)
    now = T0
    starts = []
    for _ in range(5):
        step = order.active_step()
        if step is None:
            break
        now = max(now, step.complete_by)
        order.claim("i", now)
        starts.append((now - T0).total_seconds())
        answered = now + timedelta(seconds=2.4)
        if answered > stall_ends:  # a try in flight when the stall ends gets its answer
            order.apply_reply(reply(order), answered, policy)
        else:
            order.apply_reply(
                reply(
                    order, Outcome.TRANSIENT, applied=Applied.MAYBE, error="no answer within 2.4 s"
                ),
                answered,
                policy,
            )
            if (held := order.active_step()) is not None and getattr(held, "held", False):
                order.expire(held.complete_by + timedelta(seconds=1), policy)
        now = answered
    assert order.status is OrderStatus.COMPLETED and alerts(order) == []
    assert starts[1] >= 3 and starts[2] >= 6  # a timeout per counted failure since the first


def test_7_the_count_is_not_spent_before_count_times_timeout() -> None:
    policy = RetryPolicy(max_failure_count=3)
    order = Order.accept(new_order_message(), plan_with_timeout(3), T0)
    now = T0
    while order.status is not OrderStatus.ERROR:
        step = order.active_step()
        assert step is not None
        if getattr(step, "held", False):
            now = step.complete_by + timedelta(seconds=0.5)
            order.expire(now, policy)
            continue
        now = max(now, step.complete_by)
        order.claim("i", now)
        now += timedelta(seconds=0.2)  # refused-fast 503s, reported at once
        order.apply_reply(
            reply(order, Outcome.TRANSIENT, applied=Applied.NO, error="503"), now, policy
        )
    gave_up = order.steps[0].gave_up
    assert gave_up is not None and gave_up.at >= T0 + timedelta(seconds=9)
    assert order.steps[0].failure_count == 3


def test_7_an_expiry_with_no_report_may_retry_at_once() -> None:
    order = new_order()
    order.claim("i", T0)
    step = order.expire(T0 + timedelta(seconds=31), POLICY)
    assert step.not_before == T0 + timedelta(seconds=31)


def test_7_a_reported_failure_waits_a_growing_jittered_delay() -> None:
    policy = RetryPolicy()
    delays = [policy.paced(k, "o-1").total_seconds() for k in range(1, 6)]
    assert 0.8 <= delays[0] <= 1.2 and 1.6 <= delays[1] <= 2.4 and 3.2 <= delays[2] <= 4.8
    assert delays == sorted(delays)


# --- 9. a reply's notBefore is bounded ---------------------------------------------------


def test_9_a_deferral_asking_for_days_fails_for_good_at_once_with_an_alert() -> None:
    order = new_order()
    order.claim("i", T0)
    far = T0 + timedelta(days=10)
    order.apply_reply(
        reply(order, Outcome.DEFERRED, error="Retry-After 10 days", not_before=far),
        T0 + timedelta(seconds=1),
        POLICY,
    )
    assert order.status is OrderStatus.ERROR
    [alert] = alerts(order)
    assert "past the deferral window" in alert["reason"] and "not applied" in alert["reason"]


# --- helpers -------------------------------------------------------------------------------


def new_order_message() -> Any:
    from core.order_message import decode_order

    return decode_order(json.dumps({"orderId": "o-1"}))


def plan_with_timeout(seconds: int) -> Any:
    from core.workflows import WORKFLOWS, Plan

    return Plan.of(WORKFLOWS["order"], seconds)


# --- found in review: each failed before its fix ------------------------------------------


def test_review_a_late_deferral_of_a_compensation_never_ends_the_order_unreleased() -> None:
    """A compensation that gave up by an expiry, then that attempt's late deferral: nothing
    changes on the ended step, and a cancel cannot end the order with the stock never
    released: it retries the unwinding."""
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    fail_until_given_up(order, [Applied.NO, Applied.NO, Applied.NO], now)  # definite: unwinding
    release = order.active_step()
    assert release is not None and release.step == "release-stock"
    now = release.complete_by
    for _ in range(3):
        now, claimed = claim_due(order, now)
        now = claimed.complete_by + timedelta(seconds=1)
        order.expire(now, POLICY)
    assert (order.status, release.process_state) == (OrderStatus.ERROR, StepState.ERROR)
    late = reply(order, Outcome.DEFERRED, step="release-stock", attempt=3, not_before=now)
    order.apply_reply(late, now + timedelta(seconds=1), POLICY)
    # a late deferral changes nothing on a step that has ended (docs/contracts.md §3.15)...
    assert (order.status, release.process_state) == (OrderStatus.ERROR, StepState.ERROR)
    # ... and a cancel retries the unwinding: the stock is released, never left
    order.cancel(now + timedelta(seconds=2), "ops")
    again = order.find("release-stock")
    assert order.status is OrderStatus.COMPENSATING
    assert again is not None and again.process_state is StepState.PENDING


def test_review_a_refund_while_held_lets_the_step_go_on() -> None:
    order = new_order()
    step = order.claim("i", T0)
    order.expire(T0 + timedelta(seconds=31), POLICY)  # 1: no report
    order.claim("i", T0 + timedelta(seconds=31))
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, applied=Applied.NO), T0 + timedelta(seconds=32), POLICY
    )
    order.claim("i", step.complete_by)
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, applied=Applied.NO), T0 + timedelta(seconds=61), POLICY
    )
    assert step.held and step.failure_count == 3
    late = reply(order, Outcome.DEFERRED, step="process", attempt=1, not_before=T0)
    order.apply_reply(late, T0 + timedelta(seconds=62), POLICY)
    assert step.failure_count == 2 and step.process_state is StepState.PENDING
    assert order.status is OrderStatus.PROCESSING and alerts(order) == []


def test_review_a_late_running_report_holds_a_compensation_that_was_tried_already() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    now, charge = claim_due(order, now)
    now = charge.complete_by + timedelta(seconds=1)
    order.expire(now, POLICY)  # attempt 1's report is late
    fail_until_given_up(order, [Applied.NO, Applied.NO], now)
    now, refund = claim_due(order, now)
    order.apply_reply(
        reply(order, Outcome.DEFERRED, not_before=now), now + timedelta(seconds=1), POLICY
    )
    assert refund.process_state is StepState.PENDING and refund.attempt == 1
    until = now + timedelta(seconds=60)
    running = replace(
        reply(order, Outcome.TRANSIENT, step="charge-payment", attempt=1, applied=Applied.MAYBE),
        running_until=until,
        runner="r",
    )
    order.apply_reply(running, now + timedelta(seconds=2), POLICY)
    assert refund.not_before >= until + IN_FLIGHT_GRACE


def test_review_a_run_that_ends_refusing_settles_its_own_doubt() -> None:
    """The handler is the service: its refusal when it ends settles, as a 422 does."""
    order = new_order()
    step = order.claim("i", T0)
    running = replace(
        reply(order, Outcome.TRANSIENT, applied=Applied.MAYBE),
        running_until=T0 + timedelta(seconds=55),
        runner="r",
    )
    order.apply_reply(running, T0 + timedelta(seconds=25), POLICY)
    ended = replace(
        reply(
            order,
            Outcome.REFUSED,
            step="process",
            attempt=1,
            error="refused: no such customer",
        ),
        settled=True,
        runner="r",
        run_ended=True,
    )
    order.apply_reply(ended, T0 + timedelta(seconds=40), POLICY)
    assert step.maybe_applied == []
    fail_until_given_up(order, [Applied.NO, Applied.NO], T0 + timedelta(seconds=40))
    assert "was not applied" in alerts(order)[-1]["reason"]


def test_review_a_handler_that_ends_just_after_the_last_try_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()

    def slow(order: dict[str, Any], **call: Any) -> dict[str, Any]:
        release.wait(10)
        return {"charged": True}

    client = python_client(slow, max_try_seconds=0.2)
    tries = client._tries

    async def tries_then_end(*args: Any) -> CallOutcome:
        outcome = await tries(*args)
        release.set()  # the handler ends between the last try's give-up and the reply
        await asyncio.sleep(0.1)
        return outcome

    monkeypatch.setattr(client, "_tries", tries_then_end)
    transport = RecordingTransport()
    clock = FakeClock()
    asyncio.run(AgentWorker(client, transport, clock, sleep=clock.sleep).handle(make_request(2)))
    ((sent, _),) = transport.replies
    assert sent.outcome == "succeeded" and sent.result == {"charged": True}


def test_review_a_run_that_never_ends_is_given_up_on_after_the_cap() -> None:
    import concurrent.futures

    from agents.python import _Running

    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    run = _Running(future, FakeClock(), 0.06, "stock", max_hold=0.1)
    beats: list[datetime] = []
    ended: list[Any] = []
    reported = threading.Event()

    def end(outcome: Any) -> None:
        ended.append(outcome)
        reported.set()

    run.watch(beats.append, end)
    assert reported.wait(10), "a run past its cap was never given up on"
    assert ended[0].applied == "maybe" and "given up" in ended[0].error
    assert beats  # renewed while it was held
    # it ends at last, after the cap: its outcome is still reported (a late answer)
    from agents.outcomes import Try

    future.set_result(Try(Applied.YES, False, "", result={"charged": True}))
    assert len(ended) == 2 and ended[1].applied == "yes" and ended[1].result == {"charged": True}


def test_review_a_cancel_of_a_held_step_acts_at_once() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    for _ in range(3):
        now, _ = claim_due(order, now)
        order.apply_reply(
            reply(order, Outcome.TRANSIENT, applied=Applied.NO), now + timedelta(seconds=1), POLICY
        )
    charge = order.find("charge-payment")
    assert charge is not None and charge.held
    order.cancel(now + timedelta(seconds=2), "app")
    assert charge.process_state is StepState.COMPENSATED  # not applied: nothing to undo
    assert order.status is OrderStatus.COMPENSATING


def test_review_a_cancel_of_a_held_step_in_doubt_needs_the_statement() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    for _ in range(3):
        now, _ = claim_due(order, now)
        order.apply_reply(
            reply(order, Outcome.TRANSIENT, applied=Applied.MAYBE),
            now + timedelta(seconds=1),
            POLICY,
        )
    ship = order.find("ship")
    assert ship is not None and ship.held
    preview = order.cancel_preview(now)
    assert preview.doubtful == ("ship",) and preview.in_flight == () and not preview.allowed
    with pytest.raises(TransitionRefused):
        order.cancel(now, "app")
    order.cancel(now, "ops", not_applied="ship")
    assert ship.process_state is StepState.COMPENSATED
