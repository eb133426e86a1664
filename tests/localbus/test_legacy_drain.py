"""The upgrade over Service Bus (localbus, through the real SDK): requests waiting on the
retired shared ``agent-requests`` queue are moved to their agents' own queues, with their
message ids (duplicate detection still holds) and the time they have left."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from admin.drain import ServiceBusLegacyQueue, drain
from config.settings import Connection
from core.messages import AgentRequest
from core.model import Order
from core.names import Names
from core.order_message import decode_order
from core.workflows import WORKFLOWS, Plan
from localbus.process import LocalBus
from messaging.servicebus import ServiceBusTransport, client_for
from messaging.wire import decode_request
from stores.memory import InMemoryStateStore

pytestmark = pytest.mark.timeout(120)
NAMES = Names()


@pytest.fixture(scope="module")
def bus() -> Iterator[LocalBus]:
    queues = [NAMES.legacy_requests, NAMES.agent_queue("orders"), NAMES.agent_replies]
    with LocalBus.start(queues) as started:
        yield started


def test_a_legacy_request_is_moved_to_its_agents_queue(bus: LocalBus) -> None:
    now = datetime.now(UTC)
    store = InMemoryStateStore()
    order = Order.accept(
        decode_order(json.dumps({"orderId": "o-old"})), Plan.of(WORKFLOWS["order"], 30), now
    )
    claimed = order.claim("old-instance", now)
    store.create(order)
    request = AgentRequest(
        "o-old", "process", 1, claimed.complete_by, "process", {"orderId": "o-old"}
    )
    body = json.loads(request.encode())
    assert "agent" not in body  # as the previous version sent it
    client = ServiceBusClient.from_connection_string(bus.connection_string)
    with client, client.get_queue_sender(NAMES.legacy_requests) as sender:
        sender.send_messages(ServiceBusMessage(json.dumps(body), message_id=request.message_id))
    connection = Connection("ServiceBusConnection", connection_string=bus.connection_string)
    transport = ServiceBusTransport(lambda: client_for(connection), NAMES, lambda: now)
    legacy = ServiceBusLegacyQueue(client_for(connection), NAMES.legacy_requests)
    try:
        drained = drain(legacy, store, transport, lambda: now)
    finally:
        transport.close()
    assert drained.moved == ["o-old:process:1 -> orders"] and not drained.left
    reader = ServiceBusClient.from_connection_string(bus.connection_string)
    with reader, reader.get_queue_receiver(NAMES.agent_queue("orders"), max_wait_time=5) as r:
        [message] = r.receive_messages(max_message_count=1, max_wait_time=5)
        moved = decode_request(b"".join(message.body))
        assert moved.agent == "orders" and message.message_id == "o-old:process:1"
        assert message.time_to_live is not None
        assert message.time_to_live <= timedelta(seconds=30)
        r.complete_message(message)
    with (
        client_for(connection) as again,
        again.get_queue_receiver(NAMES.legacy_requests, max_wait_time=1) as legacy_reader,
    ):
        assert legacy_reader.receive_messages(max_message_count=1, max_wait_time=1) == []
