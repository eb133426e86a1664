"""The Service Bus behaviours this app relies on, in one place, through the real SDK.

Each test states one behaviour. They run against a private ``localbus`` (the double), or,
with SERVICEBUS_TEST_CONNECTION set, against a real namespace (``make test-servicebus``):
what passes on both is what the double may be trusted for. See ``target.py`` for the queues.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.servicebus import (
    ServiceBusMessage,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    ServiceBusError,
)

from tests.localbus.target import Target

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(180)]

WAIT = 3.0  # the longest one receive call waits


def new_id() -> str:
    return "ct-" + uuid.uuid4().hex[:20]


def send(client: Any, queue: str, *messages: ServiceBusMessage) -> None:
    with client.get_queue_sender(queue) as sender:
        for message in messages:
            sender.send_messages(message)


class Mine:
    """Receives only this test's messages (by message_id); others met on a shared
    namespace stay locked while the test runs and are abandoned at the end."""

    def __init__(self, receiver: Any, ids: set[str]):
        self.receiver, self.ids = receiver, ids
        self.others: list[Any] = []

    def take(self, count: int, within: float = 10.0) -> list[Any]:
        ours: list[Any] = []
        deadline = time.monotonic() + within
        while len(ours) < count and time.monotonic() < deadline:
            wait = max(0.5, min(WAIT, deadline - time.monotonic()))
            for message in self.receiver.receive_messages(max_message_count=10, max_wait_time=wait):
                (ours if message.message_id in self.ids else self.others).append(message)
        return ours

    def nothing_within(self, seconds: float) -> bool:
        return not self.take(1, within=seconds)


@contextmanager
def receiving(client: Any, queue: str, ids: set[str], **options: Any) -> Iterator[Mine]:
    with client.get_queue_receiver(queue, max_wait_time=WAIT, **options) as receiver:
        mine = Mine(receiver, ids)
        try:
            yield mine
        finally:
            if options.get("receive_mode") != ServiceBusReceiveMode.RECEIVE_AND_DELETE:
                for message in mine.others:
                    with suppress(ServiceBusError):
                        receiver.abandon_message(message)


def test_a_message_round_trips_every_property_the_app_uses(target: Target, client: Any) -> None:
    """Sign-in ($cbs), send, peek-lock receive: message_id, correlation_id, reply_to,
    subject, content_type, time to live, application properties, the body; and what the
    broker adds: delivery count 0, a sequence number, the enqueued time, the lock's end."""
    mid = new_id()
    before = datetime.now(UTC)
    send(
        client,
        target.requests,
        ServiceBusMessage(
            b'{"hello": 1}',
            message_id=mid,
            correlation_id="corr-1",
            reply_to=target.replies,
            subject="process",
            content_type="application/json",
            time_to_live=timedelta(seconds=120),
            application_properties={"orderId": "o-1", "attempt": 2},
        ),
    )
    with receiving(client, target.requests, {mid}) as mine:
        [message] = mine.take(1)
        taken = datetime.now(UTC)
        props = {_text(k): _text(v) for k, v in (message.application_properties or {}).items()}
        assert (message.correlation_id, message.reply_to) == ("corr-1", target.replies)
        assert (message.subject, message.content_type) == ("process", "application/json")
        assert message.time_to_live == timedelta(seconds=120)
        assert props == {"orderId": "o-1", "attempt": 2}
        assert b"".join(message.body) == b'{"hello": 1}'
        assert message.delivery_count == 0
        assert message.sequence_number is not None and message.sequence_number > 0
        assert message.enqueued_time_utc >= before - timedelta(seconds=5)
        # the lock is the queue's: it began between the send and the take, so it ends a
        # lock duration after a moment in that bracket (2 s for the broker's clock)
        lock, skew = timedelta(seconds=target.lock_seconds), timedelta(seconds=2)
        assert before + lock - skew <= message.locked_until_utc <= taken + lock + skew
        mine.receiver.complete_message(message)


def test_an_unknown_queue_is_not_found(target: Target, client: Any) -> None:
    """Only declared queues exist: sending elsewhere fails (amqp:not-found), it does not
    create a queue."""
    with pytest.raises(MessagingEntityNotFoundError):
        send(client, "no-such-queue-" + uuid.uuid4().hex[:8], ServiceBusMessage(b"x"))


