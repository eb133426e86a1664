"""The AMQP 1.0 side of the double: what the azure-servicebus SDK sends and expects.

One Proton reactor thread does everything (no locks): connections, the queues of
``localbus.entities`` and a timer that ends lapsed locks and expires messages. What the
SDK needs from a broker (Service Bus's AMQP 1.0 protocol guide,
https://learn.microsoft.com/azure/service-bus-messaging/service-bus-amqp-protocol-guide, and
its request/response operations,
https://learn.microsoft.com/azure/service-bus-messaging/service-bus-amqp-request-response;
the rest is how the SDK behaves, as ``tests/localbus/test_contract.py`` states it):

- SASL ANONYMOUS and plain AMQP (``UseDevelopmentEmulator=true`` connection strings);
- ``$cbs``: every ``put-token`` is accepted. The request names no ``reply_to``: the answer
  goes out on the link the client attached *from* the same node, with ``correlation-id`` =
  the request's ``message-id`` and both ``status-code`` and ``statusCode`` (``$cbs`` reads
  one spelling, ``<entity>/$management`` the other);
- a message annotated ``x-opt-scheduled-enqueue-time`` (a timestamp, ms: what the SDK's
  ``scheduled_enqueue_time_utc`` sends) is held until that time, then enqueued (a timer at
  its time, the sweep as a backstop); the annotation stays on the message as delivered.
  The ``schedule-message`` management operation is not done (``send_messages`` is);
- entity addresses arrive as URLs (``amqps://host:port/queue``): scheme and host go;
- every delivery carries a header written here with every field (Proton leaves out a zero
  ``delivery-count``, and the SDK then reports ``None``), and the annotations
  ``x-opt-sequence-number``, ``x-opt-enqueued-time``, ``x-opt-locked-until``;
- the delivery tag *is* the lock token (``UUID.bytes_le``); it is kept beside the delivery
  and never read back (Proton's ``Delivery.tag`` decodes tags as UTF-8);
- peek-lock receivers use settle mode *second*: the outcome the client sends (accepted,
  modified, rejected, released) is echoed in the settling disposition, or the SDK reports
  that the service did not confirm the settlement;
- ``<entity>/$management``: ``com.microsoft:renew-lock``, ``update-disposition`` (how the SDK
  settles once its receive link is gone) and ``peek-message``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from proton import (
    Array,
    Condition,
    Data,
    Delivery,
    Endpoint,
    Handler,
    Link,
    Message,
    Terminus,
    symbol,
    timestamp,
    ulong,
)
from proton.reactor import Container

from localbus.entities import Entity, LockLost, QueueConfig, make_queue

log = logging.getLogger("localbus")

#: Service Bus Standard's largest message: a bigger one is refused with
#: ``amqp:link:message-size-exceeded`` (the SDK's ``MessageSizeExceededError``).
MAX_MESSAGE_SIZE = 256 * 1024
SWEEP_SECONDS = 0.2
SCHEDULED = symbol("x-opt-scheduled-enqueue-time")
CREDIT_WINDOW = 200
LOCK_LOST = "com.microsoft:message-lock-lost"
NOT_FOUND = "amqp:not-found"
NOT_IMPLEMENTED = "amqp:not-implemented"
DEAD_LETTER = "com.microsoft:dead-letter"
CBS = "$cbs"
EMPTY_HEADER = b"\x00\x53\x70\x45"  # described(0x70, list0)
MANAGEMENT = "/$management"
#: update-disposition's ``disposition-status`` values (the SDK's names).
COMPLETED, ABANDONED, SUSPENDED, DEFERRED = "completed", "abandoned", "suspended", "defered"


def node_path(address: str | None) -> str:
    """``amqps://host:5671/orders/$DeadLetterQueue`` -> ``orders/$DeadLetterQueue``."""
    if not address:
        return ""
    if "://" in address:
        address = urlsplit(address).path
    return address.strip("/")


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _header(ttl_ms: int | None, delivery_count: int, durable: bool, priority: int) -> bytes:
    """The header section with every field present (see the module docstring)."""
    data = Data()
    data.put_described()
    data.enter()
    data.put_ulong(0x70)
    data.put_list()
    data.enter()
    data.put_bool(durable)
    data.put_ubyte(priority)
    if ttl_ms:
        data.put_uint(ttl_ms)
    else:
        data.put_null()
    data.put_bool(False)  # first-acquirer
    data.put_uint(delivery_count)
    data.exit()
    data.exit()
    return data.encode()


