"""The pipeline's use cases on real Azurite and a real simulator, driven in-process.

``pump`` plays the Functions host: it feeds each queue's messages to its
handler until every queue is empty, so each test controls time exactly
(a ``FakeClock`` for deadlines) while state and messages are real.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from typing import Any

import pytest

from bootstrap import AppContext
from core.states import OrderStatus, StepState
from messaging.wire import decode_reply, decode_request
from scheduler.service import Handled
from simulator import SimulatorServer, effects_by_order
from tests.support import (
    FakeClock,
    drain,
    drain_json,
    drain_requests,
    drain_requests_json,
    status_queue,
)


def submit(ctx: AppContext, body: dict[str, Any] | str | bytes) -> Handled:
    raw = (
        body
        if isinstance(body, bytes)
        else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
    )
    return ctx.scheduler.submit(raw)


def pump(ctx: AppContext, rounds: int = 50) -> dict[str, int]:
    """Deliver every queued request, reply and dispatch until all are empty."""
    handled = {"requests": 0, "replies": 0, "dispatches": 0}
    for _ in range(rounds):
        moved = 0
        for text in drain_requests(ctx):
            request = decode_request(text)
            asyncio.run(ctx.agent_for(request.agent).handle(request))  # the request's own agent
            handled["requests"] += 1
            moved += 1
        for text in drain(ctx, ctx.names.agent_replies):
            ctx.scheduler.apply_reply(decode_reply(text))
            handled["replies"] += 1
            moved += 1
        for text in drain(ctx, ctx.names.order_dispatch):
            ctx.scheduler.dispatch(json.loads(text)["orderId"])
            handled["dispatches"] += 1
            moved += 1
        if not moved:
            return handled
    raise AssertionError("the pipeline did not settle")


def status_of(ctx: AppContext, order_id: str) -> OrderStatus:
    order = ctx.store.load(order_id)
    assert order is not None
    return order.status


# --- submit ---------------------------------------------------------------------------


def test_submit_stores_claims_and_sends_the_agent_request(ctx: AppContext, tag: str) -> None:
    order_id = f"{tag}-a"
    reply_to = status_queue(ctx, tag)
    assert submit(ctx, {"orderId": order_id, "replyTo": reply_to, "sku": "X"}) is Handled.ACCEPTED
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.PROCESSING
    [step] = order.steps
    assert step.process_state is StepState.PROCESSING and step.attempt == 1
    assert step.locked_by == ctx.instance_id
    [request] = drain_requests_json(ctx)
    assert request["orderId"] == order_id and request["step"] == "process"
    assert request["attempt"] == 1
    assert request["idempotencyKey"] == f"{order_id}:process"
    assert request["completeBy"].endswith("Z")
    assert request["order"]["sku"] == "X"
    assert [m["status"] for m in drain_json(ctx, reply_to)] == ["received", "processing"]


def test_an_order_runs_to_completed_with_one_effect(
    ctx: AppContext, tag: str, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-ok"
    submit(ctx, {"orderId": order_id, "replyTo": status_queue(ctx, tag)})
    handled = pump(ctx)
    assert handled == {"requests": 1, "replies": 1, "dispatches": 0}
    assert status_of(ctx, order_id) is OrderStatus.COMPLETED
    assert effects_by_order(simulator.effects())[order_id] == ["process"]
    assert [m["status"] for m in drain_json(ctx, f"st-{tag}")] == [
        "received",
        "processing",
        "completed",
    ]


def test_duplicate_delivery_is_a_no_op_and_other_content_is_rejected(
    ctx: AppContext, tag: str
) -> None:
    order_id = f"{tag}-dup"
    body = {"orderId": order_id, "sku": "A", "qty": 1}
    assert submit(ctx, body) is Handled.ACCEPTED
    # Same content, other key order and spacing: the same order.
    assert submit(ctx, f'{{ "qty": 1, "sku": "A", "orderId": "{order_id}" }}') is Handled.DUPLICATE
    assert submit(ctx, {**body, "qty": 2}) is Handled.REJECTED
    [rejected] = drain_json(ctx, ctx.names.orders_rejected)
    assert "already exists" in rejected["reason"] and "different content" in rejected["reason"]
    assert json.loads(rejected["message"])["qty"] == 2
    # The first accept's request, and attempt 1's again from the duplicate (its first
    # delivery may have died before the send): the same attempt, the same key.
    requests = [decode_request(text) for text in drain_requests(ctx)]
    assert [(r.order_id, r.attempt) for r in requests] == [(order_id, 1)] * 2


@pytest.mark.parametrize(
    ("raw", "reason_part"),
    [
        (b"not json at all", "not valid JSON"),
        (b"", "empty"),
        (b"\xff\xfe\x00", "not UTF-8"),
        (b'["a list"]', "JSON object, got an array"),
        (b'{"sku": 1}', "orderId is required"),
        (b'{"orderId": 42}', "orderId must be a string"),
        (b'{"orderId": "has space"}', "orderId must be 1-64 characters"),
        (b'{"orderId": "a/b"}', "orderId must be 1-64 characters"),
        (('{"orderId": "%s"}' % ("x" * 65)).encode(), "65 characters"),
        (b'{"orderId": "o1", "workflow": "nope"}', "unknown workflow 'nope'"),
        (b'{"orderId": "o1", "replyTo": "Bad_Queue"}', "replyTo must name a Storage queue"),
        (b"eyJvcmRlcklkIjogIm8xIn0=", "base64"),
    ],
)
def test_bad_messages_are_rejected_with_a_reason_and_kept(
    ctx: AppContext, raw: bytes, reason_part: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        assert submit(ctx, raw) is Handled.REJECTED
    [rejected] = drain_json(ctx, ctx.names.orders_rejected)
    assert reason_part in rejected["reason"]
    assert rejected["at"].endswith("Z")
    if raw.startswith(b"\xff"):
        assert rejected["messageBase64"] == "//4A"
    else:
        assert rejected["message"] == raw.decode()
    assert any(r.levelno == logging.ERROR and reason_part in r.getMessage() for r in caplog.records)
    assert not drain_requests(ctx)


# --- failures, supervision, fencing --------------------------------------------------------


def test_permanent_failure_is_error_with_an_operator_alert(
    ctx: AppContext, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    order_id = f"{tag}-perm"
    submit(ctx, {"orderId": order_id, "simulate": {"process": "permanent"}})
    with caplog.at_level(logging.ERROR):
        pump(ctx)
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.ERROR
    assert order.steps[0].process_state is StepState.ERROR
    [alert] = drain_json(ctx, ctx.names.operator_alerts)
    assert alert["orderId"] == order_id and alert["step"] == "process"
    assert alert["failureCount"] == 1 and "422" in alert["reason"]
    assert any(
        r.getMessage().startswith(f"OPERATOR ALERT order={order_id} step=process")
        for r in caplog.records
    )


def test_supervisor_retries_expired_steps_then_gives_up(
    ctx: AppContext, tag: str, clock: FakeClock
) -> None:
    order_id = f"{tag}-sup"
    submit(ctx, {"orderId": order_id})
    drain_requests(ctx)  # the agent "dies": no reply, ever
    for failure in (1, 2):
        clock.advance(35)
        report = ctx.supervisor.run()
        assert (report.retried, report.failed) == (1, 0)
        order = ctx.store.load(order_id)
        assert order is not None
        step = order.steps[0]
        assert (step.process_state, step.failure_count, step.locked_by) == (
            StepState.PENDING,
            failure,
            "",
        )
        clock.now = max(clock.now, step.complete_by)  # let any backoff pass
        [dispatch] = drain_json(ctx, ctx.names.order_dispatch)  # the supervisor re-dispatched
        assert ctx.scheduler.dispatch(dispatch["orderId"]) is Handled.DISPATCHED
        assert len(drain_requests(ctx)) == 1  # and again no reply
    clock.advance(35)
    report = ctx.supervisor.run()
    assert (report.retried, report.failed) == (0, 1)
    assert status_of(ctx, order_id) is OrderStatus.ERROR
    [alert] = drain_json(ctx, ctx.names.operator_alerts)
    assert alert["failureCount"] == 3
    assert ctx.supervisor.run().examined == 0  # nothing left in the processing index


def test_two_supervisors_on_one_expired_step_count_one_failure(
    ctx: AppContext, tag: str, clock: FakeClock
) -> None:
    order_id = f"{tag}-two"
    submit(ctx, {"orderId": order_id})
    drain_requests(ctx)
    clock.advance(35)
    # Both load the same version before either saves.
    first, second = ctx.store.load(order_id), ctx.store.load(order_id)
    assert first is not None and second is not None
    first.expire(clock(), ctx.retry_policy)
    second.expire(clock(), ctx.retry_policy)
    ctx.store.save(first)
    with pytest.raises(Exception, match="changed"):
        ctx.store.save(second)
    order = ctx.store.load(order_id)
    assert order is not None and order.steps[0].failure_count == 1


def test_late_reply_after_the_supervisor_reset_is_dropped(
    ctx: AppContext, tag: str, clock: FakeClock
) -> None:
    order_id = f"{tag}-late"
    submit(ctx, {"orderId": order_id})
    [request_text] = drain_requests(ctx)
    request = decode_request(request_text)
    clock.advance(35)
    ctx.supervisor.run()  # attempt 1 expired; back to Pending
    # Attempt 1's success comes after its deadline: evidence that the step applied, so it
    # completes the step (docs/contracts.md §3.11) instead of being thrown away.
    late = request.succeeded({"late": True})
    assert ctx.scheduler.apply_reply(late) is Handled.NOTED
    assert ctx.scheduler.apply_reply(late) is Handled.STALE  # once is enough
    pump(ctx)  # the supervisor's re-dispatch finds nothing left to run
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    assert order.steps[0].attempt == 1 and order.steps[0].result == {"late": True}
    # the expiry's doubt is settled by the success: attempt 1 applied
    assert order.steps[0].maybe_applied == [] and order.steps[0].attempts.items[0].applied == "yes"


def test_duplicate_reply_applies_once(ctx: AppContext, tag: str) -> None:
    order_id = f"{tag}-dupreply"
    submit(ctx, {"orderId": order_id})
    [text] = drain_requests(ctx)
    reply = decode_request(text).succeeded({"n": 1})
    assert ctx.scheduler.apply_reply(reply) is Handled.APPLIED
    assert ctx.scheduler.apply_reply(reply) is Handled.STALE


# --- safety nets --------------------------------------------------------------------------


def test_sweep_dispatches_a_step_whose_dispatch_was_lost(
    ctx: AppContext, tag: str, clock: FakeClock
) -> None:
    from core.model import Order
    from core.order_message import decode_order
    from core.workflows import WORKFLOWS, Plan

    order_id = f"{tag}-lost"
    message = decode_order(json.dumps({"orderId": order_id}))
    ctx.store.create(Order.accept(message, Plan.of(WORKFLOWS["order"], 30), clock()))
    assert ctx.scheduler.sweep().dispatched == 0  # too fresh: the submitter may still be on it
    clock.advance(11)
    assert ctx.scheduler.sweep().dispatched == 1
    pump(ctx)
    assert status_of(ctx, order_id) is OrderStatus.COMPLETED


def test_a_reply_to_queue_is_never_created_and_a_gone_one_gets_no_notices(
    ctx: AppContext, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An order naming a queue REPLY_QUEUES does not list is rejected and the queue is
    not made; a listed queue deleted after the order was accepted gets no notices and is
    not made again, the notices leave the outbox, and a WARNING says why."""
    assert submit(ctx, {"orderId": f"{tag}-new", "replyTo": "anything-new"}) is Handled.REJECTED
    [record] = drain_json(ctx, ctx.names.orders_rejected)
    assert "REPLY_QUEUES" in record["reason"]
    assert not ctx.queues.exists("anything-new")

    order_id = f"{tag}-gone"
    reply_to = status_queue(ctx, tag)
    assert submit(ctx, {"orderId": order_id, "replyTo": reply_to}) is Handled.ACCEPTED
    assert [m["status"] for m in drain_json(ctx, reply_to)] == ["received", "processing"]
    ctx.queues.client(reply_to).delete_queue()
    with caplog.at_level(logging.WARNING):
        pump(ctx)
    assert status_of(ctx, order_id) is OrderStatus.COMPLETED
    assert not ctx.queues.exists(reply_to)
    assert any(
        f"its replyTo queue {reply_to} does not exist" in r.getMessage() for r in caplog.records
    )
    assert list(ctx.store.stale_outbox(ctx.clock() + timedelta(days=1))) == []


