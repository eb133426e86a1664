"""Records that could not fit their queue, on Azurite: a rejection of a ~60 KB order and
the quarantine of a large malformed agent message keep the original in the state table
(``stores/kept.py``) and send a record with ``messagePreview`` and ``keptAs``, instead of
failing to send and ending, after five deliveries, in a poison queue. ``python -m admin
kept`` lists, shows and deletes what was kept."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.functions.queue import QueueMessage

os.environ.setdefault("AGENT_TRANSPORT", "storage")

from bootstrap import AppContext
from messaging.quarantine import quarantine
from stores.kept import MAX_RECORD_BYTES, PREVIEW_CHARS, KeptMessages
from tests.support import app_function, drain, drain_json, installed, run_cli

EMOJI = "\U0001f600"
QUEUE_LIMIT = 65_536


@pytest.fixture
def ctx(storage_connection: str, tag: str) -> Iterator[AppContext]:
    yield from installed(storage_connection, tag)


def call(name: str, body: bytes) -> None:
    app_function(name)(QueueMessage(id="m", body=body, dequeue_count=1))


def big_order(order_id: str) -> str:
    """About 60 KB of UTF-8 JSON, with quotes to escape and characters outside the BMP."""
    text = json.dumps(
        {"orderId": order_id, "note": ('say "hi" ' + EMOJI) * 4_000}, ensure_ascii=False
    )
    assert 55_000 < len(text.encode()) < QUEUE_LIMIT
    return text


def big_agent_request(order_id: str) -> str:
    text = json.dumps(
        {
            "orderId": order_id,
            "step": "process",
            "attempt": 0,  # malformed: attempts start at 1
            "idempotencyKey": f"{order_id}:process",
            "completeBy": "2030-01-01T00:00:00Z",
            "order": {"orderId": order_id, "note": ('"' + EMOJI) * 10_000},
        },
        ensure_ascii=False,
    )
    assert 55_000 < len(text.encode()) < QUEUE_LIMIT
    return text


def test_a_60_kb_order_with_an_invalid_order_id_is_rejected_with_a_kept_copy(
    ctx: AppContext, caplog: pytest.LogCaptureFixture
) -> None:
    text = big_order("not a valid id!")

    with caplog.at_level(logging.ERROR):
        call("submit_order", text.encode())  # returns: one delivery, rejected, not retried

    [raw] = drain(ctx, ctx.names.orders_rejected)
    assert len(raw.encode()) <= MAX_RECORD_BYTES
    record = json.loads(raw)
    assert set(record) == {"reason", "at", "messagePreview", "keptAs"}
    assert "orderId must be" in record["reason"] and record["at"].endswith("Z")
    assert record["messagePreview"] == text[:PREVIEW_CHARS]
    kept = KeptMessages(ctx.store.table).get(record["keptAs"])
    assert kept is not None and kept.text == text  # exactly, non-BMP characters included
    assert kept.queue == ctx.names.orders_rejected and "orderId must be" in kept.reason
    assert not drain(ctx, f"{ctx.names.orders}-poison")
    assert any("rejected" in r.getMessage() for r in caplog.records)


def test_a_large_malformed_agent_request_is_quarantined_with_a_kept_copy_and_alerted_once(
    ctx: AppContext, tag: str
) -> None:
    text = big_agent_request(f"{tag}-q")
    kept_messages = KeptMessages(ctx.store.table)

    # What run_agent_orders does with a malformed request, with the keeper it is given.
    quarantine(
        ctx.queues,
        ctx.names.agent_queue("orders"),
        text.encode(),
        "agent request: attempt must be a whole number >= 1, got 0",
        ctx.clock,
        kept_messages,
    )

    [raw] = drain(ctx, f"{ctx.names.agent_queue('orders')}-poison")
    assert len(raw.encode()) <= MAX_RECORD_BYTES
    record = json.loads(raw)
    assert {"reason", "queue", "at", "messagePreview", "keptAs"} <= set(record)
    assert "message" not in record and record["queue"] == ctx.names.agent_queue("orders")
    kept = kept_messages.get(record["keptAs"])
    assert kept is not None and kept.text == text
    # The poison queue's trigger turns it into one alert, pointing at the same copy.
    call("alert_agent_requests_orders_poison", raw.encode())
    [alert] = drain_json(ctx, ctx.names.operator_alerts)
    assert alert["keptAs"] == record["keptAs"] and alert["orderId"] == f"{tag}-q"
    assert "attempt must be" in alert["reason"]
    assert [k.row for k in kept_messages.summaries(1000) if f"{tag}-q" in k.preview] == [
        record["keptAs"]
    ]  # kept once, not again by the alert


def test_an_agent_quarantines_a_large_malformed_request_with_a_kept_copy(
    ctx: AppContext, tag: str
) -> None:
    text = big_agent_request(f"{tag}-w")

    call("run_agent_orders", text.encode())

    [record] = drain_json(ctx, f"{ctx.names.agent_queue('orders')}-poison")
    kept = KeptMessages(ctx.store.table).get(record["keptAs"])
    assert kept is not None and kept.text == text


# --- python -m admin kept (default names, as the CLI uses them) -------------------------------


def take_record(ctx: AppContext, queue: str, marker: str) -> dict[str, Any]:
    client = ctx.queues.client(queue)
    for message in client.receive_messages(max_messages=32, visibility_timeout=5):
        if marker in message.content:
            client.delete_message(message)
            return json.loads(message.content)  # type: ignore[no-any-return]
    raise AssertionError(f"no record with {marker} on {queue}")


def test_the_cli_lists_shows_and_deletes_kept_messages(
    default_ctx: AppContext, storage_connection: str, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = uuid.uuid4().hex[:10]
    order = big_order(f"bad id {marker}")
    default_ctx.scheduler.submit(order.encode())
    rejected = take_record(default_ctx, default_ctx.names.orders_rejected, marker)
    request = big_agent_request(f"cli-{marker}")
    quarantine(
        default_ctx.queues,
        default_ctx.names.agent_queue("orders"),
        request.encode(),
        "attempt must be a whole number >= 1",
        default_ctx.clock,
        KeptMessages(default_ctx.store.table),
    )
    quarantined = take_record(default_ctx, "agent-requests-orders-poison", marker)

    code, listed = run_cli(capsys, storage_connection, "kept")
    assert code == 0
    rows = {k["keptAs"]: k for k in listed}
    assert rows[rejected["keptAs"]]["queue"] == "orders-rejected"
    assert rows[rejected["keptAs"]]["length"] == len(order)
    assert rows[quarantined["keptAs"]]["queue"] == "agent-requests-orders-poison"
    assert marker in rows[quarantined["keptAs"]]["preview"]
    code, listed = run_cli(capsys, storage_connection, "kept", "list", "--limit", "1")
    assert code == 0 and len(listed) == 1

    for record, original in ((rejected, order), (quarantined, request)):
        code, shown = run_cli(capsys, storage_connection, "kept", "show", record["keptAs"])
        assert code == 0 and shown["text"] == original and shown["encoding"] == "text"
        assert shown["truncated"] is False and shown["reason"]

    row = rejected["keptAs"]
    code, shown = run_cli(capsys, storage_connection, "kept", row)  # the short form
    assert code == 0 and shown["text"] == order
    assert run_cli(capsys, storage_connection, "kept", "delete", row) == (0, {"deleted": row})
    code, missing = run_cli(capsys, storage_connection, "kept", "show", row)
    assert code == 4 and row in missing["error"]
    code, _ = run_cli(capsys, storage_connection, "kept", "delete", row)
    assert code == 4
    code, _ = run_cli(capsys, storage_connection, "kept", "show", "no/such#row")
    assert code == 4
    assert run_cli(capsys, storage_connection, "kept", "delete", quarantined["keptAs"])[0] == 0
