"""Upgrading from a version with one shared request queue (``agent-requests``), on Azurite:
the one test in which a request goes through that queue. An order stored then has a plan
that names no agents; the requests waiting on the shared queue are moved to their agents'
own queues by ``python -m admin drain-legacy-requests``, and the order runs to its end."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from admin.drain import drain
from bootstrap import AppContext
from core.messages import AgentRequest
from core.states import OrderStatus
from messaging.wire import decode_reply, decode_request
from stores import layout
from tests.integration.test_pipeline import pump, submit
from tests.support import FakeClock, drain_requests
from tests.support import drain as take


def stored_as_before_agents(ctx: AppContext, order_id: str) -> None:
    """Rewrite the order's plan as the previous version stored it: no agent anywhere."""
    row = ctx.store.table.get_entity(layout.shard_of(order_id), layout.order_row(order_id))
    plan = json.loads(row["Plan"])
    for step in plan["steps"]:
        step.pop("agent", None)
        (step.get("compensation") or {}).pop("agent", None)
    row["Plan"] = json.dumps(plan)
    ctx.store.table.update_entity(row)


def legacy_request(request: AgentRequest) -> str:
    body = json.loads(request.encode())
    body.pop("agent")  # the previous version's requests named none
    return json.dumps(body)


def test_requests_on_the_shared_queue_are_moved_to_their_agents_queues(
    ctx: AppContext, tag: str, clock: FakeClock
) -> None:
    order_id = f"{tag}-old"
    submit(ctx, {"orderId": order_id})
    [text] = drain_requests(ctx)  # what the previous version would have put on the shared queue
    stored_as_before_agents(ctx, order_id)
    legacy = ctx.queues.client(ctx.names.legacy_requests)
    legacy.create_queue()
    legacy.send_message(legacy_request(decode_request(text)))
    late_id = f"{tag}-late"
    submit(ctx, {"orderId": late_id})
    [late_text] = drain_requests(ctx)
    legacy.send_message(legacy_request(decode_request(late_text)))
    legacy.send_message("{not json")

    preview = drain(ctx.legacy_requests, ctx.store, ctx.transport, ctx.clock, dry_run=True)
    assert len(preview.moved) == 2 and len(preview.left) == 1
    assert drain_requests(ctx) == []  # a dry run moves nothing

    clock.advance(0)
    drained = drain(ctx.legacy_requests, ctx.store, ctx.transport, ctx.clock)
    assert sorted(drained.moved) == sorted(
        [f"{order_id}:process:1 -> orders", f"{late_id}:process:1 -> orders"]
    )
    assert [d["message"] for d in drained.left] == ["{not json"]
    moved = {decode_request(t).order_id: decode_request(t) for t in drain_requests(ctx)}
    assert set(moved) == {order_id, late_id}
    request = moved[order_id]
    assert request.agent == "orders"
    asyncio.run(ctx.agent_for(request.agent).handle(request))
    for reply in take(ctx, ctx.names.agent_replies):
        ctx.scheduler.apply_reply(decode_reply(reply))
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    assert order.plan.agent_of("process") == "orders"  # the migrated plan, saved


def test_a_request_past_its_deadline_is_reported_not_called(
    ctx: AppContext, tag: str, clock: FakeClock
) -> None:
    order_id = f"{tag}-expired"
    submit(ctx, {"orderId": order_id})
    [text] = drain_requests(ctx)
    legacy = ctx.queues.client(ctx.names.legacy_requests)
    legacy.create_queue()
    legacy.send_message(legacy_request(decode_request(text)))
    clock.advance(40)  # past attempt 1's deadline
    ctx.supervisor.run()  # its expiry: counted, in doubt
    drained = drain(ctx.legacy_requests, ctx.store, ctx.transport, ctx.clock)
    assert drained.not_called == [f"{order_id}:process:1 -> orders"]
    pump(ctx)  # the "not called" report: the count given back, no doubt
    order = ctx.store.load(order_id)
    assert order is not None
    step = order.steps[0]
    attempt = step.attempts.get(1)
    assert attempt is not None and attempt.applied == "no"
    assert step.failure_count == 0 or order.status is OrderStatus.COMPLETED
    assert timedelta(0) <= clock() - attempt.deadline
