"""Contract 3.3 against a real Service Bus namespace (there is no Service Bus emulator here).

Runs only when ``SERVICEBUS_TEST_CONNECTION`` is set: a connection string, or a fully
qualified namespace (``<name>.servicebus.windows.net``) reached with
DefaultAzureCredential. The namespace needs the queues ``agent-requests`` and
``agent-replies`` as infra/ creates them (duplicate detection on). Use a namespace
for tests: messages of other senders found on the queues are abandoned, not lost.

A broker that never answers makes the SDK retry for a long time, so the SDK retries
little and every test has a hard timeout.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from core.messages import AgentRequest, decode_reply, decode_request
from core.names import AGENT_REPLIES, AGENT_REQUESTS, Names
from messaging.servicebus import ServiceBusTransport

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(120)]

ENV = "SERVICEBUS_TEST_CONNECTION"
NOT_SET = (
    "SERVICEBUS_TEST_CONNECTION is not set: no Service Bus namespace here; "
    "see README 'Service Bus contract tests'"
)
SDK_OPTIONS = {"retry_total": 1, "retry_backoff_factor": 0.5, "retry_backoff_max": 2}
WAIT_SECONDS = 10


def _client_factory() -> Callable[[], object]:
    value = os.environ.get(ENV, "").strip()
    if not value:
        pytest.skip(NOT_SET)
    from azure.servicebus import ServiceBusClient

    if "Endpoint=" in value:
        return lambda: ServiceBusClient.from_connection_string(value, **SDK_OPTIONS)
    namespace = value.removeprefix("sb://").rstrip("/")
    if namespace.endswith(".servicebus.windows.net"):
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
        return lambda: ServiceBusClient(namespace, credential, **SDK_OPTIONS)
    pytest.fail(
        f"{ENV} must be a connection string (Endpoint=sb://...;SharedAccessKey...) or a "
        f"namespace <name>.servicebus.windows.net; got {value[:30]!r}..."
    )


@pytest.fixture
def new_client() -> Callable[[], object]:
    return _client_factory()


@pytest.fixture
def receiver_client(new_client: Callable[[], object]) -> Iterator[object]:
    client = new_client()
    try:
        yield client
    finally:
        client.close()  # type: ignore[attr-defined]


@pytest.fixture
def transport(new_client: Callable[[], object]) -> Iterator[ServiceBusTransport]:
    sender = ServiceBusTransport(new_client, Names(), lambda: datetime.now(UTC))  # type: ignore[arg-type]
    try:
        yield sender
    finally:
        sender.close()


def _request(seconds: float = 60) -> AgentRequest:
    now = datetime.now(UTC)
    now = now.replace(microsecond=now.microsecond // 1000 * 1000)  # what the JSON keeps
    order_id = "sbt-" + uuid.uuid4().hex[:16]
    return AgentRequest(
        order_id,
        "process",
        1,
        now + timedelta(seconds=seconds),
        "process",
        {"orderId": order_id, "qty": 1},
    )


def _receive(client: object, queue: str, order_id: str, *, settle: bool = True) -> list[object]:
    """Receive until the queue has nothing more within WAIT_SECONDS; returns this order's
    messages (completed when ``settle``). Everyone else's stay locked while we look (so
    they are not received again) and are abandoned at the end."""
    from azure.servicebus import ServiceBusReceiveMode

    ours: list[object] = []
    others: list[object] = []
    with client.get_queue_receiver(  # type: ignore[attr-defined]
        queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, max_wait_time=WAIT_SECONDS
    ) as receiver:
        try:
            while batch := receiver.receive_messages(
                max_message_count=20, max_wait_time=WAIT_SECONDS
            ):
                for message in batch:
                    props = message.application_properties or {}
                    mine = props.get(b"orderId", props.get("orderId"))
                    if mine in (order_id, order_id.encode()):
                        ours.append(message)
                        if settle:
                            receiver.complete_message(message)
                    else:
                        others.append(message)
        finally:
            for message in others:
                receiver.abandon_message(message)
    return ours


def test_request_arrives_with_the_contract_properties(
    transport: ServiceBusTransport, receiver_client: object
) -> None:
    request = _request(seconds=60)

    assert transport.send_request(request) is True
    received = _receive(receiver_client, AGENT_REQUESTS, request.order_id)

    assert len(received) == 1
    (message,) = received
    assert message.message_id == f"{request.order_id}:process:1"  # type: ignore[attr-defined]
    assert message.reply_to == AGENT_REPLIES  # type: ignore[attr-defined]
    ttl = message.time_to_live  # type: ignore[attr-defined]
    assert ttl is not None
    assert timedelta(seconds=50) <= ttl <= timedelta(seconds=60)
    assert message.content_type == "application/json"  # type: ignore[attr-defined]
    assert decode_request(b"".join(message.body)) == request  # type: ignore[attr-defined]


def test_reply_correlates_with_its_request(
    transport: ServiceBusTransport, receiver_client: object
) -> None:
    request = _request(seconds=60)
    reply = request.succeeded({"done": True})

    assert transport.send_reply(reply) is True
    received = _receive(receiver_client, AGENT_REPLIES, request.order_id)

    assert len(received) == 1
    (message,) = received
    assert message.correlation_id == f"{request.order_id}:process:1"  # type: ignore[attr-defined]
    assert decode_reply(b"".join(message.body)) == reply  # type: ignore[attr-defined]


def test_the_same_request_sent_twice_is_delivered_once(
    transport: ServiceBusTransport, receiver_client: object
) -> None:
    request = _request(seconds=60)

    assert transport.send_request(request) is True
    assert transport.send_request(request) is True
    received = _receive(receiver_client, AGENT_REQUESTS, request.order_id)

    assert len(received) == 1, (
        f"{AGENT_REQUESTS} delivered message_id {request.message_id} {len(received)} times: "
        "is duplicate detection (requiresDuplicateDetection) on for the queue?"
    )
