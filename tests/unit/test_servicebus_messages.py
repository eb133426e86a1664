"""Service Bus messages of docs/contracts.md §3.3 and the transport, with a fake client (no network)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage
from azure.servicebus.exceptions import OperationTimeoutError, ServiceBusError

from core.errors import StorageUnavailable
from core.messages import AgentRequest
from core.names import Names
from core.outcome import Applied
from messaging.servicebus import ServiceBusTransport, reply_message, request_message
from messaging.storage_queues import REPLY_TTL_SECONDS
from messaging.wire import decode_reply, decode_request

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def make_request(seconds_left: float = 30, attempt: int = 3, **changes: Any) -> AgentRequest:
    fields: dict[str, Any] = {
        "order_id": "o-1",
        "step": "reserve-stock",
        "attempt": attempt,
        "complete_by": T0 + timedelta(seconds=seconds_left),
        "path": "reserve-stock",
        "order": {"orderId": "o-1", "qty": 2},
        "trace": TRACE,
        "agent": "inventory",
    }
    fields.update(changes)
    return AgentRequest(**fields)


def body_of(message: ServiceBusMessage) -> bytes:
    return b"".join(message.body)


# --- message builders --------------------------------------------------------------------


def test_request_message_follows_the_contract() -> None:
    request = make_request(seconds_left=42)

    message = request_message(request, "agent-replies", T0)

    assert message.message_id == "o-1:reserve-stock:3"
    assert message.reply_to == "agent-replies"
    assert message.correlation_id is None
    assert message.time_to_live == timedelta(seconds=42)
    assert message.content_type == "application/json"
    assert decode_request(body_of(message)) == request
    assert message.application_properties == {
        "orderId": "o-1",
        "step": "reserve-stock",
        "attempt": 3,
        **TRACE,
    }


def test_reply_message_correlates_with_its_request() -> None:
    request = make_request(seconds_left=10)
    reply = request.succeeded({"reservation": "r-1"})

    message = reply_message(reply, T0 + timedelta(seconds=4))

    assert message.correlation_id == request_message(request, "agent-replies", T0).message_id
    assert message.correlation_id == "o-1:reserve-stock:3"
    assert message.message_id != message.correlation_id  # its own: one per report
    # A reply outlives the deadline: a late success is still evidence (docs/contracts.md §3.11).
    assert message.time_to_live == timedelta(seconds=REPLY_TTL_SECONDS)
    assert message.content_type == "application/json"
    assert decode_reply(body_of(message)) == reply
    assert message.application_properties == {
        "orderId": "o-1",
        "step": "reserve-stock",
        "attempt": 3,
        "outcome": "succeeded",
        **TRACE,
    }


def test_failed_reply_message_carries_its_outcome() -> None:
    reply = make_request().refused("reserve-stock: HTTP 409 out of stock")

    message = reply_message(reply, T0)

    assert decode_reply(body_of(message)).error == "reserve-stock: HTTP 409 out of stock"
    assert message.application_properties is not None
    assert message.application_properties["outcome"] == "failed"
    assert message.correlation_id == "o-1:reserve-stock:3"


def test_every_report_is_its_own_message_so_duplicate_detection_keeps_each() -> None:
    """The queues detect duplicates by message id (infra/app/servicebus.bicep): two reports
    of one attempt with the same outcome may carry different evidence (a redelivered copy's
    "may have applied" after "not applied"; a handler's renewals), so no two share an id."""
    request = make_request()
    reports = [
        request.transient("HTTP 503", Applied.NO),
        request.transient("HTTP 500", Applied.MAYBE),
        request.transient("still runs", Applied.MAYBE, running_until=T0, runner="r"),
        request.transient("still runs", Applied.MAYBE, running_until=T0, runner="r"),
        request.succeeded({}),
        request.succeeded({}),
    ]
    ids = [reply_message(r, T0).message_id for r in reports]
    assert len(set(ids)) == len(ids)
    assert all(i is not None and len(i) <= 128 for i in ids)


@pytest.mark.parametrize(("seconds_left", "ttl"), [(42.5, 42), (1.9, 1)])
def test_fractional_time_left_is_floored_so_the_message_never_outlives_complete_by(
    seconds_left: float, ttl: int
) -> None:
    # The SDK keeps whole seconds (int(total_seconds())): rounding down, never past the deadline.
    request = make_request(seconds_left=seconds_left)

    assert request_message(request, "agent-replies", T0).time_to_live == timedelta(seconds=ttl)


@pytest.mark.parametrize("seconds_left", [0.3, 0, -60])
def test_time_to_live_is_at_least_one_second(seconds_left: float) -> None:
    request = make_request(seconds_left=seconds_left)

    assert request_message(request, "agent-replies", T0).time_to_live == timedelta(seconds=1)
    assert reply_message(request.succeeded({}), T0).time_to_live == timedelta(
        seconds=REPLY_TTL_SECONDS
    )


def test_each_attempt_is_a_new_message_id() -> None:
    ids = {request_message(make_request(attempt=n), "q", T0).message_id for n in (1, 2, 3)}

    assert ids == {"o-1:reserve-stock:1", "o-1:reserve-stock:2", "o-1:reserve-stock:3"}


def test_messages_without_trace_carry_only_the_order_properties() -> None:
    message = request_message(make_request(trace={}), "agent-replies", T0)

    assert message.application_properties == {
        "orderId": "o-1",
        "step": "reserve-stock",
        "attempt": 3,
    }


# --- the transport, on a fake client ------------------------------------------------------------


class FakeSender:
    def __init__(self, queue: str, rendezvous: threading.Barrier | None = None):
        self.queue = queue
        self.sent: list[tuple[ServiceBusMessage, float | None]] = []
        self.closed = False
        self.error: Exception | None = None
        self.inside = 0
        self.overlaps = 0
        self._guard = threading.Lock()
        self._rendezvous = rendezvous

    def send_messages(self, message: ServiceBusMessage, timeout: float | None = None) -> None:
        with self._guard:
            self.inside += 1
            if self.inside > 1:
                self.overlaps += 1  # two threads in the SDK sender at once: not allowed
        try:
            if self._rendezvous is not None:
                self._rendezvous.wait(timeout=5)
            for _ in range(20):
                os.sched_yield()  # give other threads every chance to come in
            if self.error is not None:
                raise self.error
            with self._guard:
                self.sent.append((message, timeout))
        finally:
            with self._guard:
                self.inside -= 1

    def close(self) -> None:
        self.closed = True


class FakeClient:
    def __init__(self) -> None:
        self.senders: dict[str, FakeSender] = {}
        self.sender_requests: list[str] = []
        self.closed = False

    def get_queue_sender(self, queue_name: str) -> FakeSender:
        self.sender_requests.append(queue_name)
        return self.senders.setdefault(queue_name, FakeSender(queue_name))

    def close(self) -> None:
        self.closed = True


class Factory:
    def __init__(self) -> None:
        self.clients: list[FakeClient] = []

    def __call__(self) -> FakeClient:
        self.clients.append(FakeClient())
        return self.clients[-1]

    @property
    def client(self) -> FakeClient:
        (client,) = self.clients
        return client


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def transport(factory: Factory, clock: Clock) -> ServiceBusTransport:
    return ServiceBusTransport(factory, Names(), clock)  # type: ignore[arg-type]


@pytest.fixture
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def test_no_client_is_built_before_the_first_send(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    assert factory.clients == []


def test_request_goes_to_its_agents_queue_with_the_reply_queue(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    request = make_request()

    assert transport.send_request(request) is True

    (sender,) = factory.client.senders.values()
    assert sender.queue == "agent-requests-inventory"
    ((message, timeout),) = sender.sent
    assert message.message_id == "o-1:reserve-stock:3"
    assert message.reply_to == "agent-replies"
    assert message.time_to_live == timedelta(seconds=30)
    assert timeout == 10
    assert decode_request(body_of(message)) == request


def test_request_names_the_configured_queues(factory: Factory, clock: Clock) -> None:
    transport = ServiceBusTransport(factory, Names.unique("t1"), clock)  # type: ignore[arg-type]

    transport.send_request(make_request())

    ((message, _),) = factory.client.senders["agent-requests-t1-inventory"].sent
    assert message.reply_to == "agent-replies-t1"


def test_reply_goes_to_agent_replies_or_the_given_queue(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    reply = make_request().succeeded({"ok": True})

    assert transport.send_reply(reply) is True
    assert transport.send_reply(reply, "replies-elsewhere") is True

    senders = factory.client.senders
    assert sorted(senders) == ["agent-replies", "replies-elsewhere"]
    for queue in ("agent-replies", "replies-elsewhere"):
        ((message, _),) = senders[queue].sent
        assert message.correlation_id == "o-1:reserve-stock:3"
        assert decode_reply(body_of(message)) == reply


@pytest.mark.parametrize("seconds_left", [0, -1])
def test_no_request_is_sent_past_the_deadline_but_replies_are(
    factory: Factory, transport: ServiceBusTransport, seconds_left: float
) -> None:
    request = make_request(seconds_left=seconds_left)

    assert transport.send_request(request) is False
    assert factory.clients == []  # not even a connection
    assert transport.send_reply(request.succeeded({})) is True  # late evidence still goes


def test_the_client_is_built_once_and_each_sender_once(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    for _ in range(3):
        transport.send_request(make_request())
        transport.send_reply(make_request().succeeded({}))

    assert len(factory.clients) == 1
    assert sorted(factory.client.sender_requests) == ["agent-replies", "agent-requests-inventory"]
    assert len(factory.client.senders["agent-requests-inventory"].sent) == 3


@pytest.mark.usefixtures("fast_switching")
def test_concurrent_sends_are_serialized_per_sender(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    def work(n: int) -> None:
        for i in range(25):
            transport.send_request(make_request(order_id=f"o-{n}-{i}"))

    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(work, n) for n in range(8)]:
            future.result()

    sender = factory.client.senders["agent-requests-inventory"]
    assert len(factory.clients) == 1
    assert len(sender.sent) == 200
    assert sender.overlaps == 0


def test_the_fake_sender_does_detect_concurrent_entry() -> None:
    # Guards the test above: two unsynchronized callers are seen as an overlap.
    sender = FakeSender("q", rendezvous=threading.Barrier(2))
    message = ServiceBusMessage("x")

    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(sender.send_messages, message) for _ in range(2)]:
            future.result()

    assert sender.overlaps == 1


@pytest.mark.parametrize(
    "error", [ServiceBusError("connection lost"), OperationTimeoutError(message="timed out")]
)
def test_service_bus_errors_become_storage_unavailable(
    factory: Factory, transport: ServiceBusTransport, error: ServiceBusError
) -> None:
    transport.send_request(make_request())
    factory.client.senders["agent-requests-inventory"].error = error

    with pytest.raises(StorageUnavailable) as info:
        transport.send_request(make_request())

    assert info.value.retryable is True
    assert "agent-requests-inventory" in str(info.value)
    assert info.value.__cause__ is error


def test_close_closes_senders_and_client_and_a_later_send_reconnects(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    transport.send_request(make_request())
    transport.send_reply(make_request().succeeded({}))
    first = factory.client

    transport.close()

    assert first.closed
    assert all(s.closed for s in first.senders.values())
    assert transport.send_request(make_request()) is True
    assert len(factory.clients) == 2


def test_close_before_any_send_builds_nothing(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    transport.close()

    assert factory.clients == []
