"""devhost Service Bus triggers with fake receivers and messages (no broker here)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devhost import servicebus
from devhost.app_loader import FunctionSpec
from devhost.host import DevHost
from devhost.servicebus import (
    ServiceBusListener,
    close_within,
    host_message,
    message_body,
)
from devhost.settings import ServiceBusOptions
from hostrun.shapes import ServiceBusMessage
from tests.support import direct_invoker

ENQUEUED = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class FakeMessage:
    """What an azure.servicebus ServiceBusReceivedMessage exposes (the parts used)."""

    body: Any
    message_id: str = "o-1:process:1"
    correlation_id: str | None = "req-1"
    reply_to: str | None = "agent-replies"
    content_type: str | None = "application/json"
    delivery_count: int = 0  # the Python SDK's: earlier deliveries (the header's count)
    enqueued_time_utc: datetime = ENQUEUED
    expires_at_utc: datetime = ENQUEUED + timedelta(minutes=5)
    application_properties: dict[Any, Any] = field(
        default_factory=lambda: {b"orderId": b"o-1", "attempt": 2}
    )
    sequence_number: int = 7
    lock_token: uuid.UUID = field(default_factory=uuid.uuid4)
    subject: str | None = "process"


def test_message_bodies() -> None:
    assert message_body(b"raw") == b"raw"
    assert message_body(iter([b"a", b"b"])) == b"ab"  # AMQP data sections
    assert message_body([b"a", b"b"]) == b"ab"
    assert message_body("text") == b"text"
    assert message_body(None) == b""


def test_host_message_carries_the_contract_fields() -> None:
    """What the host has of the message; what the function then gets (UserProperties and
    Label too) is tests/runtime/test_trigger_shapes.py's."""
    source = FakeMessage(body=iter([b'{"orderId":', b'"o-1"}']))
    message = host_message(source)
    assert message.body == b'{"orderId":"o-1"}'
    assert message.message_id == "o-1:process:1"
    assert message.correlation_id == "req-1"
    assert message.reply_to == "agent-replies"
    assert message.content_type == "application/json"
    assert message.delivery_count == 1  # the host's: this delivery included
    assert message.enqueued_time_utc == ENQUEUED
    assert message.expires_at_utc == ENQUEUED + timedelta(minutes=5)
    assert message.application_properties == {"orderId": "o-1", "attempt": 2}
    assert message.sequence_number == 7
    assert message.lock_token == str(source.lock_token)
    assert message.subject == "process"


