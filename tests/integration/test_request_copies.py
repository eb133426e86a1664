"""Copies of one agent request on Storage queues, through the real triggers on Azurite:
that transport detects no duplicates, so the agent tells copies apart by their message ids
and only the copy that took the attempt calls the remote (``agents/binding.py``)."""

from __future__ import annotations

import json
import os
from typing import Any

os.environ.setdefault("AGENT_TRANSPORT", "storage")

from azure.functions.queue import QueueMessage

from bootstrap import AppContext, reset_app_context
from simulator import SimulatorServer
from tests.support import app_function, drain


def receive_requests(ctx: AppContext, queue: str) -> list[Any]:
    client = ctx.queues.client(queue)
    got = list(client.receive_messages(messages_per_page=32, max_messages=32))
    for message in got:
        client.delete_message(message)
    return got


def test_copies_of_one_request_on_storage_queues_call_the_remote_once(
    ctx: AppContext, tag: str, simulator: SimulatorServer
) -> None:
    """The same order message delivered 7 times while attempt 1 is in flight: each
    redelivery sends attempt 1's request again (its first delivery may have died before
    the send), and Storage queues detect no duplicates. The agent takes the attempt with
    the first copy it reads (a conditional write); the other copies call nothing. The copy
    that took it, redelivered after a crash, may call again, as before."""
    reset_app_context(ctx)
    try:
        order_id = f"{tag}-copies"
        body = json.dumps({"orderId": order_id}).encode()
        for n in range(7):
            app_function("submit_order")(QueueMessage(id=f"o{n}", body=body, dequeue_count=1))
        copies = receive_requests(ctx, ctx.names.agent_queue("orders"))
        assert len(copies) == 7 and {json.loads(c.content)["attempt"] for c in copies} == {1}
        run_agent = app_function("run_agent_orders")
        for copy in copies:
            run_agent(QueueMessage(id=copy.id, body=copy.content.encode(), dequeue_count=1))

        calls = [c for c in simulator.calls() if c["idempotencyKey"] == f"{order_id}:process"]
        assert len(calls) == 1
        assert len(drain(ctx, ctx.names.agent_replies)) == 1  # one report, from the taker
        order = ctx.store.load(order_id)
        assert order is not None
        [attempt] = order.steps[0].attempts.items
        assert attempt.taken_by == copies[0].id

        # The first copy again (its invocation died after the call): it may call again.
        first = copies[0]
        run_agent(QueueMessage(id=first.id, body=first.content.encode(), dequeue_count=2))
        calls = [c for c in simulator.calls() if c["idempotencyKey"] == f"{order_id}:process"]
        assert len(calls) == 2
    finally:
        reset_app_context(None)
