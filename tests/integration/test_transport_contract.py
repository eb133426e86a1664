"""The ``AgentTransport`` contract (``core/ports.py``), one suite run on both adapters:
``StorageQueueTransport`` on Azurite and ``ServiceBusTransport`` on localbus (the local
Service Bus double, through the real azure-servicebus SDK; a real namespace instead when
``SERVICEBUS_TEST_CONNECTION`` is set: ``make test-servicebus``, tests/localbus/target.py).
There is no in-memory twin of this port: the unit tests' transports only record what they
are given (tests/unit/test_services_in_memory.py), they deliver nothing.

Each test sends through the adapter as the app builds it and receives as the agent's or
the reply handler's trigger does (``Receiver``): the body, the ids, the time to live, and
the delivery count as the function sees it (1 the first time, on both: devhost's mapping
for Service Bus, ``devhost.servicebus.host_message``). Where the adapters differ by
design, the fixture states it (``Adapter``'s capabilities) and the test checks each side
of the difference; nothing is skipped.

What the port does not promise, and so is not here: delayed sends (an agent request is
due at once; a step that must wait is delayed on the ``order-dispatch`` queue, a
``QueueSender``); poison and dead-letter handling (the Functions host's and the broker's:
tests/integration/test_devhost.py, tests/localbus/test_devhost_listener.py and
test_contract.py, tests/integration/test_poison_alerts.py); the broker's own rules
(tests/localbus/test_contract.py).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from config.settings import Connection
from core.errors import StorageUnavailable
from core.messages import MAX_INLINE_ORDER_BYTES, AgentRequest
from core.names import Names
from core.outcome import Applied
from core.ports import AgentTransport
from messaging.storage_queues import REPLY_TTL_SECONDS, REQUEST_LATE_SECONDS
from messaging.wire import decode_reply, decode_request
from tests.localbus.target import Target, open_target
from tests.support import make_context

pytestmark = pytest.mark.timeout(120)

#: The agents whose queues the suite sends to; ``carrier``'s queue stands for "another
#: queue" where a reply is addressed elsewhere (on a namespace, one infra/ creates).
AGENT, OTHER_AGENT, ELSEWHERE_AGENT = "orders", "inventory", "carrier"


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Delivered:
    """One message as the trigger's function gets it."""

    body: str
    deliveries: int  # the function's delivery count: 1 the first time
    message_id: str | None
    correlation_id: str | None
    reply_to: str | None
    ttl_seconds: float | None  # the time to live it was sent with
    properties: dict[str, Any]
    content_type: str | None
    handle: Any  # the SDK's message, to settle or release

    @property
    def order_id(self) -> str | None:
        try:
            value = json.loads(self.body)
        except ValueError:
            return None
        return value.get("orderId") if isinstance(value, dict) else None


class Receiver:
    """The receiving side of an adapter: peek-lock (leased) receives filtered to this
    test's orders, then complete (``settle``) or hand back for a redelivery (``release``,
    what the host does when a function fails). Messages of other orders met on a shared
    queue (a real namespace) are handed back at the end of the test."""

    quiet: float  # how long a receive that finds nothing lasts before "nothing is there"

    def __init__(self) -> None:
        self._others: list[tuple[str, Delivered]] = []

    def receive(self, queue: str, wait: float) -> list[Delivered]:
        raise NotImplementedError

    def settle(self, queue: str, message: Delivered) -> None:
        raise NotImplementedError

    def release(self, queue: str, message: Delivered) -> None:
        raise NotImplementedError

    def take(
        self, queue: str, order_ids: set[str], count: int, within: float = 15.0
    ) -> list[Delivered]:
        """Up to ``count`` messages of ``order_ids`` from ``queue``, leased, within
        ``within`` seconds (fewer if fewer come)."""
        ours: list[Delivered] = []
        deadline = time.monotonic() + within
        while len(ours) < count and time.monotonic() < deadline:
            wait = max(0.2, min(2.0, deadline - time.monotonic()))
            for message in self.receive(queue, wait):
                if message.order_id in order_ids:
                    ours.append(message)
                else:
                    self._others.append((queue, message))
        return ours

    def take_settled(
        self, queue: str, order_ids: set[str], count: int, within: float = 15.0
    ) -> list[Delivered]:
        found = self.take(queue, order_ids, count, within)
        for message in found:
            self.settle(queue, message)
        return found

    def nothing(self, queue: str, order_ids: set[str]) -> bool:
        """True if no message of ``order_ids`` comes within ``quiet``."""
        return not self.take_settled(queue, order_ids, 1, within=self.quiet)

    def hand_back_others(self) -> None:
        for queue, message in self._others:
            with suppress(Exception):
                self.release(queue, message)
        self._others.clear()


