"""Contract 3.3 through the app's own transport, against a real Service Bus namespace when
``SERVICEBUS_TEST_CONNECTION`` is set (a connection string, or a fully qualified namespace
``<name>.servicebus.windows.net`` reached with DefaultAzureCredential), else against a
private ``localbus`` (tests/localbus/target.py). A namespace needs the queues
``agent-requests-orders`` and ``agent-replies`` as infra/ creates them (duplicate
detection on).
Use a namespace for tests: messages of other senders found on the queues are abandoned,
not lost. The broker's own behaviours are in tests/localbus/test_contract.py.

A broker that never answers makes the SDK retry for a long time, so the SDK retries
little and every test has a hard timeout.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from core.messages import AgentRequest, decode_reply, decode_request
from core.names import AGENT_REPLIES, Names
from messaging.servicebus import ServiceBusTransport
from tests.localbus.target import AGENT_REQUESTS, Target, open_target

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(120)]

#: How long a receive that finds nothing waits before the queue is taken as drained.
WAIT = {"seconds": 10.0}


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with open_target() as found:
        WAIT["seconds"] = 10.0 if found.name == "namespace" else 1.5
        yield found


@pytest.fixture
def new_client(target: Target) -> Callable[[], object]:
    return target.new_client


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
        agent="orders",
    )


def _receive(client: object, queue: str, order_id: str, *, settle: bool = True) -> list[object]:
    """Receive until the queue has nothing more within WAIT_SECONDS; returns this order's
    messages (completed when ``settle``). Everyone else's stay locked while we look (so
    they are not received again) and are abandoned at the end."""
    from azure.servicebus import ServiceBusReceiveMode

    ours: list[object] = []
    others: list[object] = []
    with client.get_queue_receiver(  # type: ignore[attr-defined]
        queue, receive_mode=ServiceBusReceiveMode.PEEK_LOCK, max_wait_time=WAIT["seconds"]
    ) as receiver:
        try:
            while batch := receiver.receive_messages(
                max_message_count=20, max_wait_time=WAIT["seconds"]
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
