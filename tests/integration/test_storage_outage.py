"""A storage outage delays orders; it does not poison them (docs/contracts.md §3.11).

Every table request answers 503 for a while, under the SDK (its own retries run as in
production). The triggers ride it out inside the invocation (``messaging/resilience``)
instead of failing it, which would spend one of ``maxDequeueCount`` deliveries each
few seconds and move a good order to ``orders-poison`` within about 40 s.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import azure.functions as func
import pytest
import requests
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient

from bootstrap import AppContext, bootstrap, reset_app_context
from bootstrap import clients as bootstrap_clients
from bootstrap.clients import retry_options
from core.errors import StorageUnavailable
from core.names import Names
from core.states import OrderStatus
from messaging import resilience
from messaging.storage_queues import StorageQueues
from stores.tables import TableStateStore
from tests.integration.test_storage_faults import FaultyAdapter, faulty_transport
from tests.support import (
    FakeClock,
    app_function,
    drain_requests,
    make_context,
    on_devhost,
    settings_from,
)


class Outage(FaultyAdapter):
    """Answers 503 to every table request until ``until`` (monotonic seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.until = 0.0
        self.refused = 0
        self._count_lock = threading.Lock()

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        if time.monotonic() < self.until and "/devstoreaccount1/" in (request.url or ""):
            with self._count_lock:
                self.refused += 1
            self.add(lambda _r: True, "503")
        return super().send(request, *args, **kwargs)


@pytest.fixture
def outage() -> Outage:
    return Outage()


@pytest.fixture
def ctx(storage_connection: str, tag: str, outage: Outage) -> Iterator[AppContext]:
    context = make_context(storage_connection, tag, clock=FakeClock())
    tables = TableServiceClient.from_connection_string(
        storage_connection, transport=faulty_transport(outage), **retry_options("table")
    )
    context.__dict__["store"] = TableStateStore(tables.get_table_client(context.names.state_table))
    # Queues stay up: the outage is the table service's.
    queues = QueueServiceClient.from_connection_string(storage_connection, **retry_options("queue"))
    context.__dict__["queues"] = StorageQueues(queues)
    reset_app_context(context)
    yield context
    reset_app_context(None)


def function(name: str) -> Callable[..., Any]:
    return app_function(name)


def test_an_order_submitted_during_a_table_outage_is_accepted_when_it_ends(
    ctx: AppContext, outage: Outage, tag: str
) -> None:
    order_id = f"{tag}-outage"
    outage.until = time.monotonic() + 12  # longer than the SDK's own retries
    function("submit_order")(
        func.QueueMessage(id="m", body=json.dumps({"orderId": order_id}).encode())
    )
    assert outage.refused > 3  # the outage was real: many requests refused
    # The invocation waited it out, not failed it: it returned, and the order it could
    # store only once the outage had ended is stored.
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.PROCESSING
    [request] = drain_requests(ctx)  # and it went on to dispatch
    assert json.loads(request)["orderId"] == order_id


def test_a_reply_during_a_table_outage_is_applied_when_it_ends(
    ctx: AppContext, outage: Outage, tag: str
) -> None:
    from messaging.wire import decode_request

    order_id = f"{tag}-reply"
    ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    [text] = drain_requests(ctx)
    reply = decode_request(text).succeeded({"ok": True})
    outage.until = time.monotonic() + 8
    function("handle_agent_reply")(func.QueueMessage(id="r", body=reply.encode().encode()))
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED


def test_ride_out_gives_up_after_its_budget_and_the_host_gets_the_failure() -> None:
    calls: list[float] = []

    def always_down() -> None:
        calls.append(time.monotonic())
        raise StorageUnavailable("down")

    slept: list[float] = []
    with pytest.raises(StorageUnavailable):
        resilience.ride_out(always_down, what="test", seconds=0.5, sleep=slept.append)
    assert len(calls) >= 2 and slept  # it retried, with waits, then gave up


def test_ride_out_does_not_retry_what_waiting_cannot_cure() -> None:
    calls = 0

    def broken() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        resilience.ride_out(broken, what="test", seconds=5, sleep=lambda _s: None)
    assert calls == 1


def test_routes_whose_first_request_meets_a_table_outage_answer_503_then_recover(
    storage_connection: str, tag: str, outage: Outage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's first use of the store creates its table: that creation meets the
    outage like any other request, so each route answers 503 ``retryable`` (a console
    page, its 503 page), not a 500, and the same process answers normally once storage is
    back. (The SDK's own retries are off here: the outage is the test's, not its length.)"""
    tables = TableServiceClient.from_connection_string(
        storage_connection, transport=faulty_transport(outage), retry_total=0
    )
    monkeypatch.setattr(bootstrap_clients, "table_service", lambda *_args: tables)
    context = bootstrap(
        settings_from({"AzureWebJobsStorage": storage_connection, "AGENT_TRANSPORT": "storage"}),
        names=Names.unique(tag),
    )
    reset_app_context(on_devhost(context))  # the console's pages need a principal
    missing = f"{tag}-none"
    calls = {
        "get_order": func.HttpRequest(
            "GET", f"/api/orders/{missing}", route_params={"orderId": missing}, body=b""
        ),
        "pause_agent": func.HttpRequest(
            "POST",
            "/api/agents/orders/pause",
            route_params={"agent": "orders"},
            body=b'{"reason": "maintenance"}',
        ),
        "console_agent_confirm": func.HttpRequest(
            "GET",
            "http://h:7071/api/console/agents/orders/confirm",
            params={"action": "pause", "reason": "maintenance"},
            route_params={"agent": "orders"},
            body=b"",
        ),
    }
    try:
        outage.until = time.monotonic() + 600
        for name, request in calls.items():
            down = function(name)(request)
            assert down.status_code == 503, (name, down.get_body())
            if name != "console_agent_confirm":
                assert json.loads(down.get_body())["retryable"] is True, name
                assert down.headers["Retry-After"], name

        outage.until = 0.0  # storage is back
        assert function("get_order")(calls["get_order"]).status_code == 404  # no such order
        assert function("console_agent_confirm")(calls["console_agent_confirm"]).status_code == 200
        assert function("pause_agent")(calls["pause_agent"]).status_code == 200
    finally:
        reset_app_context(None)