class StorageReceiver(Receiver):
    """What the queue trigger does on a Storage queue (devhost/queues.py): lease a
    message (``visibility_timeout``), delete it on success, make it visible at once on
    failure (host.json ``visibilityTimeout`` 0)."""

    quiet = 0.5  # a message is visible once its send returns

    def __init__(self, client_for: Callable[[str], Any]) -> None:
        super().__init__()
        self._client_for = client_for

    def receive(self, queue: str, wait: float) -> list[Delivered]:
        client = self._client_for(queue)
        batch = list(client.receive_messages(max_messages=32, visibility_timeout=60))
        if not batch:
            time.sleep(min(wait, 0.2))
        return [
            Delivered(
                body=m.content,
                deliveries=int(m.dequeue_count),
                message_id=m.id,
                correlation_id=None,
                reply_to=None,
                ttl_seconds=(m.expires_on - m.inserted_on).total_seconds(),
                properties={},
                content_type=None,
                handle=m,
            )
            for m in batch
        ]

    def settle(self, queue: str, message: Delivered) -> None:
        self._client_for(queue).delete_message(message.handle)

    def release(self, queue: str, message: Delivered) -> None:
        self._client_for(queue).update_message(message.handle, visibility_timeout=0)


class ServiceBusReceiver(Receiver):
    """What the Service Bus trigger does (devhost/servicebus.py): a peek-lock receiver per
    queue, complete on success, abandon on failure; the function's view of a message
    through devhost's own mapping (``host_message``: the delivery count as the
    Functions host gives it). One per test, on the module's client: a receiver left open
    keeps link credit, and the broker then hands it (locks) each new message at once, as
    it would a listening agent."""

    def __init__(self, client: Any, quiet: float) -> None:
        super().__init__()
        self.quiet = quiet
        self._client = client
        self._receivers: dict[str, Any] = {}

    def _receiver(self, queue: str) -> Any:
        if queue not in self._receivers:
            self._receivers[queue] = self._client.get_queue_receiver(
                queue, max_wait_time=2.0, prefetch_count=0
            )
        return self._receivers[queue]

    def receive(self, queue: str, wait: float) -> list[Delivered]:
        from devhost.servicebus import host_message

        batch = self._receiver(queue).receive_messages(max_message_count=20, max_wait_time=wait)
        delivered = []
        for message in batch:
            seen = host_message(message)
            assert seen.delivery_count is not None, f"{seen.message_id} has no delivery count"
            ttl = message.time_to_live  # the broker's; the host does not pass it on
            delivered.append(
                Delivered(
                    body=seen.body.decode("utf-8"),
                    deliveries=seen.delivery_count,
                    message_id=seen.message_id,
                    correlation_id=seen.correlation_id,
                    reply_to=seen.reply_to,
                    ttl_seconds=None if ttl is None else ttl.total_seconds(),
                    properties=dict(seen.application_properties),
                    content_type=seen.content_type,
                    handle=message,
                )
            )
        return delivered

    def settle(self, queue: str, message: Delivered) -> None:
        self._receiver(queue).complete_message(message.handle)

    def release(self, queue: str, message: Delivered) -> None:
        self._receiver(queue).abandon_message(message.handle)

    def close(self) -> None:
        from devhost.servicebus import close_within

        self.hand_back_others()
        for receiver in self._receivers.values():
            close_within(receiver, 0.0)  # detaching takes ~0.7 s each: in the background
        self._receivers.clear()


