"""Service Bus queue triggers: a PEEK_LOCK message pump per function, when configured.

One message per receive (a batch waits 200 ms more: the SDK's ``_further_pull_receive_timeout``);
a receive ends when one arrives, so its wait bounds how late a stop is seen or an ended one
settled (``SETTLE_WAIT_SECONDS``). An ``AutoLockRenewer`` keeps each lock (up to host.json's
``maxAutoLockRenewalDuration``); settled on the receiving thread: completed, else abandoned.
Past the max delivery count Service Bus dead-letters (``<queue>/$DeadLetterQueue`` reads
it). Closing is bounded: a namespace that never answers cannot hold up shutdown. Only
:func:`sdk_receiver_factory` and the default renewer touch the SDK.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from config.settings import Connection
from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker, Listener, start_thread
from devhost.settings import ServiceBusOptions
from hostrun.shapes import ServiceBusMessage

log = logging.getLogger("devhost.servicebus")
MAX_WAIT_SECONDS = 5.0  # the longest a receive waits: how late a stop is seen
#: A receive's wait while messages run: how late an ended one is settled (its lock kept).
#: Not 50 ms: that made 20 receives a second beside slow functions (``bench.isolation``).
SETTLE_WAIT_SECONDS = 1.0
CLOSE_TIMEOUT_SECONDS = 5.0
#: The fields of :class:`ServiceBusMessage` taken as they are from the SDK's message.
# fmt: off
_SAME = (
    "content_type", "correlation_id", "dead_letter_source", "enqueued_time_utc",
    "expires_at_utc", "partition_key", "reply_to", "reply_to_session_id", "sequence_number",
    "session_id", "subject", "to",
)
# fmt: on


def message_body(body: Any) -> bytes:
    """The body as bytes: the SDK gives the data sections of a message as an iterable."""
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray | memoryview | str):
        return body.encode("utf-8") if isinstance(body, str) else bytes(body)
    return b"".join(bytes(section) for section in body)


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else value


def host_message(message: Any) -> ServiceBusMessage:
    """The message as the Functions host has it, from an SDK (or fake) message."""

    def get(name: str) -> Any:
        return _text(getattr(message, name, None))

    raw = getattr(message, "application_properties", None) or {}
    lock_token, count = get("lock_token"), get("delivery_count")
    return ServiceBusMessage(
        body=message_body(getattr(message, "body", None)),
        message_id=get("message_id") or "",
        # The Python SDK counts *earlier* deliveries (the AMQP header's); the host's .NET SDK
        # adds one (tests/localbus/test_devhost_listener.py shows both through localbus).
        delivery_count=count + 1 if isinstance(count, int) else None,
        lock_token=None if lock_token is None else str(lock_token),
        # Text keys and values: the SDK may hand back bytes.
        application_properties={str(_text(key)): _text(value) for key, value in raw.items()},
        **{name: get(name) for name in _SAME},
    )


def sdk_receiver_factory(connection: Connection, queue_name: str) -> Callable[[], Any]:
    """Opens a PEEK_LOCK receiver on the queue; one client per function, reused."""
    from azure.servicebus import ServiceBusReceiveMode, ServiceBusSubQueue

    from bootstrap.clients import credential
    from messaging.servicebus import client_for

    client = client_for(connection, credential)  # the app's own client; it connects when first used
    queue, _, sub = queue_name.partition("/")
    dead_letters = sub.lower() == "$deadletterqueue"  # the host's name for that sub-queue
    return lambda: client.get_queue_receiver(
        queue if dead_letters else queue_name,
        receive_mode=ServiceBusReceiveMode.PEEK_LOCK,
        prefetch_count=0,
        max_wait_time=MAX_WAIT_SECONDS,
        sub_queue=ServiceBusSubQueue.DEAD_LETTER if dead_letters else None,
    )


def close_within(resource: Any, timeout: float = CLOSE_TIMEOUT_SECONDS) -> bool:
    """Close ``resource`` in a daemon thread; False if it did not finish within ``timeout``."""

    def close() -> None:
        try:
            resource.close()
        except Exception as error:  # noqa: BLE001 - closing is best effort
            log.debug("closing %r failed: %s", resource, error)

    thread = start_thread("servicebus-close", close)
    thread.join(timeout)
    return not thread.is_alive()


class ServiceBusListener(Listener):
    def __init__(
        self,
        spec: FunctionSpec,
        open_receiver: Callable[[], Any],
        invoker: Invoker,
        options: ServiceBusOptions,
        renewer_factory: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(spec, invoker, options.max_concurrent_calls)
        self._open, self.options = open_receiver, options
        self._renewer_factory = renewer_factory or self._sdk_renewer
        self.in_flight = 0  # messages received and not yet settled (read by shutdown)
        self.received = False  # a receive worked since the last (re)connect

    def _sdk_renewer(self) -> Any:
        from azure.servicebus import AutoLockRenewer

        return AutoLockRenewer(max_lock_renewal_duration=self.options.max_auto_lock_renewal)

    def describe(self) -> str:
        where = f"connection {self.spec.trigger.get('connection')}"
        calls = self.options.max_concurrent_calls
        return f"queue {self.source!r} ({where}; PEEK_LOCK, maxConcurrentCalls {calls})"

    def start(self, stop: threading.Event) -> threading.Thread:
        return start_thread(f"servicebus-{self.spec.name}", self.run, stop)

    def run(self, stop: threading.Event) -> None:
        backoff = 1.0
        renewer = self._renewer_factory()
        try:
            while not stop.is_set():
                receiver = None
                self.received = False
                try:
                    receiver = self._open()
                    self.pump(receiver, renewer, stop)
                except Exception as error:  # noqa: BLE001 - reconnect after any SDK error
                    backoff = 1.0 if self.received else backoff  # it worked: start over
                    self.report_receive(error)
                    self.warn("retrying in %.0f s", backoff, level=logging.DEBUG)
                    stop.wait(backoff)
                    backoff = min(backoff * 2, 60.0)
                finally:
                    if receiver is not None:
                        close_within(receiver)
        finally:
            try:
                renewer.close(wait=False)
            except Exception as error:  # noqa: BLE001 - closing is best effort
                log.debug("closing the lock renewer failed: %s", error)

    def pump(self, receiver: Any, renewer: Any, stop: threading.Event) -> None:
        """Receive, run and settle until ``stop``; what runs is settled before returning
        (on this receiver, whose link holds the messages' locks), also after an error."""
        running: dict[Future[bool], Any] = {}
        try:
            while not stop.is_set():
                self._settle_done(receiver, running)
                if len(running) >= self.options.max_concurrent_calls:
                    wait(running, timeout=MAX_WAIT_SECONDS, return_when=FIRST_COMPLETED)
                    continue
                # Shorter while messages run: the ended ones are settled within the wait.
                patience = SETTLE_WAIT_SECONDS if running else MAX_WAIT_SECONDS
                batch = receiver.receive_messages(max_message_count=1, max_wait_time=patience)
                for message in batch:
                    self._start(receiver, renewer, message, running)
                self.received = True  # since this (re)connect
                self.report_receive()
        finally:
            while running:
                wait(running, timeout=MAX_WAIT_SECONDS, return_when=FIRST_COMPLETED)
                self._settle_done(receiver, running)
            self.in_flight = 0

    def _start(
        self, receiver: Any, renewer: Any, message: Any, running: dict[Future[bool], Any]
    ) -> None:
        try:
            renewal = self.options.max_auto_lock_renewal
            renewer.register(receiver, message, max_lock_renewal_duration=renewal)
        except Exception as error:  # noqa: BLE001 - it still runs; its lock may lapse
            self.warn("cannot renew locks: %s", error)
        running[self._pool.submit(self.run_one, message)] = message
        self.in_flight = len(running)

    def _settle_done(self, receiver: Any, running: dict[Future[bool], Any]) -> None:
        for run in [run for run in running if run.done()]:
            message = running.pop(run)
            # The invoker reports a function's failure; anything it raised is one too.
            self.settle(receiver, message, run.exception() is None and bool(run.result()))
        self.in_flight = len(running)

    def run_one(self, message: Any) -> bool:
        shape = host_message(message)  # with the host's delivery count, one more than the SDK's
        return self.invoke(shape, f"message {shape.message_id}, count {shape.delivery_count}")

    def settle(self, receiver: Any, message: Any, succeeded: bool) -> None:
        action = "complete" if succeeded else "abandon"
        try:
            (receiver.complete_message if succeeded else receiver.abandon_message)(message)
        except Exception as error:  # noqa: BLE001 - Service Bus redelivers after the lock
            what = "cannot %s message %s (%s); Service Bus redelivers it when its lock expires"
            self.warn(what, action, getattr(message, "message_id", "?"), error)