def test_complete_removes_the_message(target: Target, client: Any) -> None:
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"x", message_id=mid))
    with receiving(client, target.requests, {mid}) as mine:
        [message] = mine.take(1)
        mine.receiver.complete_message(message)
        assert mine.nothing_within(target.lock_seconds + target.quiet)


def test_abandon_redelivers_at_once_with_the_delivery_count_up(target: Target, client: Any) -> None:
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"x", message_id=mid))
    with receiving(client, target.requests, {mid}) as mine:
        [first] = mine.take(1)
        mine.receiver.abandon_message(first)
        [second] = mine.take(1, within=5)  # not after the lock: now
        assert (first.delivery_count, second.delivery_count) == (0, 1)
        mine.receiver.complete_message(second)


def test_a_lapsed_lock_redelivers_and_the_old_lock_cannot_settle(
    target: Target, client: Any
) -> None:
    """A receiver that dies holding a message: the message comes back once its lock
    lapses, counted as a delivery; the first receiver's lock token is then worthless."""
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"x", message_id=mid))
    with receiving(client, target.requests, {mid}) as mine:
        [first] = mine.take(1)
        [second] = mine.take(1, within=target.lock_seconds + 15)
        # Not before the lock lapsed, by the broker's own lock times: the second delivery's
        # lock began (its end less the lock's length) when the first lock had ended.
        second_locked_at = second.locked_until_utc - timedelta(seconds=target.lock_seconds)
        assert second_locked_at >= first.locked_until_utc - timedelta(seconds=1), (
            f"redelivered at {second_locked_at}, first locked until {first.locked_until_utc}"
        )
        assert second.delivery_count == 1
        with pytest.raises(MessageLockLostError):
            mine.receiver.complete_message(first)
        mine.receiver.complete_message(second)


def test_renewing_a_lock_keeps_the_message(target: Target, client: Any) -> None:
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"x", message_id=mid))
    with receiving(client, target.requests, {mid}) as mine:
        [message] = mine.take(1)
        first_until = message.locked_until_utc
        for _ in range(2):  # past the original lock
            time.sleep(target.lock_seconds * 0.6)
            mine.receiver.renew_message_lock(message)
        assert message.locked_until_utc > first_until
        assert mine.nothing_within(target.quiet)  # not redelivered meanwhile
        mine.receiver.complete_message(message)


def test_dead_letter_keeps_the_message_with_its_reason(target: Target, client: Any) -> None:
    """Dead-lettered messages are read from ``<queue>/$DeadLetterQueue`` (the SDK's
    sub-queue receiver, the trigger the supervisor's alerts use), with the reason."""
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"body", message_id=mid))
    with receiving(client, target.requests, {mid}) as mine:
        [message] = mine.take(1)
        mine.receiver.dead_letter_message(message, reason="bad", error_description="why")
    dead = _dead_letters(client, target.requests, mid)
    assert (dead.dead_letter_reason, dead.dead_letter_error_description) == ("bad", "why")
    assert b"".join(dead.body) == b"body"


def test_the_max_delivery_count_dead_letters(target: Target, client: Any) -> None:
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"x", message_id=mid))
    counts = []
    with receiving(client, target.requests, {mid}) as mine:
        for _ in range(target.max_delivery_count):
            [message] = mine.take(1)
            counts.append(message.delivery_count)
            mine.receiver.abandon_message(message)
        assert mine.nothing_within(target.quiet)
    assert counts == list(range(target.max_delivery_count))
    dead = _dead_letters(client, target.requests, mid)
    assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
    # Believed (not yet seen on a namespace): the count goes with it to the sub-queue.
    assert dead.delivery_count == target.max_delivery_count


