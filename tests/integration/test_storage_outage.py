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

from bootstrap import AppContext, reset_app_context
from bootstrap.clients import retry_options
from core.errors import StorageUnavailable
from core.states import OrderStatus
from messaging import resilience
from messaging.storage_queues import StorageQueues
from stores.tables import TableStateStore
from tests.integration.test_storage_faults import FaultyAdapter, faulty_transport
from tests.support import FakeClock, app_function, drain_requests, make_context


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
    started = time.monotonic()
    function("submit_order")(
        func.QueueMessage(id="m", body=json.dumps({"orderId": order_id}).encode())
    )
    took = time.monotonic() - started
    assert outage.refused > 3  # the outage was real: many requests refused
    assert took >= 10  # the invocation waited it out, not failed it
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.PROCESSING
    [request] = drain_requests(ctx)  # and it went on to dispatch
    assert json.loads(request)["orderId"] == order_id


def test_a_reply_during_a_table_outage_is_applied_when_it_ends(
    ctx: AppContext, outage: Outage, tag: str
) -> None:
    from core.messages import decode_request

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
