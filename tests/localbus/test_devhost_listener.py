"""devhost's Service Bus listener through the real SDK against localbus: the trigger a
function gets, redelivery after a failed invocation, the dead-letter sub-queue trigger."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from config.settings import Connection
from devhost.app_loader import FunctionSpec
from devhost.servicebus import ServiceBusListener, sdk_receiver_factory
from devhost.settings import ServiceBusOptions
from hostrun import shapes
from localbus.process import LocalBus
from tests.support import direct_invoker

pytestmark = pytest.mark.timeout(120)

QUEUE = "jobs"


@pytest.fixture(scope="module")
def bus() -> Iterator[LocalBus]:
    with LocalBus.start([f"{QUEUE}:lock-duration=5:max-delivery-count=3"]) as started:
        yield started


def listen(bus: LocalBus, queue: str, handler: Any) -> tuple[threading.Event, threading.Thread]:
    trigger = {
        "type": "serviceBusTrigger",
        "name": "msg",
        "queueName": queue,
        "connection": "ServiceBusConnection",
    }
    spec = FunctionSpec("fn", "serviceBusTrigger", trigger, handler)
    connection = Connection("ServiceBusConnection", connection_string=bus.connection_string)
    listener = ServiceBusListener(
        spec, sdk_receiver_factory(connection, queue), direct_invoker(), ServiceBusOptions(4, 60.0)
    )
    stop = threading.Event()
    return stop, listener.start(stop)


def send(bus: LocalBus, body: bytes, message_id: str) -> None:
    client = ServiceBusClient.from_connection_string(bus.connection_string)
    with client, client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage(body, message_id=message_id))


def test_a_failed_invocation_is_redelivered_counted_as_the_host_counts(bus: LocalBus) -> None:
    """The function fails once: the message comes back at once (abandoned), and the
    function sees delivery counts 1 then 2, as under the Functions host."""
    seen: list[int | None] = []  # delivery_count is optional in the host's shape
    done = threading.Event()

    def handler(msg: shapes.ServiceBusMessage) -> None:
        seen.append(msg.delivery_count)
        if len(seen) == 1:
            raise RuntimeError("first try fails")
        done.set()

    stop, thread = listen(bus, QUEUE, handler)
    try:
        send(bus, b"x", "redelivered-1")
        assert done.wait(20), seen
    finally:
        stop.set()
        thread.join(15)
    assert seen == [1, 2]


def test_a_message_that_always_fails_reaches_the_dead_letter_trigger(bus: LocalBus) -> None:
    """max-delivery-count 3: three invocations, then ``jobs/$DeadLetterQueue`` (the
    supervisor's alert trigger binds to that name) gets it, with the reason."""
    failures: list[int | None] = []
    dead: list[tuple[bytes, Any]] = []
    arrived = threading.Event()

    def always_fails(msg: shapes.ServiceBusMessage) -> None:
        failures.append(msg.delivery_count)
        raise RuntimeError("never works")

    def on_dead_letter(msg: shapes.ServiceBusMessage) -> None:
        dead.append((msg.body, msg.application_properties.get("DeadLetterReason")))
        arrived.set()

    stops = [
        listen(bus, QUEUE, always_fails),
        listen(bus, f"{QUEUE}/$DeadLetterQueue", on_dead_letter),
    ]
    try:
        send(bus, b"poison", "always-fails-1")
        assert arrived.wait(30), failures
        time.sleep(0.5)
    finally:
        for stop, _ in stops:
            stop.set()
        for _, thread in stops:
            thread.join(15)
    assert failures == [1, 2, 3]
    assert dead == [(b"poison", "MaxDeliveryCountExceeded")]


def test_an_expired_message_reaches_the_dead_letter_trigger_counted_as_the_host_counts(
    bus: LocalBus,
) -> None:
    """Never delivered, a message expires: the dead-letter trigger sees count 1, which
    supervisor/expired.py reads as "unread". The trigger fails once: its retry sees 2,
    which proves nothing (an agent's delivery would show the same)."""
    seen: list[tuple[int | None, Any]] = []
    done = threading.Event()

    def on_dead_letter(msg: shapes.ServiceBusMessage) -> None:
        seen.append((msg.delivery_count, msg.application_properties.get("DeadLetterReason")))
        if len(seen) == 1:
            raise RuntimeError("the trigger fails once")
        done.set()

    client = ServiceBusClient.from_connection_string(bus.connection_string)
    with client, client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(
            ServiceBusMessage(b"late", message_id="expires-1", time_to_live=timedelta(seconds=1))
        )
    time.sleep(1.5)  # expired unread (the SDK sends whole seconds): nobody read the queue
    stop, thread = listen(bus, f"{QUEUE}/$DeadLetterQueue", on_dead_letter)
    try:
        assert done.wait(30), seen
    finally:
        stop.set()
        thread.join(15)
    assert seen == [(1, "TTLExpiredException"), (2, "TTLExpiredException")]
