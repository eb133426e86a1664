"""The operator CLI against real Azurite (default table and queue names)."""

from __future__ import annotations

import json
import uuid

import pytest

from bootstrap import AppContext
from tests.support import run_cli


def test_cli_shows_lists_resubmits_and_cancels(
    default_ctx: AppContext, storage_connection: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ctx = default_ctx
    order_id = f"cli-{uuid.uuid4().hex[:8]}"
    ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    [text] = [
        m.content
        for m in ctx.queues.client(ctx.names.agent_queue("orders")).receive_messages()
        if order_id in m.content
    ]
    from messaging.wire import decode_request

    ctx.scheduler.apply_reply(decode_request(text).refused("HTTP 422 card declined"))

    code, shown = run_cli(capsys, storage_connection, "show", order_id)
    assert code == 0 and shown["status"] == "error"
    code, listed = run_cli(capsys, storage_connection, "list", "--status", "error", "--all")
    assert code == 0 and order_id in [o["orderId"] for o in listed["orders"]]
    code, refused = run_cli(capsys, storage_connection, "cancel", "missing-order")
    assert code == 4 and "missing-order" in refused["error"]
    code, resubmitted = run_cli(capsys, storage_connection, "resubmit", order_id, "--by", "bob")
    assert code == 0 and resubmitted["status"] == "processing"
    code, again = run_cli(capsys, storage_connection, "resubmit", order_id)
    assert code == 1 and again["reason"] == "not-in-error"
    # The resubmit was handed to the scheduler through the dispatch queue.
    dispatches = [
        json.loads(m.content)
        for m in ctx.queues.client(ctx.names.order_dispatch).peek_messages(max_messages=32)
    ]
    assert {"orderId": order_id} in dispatches
    code, alerts = run_cli(capsys, storage_connection, "alerts")
    assert code == 0 and any(a["orderId"] == order_id for a in alerts)
