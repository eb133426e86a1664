"""docs/contracts.md §3.11 at its edges, on Azurite with the simulator: a row written before
typed attempt state, a 403 after a timeout, a 409, and a cancel around a doubt through the
API. (A create retried after a 503: ``test_storage_faults.py``.)"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import azure.functions as func
from azure.data.tables import UpdateMode

from agents.build import build_agent
from bootstrap import AppContext, reset_app_context
from core.history import Happened
from core.outcome import Applied
from core.states import OrderStatus, StepKind, StepState
from core.workflows import AGENTS
from messaging.wire import decode_reply, decode_request
from simulator import SimulatorServer, effects_by_order
from stores import entities, layout
from tests.integration.test_pipeline import pump, submit
from tests.support import FakeClock, app_function, drain, drain_json, drain_requests, make_context


def run_request(ctx: AppContext, text: str) -> None:
    """The request's own agent runs it; its reply is applied."""
    request = decode_request(text)
    asyncio.run(ctx.agent_for(request.agent).handle(request))
    for reply in drain(ctx, ctx.names.agent_replies):
        ctx.scheduler.apply_reply(decode_reply(reply))


def to_ship(ctx: AppContext, order_id: str, **ship: Any) -> str:
    """A fulfilment order with reserve-stock and charge-payment done; ship's request."""
    body: dict[str, Any] = {"orderId": order_id, "workflow": "fulfilment"}
    if ship:
        body["simulate"] = {"ship": ship}
    submit(ctx, body)
    for _ in range(2):
        [request] = drain_requests(ctx)
        run_request(ctx, request)
    [request] = drain_requests(ctx)
    assert json.loads(request)["step"] == "ship"
    return request


def expire_once(ctx: AppContext, clock: FakeClock) -> None:
    clock.advance(35)
    ctx.supervisor.run()


def test_a_row_written_before_typed_state_is_migrated_when_read(
    ctx: AppContext, tag: str, clock: FakeClock
) -> None:
    order_id = f"{tag}-old"
    submit(ctx, {"orderId": order_id})
    drain_requests(ctx)  # attempt 1's request is lost
    expire_once(ctx, clock)  # no report: counted, in doubt
    order = ctx.store.load(order_id)
    assert order is not None
    step = order.steps[0]
    # Rewrite the step's row as the previous version wrote it: no AttemptState.
    old = entities.step_entity(step)
    del old["AttemptState"]
    old["MaybeApplied"] = "[1]"
    ctx.store.table.update_entity(old, mode=UpdateMode.REPLACE)
    raw = ctx.store.table.get_entity(layout.shard_of(order_id), old["RowKey"])
    assert "AttemptState" not in raw
    migrated = ctx.store.load(order_id)
    assert migrated is not None
    again = migrated.steps[0]
    assert again.maybe_applied == [1] and again.failure_count == 1
    [attempt] = again.attempts.items
    assert (attempt.ending, attempt.applied, attempt.counted) == ("expired", "unknown", True)
    # The next save writes it; a late "not applied" report then clears the doubt.
    late = decode_request(
        json.dumps(
            {
                "orderId": order_id,
                "step": "process",
                "attempt": 1,
                "idempotencyKey": f"{order_id}:process",
                "completeBy": attempt.deadline.isoformat(),
                "path": "process",
                "order": {"orderId": order_id},
            }
        )
    ).transient("process: HTTP 503", Applied.NO)
    ctx.scheduler.apply_reply(late)
    stored = ctx.store.table.get_entity(layout.shard_of(order_id), old["RowKey"])
    assert json.loads(stored["AttemptState"])["attempts"]["items"][0]["applied"] == "no"
    loaded = ctx.store.load(order_id)
    assert loaded is not None and loaded.steps[0].maybe_applied == []


