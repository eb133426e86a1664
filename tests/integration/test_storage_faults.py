"""Storage faults on real Azurite: 5xx and lost responses injected under the SDK.

A ``requests`` adapter below the SDK's pipeline (so the SDK's own retry
policy runs as in production) answers 503/500 without sending, or sends the
request and then loses the response (a read timeout after the server applied
it: the ambiguous write). Plus clock skew between instances.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import requests
import urllib3
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient

from bootstrap import AppContext
from bootstrap.clients import retry_options
from core.states import OrderStatus
from messaging.storage_queues import StorageQueues
from messaging.wire import decode_reply, decode_request
from scheduler.service import Handled
from stores.tables import TableStateStore
from supervisor.service import SKEW_GRACE
from tests.support import FakeClock, drain, drain_requests, make_context, status_queue


class FaultyAdapter(requests.adapters.HTTPAdapter):
    """Injects faults into matching requests: ``plan`` maps a predicate to a list of
    faults consumed one per matching request: "503", "500", "lose" (send, then
    raise ReadTimeout: the server applied it, the client never hears), or "applied-500",
    "applied-503" ... (send, then answer that 5xx: the server applied it, and the SDK
    retries a POST on 500, 503 and 504: the retry is refused, 409 or 412)."""

    def __init__(self) -> None:
        super().__init__(pool_maxsize=16)
        self.plan: list[tuple[Callable[[requests.PreparedRequest], bool], list[str]]] = []
        self.injected: list[str] = []
        self._lock = threading.Lock()

    def add(self, match: Callable[[requests.PreparedRequest], bool], *faults: str) -> None:
        self.plan.append((match, list(faults)))

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        fault = None
        with self._lock:
            for match, faults in self.plan:
                if faults and match(request):
                    fault = faults.pop(0)
                    self.injected.append(f"{fault} {request.method} {request.url}")
                    break
        if fault in ("503", "500"):
            raw = urllib3.HTTPResponse(
                body=io.BytesIO(b""),
                status=int(fault),
                reason="Injected",
                headers={"Content-Length": "0"},
                preload_content=False,
            )
            return self.build_response(request, raw)
        result = super().send(request, *args, **kwargs)
        if fault == "lose":
            raise requests.exceptions.ReadTimeout("injected: response lost after sending")
        if fault is not None and fault.startswith("applied-"):  # applied, and yet a 5xx
            result.close()
            raw = urllib3.HTTPResponse(
                body=io.BytesIO(b""),
                status=int(fault.removeprefix("applied-")),
                reason="Injected after applying",
                headers={"Content-Length": "0"},
                preload_content=False,
            )
            return self.build_response(request, raw)
        return result


def faulty_transport(adapter: FaultyAdapter) -> RequestsTransport:
    session = requests.Session()
    session.mount("http://", adapter)
    return RequestsTransport(session=session, session_owner=True)


def is_batch(request: requests.PreparedRequest) -> bool:
    return request.method == "POST" and "$batch" in (request.url or "")


def body_of(request: requests.PreparedRequest) -> bytes:
    """The body the SDK sends (bytes, as for the table batches this file matches on)."""
    body = request.body or b""
    assert isinstance(body, bytes), f"{request.method} {request.url}: a {type(body).__name__} body"
    return body


def is_query(request: requests.PreparedRequest) -> bool:
    return request.method == "GET" and "()" in (request.url or "")


def is_queue_send(request: requests.PreparedRequest) -> bool:
    return request.method == "POST" and (request.url or "").split("?")[0].endswith("/messages")


@pytest.fixture
def adapter() -> FaultyAdapter:
    return FaultyAdapter()


@pytest.fixture
def ctx(storage_connection: str, tag: str, adapter: FaultyAdapter) -> AppContext:
    context = make_context(storage_connection, tag, clock=FakeClock())
    # The production retry settings, with the injected faults underneath.
    tables = TableServiceClient.from_connection_string(
        storage_connection, transport=faulty_transport(adapter), **retry_options("table")
    )
    queues = QueueServiceClient.from_connection_string(
        storage_connection, transport=faulty_transport(adapter), **retry_options("queue")
    )
    context.__dict__["store"] = TableStateStore(tables.get_table_client(context.names.state_table))
    context.__dict__["queues"] = StorageQueues(queues)
    return context


def test_5xx_from_tables_and_queues_are_retried(
    ctx: AppContext, adapter: FaultyAdapter, tag: str
) -> None:
    adapter.add(is_batch, "503", "500")
    adapter.add(is_query, "503")
    adapter.add(is_queue_send, "503", "500")
    order_id = f"{tag}-5xx"
    assert ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode()) is Handled.ACCEPTED
    [request] = drain_requests(ctx)
    assert ctx.scheduler.apply_reply(decode_request(request).succeeded({})) is Handled.APPLIED
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    assert len(adapter.injected) == 5


def test_a_lost_response_to_a_claim_is_resolved_by_rereading(
    ctx: AppContext, adapter: FaultyAdapter, tag: str
) -> None:
    order_id = f"{tag}-lost-claim"
    ctx.scheduler.submit(json.dumps({"orderId": f"{tag}-warmup"}).encode())
    # The claim's transaction applies, its answer is lost; the SDK retries it with the
    # same If-Match, gets 412, and the store sees its own WriteId: the claim is ours.
    adapter.add(lambda r: is_batch(r) and b"Processing" in body_of(r), "lose")
    assert ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode()) is Handled.ACCEPTED
    assert any(i.startswith("lose") for i in adapter.injected)
    order = ctx.store.load(order_id)
    assert order is not None
    step = order.steps[0]
    assert (step.attempt, str(step.process_state)) == (1, "Processing")
    assert [h["event"] for h in step.history].count("claimed") == 1
    requests_sent = [json.loads(t) for t in drain_requests(ctx)]
    assert [r["attempt"] for r in requests_sent if r["orderId"] == order_id] == [1]


def test_a_lost_response_to_a_reply_applies_it_once(
    ctx: AppContext, adapter: FaultyAdapter, tag: str
) -> None:
    order_id = f"{tag}-lost-reply"
    reply_to = status_queue(ctx, tag)
    ctx.scheduler.submit(json.dumps({"orderId": order_id, "replyTo": reply_to}).encode())
    [request] = drain_requests(ctx)
    adapter.add(is_batch, "lose")
    assert ctx.scheduler.apply_reply(decode_request(request).succeeded({"n": 1})) is (
        Handled.APPLIED
    )
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    assert [h["event"] for h in order.steps[0].history].count("succeeded") == 1
    statuses = [json.loads(t)["status"] for t in drain(ctx, f"st-{tag}")]
    assert statuses.count("completed") == 1


def test_a_lost_response_to_the_submit_transaction_still_dispatches(
    ctx: AppContext, adapter: FaultyAdapter, tag: str
) -> None:
    order_id = f"{tag}-lost-create"
    adapter.add(lambda r: is_batch(r) and order_id.encode() in body_of(r), "lose")
    # The create applied and its answer was lost; the store reads its WriteId: its own.
    outcome = ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    assert outcome is Handled.ACCEPTED
    sent = [json.loads(t) for t in drain_requests(ctx)]
    assert [r["orderId"] for r in sent] == [order_id]


def test_a_create_that_applied_and_was_retried_after_a_503_is_ours(
    ctx: AppContext, adapter: FaultyAdapter, tag: str
) -> None:
    """The create applied, the server still answered 503, the SDK retried the POST (it does
    for 500, 503, 504) and met 409. Not a duplicate delivery: the store sees its own
    WriteId, so the submit goes on and sends attempt 1's request (before, the claim stood
    with no request, and its expiry was counted as "may have applied")."""
    order_id = f"{tag}-503-create"
    adapter.add(lambda r: is_batch(r) and order_id.encode() in body_of(r), "applied-503")
    assert ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode()) is Handled.ACCEPTED
    assert any(i.startswith("applied-503") for i in adapter.injected)
    sent = [json.loads(t) for t in drain_requests(ctx)]
    assert [(r["orderId"], r["attempt"]) for r in sent] == [(order_id, 1)]
    order = ctx.store.load(order_id)
    assert order is not None and order.steps[0].attempt == 1


def test_a_duplicated_queue_message_is_harmless(
    ctx: AppContext, adapter: FaultyAdapter, tag: str
) -> None:
    order_id = f"{tag}-dupsend"
    adapter.add(is_queue_send, "lose")  # the agent request is enqueued twice
    ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    texts = drain_requests(ctx)
    assert len(texts) == 2 and texts[0] == texts[1]
    outcomes = [ctx.scheduler.apply_reply(decode_request(t).succeeded({})) for t in texts]
    assert outcomes == [Handled.APPLIED, Handled.STALE]


def test_clock_skew_between_instances_does_not_break_fencing(
    storage_connection: str, tag: str
) -> None:
    scheduler_clock = FakeClock()
    supervisor_clock = FakeClock(scheduler_clock.now + timedelta(seconds=5))  # 5 s fast
    scheduler = make_context(storage_connection, tag, clock=scheduler_clock, timeout=30)
    supervisor = make_context(storage_connection, tag, clock=supervisor_clock, timeout=30)
    order_id = f"{tag}-skew"
    scheduler.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    [request] = drain_requests(scheduler)
    # Before the deadline by the scheduler's clock, the fast supervisor thinks the deadline
    # passed half its grace ago (within its grace: it waits) ...
    grace = SKEW_GRACE.total_seconds()
    scheduler_clock.advance(30 - 5 + grace / 2)
    supervisor_clock.advance(30 - 5 + grace / 2)
    assert supervisor.supervisor.run().retried == 0
    # ... one grace later it is past by its clock: it resets the step, seconds early.
    scheduler_clock.advance(grace)
    supervisor_clock.advance(grace)
    assert scheduler_clock() < decode_request(request).complete_by  # early, by the scheduler
    assert supervisor.supervisor.run().retried == 1
    # The agent's success, in time by the scheduler's clock, arrives for an attempt the
    # fast supervisor reset: still evidence, so it completes the step (docs/contracts.md §3.11).
    reply = decode_request(request).succeeded({"late": True})
    assert scheduler.scheduler.apply_reply(reply) is Handled.NOTED
    # The re-dispatch finds nothing to run: the step never runs twice at once.
    [dispatch] = drain(scheduler, scheduler.names.order_dispatch)
    scheduler_clock.advance(5)
    assert scheduler.scheduler.dispatch(json.loads(dispatch)["orderId"]) is Handled.NOTHING_TO_DO
    assert not drain_requests(scheduler)
    order = scheduler.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    assert decode_reply(reply.encode()).attempt == 1
