"""The operator CLI against real Azurite (default table and queue names)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from admin.__main__ import main
from bootstrap import AppContext, bootstrap
from tests.support import settings_from


@pytest.fixture
def ctx(storage_connection: str) -> AppContext:
    context = bootstrap(
        settings_from(
            {
                "AzureWebJobsStorage": storage_connection,
                "AGENT_TRANSPORT": "storage",
                "REMOTE_SERVICE_URL": "http://127.0.0.1:9",
            }
        )
    )
    context.provision()
    return context


def run(capsys: pytest.CaptureFixture[str], connection: str, *args: str) -> tuple[int, Any]:
    """The CLI's exit code and its JSON output (an object, or a list for ``alerts``)."""
    code = main(["--connection", connection, *args])
    return code, json.loads(capsys.readouterr().out)


def test_cli_shows_lists_resubmits_and_cancels(
    ctx: AppContext, storage_connection: str, capsys: pytest.CaptureFixture[str]
) -> None:
    order_id = f"cli-{uuid.uuid4().hex[:8]}"
    ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    [text] = [
        m.content
        for m in ctx.queues.client(ctx.names.agent_queue("orders")).receive_messages()
        if order_id in m.content
    ]
    from core.messages import decode_request

    ctx.scheduler.apply_reply(decode_request(text).refused("HTTP 422 card declined"))

    code, shown = run(capsys, storage_connection, "show", order_id)
    assert code == 0 and shown["status"] == "error"
    code, listed = run(capsys, storage_connection, "list", "--status", "error", "--all")
    assert code == 0 and order_id in [o["orderId"] for o in listed["orders"]]
    code, refused = run(capsys, storage_connection, "cancel", "missing-order")
    assert code == 4 and "missing-order" in refused["error"]
    code, resubmitted = run(capsys, storage_connection, "resubmit", order_id, "--by", "bob")
    assert code == 0 and resubmitted["status"] == "processing"
    code, again = run(capsys, storage_connection, "resubmit", order_id)
    assert code == 1 and again["reason"] == "not-in-error"
    # The resubmit was handed to the scheduler through the dispatch queue.
    dispatches = [
        json.loads(m.content)
        for m in ctx.queues.client(ctx.names.order_dispatch).peek_messages(max_messages=32)
    ]
    assert {"orderId": order_id} in dispatches
    code, alerts = run(capsys, storage_connection, "alerts")
    assert code == 0 and any(a["orderId"] == order_id for a in alerts)