@dataclass
class Payload:
    """A stored message: the client's message without its header (kept apart)."""

    message: Message
    durable: bool
    priority: int

    @classmethod
    def of(cls, message: Message) -> Payload:
        durable, priority = bool(message.durable), int(message.priority)
        message.durable, message.priority, message.ttl = False, 4, 0
        message.first_acquirer, message.delivery_count = False, 0
        return cls(message, durable, priority)


def encode(stored: Any, locked_until: float | None) -> bytes:
    """The bytes of ``stored`` (an ``entities.Stored``) as the SDK receives them."""
    payload: Payload = stored.payload
    message: Any = payload.message  # Proton's annotations are narrower than what it takes
    annotations = dict(message.annotations or {})
    annotations[symbol("x-opt-sequence-number")] = int(stored.sequence_number)
    annotations[symbol("x-opt-enqueued-time")] = timestamp(int(stored.enqueued_at * 1000))
    if locked_until:
        annotations[symbol("x-opt-locked-until")] = timestamp(int(locked_until * 1000))
    properties = dict(message.properties or {})
    if stored.dead_letter_reason is not None or stored.dead_letter_description is not None:
        properties["DeadLetterReason"] = stored.dead_letter_reason or ""
        properties["DeadLetterErrorDescription"] = stored.dead_letter_description or ""
    saved = message.annotations, message.properties
    message.annotations, message.properties = annotations, properties
    try:
        body = bytes(message.encode())
    finally:
        message.annotations, message.properties = saved
    # Proton writes an empty header (its fields are all defaults here): ours replaces it.
    if body.startswith(EMPTY_HEADER):
        body = body[len(EMPTY_HEADER) :]
    ttl_ms = int(stored.ttl * 1000) if stored.ttl else None
    return _header(ttl_ms, stored.delivery_count, payload.durable, payload.priority) + body


@dataclass
class Outgoing:
    """What a delivery we sent stands for (kept as an attribute of the Proton delivery)."""

    entity: Entity
    token: uuid.UUID | None  # None: receive-and-delete, already settled


