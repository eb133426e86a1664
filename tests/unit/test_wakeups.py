"""Which way an order's wake-up goes (messaging/dispatch.py), on a fake clock: due now, on
``order-dispatch`` at once; later, a Service Bus scheduled message for the due time to the
millisecond where the agent queues are on Service Bus, else a whole-second visibility
delay on ``order-dispatch`` (Storage queues)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.servicebus import ServiceBusMessage

from core.names import Names
from messaging.dispatch import MAX_DELAY_SECONDS, DispatchQueue
from messaging.servicebus import wakeup_message

NOW = datetime(2026, 11, 27, 12, 0, 0, 250_000, tzinfo=UTC)
NAMES = Names()
BODY = json.dumps({"orderId": "o-1"}, separators=(",", ":"))


class Queues:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float]] = []

    def send(self, queue: str, body: str, *, delay_seconds: float = 0, **_: Any) -> None:
        self.sent.append((queue, body, delay_seconds))


class Scheduled:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, datetime]] = []

    def send_at(self, queue: str, body: str, at: datetime) -> None:
        self.sent.append((queue, body, at))


def _queues(scheduled: bool) -> tuple[DispatchQueue, Queues, Scheduled]:
    queues, wakeups = Queues(), Scheduled()
    later = wakeups if scheduled else None
    dispatch = DispatchQueue(queues, NAMES, lambda: NOW, scheduled=later)  # type: ignore[arg-type]
    return dispatch, queues, wakeups


def test_on_service_bus_a_later_wake_up_is_scheduled_for_its_time() -> None:
    dispatch, queues, wakeups = _queues(scheduled=True)
    dispatch.send("o-1", 2.3456)
    assert queues.sent == []
    assert wakeups.sent == [(NAMES.order_wakeups, BODY, NOW + timedelta(seconds=2.3456))]


def test_due_now_goes_on_order_dispatch_at_once_on_either_transport() -> None:
    for scheduled in (True, False):
        dispatch, queues, wakeups = _queues(scheduled)
        dispatch.send("o-1", 0)
        dispatch.send("o-1", -3)  # a time already gone
        assert wakeups.sent == []
        assert queues.sent == [(NAMES.order_dispatch, BODY, 0.0)] * 2


def test_on_storage_queues_a_later_wake_up_is_a_visibility_delay() -> None:
    dispatch, queues, wakeups = _queues(scheduled=False)
    dispatch.send("o-1", 2.5)
    dispatch.send("o-1", 30 * 86_400)  # capped: the supervisor wakes what is further off
    assert wakeups.sent == []
    assert queues.sent == [
        (NAMES.order_dispatch, BODY, 2.5),
        (NAMES.order_dispatch, BODY, MAX_DELAY_SECONDS),
    ]


def test_an_orders_wake_up_is_for_its_next_due_time() -> None:
    class Order:
        order_id = "o-1"

        @staticmethod
        def next_due() -> datetime:
            return NOW + timedelta(seconds=5, microseconds=1)

    dispatch, _, wakeups = _queues(scheduled=True)
    dispatch(Order())  # type: ignore[arg-type]
    assert wakeups.sent == [(NAMES.order_wakeups, BODY, NOW + timedelta(seconds=5, microseconds=1))]


def test_the_scheduled_message_is_never_early_and_never_a_duplicate() -> None:
    at = NOW + timedelta(seconds=5, microseconds=1)
    one, two = wakeup_message(BODY, at), wakeup_message(BODY, at)
    assert isinstance(one, ServiceBusMessage)
    # the wire carries milliseconds: rounded up, not down
    assert one.scheduled_enqueue_time_utc == NOW + timedelta(seconds=5, milliseconds=1)
    assert wakeup_message(BODY, NOW).scheduled_enqueue_time_utc == NOW
    assert one.message_id != two.message_id  # duplicate detection keeps every wake-up
    assert b"".join(one.body) == BODY.encode()