def test_an_expired_message_is_never_delivered_and_is_dead_lettered(
    target: Target, client: Any
) -> None:
    """Time to live: both queues dead-letter expired messages (infra/app/servicebus.bicep):
    an expired reply is an alert, an expired request a "not called" report
    (supervisor/expired.py)."""
    request, reply = new_id(), new_id()
    send(
        client,
        target.requests,
        ServiceBusMessage(b"r", message_id=request, time_to_live=timedelta(seconds=1)),
    )
    send(
        client,
        target.replies,
        ServiceBusMessage(b"p", message_id=reply, time_to_live=timedelta(seconds=1)),
    )
    time.sleep(1.5)
    for queue, mid in ((target.requests, request), (target.replies, reply)):
        with receiving(client, queue, {mid}) as mine:
            assert mine.nothing_within(target.quiet), f"{queue} delivered an expired message"
    for queue, mid in ((target.requests, request), (target.replies, reply)):
        dead = _dead_letters(client, queue, mid, within=target.expiry_grace)
        assert dead.dead_letter_reason == "TTLExpiredException", queue


def test_an_expired_message_keeps_its_delivery_count_in_the_dead_letter_queue(
    target: Target, client: Any
) -> None:
    """What supervisor/expired.py relies on to report an expired request "not called":
    one never delivered reaches the dead-letter queue with count 0, and one whose lock
    ended after its expiry (lapsed: an agent that died mid-call; or abandoned) with that
    delivery counted. Documented: every lock that ends unsettled counts, and a locked
    message expires when its lock ends; believed until this passes on a namespace: the
    count is kept by the move, and the last lock's end is counted before it."""
    never, lapsed, abandoned = new_id(), new_id(), new_id()
    ttl = timedelta(seconds=min(target.lock_seconds / 2, 10))  # ends before the lock
    with receiving(client, target.requests, {lapsed, abandoned}) as mine:
        mine.take(1, within=0.5)  # the receive link is open before the clock starts
        sent = time.monotonic()
        for mid, body in ((lapsed, b"l"), (abandoned, b"a")):
            send(client, target.requests, ServiceBusMessage(body, message_id=mid, time_to_live=ttl))
        held = {m.message_id: m for m in mine.take(2, within=ttl.total_seconds() / 2)}
        assert set(held) == {lapsed, abandoned}, "not received before they expired"
        send(client, target.requests, ServiceBusMessage(b"n", message_id=never, time_to_live=ttl))
        time.sleep(max(0.0, sent + ttl.total_seconds() + 0.2 - time.monotonic()))
        mine.receiver.abandon_message(held[abandoned])  # past its expiry, within its lock
        time.sleep(target.lock_seconds)  # the other lock lapses, past its expiry
        assert mine.nothing_within(target.quiet)  # expired: neither comes back
    counts = {
        mid: _dead_letters(client, target.requests, mid, within=target.expiry_grace)
        for mid in (never, lapsed, abandoned)
    }
    assert {m: d.dead_letter_reason for m, d in counts.items()} == dict.fromkeys(
        counts, "TTLExpiredException"
    )
    assert counts[never].delivery_count == 0
    assert counts[lapsed].delivery_count >= 1, "a lock that lapsed past expiry went uncounted"
    assert counts[abandoned].delivery_count >= 1


def test_the_same_message_id_is_delivered_once(target: Target, client: Any) -> None:
    """Duplicate detection (the queues' window is 10 min): the copy is accepted, dropped."""
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"1", message_id=mid))
    send(client, target.requests, ServiceBusMessage(b"2", message_id=mid))
    with receiving(client, target.requests, {mid}) as mine:
        [message] = mine.take(1)
        assert b"".join(message.body) == b"1"
        mine.receiver.complete_message(message)
        assert mine.nothing_within(target.quiet)