class FakeReceiver:
    def __init__(self, batches: list[list[FakeMessage]]) -> None:
        self.batches = batches
        self.completed: list[str] = []
        self.abandoned: list[str] = []
        self.receives = 0
        self.closed = False
        self.drained = threading.Event()
        self.changed = threading.Condition()  # a receive, a complete or an abandon

    def wait_until(self, done: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Wait for what the listener does to this receiver to make ``done`` true."""
        with self.changed:
            return self.changed.wait_for(done, timeout)

    def _note(self, change: Callable[[], None]) -> None:
        with self.changed:
            change()
            self.changed.notify_all()

    def receive_messages(
        self, max_message_count: int | None = 1, max_wait_time: float | None = None
    ) -> list[Any]:
        self._note(lambda: setattr(self, "receives", self.receives + 1))
        if self.batches:
            return self.batches.pop(0)
        self.drained.set()
        time.sleep(0.01)  # an empty receive waits a little, as the SDK's does
        return []

    def complete_message(self, message: Any) -> None:
        self._note(lambda: self.completed.append(message.message_id))

    def abandon_message(self, message: Any) -> None:
        self._note(lambda: self.abandoned.append(message.message_id))

    def close(self) -> None:
        self.closed = True


class FakeRenewer:
    def __init__(self) -> None:
        self.registered: list[tuple[Any, float | None]] = []
        self.closed = False

    def register(
        self, receiver: Any, message: Any, max_lock_renewal_duration: float | None = None
    ) -> None:
        self.registered.append((message.message_id, max_lock_renewal_duration))

    def close(self, wait: bool = True) -> None:
        self.closed = True


def spec(handler: Any) -> FunctionSpec:
    trigger = {
        "type": "serviceBusTrigger",
        "name": "message",
        "queueName": "agent-requests",
        "connection": "ServiceBusConnection",
    }
    return FunctionSpec("agent", "serviceBusTrigger", trigger, handler)


def handler(message: ServiceBusMessage) -> None:
    if message.body == b"bad":
        raise ValueError("bad message")


def test_success_completes_and_failure_abandons() -> None:
    receiver = FakeReceiver(
        [[FakeMessage(b"good", message_id="a"), FakeMessage(b"bad", message_id="b")]]
    )
    renewer = FakeRenewer()
    options = ServiceBusOptions(max_concurrent_calls=4, max_auto_lock_renewal=60.0)
    listener = ServiceBusListener(
        spec(handler), lambda: receiver, direct_invoker(), options, renewer_factory=lambda: renewer
    )
    stop = threading.Event()
    thread = listener.start(stop)
    try:
        assert receiver.drained.wait(5)
    finally:
        stop.set()
        thread.join(5)
    assert receiver.completed == ["a"]
    assert receiver.abandoned == ["b"]
    assert renewer.registered == [("a", 60.0), ("b", 60.0)]
    assert receiver.closed and renewer.closed
    assert not thread.is_alive()


def test_a_failing_receiver_is_reopened() -> None:
    opened: list[FakeReceiver] = []

    class Broken(FakeReceiver):
        def receive_messages(
            self, max_message_count: int | None = 1, max_wait_time: float | None = None
        ) -> list[Any]:
            raise ConnectionError("link detached")

    good = FakeReceiver([[FakeMessage(b"good", message_id="a")]])

    def open_receiver() -> FakeReceiver:
        receiver = Broken([]) if not opened else good
        opened.append(receiver)
        return receiver

    listener = ServiceBusListener(
        spec(handler),
        open_receiver,
        direct_invoker(),
        ServiceBusOptions(),
        renewer_factory=FakeRenewer,
    )
    stop = threading.Event()
    thread = listener.start(stop)
    try:
        assert good.drained.wait(5)
    finally:
        stop.set()
        thread.join(5)
    assert opened[0].closed
    assert good.completed == ["a"]


def test_the_reconnect_back_off_starts_over_after_the_receiver_worked() -> None:
    class Broken(FakeReceiver):
        def __init__(self, batches_before: int = 0) -> None:
            super().__init__([])
            self.batches_before = batches_before

        def receive_messages(
            self, max_message_count: int | None = 1, max_wait_time: float | None = None
        ) -> list[Any]:
            if self.batches_before:
                self.batches_before -= 1
                return []
            raise ConnectionError("link detached")

    good = FakeReceiver([[FakeMessage(b"good", message_id="a")]])
    receivers: list[FakeReceiver] = [Broken(), Broken(), Broken(batches_before=1), Broken(), good]

    class RecordingStop(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            self.waits: list[float] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout or 0.0)
            return self.is_set()  # no real waiting

    listener = ServiceBusListener(
        spec(handler),
        lambda: receivers.pop(0),
        direct_invoker(),
        ServiceBusOptions(),
        renewer_factory=FakeRenewer,
    )
    stop = RecordingStop()
    thread = listener.start(stop)
    try:
        assert good.drained.wait(5)
    finally:
        stop.set()
        thread.join(5)
    # 1, 2 s; then a receiver that worked before failing: 1 s again, not 4
    assert stop.waits == [1.0, 2.0, 1.0, 2.0]


def test_failed_receives_warn_once_and_the_one_that_works_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As a Storage queue listener logs them: the first failure in a row is a WARNING, the
    others DEBUG, and the receive that works after them INFO."""

    class Broken(FakeReceiver):
        def receive_messages(
            self, max_message_count: int | None = 1, max_wait_time: float | None = None
        ) -> list[Any]:
            raise ConnectionError("link detached")

    class NoWaiting(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            return self.is_set()

    good = FakeReceiver([[FakeMessage(b"good", message_id="a")]])
    receivers: list[FakeReceiver] = [Broken([]), Broken([]), Broken([]), good]
    listener = ServiceBusListener(
        spec(handler),
        lambda: receivers.pop(0),
        direct_invoker(),
        ServiceBusOptions(),
        renewer_factory=FakeRenewer,
    )
    stop = NoWaiting()
    with caplog.at_level(logging.DEBUG, logger="devhost"):
        thread = listener.start(stop)
        try:
            assert good.drained.wait(5)
        finally:
            stop.set()
            thread.join(5)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "queue " in r.getMessage()]
    failed = (
        "cannot read queue agent-requests: link detached",
        "queue agent-requests answers again",
    )
    assert said == [
        ("WARNING", f"function agent: {failed[0]}"),
        ("DEBUG", f"function agent: {failed[0]}"),
        ("DEBUG", f"function agent: {failed[0]}"),
        ("INFO", f"function agent: {failed[1]}"),
    ]


def test_settle_errors_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    class LockLost(FakeReceiver):
        def complete_message(self, message: Any) -> None:
            raise RuntimeError("lock lost")

    listener = ServiceBusListener(
        spec(handler),
        lambda: LockLost([]),
        direct_invoker(),
        ServiceBusOptions(),
        renewer_factory=FakeRenewer,
    )
    listener.settle(LockLost([]), FakeMessage(b"x"), succeeded=True)
    assert "redelivers" in caplog.text


def test_closing_a_hung_receiver_is_bounded() -> None:
    hung, closing, closed = threading.Event(), threading.Event(), threading.Event()

    class Hangs:
        def close(self) -> None:
            closing.set()
            hung.wait(30)
            closed.set()

    try:
        assert close_within(Hangs(), timeout=0.2) is False
        assert closing.is_set() and not closed.is_set()  # it gave up while close still hung
    finally:
        hung.set()


def test_not_configured_means_skipped_with_a_reason() -> None:
    only_client_id = {"ServiceBusConnection__clientId": "00000000-0000-0000-0000-000000000000"}
    for environ in ({}, only_client_id):
        devhost = DevHost.build([spec(handler)], {}, environ, http_port=0, invoker=direct_invoker())
        assert devhost.service_bus == []
        assert "SKIPPED" in devhost.lines[0]
        assert "ServiceBusConnection__fullyQualifiedNamespace" in devhost.lines[0]


def test_a_configured_namespace_gets_a_listener_with_the_apps_client() -> None:
    namespace = {"ServiceBusConnection__fullyQualifiedNamespace": "ns.servicebus.windows.net"}
    devhost = DevHost.build([spec(handler)], {}, namespace, http_port=0, invoker=direct_invoker())
    assert len(devhost.service_bus) == 1
    assert "queue 'agent-requests'" in devhost.lines[0]


def test_a_bad_connection_string_is_a_config_error() -> None:
    from devhost.settings import ConfigError

    with pytest.raises(ConfigError, match="ServiceBusConnection"):
        DevHost.build(
            [spec(handler)],
            {},
            {"ServiceBusConnection": "nonsense"},
            http_port=0,
            invoker=direct_invoker(),
        )


def test_a_broker_that_never_answers_does_not_hold_up_shutdown() -> None:
    never, receiving, received = threading.Event(), threading.Event(), threading.Event()

    class Silent(FakeReceiver):
        def receive_messages(
            self, max_message_count: int | None = 1, max_wait_time: float | None = None
        ) -> list[Any]:
            receiving.set()
            never.wait(30)  # ignores max_wait_time, as a hung connection would
            received.set()
            return []

    devhost = DevHost(direct_invoker(), {})
    devhost.service_bus.append(
        ServiceBusListener(
            spec(handler),
            lambda: Silent([]),
            devhost.invoker,
            ServiceBusOptions(),
            renewer_factory=FakeRenewer,
        )
    )
    stop = threading.Event()
    devhost.start(stop)
    assert receiving.wait(5)  # the listener is stuck in its receive
    stop.set()
    assert devhost.stop(grace_seconds=1.0) is True
    assert not received.is_set(), "the stop waited for the receive the broker never answered"
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("servicebus-"))
    never.set()