@dataclass
class Adapter:
    """One adapter of the port, how its messages are received, and what it does by design
    that the other does not (each test that meets a difference checks both sides)."""

    name: str
    transport: AgentTransport
    names: Names
    receiver: Receiver
    #: Builds the same adapter on a broker that does not answer (connections refused).
    unreachable: Callable[[], AgentTransport]
    #: Service Bus: ``message_id``, ``correlation_id``, ``reply_to`` and application
    #: properties per docs/contracts.md §3.3. Storage queues carry a body and nothing
    #: else: the ids travel in the body (both carry them there).
    message_properties: bool
    #: Service Bus duplicate detection (infra/app/servicebus.bicep): a second message with
    #: the same ``message_id`` is accepted and dropped. Storage queues deliver every copy.
    drops_duplicate_ids: bool
    #: How long a request lives past its step's deadline: Storage, an hour (a late agent
    #: answers "not called", messaging/storage_queues.py); Service Bus, nothing (time to
    #: live = the time left, §3.3; one that expires unread is reported by the dead-letter
    #: trigger, supervisor/expired.py).
    request_outlives_deadline_seconds: int
    #: Storage creates a queue on its first message (a new ``replyTo``); a Service Bus
    #: queue exists only if declared (infra/), so a send elsewhere is refused, not lost.
    creates_missing_queues: bool
    #: run at the end, newest first (what they return is ignored)
    closers: list[Callable[[], object]] = field(default_factory=list)


# --- the two adapters --------------------------------------------------------------------


@dataclass
class Bus:
    """The Service Bus side, once per module: the adapter and a client on one localbus (or
    the namespace), whose queues are those of the agents the suite uses; the lock as infra/
    sets it (30 s), so a busy machine never redelivers mid-test."""

    target: Target
    names: Names
    transport: Any  # messaging.servicebus.ServiceBusTransport
    client: Any  # azure.servicebus.ServiceBusClient, for the tests' receivers


@pytest.fixture(scope="module")
def bus() -> Iterator[Bus]:
    from devhost.servicebus import close_within
    from messaging.servicebus import ServiceBusTransport

    names = Names()  # the queues are declared (localbus, infra/): the app's own names
    more = (names.agent_queue(OTHER_AGENT), names.agent_queue(ELSEWHERE_AGENT))
    with open_target(more_queues=more, lock_seconds=30.0) as target:
        transport = ServiceBusTransport(target.new_client, names, utc_now)
        client = target.new_client()
        try:
            yield Bus(target, names, transport, client)
        finally:
            close_within(client)
            close_within(transport)


