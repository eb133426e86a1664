"""Agent requests and replies on Service Bus queues (the default transport in Azure), and
the orders' wake-ups at a time (``send_at``: scheduled messages on ``order-wakeups``).

Contract 3.3: ``message_id`` = ``<orderId>:<step>:<attempt>`` (the queues have
duplicate detection on, so a request sent twice is delivered once),
``correlation_id`` of a reply = its request's ``message_id``, ``reply_to`` =
the reply queue, time-to-live = the time left before ``completeBy``. A reply's own
``message_id`` is unique per report (``reply_message``): duplicate detection must never
drop a report that carries new evidence.

The SDK's sync senders are not thread-safe and the Functions worker runs sync
functions on a thread pool: one lock per sender.

Every wait on the send path is bounded (azure-servicebus 7.15.0): the client's
retries (``retry_total``, a short exponential backoff capped by
``retry_backoff_max``), each attempt (``try_timeout``: link acquisition, the
CBS token, the send), the whole send (``timeout=``), and the wait for a sender's
lock (``busy``: StorageUnavailable, never blocking a worker thread forever).

Errors: too big or malformed (a ``message_id`` over 128 characters) is
``TransportRefused`` (permanent); everything else, authentication and
authorization included (a new role assignment takes minutes to propagate), is
``StorageUnavailable`` (retry later).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from config.settings import Connection, SettingsError
from core.errors import OrderError, StorageUnavailable
from core.messages import AgentReply, AgentRequest
from core.names import Names
from core.ports import Clock
from messaging.storage_queues import REPLY_TTL_SECONDS
from observability.logs import get_logger

if TYPE_CHECKING:
    from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSender

log = get_logger(__name__)
#: The whole send, retries included (the SDK's ``timeout=``).
SEND_TIMEOUT_SECONDS = 10
#: One attempt (the SDK's ``try_timeout``): opening the link, the token, the send.
TRY_TIMEOUT_SECONDS = 5
#: How long a send waits for another thread's send on the same sender.
LOCK_TIMEOUT_SECONDS = SEND_TIMEOUT_SECONDS + TRY_TIMEOUT_SECONDS
#: The client's retry policy: a few quick tries that fit in ``SEND_TIMEOUT_SECONDS``.
CLIENT_OPTIONS: dict[str, Any] = {
    "retry_total": 3,
    "retry_backoff_factor": 0.5,
    "retry_backoff_max": 2,
    "retry_mode": "exponential",
    "try_timeout": TRY_TIMEOUT_SECONDS,
}


class TransportRefused(OrderError):
    """The message can never be sent (too big, malformed): not retryable."""


def _properties(order_id: str, step: str, attempt: int, trace: dict[str, str]) -> dict[Any, Any]:
    props: dict[Any, Any] = {"orderId": order_id, "step": step, "attempt": attempt}
    props.update(trace)  # traceparent / tracestate, so one order is one trace
    return props


def request_message(request: AgentRequest, reply_queue: str, now: datetime) -> ServiceBusMessage:
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(
        request.encode(),
        message_id=request.message_id,
        reply_to=reply_queue,
        time_to_live=max(request.complete_by - now, timedelta(seconds=1)),
        content_type="application/json",
        subject=request.step,
        application_properties=_properties(
            request.order_id, request.step, request.attempt, request.trace
        ),
    )


def reply_message(reply: AgentReply, now: datetime) -> ServiceBusMessage:
    from azure.servicebus import ServiceBusMessage

    return ServiceBusMessage(
        reply.encode(),
        # Every report is its own message: two reports of one attempt may carry different
        # evidence (a redelivered copy's "may have applied" after the first copy's "not
        # applied", a Python handler's renewals and its end), and the queues have duplicate
        # detection on (infra/app/servicebus.bicep), which would drop the second of two
        # messages that share an id. A report sent twice is harmless: applying one is
        # idempotent. The attempt's id stays in correlation_id.
        message_id=uuid.uuid4().hex,
        correlation_id=reply.message_id,  # = the request's message_id
        # Not the time left: a late success is still evidence (docs/contracts.md §3.11).
        time_to_live=timedelta(seconds=REPLY_TTL_SECONDS),
        content_type="application/json",
        subject=reply.step,
        application_properties={
            **_properties(reply.order_id, reply.step, reply.attempt, reply.trace),
            "outcome": reply.outcome.wire,
        },
    )


def wakeup_message(body: str, at: datetime) -> ServiceBusMessage:
    """A scheduled message: invisible until ``at``, then pushed to its trigger. ``at`` is
    rounded up to the millisecond (the wire's unit), so it is never early. Its id is its
    own: a later wake-up of the same order must not be dropped as a duplicate."""
    from azure.servicebus import ServiceBusMessage

    spare = at.microsecond % 1000
    return ServiceBusMessage(
        body,
        message_id=uuid.uuid4().hex,
        content_type="application/json",
        scheduled_enqueue_time_utc=at + timedelta(microseconds=1000 - spare) if spare else at,
    )


def client_for(
    connection: Connection, credential: Callable[[Connection], Any] | None = None
) -> ServiceBusClient:
    """The client for ``connection``: a connection string, or identity-based with the
    identity ``credential`` gives for it (``bootstrap.clients.credential``)."""
    from azure.servicebus import ServiceBusClient

    options = dict(CLIENT_OPTIONS)
    if connection.connection_string:
        return ServiceBusClient.from_connection_string(connection.connection_string, **options)
    if connection.fully_qualified_namespace and credential is not None:
        return ServiceBusClient(
            connection.fully_qualified_namespace, credential(connection), **options
        )
    raise SettingsError(
        f"{connection.name}: give a connection string or {connection.name}__fullyQualifiedNamespace"
    )


class ServiceBusTransport:
    def __init__(self, client_factory: Callable[[], ServiceBusClient], names: Names, clock: Clock):
        self._client_factory = client_factory
        self._client: ServiceBusClient | None = None
        self._senders: dict[str, tuple[ServiceBusSender, threading.Lock]] = {}
        self._lock = threading.Lock()
        self._names = names
        self._clock = clock

    def _sender(self, queue: str) -> tuple[ServiceBusSender, threading.Lock]:
        if not self._lock.acquire(timeout=LOCK_TIMEOUT_SECONDS):
            raise StorageUnavailable(
                f"Service Bus transport busy: no sender for queue {queue} "
                f"within {LOCK_TIMEOUT_SECONDS} s"
            )
        try:
            if self._client is None:
                self._client = self._client_factory()
            if queue not in self._senders:
                self._senders[queue] = (self._client.get_queue_sender(queue), threading.Lock())
            return self._senders[queue]
        finally:
            self._lock.release()

    def _discard(self, queue: str, sender: ServiceBusSender) -> None:
        """Forget a sender the SDK shut down, so the next send opens a new one."""
        with self._lock:
            if queue in self._senders and self._senders[queue][0] is sender:
                del self._senders[queue]

    def _send(self, queue: str, build: Callable[[], ServiceBusMessage]) -> None:
        from azure.servicebus.exceptions import (
            MessageSizeExceededError,
            ServiceBusAuthenticationError,
            ServiceBusAuthorizationError,
            ServiceBusError,
        )

        try:
            message = build()
        except (ValueError, TypeError) as exc:  # e.g. a message_id over 128 characters
            raise TransportRefused(
                f"cannot build a Service Bus message for queue {queue}: {exc}"
            ) from exc
        try:
            sender, lock = self._sender(queue)
        except (ServiceBusError, ValueError, OSError) as exc:
            raise StorageUnavailable(f"could not open Service Bus queue {queue}: {exc}") from exc
        if not lock.acquire(timeout=LOCK_TIMEOUT_SECONDS):
            raise StorageUnavailable(
                f"Service Bus sender for queue {queue} busy: another send held it for more "
                f"than {LOCK_TIMEOUT_SECONDS} s"
            )
        try:
            sender.send_messages(message, timeout=SEND_TIMEOUT_SECONDS)
        except MessageSizeExceededError as exc:  # also a ValueError: before the one below
            raise TransportRefused(
                f"Service Bus refused the message for queue {queue} (too large): {exc}"
            ) from exc
        except (ServiceBusAuthenticationError, ServiceBusAuthorizationError) as exc:
            # Transient as far as we can tell: a new role assignment takes minutes to
            # propagate, a token endpoint can fail for a while.
            raise StorageUnavailable(
                f"Service Bus did not let this identity send to queue {queue} (yet): {exc}"
            ) from exc
        except ValueError as exc:  # the SDK shut this sender down: use a new one next time
            self._discard(queue, sender)
            raise StorageUnavailable(f"could not send to Service Bus queue {queue}: {exc}") from exc
        except (ServiceBusError, OSError) as exc:
            raise StorageUnavailable(f"could not send to Service Bus queue {queue}: {exc}") from exc
        finally:
            lock.release()

    def send_request(self, request: AgentRequest) -> bool:
        now = self._clock()
        if request.complete_by <= now:
            log.warning("deadline passed before the request was sent; not sending")
            return False
        self._send(
            self._names.agent_queue(request.agent),
            lambda: request_message(request, self._names.agent_replies, now),
        )
        return True

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        # Sent however late: a late success completes the step, a late report corrects
        # what the supervisor assumed (docs/contracts.md §3.11).
        now = self._clock()
        self._send(reply_to or self._names.agent_replies, lambda: reply_message(reply, now))
        return True

    def send_at(self, queue: str, body: str, at: datetime) -> None:
        """``body`` on ``queue``, enqueued by the broker at ``at`` (``ScheduledSender``):
        a plain send with ``scheduled_enqueue_time_utc`` (``schedule_messages`` would
        return sequence numbers to cancel with, which nothing here needs)."""
        self._send(queue, lambda: wakeup_message(body, at))

    def close(self) -> None:
        with self._lock:
            for sender, _ in self._senders.values():
                sender.close()
            self._senders.clear()
            if self._client is not None:
                self._client.close()
                self._client = None
