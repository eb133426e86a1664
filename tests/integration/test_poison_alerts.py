"""Every message given up on raises one operator alert (docs/contracts.md §3.11), through the real
functions of function_app.py on Azurite: one queue trigger per ``<queue>-poison`` queue
and, on Service Bus, one trigger per dead-letter sub-queue.

A test puts the message on the queue the function is bound to, receives it as the host
would, and calls the function with it (``tests/integration/test_bad_input.py`` calls
functions the same way); the alert goes to this test's own ``operator-alerts`` queue.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.functions.queue import QueueMessage
from azure.storage.queue import QueueClient

os.environ.setdefault("AGENT_TRANSPORT", "storage")

from bootstrap import AppContext
from core.names import Names
from stores.kept import MAX_RECORD_BYTES, PREVIEW_CHARS, KeptMessages
from tests.support import app_function, drain, drain_json, installed, make_context

ROOT = Path(__file__).resolve().parents[2]
#: A Service Bus connection nothing listens on: the dead-letter triggers need one to exist.
UNUSED_BUS = {
    "ServiceBusConnection": "Endpoint=sb://unused.invalid/;SharedAccessKeyName=k;"
    "SharedAccessKey=a2V5"
}
EMOJI = "\U0001f600"


@pytest.fixture
def ctx(storage_connection: str, tag: str) -> Iterator[AppContext]:
    yield from installed(storage_connection, tag)


def function(name: str) -> Callable[..., Any]:
    return app_function(name)  # the process-wide list: get_functions() runs once per app


_LIST_FUNCTIONS = textwrap.dedent(
    """
    import json, function_app
    print(json.dumps([
        [f.get_function_name(), [[b.type, getattr(b, "queue_name", None)]
                                 for b in f.get_bindings()]]
        for f in function_app.app.get_functions()
    ]))
    """
)


@functools.cache
def registry(transport: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    """(function, ((trigger type, queue), ...)) as function_app declares them with
    AGENT_TRANSPORT=transport: in a child process, since the transport decides which
    functions exist when function_app is imported, and an app lists its functions once."""
    env = {**os.environ, "AGENT_TRANSPORT": transport}
    out = subprocess.run(
        [sys.executable, "-c", _LIST_FUNCTIONS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    listed = json.loads(out.stdout.strip().splitlines()[-1])
    return tuple(
        (name, tuple((kind, queue) for kind, queue in bindings if queue))
        for name, bindings in listed
    )


def triggered_by(transport: str) -> dict[str, list[str]]:
    """Queue (or dead-letter sub-queue) -> the functions it triggers."""
    out: dict[str, list[str]] = {}
    for name, bindings in registry(transport):
        for kind, queue in bindings:
            if kind in ("queueTrigger", "serviceBusTrigger"):
                out.setdefault(queue, []).append(name)
    return out


def alert_function(poison_queue: str) -> str:
    return f"alert_{poison_queue.replace('-', '_')}"


def deliver(ctx: AppContext, poison_queue: str, body: str) -> None:
    """As the host: the message goes onto the poison queue, is received, handed to the
    function bound to that queue, and deleted once the function returns."""
    [name] = triggered_by("storage")[poison_queue]
    client: QueueClient = ctx.queues.client(poison_queue)
    ctx.queues.ensure(poison_queue)
    sent = client.send_message(body)
    for _ in range(50):
        for message in client.receive_messages(max_messages=32, visibility_timeout=5):
            if message.id != sent.id:
                continue  # someone else's: visible again in a few seconds
            function(name)(
                QueueMessage(
                    id=message.id,
                    body=message.content.encode("utf-8"),
                    dequeue_count=message.dequeue_count,
                )
            )
            client.delete_message(message)
            return
    raise AssertionError(f"message {sent.id} never came back from {poison_queue}")


def test_every_poison_queue_has_exactly_one_alert_function() -> None:
    functions = triggered_by("storage")

    poison_queues = {q for q in functions if q.endswith("-poison")}
    assert poison_queues == set(Names().poison_queues())
    for queue in Names().poison_queues():
        assert functions[queue] == [alert_function(queue)]
    names = [name for name, _ in registry("storage")]
    assert len(names) == len(set(names))
    assert not [q for q in functions if "$DeadLetterQueue" in q]  # storage: no broker


def test_on_service_bus_each_dead_letter_queue_has_exactly_one_alert_function() -> None:
    functions = triggered_by("servicebus")

    for queue in ("agent-requests-carrier", "agent-replies", "order-wakeups"):
        assert functions[f"{queue}/$DeadLetterQueue"] == [
            f"alert_{queue.replace('-', '_')}_dead_letters"
        ]
    for queue in Names().poison_queues():
        assert functions[queue] == [alert_function(queue)]
    names = [name for name, _ in registry("servicebus")]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("poison_queue", Names().poison_queues())
def test_a_message_on_a_poison_queue_raises_one_alert(
    ctx: AppContext, tag: str, poison_queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    order_id = f"{tag}-p"
    body = json.dumps({"orderId": order_id, "step": "process", "note": f"caf\u00e9 {EMOJI}"})

    with caplog.at_level(logging.ERROR):
        deliver(ctx, poison_queue, body)

    [alert] = drain_json(ctx, ctx.names.operator_alerts)
    assert alert["poisonQueue"] == poison_queue  # each function alerts for its own queue
    assert alert["queue"] == poison_queue.removesuffix("-poison")
    assert alert["orderId"] == order_id and alert["step"] == "process"
    assert alert["message"] == body
    assert isinstance(alert["failureCount"], int)
    assert {"orderId", "step", "reason", "failureCount", "at"} <= alert.keys()
    logged = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and r.getMessage().startswith("OPERATOR ALERT")
    ]
    assert len(logged) == 1 and f"order={order_id}" in logged[0]
    assert poison_queue in logged[0]


def test_a_malformed_agent_reply_is_quarantined_then_alerted_exactly_once(
    ctx: AppContext, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    reply = json.dumps(
        {
            "orderId": f"{tag}-r",
            "step": "process",
            "attempt": 1,
            "idempotencyKey": f"{tag}-r:process",
            "completeBy": "2030-01-01T00:00:00Z",
            "outcome": "maybe",
        }
    )

    with caplog.at_level(logging.ERROR):
        function("handle_agent_reply")(QueueMessage(id="m", body=reply.encode()))
        [record] = drain(ctx, f"{ctx.names.agent_replies}-poison")
        # What the host does next: the record arrives at the poison queue's trigger.
        function("alert_agent_replies_poison")(
            QueueMessage(id="p", body=record.encode(), dequeue_count=1)
        )

    [alert] = drain_json(ctx, ctx.names.operator_alerts)
    assert alert["message"] == reply  # the reply itself, not the record around it
    assert alert["orderId"] == f"{tag}-r" and alert["step"] == "process"
    assert "outcome" in alert["reason"] and "failed on it" not in alert["reason"]
    assert not drain(ctx, f"{ctx.names.agent_replies}-poison")
    operator_alerts = [r for r in caplog.records if r.getMessage().startswith("OPERATOR ALERT")]
    assert len(operator_alerts) == 1


def test_a_large_poisoned_order_is_kept_whole_and_its_alert_fits(ctx: AppContext, tag: str) -> None:
    body = json.dumps(
        {"orderId": f"{tag}-big", "blob": ('"q" ' + EMOJI) * 6_000}, ensure_ascii=False
    )
    assert 55_000 < len(body.encode()) < 65_536

    deliver(ctx, "orders-poison", body)

    [text] = drain(ctx, ctx.names.operator_alerts)
    assert len(text.encode()) <= MAX_RECORD_BYTES
    alert = json.loads(text)
    assert alert["orderId"] == f"{tag}-big" and alert["messagePreview"] == body[:PREVIEW_CHARS]
    kept = KeptMessages(ctx.store.table).get(alert["keptAs"])
    assert kept is not None and kept.text == body and kept.queue == "orders-poison"


def test_a_dead_lettered_service_bus_message_raises_one_alert(
    storage_connection: str, tag: str
) -> None:
    """The dead-letter triggers exist only with AGENT_TRANSPORT=servicebus (decided when
    function_app is imported), so they run in a child process, against Azurite's storage
    and the default queue names; no broker is needed to call them."""
    script = textwrap.dedent(
        """
        import asyncio, inspect, json, sys, function_app

        class DeadLetter:
            def __init__(self, body, props):
                self._body = body
                self.application_properties = props
                self.delivery_count = 5
                self.dead_letter_reason = None
                self.dead_letter_error_description = None

            def get_body(self):
                return self._body

        functions = {f.get_function_name(): f.get_user_function()
                     for f in function_app.app.get_functions()}
        for queue, order in json.loads(sys.argv[1]):
            done = functions[f"alert_{queue.replace('-', '_')}_dead_letters"](DeadLetter(
                json.dumps({"orderId": order, "step": "ship"}).encode(),
                {"DeadLetterReason": "TTLExpiredException",
                 "DeadLetterErrorDescription": "the message expired"},
            ))
            if inspect.iscoroutine(done):  # async: the worker awaits it on its loop
                asyncio.run(done)
        """
    )
    orders = [
        ["agent-requests-carrier", f"{tag}-dq"],
        ["agent-replies", f"{tag}-dp"],
        ["order-wakeups", f"{tag}-dw"],
    ]
    _run_on_service_bus(script, [json.dumps(orders)], storage_connection, UNUSED_BUS)
    ours = _take_alerts(storage_connection, tag, lambda order: order.startswith(f"{tag}-d"))
    assert sorted(a["poisonQueue"] for a in ours) == [
        "agent-replies/$DeadLetterQueue",
        "agent-requests-carrier/$DeadLetterQueue",
        "order-wakeups/$DeadLetterQueue",
    ]
    for alert in ours:
        assert "TTLExpiredException - the message expired" in alert["reason"]
        assert alert["failureCount"] == 5 and alert["step"] == "ship"


def _expired_request_alerts(
    storage_connection: str, tag: str, order_id: str, count: int, env: dict[str, str]
) -> tuple[list[dict[str, Any]], str]:
    """Run the carrier's dead-letter trigger in a process of its own on an expired request
    of ``order_id`` whose dead-letter delivery count is ``count``; the alerts it raised,
    and what it logged."""
    script = textwrap.dedent(
        """
        import asyncio, sys, function_app
        from datetime import UTC, datetime
        from core.messages import AgentRequest

        class DeadLetter:
            delivery_count = int(sys.argv[2])
            dead_letter_reason = dead_letter_error_description = None
            application_properties = {"DeadLetterReason": "TTLExpiredException"}

            def get_body(self):
                return AgentRequest(sys.argv[1], "ship", 1, datetime(2026, 1, 1, tzinfo=UTC),
                                    "ship", {}, agent="carrier", token="t").encode().encode()

        functions = {f.get_function_name(): f.get_user_function()
                     for f in function_app.app.get_functions()}
        asyncio.run(functions["alert_agent_requests_carrier_dead_letters"](DeadLetter()))
        """
    )
    run = _run_on_service_bus(script, [order_id, str(count)], storage_connection, env)
    return _take_alerts(storage_connection, tag, lambda order: order == order_id), run.stderr


def _run_on_service_bus(
    script: str, args: list[str], storage_connection: str, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``script`` in a child process that imports function_app with
    ``AGENT_TRANSPORT=servicebus`` (the dead-letter triggers exist only then), against
    Azurite's storage and the default queue names, with ``env`` on top; it must succeed."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env={
            **os.environ,
            "AGENT_TRANSPORT": "servicebus",
            "AzureWebJobsStorage": storage_connection,
            "REMOTE_SERVICE_URL": "http://127.0.0.1:9",
            **env,
        },
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


def _take_alerts(
    storage_connection: str, tag: str, ours: Callable[[str], bool]
) -> list[dict[str, Any]]:
    """The alerts on the default operator-alerts queue whose order is ``ours``, received
    and deleted; the others are left for whom they are."""
    client = make_context(storage_connection, tag).queues.client(Names().operator_alerts)
    taken: list[dict[str, Any]] = []
    for message in client.receive_messages(max_messages=32, visibility_timeout=5):
        alert = json.loads(message.content)
        if ours(str(alert.get("orderId", ""))):
            taken.append(alert)
            client.delete_message(message)
    return taken


def test_an_expired_request_delivered_before_keeps_its_doubt_unreported_and_unpaged(
    storage_connection: str, tag: str
) -> None:
    """An expired agent request whose dead-letter delivery count is above 1 may have been
    read by an agent (or the trigger failed on it before): the trigger reports nothing
    (no Service Bus is reachable here, so a report would fail the invocation) and pages
    nobody: the attempt keeps the doubt its expiry assumed, which the order settles or
    alerts on itself (supervisor/expired.py). A WARNING says why."""
    order_id = f"{tag}-dx"
    alerts, logged = _expired_request_alerts(storage_connection, tag, order_id, 2, UNUSED_BUS)
    assert alerts == []
    assert "not reported as not called" in logged and "delivery count 2" in logged


def test_an_unread_expired_request_whose_report_cannot_be_sent_is_alerted_not_retried(
    storage_connection: str, tag: str
) -> None:
    """Count 1 proves the request unread, but its "not called" report cannot be sent (no
    Service Bus listens here; the ride-out budget is cut to 1 s): the invocation does not
    fail, which could loop unseen on a dead-letter queue with no delivery limit. An
    operator is told, once, that no agent read it and why the report is missing."""
    refused = {
        "ServiceBusConnection": "Endpoint=sb://127.0.0.1:9/;SharedAccessKeyName=k;"
        "SharedAccessKey=a2V5",
        "ORDERS_RIDE_OUT_SECONDS": "1",
    }
    order_id = f"{tag}-du"
    [alert], _ = _expired_request_alerts(storage_connection, tag, order_id, 1, refused)
    assert alert["poisonQueue"] == "agent-requests-carrier/$DeadLetterQueue"
    assert "no agent read it" in alert["reason"] and "could not be sent" in alert["reason"]
    assert "safe" in alert["reason"]