def refused_port() -> tuple[socket.socket, int]:
    """A port bound and not listening (held until closed): connections are refused."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    return held, int(held.getsockname()[1])


def storage_adapter(request: pytest.FixtureRequest) -> Adapter:
    from bootstrap import clients
    from messaging.storage_queues import StorageQueues, StorageQueueTransport

    connection = request.getfixturevalue("storage_connection")
    ctx = make_context(connection, request.getfixturevalue("tag"))  # the app's wiring
    receiver = StorageReceiver(ctx.queues.client)
    closers: list[Callable[[], object]] = [receiver.hand_back_others]

    def unreachable() -> AgentTransport:
        held, port = refused_port()
        closers.append(held.close)
        endpoint = f"QueueEndpoint=http://127.0.0.1:{port}/devstoreaccount1"
        dead = re.sub(r"QueueEndpoint=[^;]*", endpoint, connection)
        service = clients.queue_service(Connection("AzureWebJobsStorage", connection_string=dead))
        return StorageQueueTransport(StorageQueues(service), ctx.names, utc_now)

    return Adapter(
        "storage",
        ctx.transport,
        ctx.names,
        receiver,
        unreachable,
        message_properties=False,
        drops_duplicate_ids=False,
        request_outlives_deadline_seconds=REQUEST_LATE_SECONDS,
        creates_missing_queues=True,
        closers=closers,
    )


def servicebus_adapter(request: pytest.FixtureRequest) -> Adapter:
    from devhost.servicebus import close_within
    from localbus import connection_string
    from messaging.servicebus import ServiceBusTransport, client_for

    bus: Bus = request.getfixturevalue("bus")
    receiver = ServiceBusReceiver(bus.client, bus.target.quiet)
    closers: list[Callable[[], object]] = [receiver.close]

    def unreachable() -> AgentTransport:
        held, port = refused_port()
        dead = Connection(
            "ServiceBusConnection", connection_string=connection_string("127.0.0.1", port)
        )
        sender = ServiceBusTransport(lambda: client_for(dead), bus.names, utc_now)
        # Closing a client that never connected can take seconds: in the background.
        closers.extend([lambda: close_within(sender, 0.5), held.close])
        return sender

    return Adapter(
        "servicebus",
        bus.transport,
        bus.names,
        receiver,
        unreachable,
        message_properties=True,
        drops_duplicate_ids=True,
        request_outlives_deadline_seconds=0,
        creates_missing_queues=False,
        closers=closers,
    )


@pytest.fixture(
    params=[
        pytest.param("storage", id="storage"),
        pytest.param("servicebus", id="servicebus", marks=pytest.mark.servicebus),
    ]
)
def adapter(request: pytest.FixtureRequest) -> Iterator[Adapter]:
    built = storage_adapter(request) if request.param == "storage" else servicebus_adapter(request)
    try:
        yield built
    finally:
        for close in reversed(built.closers):
            with suppress(Exception):
                close()


# --- helpers -----------------------------------------------------------------------------


def new_order_id() -> str:
    return "tc-" + uuid.uuid4().hex[:16]


def whole_ms(at: datetime) -> datetime:
    return at.replace(microsecond=at.microsecond // 1000 * 1000)  # what the JSON keeps


def make_request(
    order_id: str | None = None,
    *,
    seconds: float = 60,
    attempt: int = 1,
    agent: str = AGENT,
    step: str = "process",
    order: dict[str, Any] | None = None,
) -> AgentRequest:
    order_id = order_id or new_order_id()
    return AgentRequest(
        order_id,
        step,
        attempt,
        whole_ms(utc_now() + timedelta(seconds=seconds)),
        step,
        order if order is not None else {"orderId": order_id, "qty": 1},
        {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
        agent=agent,
    )


def requests_of(adapter: Adapter, agent: str = AGENT) -> str:
    return adapter.names.agent_queue(agent)


# --- the contract ------------------------------------------------------------------------


def test_a_request_reaches_its_own_agents_queue_with_its_body_intact(adapter: Adapter) -> None:
    """Each agent's requests go to ``agent-requests-<agent>`` and nowhere else, at once
    (no delay), and decode to the request sent: ids, deadline, path, the order's JSON
    (non-ASCII, control characters, big numbers), the trace context, ``singledOut``."""
    order_id = new_order_id()
    order = {
        "orderId": order_id,
        "note": "Grüße, 東京 \U0001f680 \x00\t\n",
        "big": 10**30,
        "items": [{"sku": "A-1", "qty": 2}],
    }
    first = replace(make_request(order_id, order=order), singled_out=True)
    second = make_request(order_id, agent=OTHER_AGENT, step="reserve-stock")
    receiver = adapter.receiver

    assert adapter.transport.send_request(first) is True
    assert adapter.transport.send_request(second) is True

    [got] = receiver.take_settled(requests_of(adapter), {order_id}, 1)
    [got_other] = receiver.take_settled(requests_of(adapter, OTHER_AGENT), {order_id}, 1)
    assert decode_request(got.body) == first
    assert decode_request(got_other.body) == second
    assert receiver.nothing(requests_of(adapter), {order_id})
    assert receiver.nothing(requests_of(adapter, OTHER_AGENT), {order_id})


def test_requests_and_replies_carry_the_ids_of_contract_3_3(adapter: Adapter) -> None:
    """Both: the body carries ``orderId``, ``step``, ``attempt`` and ``idempotencyKey``
    (stable across attempts), which is what a reply is matched on. Service Bus also:
    ``message_id`` = ``<orderId>:<step>:<attempt>``, ``reply_to`` = the reply queue,
    a reply's ``correlation_id`` = its request's ``message_id``, the ids as application
    properties. Storage queues have no such properties (the queue's own message id is
    not the contract's)."""
    request = make_request(attempt=3)
    order_id, receiver = request.order_id, adapter.receiver

    adapter.transport.send_request(request)
    [got] = receiver.take_settled(requests_of(adapter), {order_id}, 1)
    reply = decode_request(got.body).succeeded({"done": True})
    assert adapter.transport.send_reply(reply) is True
    [answer] = receiver.take_settled(adapter.names.agent_replies, {order_id}, 1)

    sent = json.loads(got.body)
    assert (sent["orderId"], sent["step"], sent["attempt"]) == (order_id, "process", 3)
    assert sent["idempotencyKey"] == f"{order_id}:process"
    assert decode_reply(answer.body) == reply
    assert decode_reply(answer.body).message_id == f"{order_id}:process:3"
    if adapter.message_properties:
        assert got.message_id == f"{order_id}:process:3"
        assert got.reply_to == adapter.names.agent_replies
        assert got.content_type == "application/json"
        assert answer.message_id != got.message_id  # every report is its own message
        assert answer.correlation_id == got.message_id
        assert {k: got.properties.get(k) for k in ("orderId", "step", "attempt")} == {
            "orderId": order_id,
            "step": "process",
            "attempt": 3,
        }
        assert got.properties.get("traceparent") == request.trace["traceparent"]
        assert answer.properties.get("outcome") == "succeeded"
    else:
        assert got.message_id != f"{order_id}:process:3"
        assert (got.correlation_id, got.reply_to, got.properties) == (None, None, {})
        assert (answer.correlation_id, answer.reply_to, answer.properties) == (None, None, {})


def test_every_report_of_an_attempt_arrives_even_alike_ones(adapter: Adapter) -> None:
    """Reports of one attempt that look alike carry different evidence: the first copy's
    "transient, not applied" and a redelivered copy's "transient, may have applied"; a
    Python handler's renewals, then its end. The Service Bus queues have duplicate
    detection on (infra/app/servicebus.bicep; localbus is configured the same), which drops
    a message whose id it saw within ten minutes: no two reports may share one."""
    request = make_request(attempt=2)
    order_id, receiver = request.order_id, adapter.receiver
    reports = [
        request.transient("process: HTTP 503", Applied.NO),
        request.transient("process: HTTP 500", Applied.MAYBE),
        request.transient(
            "still runs", Applied.MAYBE, running_until=request.complete_by, runner="r"
        ),
        request.transient(
            "still runs", Applied.MAYBE, running_until=request.complete_by, runner="r"
        ),
        request.succeeded({"late": True}),
        request.succeeded({"late": True}),
    ]
    for report in reports:
        assert adapter.transport.send_reply(report) is True
    got = receiver.take_settled(adapter.names.agent_replies, {order_id}, len(reports))
    assert sorted(decode_reply(g.body).error or "" for g in got) == sorted(
        r.error or "" for r in reports
    )


def test_a_reply_goes_to_the_default_reply_queue_or_the_one_it_is_addressed_to(
    adapter: Adapter,
) -> None:
    request = make_request()
    order_id, receiver = request.order_id, adapter.receiver
    elsewhere = adapter.names.agent_queue(ELSEWHERE_AGENT)
    home = request.refused("HTTP 422 declined", settled=True)
    away = request.deferred("circuit open", whole_ms(utc_now() + timedelta(seconds=30)))

    assert adapter.transport.send_reply(home) is True
    assert adapter.transport.send_reply(away, elsewhere) is True

    [at_home] = receiver.take_settled(adapter.names.agent_replies, {order_id}, 1)
    [at_elsewhere] = receiver.take_settled(elsewhere, {order_id}, 1)
    assert decode_reply(at_home.body) == home
    assert decode_reply(at_elsewhere.body) == away
    assert receiver.nothing(adapter.names.agent_replies, {order_id})
    assert receiver.nothing(elsewhere, {order_id})


def test_a_reply_to_a_queue_nobody_created(adapter: Adapter) -> None:
    """Storage: the queue is created and the reply delivered (a new ``replyTo``). Service
    Bus: only declared queues exist, so the send fails as ``StorageUnavailable`` (the
    caller keeps the reply and retries), never silently lost and never an SDK error."""
    request = make_request()
    nowhere = "nobody-made-" + uuid.uuid4().hex[:10]
    reply = request.succeeded({"ok": True})

    if adapter.creates_missing_queues:
        assert adapter.transport.send_reply(reply, nowhere) is True
        [got] = adapter.receiver.take_settled(nowhere, {request.order_id}, 1)
        assert decode_reply(got.body) == reply
    else:
        with pytest.raises(StorageUnavailable, match=nowhere):
            adapter.transport.send_reply(reply, nowhere)


def test_a_request_whose_deadline_has_passed_is_not_sent(adapter: Adapter) -> None:
    """``send_request`` is False and nothing reaches the queue (a request never sent is no
    try, docs/contracts.md §3.11); a reply for the same attempt is still sent."""
    request = make_request(seconds=-0.001)

    assert adapter.transport.send_request(request) is False
    assert adapter.transport.send_reply(request.succeeded({})) is True

    assert adapter.receiver.nothing(requests_of(adapter), {request.order_id})
    assert adapter.receiver.take_settled(adapter.names.agent_replies, {request.order_id}, 1)


def test_time_to_live_a_request_its_time_left_a_reply_an_hour(adapter: Adapter) -> None:
    """A request lives until its deadline (Service Bus, §3.3), or an hour past it
    (Storage, so that a late agent still answers "not called"); a reply lives an hour
    whatever its deadline, so that a late success still counts (§3.11)."""
    request = make_request(seconds=30)
    late = make_request(request.order_id, seconds=-120, attempt=2).succeeded({})

    adapter.transport.send_request(request)
    adapter.transport.send_reply(late)
    [got] = adapter.receiver.take_settled(requests_of(adapter), {request.order_id}, 1)
    [answer] = adapter.receiver.take_settled(adapter.names.agent_replies, {request.order_id}, 1)

    expected = 30 + adapter.request_outlives_deadline_seconds
    assert got.ttl_seconds is not None and expected - 3 <= got.ttl_seconds <= expected + 1
    assert answer.ttl_seconds is not None
    assert REPLY_TTL_SECONDS - 2 <= answer.ttl_seconds <= REPLY_TTL_SECONDS + 1


def test_a_request_not_read_by_its_deadline(adapter: Adapter) -> None:
    """Service Bus: it expires unread and is never delivered (an agent would call for
    it). Storage: it is still delivered after its deadline, and its ``completeBy`` tells
    the agent not to call."""
    request = make_request(seconds=1.2)

    assert adapter.transport.send_request(request) is True
    # Past the deadline by more than a second: Storage counts time to live in whole seconds.
    time.sleep(max(0.0, (request.complete_by - utc_now()).total_seconds()) + 1.8)

    if adapter.request_outlives_deadline_seconds:
        [got] = adapter.receiver.take_settled(requests_of(adapter), {request.order_id}, 1)
        assert decode_request(got.body).complete_by < utc_now()
    else:
        assert adapter.receiver.nothing(requests_of(adapter), {request.order_id}), (
            f"{adapter.name} delivered a request past its time to live"
        )


def test_a_request_handed_back_comes_again_counted(adapter: Adapter) -> None:
    """The agent learns a redelivery from the count (an earlier delivery may have called
    the remote): 1 the first time, 2 after the function failed once, body unchanged."""
    request = make_request()
    queue, ids = requests_of(adapter), {request.order_id}

    adapter.transport.send_request(request)
    [first] = adapter.receiver.take(queue, ids, 1)
    adapter.receiver.release(queue, first)
    [second] = adapter.receiver.take(queue, ids, 1, within=10)
    adapter.receiver.settle(queue, second)

    assert (first.deliveries, second.deliveries) == (1, 2)
    assert second.body == first.body
    assert adapter.receiver.nothing(queue, ids)


def test_copies_of_one_attempt_and_reports_of_one_attempt(adapter: Adapter) -> None:
    """The same request sent twice (a retried send, a re-dispatch): Service Bus drops the
    copy (duplicate detection on ``message_id``), Storage delivers both (the reply's
    fencing makes the second harmless). On both, the next attempt is a new message, and
    a failure report and a success for the same attempt are both delivered: duplicate
    detection must never drop a success as a copy of a failure report."""
    first = make_request()
    order_id = first.order_id
    second = make_request(order_id, attempt=2)

    for request in (first, first, second):
        assert adapter.transport.send_request(request) is True
    adapter.transport.send_reply(first.transient("HTTP 503", Applied.NO))
    adapter.transport.send_reply(first.succeeded({"late": True}))

    expected = [1, 2] if adapter.drops_duplicate_ids else [1, 1, 2]
    requests = adapter.receiver.take_settled(requests_of(adapter), {order_id}, len(expected))
    assert sorted(decode_request(r.body).attempt for r in requests) == expected
    assert adapter.receiver.nothing(requests_of(adapter), {order_id}), (
        f"{requests_of(adapter)} delivered a copy of {first.message_id}: is duplicate "
        "detection (requiresDuplicateDetection) on for the queue?"
    )
    replies = adapter.receiver.take_settled(adapter.names.agent_replies, {order_id}, 2)
    assert sorted(decode_reply(r.body).outcome for r in replies) == ["succeeded", "transient"]


def test_the_largest_messages_the_app_builds_are_sent_whole_or_marked(adapter: Adapter) -> None:
    """An order body just under ``MAX_INLINE_ORDER_BYTES`` travels in its request; one
    over it travels without its order (``orderInline: false``: the agent reads it from the
    store); a 100 KB remote result is cut with a marker: every one fits its queue (a
    Storage queue message is 64 KiB)."""
    order_id = new_order_id()
    base = make_request(order_id, order={"orderId": order_id, "blob": ""})
    room = MAX_INLINE_ORDER_BYTES - len(base.encode().encode()) - 10
    fits = make_request(order_id, order={"orderId": order_id, "blob": "x" * room})
    # Over a Storage queue message (65,536 characters) if it travelled whole.
    too_big = make_request(order_id, attempt=2, order={"orderId": order_id, "blob": "y" * 70_000})
    reply = fits.succeeded({"blob": "z" * 100_000})
    assert len(fits.encode()) > MAX_INLINE_ORDER_BYTES - 100

    for request in (fits, too_big):
        assert adapter.transport.send_request(request) is True
    assert adapter.transport.send_reply(reply) is True

    got = adapter.receiver.take_settled(requests_of(adapter), {order_id}, 2)
    by_attempt = {decode_request(m.body).attempt: decode_request(m.body) for m in got}
    assert by_attempt[1] == fits
    assert by_attempt[2] == replace(too_big, order=None)
    [answer] = adapter.receiver.take_settled(adapter.names.agent_replies, {order_id}, 1)
    result = decode_reply(answer.body).result
    assert result is not None and result["truncated"] is True and result["size"] > 100_000


def test_sends_from_many_threads_at_once_all_arrive_once(adapter: Adapter) -> None:
    """The Functions worker runs sync functions on a thread pool: one transport, shared."""
    order_ids = [new_order_id() for _ in range(12)]
    errors: list[BaseException] = []

    def send(order_id: str) -> None:
        try:
            adapter.transport.send_request(make_request(order_id))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(o,)) for o in order_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    got = adapter.receiver.take_settled(requests_of(adapter), set(order_ids), len(order_ids))
    assert sorted(m.order_id or "" for m in got) == sorted(order_ids)
    assert adapter.receiver.nothing(requests_of(adapter), set(order_ids))


def test_a_broker_that_does_not_answer_is_unavailable_not_an_sdk_error(adapter: Adapter) -> None:
    """The scheduler records a request it could not send (``Order.unsent``) when the send
    raises an ``OrderError``; anything else would escape the claim. Both directions raise
    ``StorageUnavailable`` (retry later), within the adapter's bounded retries."""
    dead = adapter.unreachable()
    request = make_request()

    with ThreadPoolExecutor(2) as pool:  # side by side: each waits out its retries
        sends = [
            pool.submit(dead.send_request, request),
            pool.submit(dead.send_reply, request.succeeded({})),
        ]
        errors = [send.exception(timeout=60) for send in sends]

    assert [type(e) for e in errors] == [StorageUnavailable, StorageUnavailable], errors