def test_sweep_resends_notices_left_in_the_outbox(
    ctx: AppContext, tag: str, clock: FakeClock
) -> None:
    from core.model import Order
    from core.order_message import decode_order
    from core.workflows import WORKFLOWS, Plan

    order_id = f"{tag}-outbox"
    message = decode_order(json.dumps({"orderId": order_id, "replyTo": status_queue(ctx, tag)}))
    ctx.store.create(Order.accept(message, Plan.of(WORKFLOWS["order"], 30), clock()))
    # The process "died" before sending its notices.
    assert not drain(ctx, f"st-{tag}")
    clock.advance(31)
    report = ctx.scheduler.sweep()
    assert report.notices == 1
    # Its lost dispatch went out in the same sweep, after the older notice.
    assert [m["status"] for m in drain_json(ctx, f"st-{tag}")] == ["received", "processing"]
    assert ctx.scheduler.sweep().notices == 0  # delivered rows are gone


# --- fulfilment and the operator ----------------------------------------------------------


def test_failed_ship_compensates_in_reverse_order(
    ctx: AppContext, tag: str, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-ship"
    submit(
        ctx,
        {
            "orderId": order_id,
            "workflow": "fulfilment",
            "replyTo": status_queue(ctx, tag),
            "simulate": {"ship": "permanent"},
        },
    )
    pump(ctx)
    assert status_of(ctx, order_id) is OrderStatus.COMPENSATED
    assert effects_by_order(simulator.effects())[order_id] == [
        "reserve-stock",
        "charge-payment",
        "refund-payment",
        "release-stock",
    ]
    statuses = [m["status"] for m in drain_json(ctx, f"st-{tag}")]
    assert statuses == ["received", "processing", "compensating", "compensated"]
    # Undone without anyone's help: the app hears "compensated", no operator is paged.
    assert drain_json(ctx, ctx.names.operator_alerts) == []


def test_operator_resubmits_an_error_order(
    ctx: AppContext, tag: str, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-resub"
    # Permanent on the first call only: a 422 once, then the service is fixed.
    submit(ctx, {"orderId": order_id, "simulate": {"process": {"fail": "transient", "times": 0}}})
    pump(ctx)
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    failing = f"{tag}-resub2"
    submit(ctx, {"orderId": failing, "simulate": {"process": "permanent"}})
    pump(ctx)
    assert status_of(ctx, failing) is OrderStatus.ERROR
    listed = ctx.admin.page(OrderStatus.ERROR)
    assert failing in [o["orderId"] for o in listed["orders"]]
    view = ctx.admin.resubmit(failing, "alice")
    assert view["status"] == "processing"
    assert view["steps"][0]["FailureCount"] == 0
    assert pump(ctx)["dispatches"] == 1
    # Still permanent at the simulator: back to error, with both attempts in the history.
    shown = ctx.admin.show(failing)
    assert shown["status"] == "error"
    assert [a["outcome"] for a in shown["steps"][0]["attempts"]] == ["refused", "refused"]
    assert all(a["applied"] == "no" for a in shown["steps"][0]["attempts"])
    assert any(
        h["event"] == "resubmitted" and h["by"] == "alice" for h in shown["steps"][0]["history"]
    )
