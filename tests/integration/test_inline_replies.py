"""The default path on real Azurite: an instance that runs the reply handler applies its
agents' replies in process (messaging/inline.py), and the reply queue stays empty."""

from __future__ import annotations

import asyncio
import json

import pytest

from bootstrap import AppContext
from core.states import OrderStatus
from messaging.wire import decode_request
from simulator import SimulatorServer, effects_by_order
from tests.support import drain, drain_requests


@pytest.fixture
def inline_replies() -> bool:
    """Overrides the package's fixture: here the reply handler runs in this instance."""
    return True


def run_requests(ctx: AppContext) -> int:
    handled = 0
    for text in drain_requests(ctx):
        request = decode_request(text)
        asyncio.run(ctx.agent_for(request.agent).handle(request))
        handled += 1
    return handled


def test_a_workflow_runs_to_its_end_with_no_reply_on_the_queue(
    ctx: AppContext, tag: str, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-inline"
    ctx.scheduler.submit(json.dumps({"orderId": order_id, "workflow": "fulfilment"}).encode())
    steps = 0
    while run_requests(ctx):  # each reply claims and sends the next step itself
        steps += 1
        assert drain(ctx, ctx.names.agent_replies) == []
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    assert steps == 3
    assert effects_by_order(simulator.effects())[order_id] == [
        "reserve-stock",
        "charge-payment",
        "ship",
    ]


def test_a_reply_for_another_queue_is_sent_there(
    ctx: AppContext, tag: str, simulator: SimulatorServer
) -> None:
    order_id = f"{tag}-elsewhere"
    ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    [text] = drain_requests(ctx)
    request = decode_request(text)
    elsewhere = f"{ctx.names.agent_replies}-other"
    ctx.queues.ensure(elsewhere)
    asyncio.run(ctx.agent_for(request.agent).handle(request, reply_to=elsewhere))
    [reply] = drain(ctx, elsewhere)
    assert json.loads(reply)["outcome"] == "succeeded"
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.PROCESSING  # not applied here