def test_the_pump_runs_the_next_message_while_one_is_still_running() -> None:
    # The host's processor has no batch barrier: a slow message does not hold up the next.
    release = threading.Event()

    def slow_or_quick(message: ServiceBusMessage) -> None:
        if message.body == b"slow":
            release.wait(10)

    receiver = FakeReceiver(
        [[FakeMessage(b"slow", message_id="a")], [FakeMessage(b"quick", message_id="b")]]
    )
    options = ServiceBusOptions(max_concurrent_calls=4, max_auto_lock_renewal=60.0)
    listener = ServiceBusListener(
        spec(slow_or_quick),
        lambda: receiver,
        direct_invoker(),
        options,
        renewer_factory=FakeRenewer,
    )
    stop = threading.Event()
    thread = listener.start(stop)
    try:
        # settled while "a" still runs (it waits for release)
        assert receiver.wait_until(lambda: receiver.completed == ["b"]), receiver.completed
        settled_at = receiver.receives
        assert receiver.wait_until(lambda: receiver.receives > settled_at)  # a round after it
        assert listener.in_flight == 1
        release.set()
        assert receiver.wait_until(lambda: len(receiver.completed) == 2)
        assert receiver.completed == ["b", "a"]
    finally:
        release.set()
        stop.set()
        thread.join(5)
    assert listener.in_flight == 0 and not thread.is_alive()