class Broker(Handler):
    """The reactor's handler. ``queues``: the only entities that exist."""

    def __init__(self, queues: list[QueueConfig], host: str = "127.0.0.1", port: int = 0):
        super().__init__()
        self.queues = queues
        self.host, self.port = host, port
        self.entities: dict[str, Entity] = {}  # by lower-case path
        self.consumers: dict[str, list[Any]] = {}  # entity path -> receivers' links
        self.replies: dict[int, list[Message]] = {}  # id(reply link) -> answers waiting
        self.sequence = 0
        self.bound_port = 0
        self.container: Container | None = None
        self.on_ready: Callable[[int], None] | None = None  # called with the port, listening
        for config in self.queues:
            queue = make_queue(config)
            assert queue.dead_letters is not None
            for entity in (queue, queue.dead_letters):
                self.entities[entity.path.lower()] = entity
                self.consumers[entity.path] = []

    # -- running ---------------------------------------------------------------------------

    def on_reactor_init(self, event: Any) -> None:
        acceptor = event.container.acceptor(self.host, self.port)
        # Proton has no accessor for the port it bound (port 0: a free one).
        self.bound_port = int(acceptor._selectable._delegate.getsockname()[1])
        event.container.schedule(SWEEP_SECONDS, self)
        if self.on_ready is not None:
            self.on_ready(self.bound_port)

    def on_timer_task(self, event: Any) -> None:
        now = time.time()
        for entity in self.entities.values():
            entity.activate(now)
            entity.expire(now)
            self._pump(entity)
        event.container.schedule(SWEEP_SECONDS, self)

    def _wake_at(self, entity: Entity, at: float) -> None:
        """Enqueue ``entity``'s scheduled messages at ``at`` and deliver them (never before:
        a timer that fires early is set again for the rest)."""
        broker = self

        class Wake(Handler):
            def on_timer_task(self, event: Any) -> None:
                now = time.time()
                if now < at:
                    event.container.schedule(at - now, self)
                    return
                entity.activate(now)
                broker._pump(entity)

        if self.container is not None:
            self.container.schedule(max(at - time.time(), 0.0), Wake())

    def on_connection_bound(self, event: Any) -> None:
        sasl = event.transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")

    # -- endpoints -------------------------------------------------------------------------

    def on_connection_remote_open(self, event: Any) -> None:
        event.connection.open()

    def on_connection_remote_close(self, event: Any) -> None:
        event.connection.close()

    def on_session_remote_open(self, event: Any) -> None:
        event.session.open()

    def on_session_remote_close(self, event: Any) -> None:
        event.session.close()

    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        address = link.remote_target.address if link.is_receiver else link.remote_source.address
        path = node_path(address)
        if link.is_receiver:
            link.target.address = address
        else:
            link.source.address = address
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        link.max_message_size = MAX_MESSAGE_SIZE
        kind = self._kind(path)
        if kind is None:  # refused: an attach without the terminus, then the error
            if link.is_receiver:
                link.target.address = None
                link.target.type = Terminus.UNSPECIFIED
            else:
                link.source.address = None
                link.source.type = Terminus.UNSPECIFIED
            link.open()
            link.condition = Condition(
                NOT_FOUND,
                f"The messaging entity '{address}' could not be found. "
                f"(localbus has: {', '.join(q.name for q in self.queues)})",
            )
            link.close()
            return
        link.localbus_path = path
        link.localbus_kind = kind
        link.open()
        if link.is_receiver:
            link.flow(CREDIT_WINDOW)
        elif kind == "queue":
            self.consumers[self._entity(path).path].append(link)

    def _kind(self, path: str) -> str | None:
        if path.lower() == CBS:
            return "cbs"
        if path.lower().endswith(MANAGEMENT):
            return "management" if path[: -len(MANAGEMENT)].lower() in self.entities else None
        return "queue" if path.lower() in self.entities else None

    def _entity(self, path: str) -> Entity:
        return self.entities[path.lower()]

    def on_link_remote_close(self, event: Any) -> None:
        self._forget(event.link)
        event.link.close()

    def on_link_final(self, event: Any) -> None:
        self._forget(event.link)

    def _forget(self, link: Any) -> None:
        # Unsettled deliveries keep their locks: the messages come back when the locks
        # lapse, or are settled through $management meanwhile (as in Service Bus).
        for links in self.consumers.values():
            if link in links:
                links.remove(link)
        self.replies.pop(id(link), None)

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        log.info("connection error: %s", condition.description if condition else "?")

    def on_transport_closed(self, event: Any) -> None:
        connection = event.connection
        if connection is None:
            return
        link = connection.link_head(0)
        while link is not None:
            self._forget(link)
            link = link.next(0)

    # -- flow and deliveries ---------------------------------------------------------------

    def on_link_flow(self, event: Any) -> None:
        link = event.link
        if not link.is_sender:
            return
        kind = getattr(link, "localbus_kind", None)
        if kind == "queue":
            self._pump(self._entity(link.localbus_path))
        elif kind is not None:
            self._flush_replies(link)
        if link.drain_mode:
            link.drained()

    def on_delivery(self, event: Any) -> None:
        delivery, link = event.delivery, event.link
        if link.is_receiver:
            self._incoming(link, delivery)
        else:
            self._outcome(delivery)

    def _incoming(self, link: Any, delivery: Any) -> None:
        if not delivery.readable or delivery.partial:
            return
        data = link.recv(delivery.pending)
        link.advance()
        if link.credit < CREDIT_WINDOW // 2:
            link.flow(CREDIT_WINDOW - link.credit)
        if len(data) > MAX_MESSAGE_SIZE:  # what Service Bus Standard answers
            self._settle(
                delivery,
                Delivery.REJECTED,
                Condition(
                    "amqp:link:message-size-exceeded",
                    f"The received message is {len(data)} bytes; the limit is "
                    f"{MAX_MESSAGE_SIZE} bytes.",
                ),
            )
            return
        message = Message()
        try:
            message.decode(data)
        except Exception as error:  # noqa: BLE001 - a malformed message is refused
            self._settle(delivery, Delivery.REJECTED, Condition("amqp:decode-error", str(error)))
            return
        kind = getattr(link, "localbus_kind", None)
        if kind == "queue":
            entity = self._entity(link.localbus_path)
            if entity.is_dead_letter_queue:
                self._settle(
                    delivery,
                    Delivery.REJECTED,
                    Condition(NOT_IMPLEMENTED, "cannot send to a dead-letter queue"),
                )
                return
            self._enqueue(entity, message)
            self._settle(delivery, Delivery.ACCEPTED)
            self._pump(entity)
            return
        self._settle(delivery, Delivery.ACCEPTED)
        if kind == "cbs":
            self._reply(link, message, 200, "OK", None)
        elif kind == "management":
            self._management(link, message)

    def _enqueue(self, entity: Entity, message: Message) -> None:
        ttl = (message.ttl or 0) or None  # Proton gives seconds
        message_id = message.id
        payload = Payload.of(message)
        self.sequence += 1
        key = None if message_id is None else str(_text(message_id))
        annotations: dict[Any, Any] = dict(message.annotations or {})
        scheduled = annotations.get(SCHEDULED)
        at = int(scheduled) / 1000 if isinstance(scheduled, int) else None
        now = time.time()
        stored = entity.enqueue(payload, key, ttl, now, self.sequence, scheduled_at=at)
        if stored is not None and stored.sequence_number in entity.scheduled:
            self._wake_at(entity, stored.enqueued_at)

    @staticmethod
    def _settle(delivery: Any, outcome: int, condition: Condition | None = None) -> None:
        if condition is not None:
            # With every field: the SDK reads a rejected error's info by position.
            if not condition.info:
                condition = Condition(
                    condition.name, condition.description, {symbol("localbus"): True}
                )
            delivery.local.condition = condition
        delivery.update(outcome)
        delivery.settle()

    def _pump(self, entity: Entity) -> None:
        """Deliver waiting messages to the entity's receivers that have credit, in turn."""
        links = self.consumers.get(entity.path, [])
        while links:
            ready = [
                link for link in links if link.credit > 0 and link.state & Endpoint.LOCAL_ACTIVE
            ]
            if not ready:
                return
            progressed = False
            for link in ready:
                peek_lock = link.snd_settle_mode != Link.SND_SETTLED
                stored = entity.take(time.time(), lock=peek_lock)
                if stored is None:
                    return
                token = stored.lock_token or uuid.uuid4()
                delivery = link.delivery(token.bytes_le)
                delivery.localbus = Outgoing(entity, stored.lock_token)
                link.send(encode(stored, stored.locked_until if peek_lock else None))
                link.advance()
                if not peek_lock:
                    delivery.settle()
                progressed = True
            if not progressed:
                return

    def _outcome(self, delivery: Any) -> None:
        """The client settled (or updated) a delivery we sent: apply it and echo it."""
        outgoing: Outgoing | None = getattr(delivery, "localbus", None)
        if outgoing is None or outgoing.token is None:
            if delivery.settled:
                delivery.settle()
            return
        state = delivery.remote_state
        if state not in (
            Delivery.ACCEPTED,
            Delivery.REJECTED,
            Delivery.RELEASED,
            Delivery.MODIFIED,
        ):
            return
        entity, token = outgoing.entity, outgoing.token
        now = time.time()
        try:
            if state == Delivery.ACCEPTED:
                entity.complete(token, now)
            elif state == Delivery.RELEASED:
                entity.release(token, now)
            elif state == Delivery.REJECTED:
                reason, description = _dead_letter_details(delivery.remote.condition)
                entity.dead_letter(token, now, reason, description)
            elif delivery.remote.undeliverable:  # modified + undeliverable-here: defer
                raise NotImplementedError
            else:
                entity.abandon(token, now)
        except LockLost as error:
            self._settle(delivery, Delivery.REJECTED, Condition(LOCK_LOST, str(error)))
        except NotImplementedError:
            self._settle(
                delivery, Delivery.REJECTED, Condition(NOT_IMPLEMENTED, "localbus does not defer")
            )
        else:
            if state == Delivery.MODIFIED:
                delivery.local.failed = delivery.remote.failed
                delivery.local.undeliverable = delivery.remote.undeliverable
            self._settle(delivery, state)
        delivery.localbus = Outgoing(entity, None)
        self._pump(entity)

    # -- $cbs and $management --------------------------------------------------------------

    def _reply(self, link: Any, request: Message, status: int, description: str, body: Any) -> None:
        """Answer ``request`` on the link the client attached from the same node."""
        properties: dict[str, Any] = {
            "status-code": status,
            "statusCode": status,
            "status-description": description,
            "statusDescription": description,
        }
        if status >= 300:
            condition = symbol(_CONDITIONS.get(status, NOT_FOUND))
            properties["errorCondition"] = properties["error-condition"] = condition
        response: Any = Message(body=body)
        response.correlation_id = request.id
        response.properties = properties
        reply_link = self._reply_link(link, request.reply_to)
        if reply_link is None:
            log.warning("no link to answer %s on %s", request.id, link.localbus_path)
            return
        self.replies.setdefault(id(reply_link), []).append(response)
        self._flush_replies(reply_link)

    def _reply_link(self, link: Any, reply_to: str | None) -> Any:
        path = link.localbus_path.lower()
        found = None
        candidate = link.connection.link_head(Endpoint.LOCAL_ACTIVE)
        while candidate is not None:
            if candidate.is_sender and getattr(candidate, "localbus_path", "").lower() == path:
                if reply_to and candidate.remote_target.address == reply_to:
                    return candidate
                found = found or candidate
            candidate = candidate.next(Endpoint.LOCAL_ACTIVE)
        return found

    def _flush_replies(self, link: Any) -> None:
        waiting = self.replies.get(id(link), [])
        while waiting and link.credit > 0:
            response = waiting.pop(0)
            delivery = link.delivery(uuid.uuid4().bytes)
            link.send(response.encode())
            link.advance()
            delivery.settle()

    def _management(self, link: Any, request: Message) -> None:
        entity = self._entity(link.localbus_path[: -len(MANAGEMENT)])
        properties: dict[Any, Any] = dict(request.properties or {})
        operation = str(_text(properties.get("operation", "")))
        raw: Any = request.body if isinstance(request.body, dict) else {}
        body: dict[str, Any] = {str(_text(k)): v for k, v in raw.items()}
        now = time.time()
        try:
            if operation == "com.microsoft:renew-lock":
                expirations = [entity.renew(token, now) for token in _tokens(body)]
                answer = {"expirations": Array(0, Data.TIMESTAMP, *map(_ms, expirations))}
                self._reply(link, request, 200, "OK", answer)
            elif operation == "com.microsoft:update-disposition":
                self._update_disposition(entity, body, now)
                self._reply(link, request, 200, "OK", {})
            elif operation == "com.microsoft:peek-message":
                start = int(body.get("from-sequence-number", 0))
                count = int(body.get("message-count", 1))
                found = entity.peek(start, count)
                if not found:
                    self._reply(link, request, 204, "No messages", None)
                else:
                    messages = [{"message": encode(s, None)} for s in found]
                    self._reply(link, request, 200, "OK", {"messages": messages})
            else:
                self._reply(link, request, 501, f"localbus does not do {operation!r}", None)
        except LockLost as error:
            self._reply(link, request, 410, str(error), None)
        self._pump(entity)

    @staticmethod
    def _update_disposition(entity: Entity, body: dict[str, Any], now: float) -> None:
        status = str(_text(body.get("disposition-status", "")))
        for token in _tokens(body):
            if status == COMPLETED:
                entity.complete(token, now)
            elif status == ABANDONED:
                entity.abandon(token, now)
            elif status == SUSPENDED:
                reason = _text(body.get("deadletter-reason")) or None
                description = _text(body.get("deadletter-description")) or None
                entity.dead_letter(token, now, reason, description)
            else:
                raise LockLost(f"localbus does not do disposition {status!r}")


_CONDITIONS = {410: LOCK_LOST, 404: NOT_FOUND, 501: NOT_IMPLEMENTED}


def _ms(seconds: float) -> timestamp:
    return timestamp(int(seconds * 1000))


def _tokens(body: dict[str, Any]) -> Iterable[uuid.UUID]:
    raw = body.get("lock-tokens")
    values = raw.elements if isinstance(raw, Array) else (raw or [])
    return [value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)) for value in values]


def _dead_letter_details(condition: Condition | None) -> tuple[str | None, str | None]:
    if condition is None:
        return None, None
    raw: Any = condition.info or {}
    info = {str(_text(k)): _text(v) for k, v in raw.items()}
    reason = info.get("DeadLetterReason")
    description = info.get("DeadLetterErrorDescription") or condition.description
    if reason is None and str(condition.name) != DEAD_LETTER:
        reason = str(condition.name)
    return reason, description


def run(broker: Broker) -> Container:
    """A container for ``broker`` (call ``.run()`` on it, on the thread that owns it)."""
    container = Container(broker)
    container.container_id = "localbus"
    broker.container = container
    return container


__all__ = ["Broker", "encode", "node_path", "run", "ulong"]
