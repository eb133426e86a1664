"""Contract 3.11 through the real pipeline: Azurite, the simulator, the real agent and
remote client, driven in-process (``pump`` plays the Functions host)."""

from __future__ import annotations

import json
from datetime import timedelta

from bootstrap import AppContext
from core.states import OrderStatus, StepState
from core.timefmt import parse_iso
from messaging.wire import decode_reply, decode_request
from simulator import SimulatorServer, effects_by_order
from tests.integration.test_pipeline import pump, status_of, submit
from tests.support import FakeClock, drain, drain_requests, drain_requests_json, handle_request


def test_retry_after_past_the_deadline_defers_without_a_failure(
    ctx: AppContext, tag: str, simulator: SimulatorServer, clock: FakeClock
) -> None:
    order_id = f"{tag}-ra"
    throttled = {"fail": "transient", "times": 1, "status": 429, "retryAfter": 120}
    submit(ctx, {"orderId": order_id, "simulate": {"process": throttled}})
    pump(ctx)
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.PROCESSING
    [step] = order.steps
    assert step.process_state is StepState.PENDING
    assert step.failure_count == 0 and step.deferrals == 1
    # not before the time the remote asked for (measured from now, on the agent's clock)
    assert step.complete_by >= clock() + timedelta(seconds=110)
    calls = [c for c in simulator.calls() if c["idempotencyKey"] == f"{order_id}:process"]
    assert len(calls) == 1  # the agent did not call again within the attempt
    deferred = [h for h in step.history if h["event"] == "deferred"]
    assert "Retry-After" in deferred[0]["reason"] and deferred[0]["applied"] == "no"
    # a delayed dispatch waits for it; once due, the call succeeds
    clock.advance(130)
    assert ctx.scheduler.dispatch(order_id).value == "dispatched"
    pump(ctx)
    assert status_of(ctx, order_id) is OrderStatus.COMPLETED


def test_cancel_while_ship_is_in_flight_and_succeeds_is_too_late(
    ctx: AppContext, tag: str, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-late-cancel"
    submit(ctx, {"orderId": order_id, "workflow": "fulfilment"})
    # run reserve-stock and charge-payment, and hold ship's request
    for _ in range(2):
        [request] = drain_requests(ctx)
        handle_request(ctx, request)
        [reply] = drain(ctx, ctx.names.agent_replies)
        ctx.scheduler.apply_reply(decode_reply(reply))
    [ship] = drain_requests(ctx)
    assert json.loads(ship)["step"] == "ship"
    view = ctx.admin.cancel(order_id, "app", "changed mind")
    assert view["status"] == "processing"  # ship is in flight: it finishes first
    handle_request(ctx, ship)
    [reply] = drain(ctx, ctx.names.agent_replies)
    ctx.scheduler.apply_reply(decode_reply(reply))
    pump(ctx)
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    assert any(e["event"] == "cancel-too-late" for e in order.history)
    # shipped, and not refunded or released
    assert effects_by_order(simulator.effects())[order_id] == [
        "reserve-stock",
        "charge-payment",
        "ship",
    ]


def test_a_60_kb_order_runs_to_completion_and_the_remote_gets_it_whole(
    ctx: AppContext, tag: str, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-big"
    body = {"orderId": order_id, "notes": "é😀" * 9_500}  # ~57 KB of UTF-8
    raw = json.dumps(body, ensure_ascii=False).encode()
    assert 55_000 < len(raw) < 65_536
    submit(ctx, raw)
    [request] = drain_requests_json(ctx)
    assert request.get("orderInline") is False and "order" not in request  # by reference
    decoded = decode_request(json.dumps(request))
    assert decoded.order is None and decoded.complete_by == parse_iso(request["completeBy"])
    handle_request(ctx, decoded)  # reads the order from the state table
    [reply] = drain(ctx, ctx.names.agent_replies)
    ctx.scheduler.apply_reply(decode_reply(reply))
    assert status_of(ctx, order_id) is OrderStatus.COMPLETED
    [effect] = [e for e in simulator.effects() if e["orderId"] == order_id]
    assert effect["step"] == "process"