def test_a_stop_lets_running_messages_finish_and_settles_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(message: ServiceBusMessage) -> None:
        started.set()
        release.wait(10)

    receiver = FakeReceiver([[FakeMessage(b"slow", message_id="a")]])
    listener = ServiceBusListener(
        spec(slow),
        lambda: receiver,
        direct_invoker(),
        ServiceBusOptions(),
        renewer_factory=FakeRenewer,
    )
    stop = threading.Event()
    # The listener, stopped, waits for what runs (concurrent.futures.wait): say when.
    draining = threading.Event()

    def wait_for_running(*args: Any, **kwargs: Any) -> Any:
        if stop.is_set():
            draining.set()
        return futures_wait(*args, **kwargs)

    monkeypatch.setattr(servicebus, "wait", wait_for_running)
    thread = listener.start(stop)
    try:
        assert started.wait(5)
        stop.set()
        assert draining.wait(5), "the stopped listener did not wait for its running message"
        assert listener.in_flight == 1 and receiver.completed == []  # still running
        assert receiver.abandoned == [] and not receiver.closed
        release.set()
        thread.join(5)
    finally:
        release.set()
        stop.set()
    assert receiver.completed == ["a"] and receiver.closed


def test_while_a_function_waits_the_pump_receives_once_a_settle_wait_not_twenty_times_a_second() -> (
    None
):
    """A function that waits 10 s on a slow remote: meanwhile the pump receives once per
    SETTLE_WAIT_SECONDS (each receive a round trip on the connection), not in a spin of
    short receives; the message is still settled once the function has ended. The
    receiver's waits pass on a clock of its own (no real waiting)."""
    release = threading.Event()  # the slow remote answers
    receives_while_running: list[float] = []

    def waits_on_the_remote(message: ServiceBusMessage) -> None:
        release.wait(10)

    class Clocked(FakeReceiver):
        def __init__(self, batches: list[list[FakeMessage]]) -> None:
            super().__init__(batches)
            self.now = 0.0  # seconds, this receiver's own clock

        def receive_messages(
            self, max_message_count: int | None = 1, max_wait_time: float | None = None
        ) -> list[Any]:
            if self.batches or release.is_set():
                return super().receive_messages(max_message_count, max_wait_time)
            receives_while_running.append(max_wait_time or 0.0)
            self.now += max_wait_time or 0.0  # nothing arrived: it waited that long
            if self.now >= 10.0:
                release.set()
            return []

    receiver = Clocked([[FakeMessage(b"slow", message_id="a")]])
    listener = ServiceBusListener(
        spec(waits_on_the_remote),
        lambda: receiver,
        direct_invoker(),
        ServiceBusOptions(max_concurrent_calls=4),
        renewer_factory=FakeRenewer,
    )
    stop = threading.Event()
    thread = listener.start(stop)
    try:
        assert release.wait(5), "the pump stopped receiving while the function ran"
        assert receiver.wait_until(lambda: receiver.completed == ["a"]), receiver.completed
    finally:
        release.set()
        stop.set()
        thread.join(5)
    # at most one receive a second while it ran (short waits made 200 of them)
    assert 1 <= len(receives_while_running) <= 10, receives_while_running
    assert min(receives_while_running) >= 1.0