def test_a_scheduled_message_is_delivered_at_its_time_not_before(
    target: Target, client: Any
) -> None:
    """``scheduled_enqueue_time_utc`` (a plain send with the annotation, as the app's order
    wake-ups are sent): invisible until its time, whatever is sent meanwhile goes first,
    then delivered (how soon after its time is printed: a figure, not a check), enqueued
    at its time, its scheduled time visible on receipt; a copy with the same message_id is
    dropped, as any duplicate."""
    scheduled, plain = new_id(), new_id()
    at = datetime.now(UTC) + timedelta(seconds=2.5)
    early = ServiceBusMessage(b"wake", message_id=scheduled, scheduled_enqueue_time_utc=at)
    copy = ServiceBusMessage(b"copy", message_id=scheduled, scheduled_enqueue_time_utc=at)
    send(client, target.requests, early, copy, ServiceBusMessage(b"now", message_id=plain))
    with receiving(client, target.requests, {scheduled, plain}) as mine:
        [first] = mine.take(1, within=2)
        assert first.message_id == plain, "a scheduled message came before its time"
        mine.receiver.complete_message(first)
        [woken] = mine.take(1, within=5)
        received = datetime.now(UTC)
        lag = (received - at).total_seconds()
        # localbus: the time as sent (whole ms); a namespace: another machine's clock
        skew = 0.001 if target.name == "localbus" else 1.0
        print(f"scheduled message received {lag * 1000:.0f} ms after its time ({target.name})")
        assert lag >= -skew, f"received {-lag:.3f} s before its time"
        assert b"".join(woken.body) == b"wake"
        assert woken.scheduled_enqueue_time_utc is not None
        assert abs((woken.scheduled_enqueue_time_utc - at).total_seconds()) < 0.002
        assert abs((woken.enqueued_time_utc - at).total_seconds()) <= 1.0 + skew
        mine.receiver.complete_message(woken)
        assert mine.nothing_within(target.quiet), "the copy was delivered too"


def test_settling_through_management_works_without_the_receive_link(
    target: Target, client: Any
) -> None:
    """``com.microsoft:update-disposition``: how the SDK settles once its receive link is
    gone (called here directly, as the SDK does in that case)."""
    done, dropped = new_id(), new_id()
    send(
        client,
        target.requests,
        ServiceBusMessage(b"x", message_id=done),
        ServiceBusMessage(b"y", message_id=dropped),
    )
    with receiving(client, target.requests, {done, dropped}) as mine:
        messages = {m.message_id: m for m in mine.take(2)}
        mine.receiver._settle_message_via_mgmt_link("completed", [messages[done].lock_token])
        mine.receiver._settle_message_via_mgmt_link(
            "suspended",
            [messages[dropped].lock_token],
            dead_letter_details={"deadletter-reason": "r", "deadletter-description": "d"},
        )
        for message in messages.values():
            message._settled = True
        assert mine.nothing_within(target.lock_seconds + target.quiet)
    assert _dead_letters(client, target.requests, dropped).dead_letter_reason == "r"


def test_receive_and_delete_takes_the_message_at_once(target: Target, client: Any) -> None:
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"x", message_id=mid))
    with receiving(
        client, target.requests, {mid}, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as mine:
        [message] = mine.take(1)
        assert message.lock_token is None
    with receiving(client, target.requests, {mid}) as mine:
        assert mine.nothing_within(target.quiet)


def test_peek_shows_messages_without_locking_them(target: Target, client: Any) -> None:
    mid = new_id()
    send(client, target.requests, ServiceBusMessage(b"x", message_id=mid))
    with client.get_queue_receiver(target.requests, max_wait_time=WAIT) as receiver:
        seen = _peek_for(receiver, mid)
        assert seen is not None and seen.delivery_count == 0
    with receiving(client, target.requests, {mid}) as mine:
        [message] = mine.take(1)  # peeking did not lock it
        mine.receiver.complete_message(message)


def test_a_message_over_256_kb_is_refused_by_the_sdk(target: Target, client: Any) -> None:
    """Standard's limit, 256 KB; the app's transport turns this error into TransportRefused."""
    with pytest.raises(MessageSizeExceededError):
        send(client, target.requests, ServiceBusMessage(b"x" * (300 * 1024), message_id=new_id()))


# -- helpers ------------------------------------------------------------------------------


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _dead_letters(client: Any, queue: str, mid: str, within: float = 10.0) -> Any:
    with receiving(client, queue, {mid}, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as mine:
        found = mine.take(1, within=within)
        assert found, f"{mid} is not in {queue}/$DeadLetterQueue"
        mine.receiver.complete_message(found[0])
        return found[0]


def _peek_for(receiver: Any, mid: str) -> Any:
    sequence = 0
    for _ in range(20):
        batch = receiver.peek_messages(max_message_count=50, sequence_number=sequence)
        if not batch:
            return None
        for message in batch:
            if message.message_id == mid:
                return message
        sequence = batch[-1].sequence_number + 1
    return None