def test_a_403_after_a_timeout_leaves_the_doubt_and_refunds_nothing(
    ctx: AppContext, tag: str, clock: FakeClock, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-403"
    to_ship(ctx, order_id, fail="permanent", status=403, error="forbidden")  # attempt 1 lost
    expire_once(ctx, clock)  # no answer by the deadline: it may have shipped
    pump(ctx)  # attempt 2: a gateway's 403
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.ERROR
    ship = order.find("ship")
    assert ship is not None and ship.process_state is StepState.ERROR
    assert ship.maybe_applied == [1] and ship.attempt == 2
    assert not any(s.kind is StepKind.COMPENSATION for s in order.steps)
    [alert] = [a for a in drain_json(ctx, ctx.names.operator_alerts) if a["orderId"] == order_id]
    assert "may have been applied" in alert["reason"] and alert["step"] == "ship"
    assert effects_by_order(simulator.effects())[order_id] == ["reserve-stock", "charge-payment"]


def test_a_409_is_transient_and_may_have_applied(
    storage_connection: str, tag: str, simulator: SimulatorServer
) -> None:
    """409 "key in use": retried within the attempt, then reported as "may have applied"
    (on the wall clock, with 3 s steps, so the agent's retries really run)."""
    ctx = make_context(storage_connection, f"{tag}x", remote_url=simulator.url, timeout=3)
    order_id = f"{tag}-409"
    submit(
        ctx, {"orderId": order_id, "simulate": {"process": {"fail": "permanent", "status": 409}}}
    )
    [text] = drain_requests(ctx)
    request = decode_request(text)
    agent = build_agent(
        AGENTS[request.agent or "orders"], ctx.settings, ctx.transport, lambda: datetime.now(UTC)
    )
    asyncio.run(agent.handle(request))
    [reply_text] = drain(ctx, ctx.names.agent_replies)
    reply = decode_reply(reply_text)
    assert reply.outcome == "transient" and reply.applied == "maybe", reply
    ctx.scheduler.apply_reply(reply)
    order = ctx.store.load(order_id)
    assert order is not None
    step = order.steps[0]
    assert step.process_state is StepState.PENDING and step.failure_count == 1
    assert step.maybe_applied == [1]
    calls = [c for c in simulator.calls() if c["idempotencyKey"] == f"{order_id}:process"]
    assert len(calls) >= 2  # retried, not refused


def _post(route: str, order_id: str, body: dict[str, Any] | None) -> func.HttpResponse:
    request = func.HttpRequest(
        method="POST",
        url=f"http://localhost/api/orders/{order_id}/cancel",
        route_params={"orderId": order_id},
        body=json.dumps(body).encode() if body is not None else b"",
        headers={"content-type": "application/json"},
    )
    response: func.HttpResponse = app_function(route)(request)
    return response


def test_cancel_around_a_doubt_through_the_api(
    ctx: AppContext, tag: str, clock: FakeClock, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-doubt"
    to_ship(ctx, order_id)  # ship's requests are never answered: three expiries
    for _ in range(3):
        expire_once(ctx, clock)
        drain_requests(ctx)
        for text in drain(ctx, ctx.names.order_dispatch):
            ctx.scheduler.dispatch(json.loads(text)["orderId"])
        drain_requests(ctx)
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.ERROR
    reset_app_context(ctx)
    try:
        refused = _post("cancel_order", order_id, {"reason": "customer asked"})
        assert refused.status_code == 409
        answer = json.loads(refused.get_body())
        assert answer["reason"] == "doubt" and f"{order_id}:ship" in answer["error"]
        assert ctx.store.load(order_id).status is OrderStatus.ERROR  # type: ignore[union-attr]
        for bad_names in ([3], [], "Ship!", ["ship", {"x": 1}]):  # step names, or a list of them
            bad = _post("cancel_order", order_id, {"notApplied": bad_names})
            assert bad.status_code == 400, bad_names
        stated = {"reason": "carrier: nothing shipped", "notApplied": "ship"}
        done = _post("cancel_order", order_id, stated)
        assert done.status_code == 200, done.get_body()
        assert json.loads(done.get_body())["status"] == "compensating"
    finally:
        reset_app_context()
    order = ctx.store.load(order_id)
    assert order is not None
    ship = order.find("ship")
    assert ship is not None and not ship.may_have_applied
    assert all(a.applied is not Applied.YES for a in ship.attempts.items)
    said = [h for h in ship.history if h["event"] == Happened.STATED_NOT_APPLIED]
    assert said and said[0]["by"] == "function-key"
    assert said[0]["reason"] == "carrier: nothing shipped"
    pump(ctx)  # refund, release
    assert ctx.store.load(order_id).status is OrderStatus.CANCELLED  # type: ignore[union-attr]
    assert effects_by_order(simulator.effects())[order_id] == [
        "reserve-stock",
        "charge-payment",
        "refund-payment",
        "release-stock",
    ]
