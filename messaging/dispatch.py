"""An order's next step, delivered when it is due: the ``order-dispatch`` queue, and the
``order-wakeups`` Service Bus queue for what is due later when the agent queues are on
Service Bus (as deployed).

A message ``{"orderId": ...}``, received when the active step may run;
``dispatch_order`` (or ``wake_order``, scheduler) receives it and claims the step. Used
by the scheduler (a delay's end, a step not due yet), the supervisor (a retry after its
backoff, a compensation to run) and the operator (a resubmitted step).

How a message waits (docs/contracts.md §3.13):

- due now (``NOW_SECONDS`` or less ahead): on ``order-dispatch`` at once, whatever the
  transport;
- later, with a ``scheduled`` sender (``AGENT_TRANSPORT=servicebus``): a Service Bus
  scheduled message for the due time to the millisecond, which the broker pushes to
  ``wake_order`` when it is enqueued: no rounding, no poll;
- later, on Storage queues only: on ``order-dispatch`` with a visibility delay, which a
  Storage queue takes in whole seconds (rounded up), then picked up at the trigger's next
  poll: up to ``1 s + maxPollingInterval`` (host.json, 0.5 s) late.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta

from core.model import Order
from core.names import Names
from core.ports import QueueSender, ScheduledSender
from messaging import bound

#: A Storage queue message can stay invisible for 7 days at most (the supervisor wakes an
#: order whose time is further off); wake-ups keep the same bound.
MAX_DELAY_SECONDS = 7 * 86_400 - 60
#: A wake-up due this close (seconds) or closer is sent now, on ``order-dispatch``.
NOW_SECONDS = 0.0


class DispatchQueue:
    def __init__(
        self,
        queues: QueueSender,
        names: Names,
        clock: Callable[[], datetime],
        scheduled: ScheduledSender | None = None,
    ):
        """``scheduled``: where a wake-up for later goes (Service Bus), or None (Storage
        queues: a visibility delay on ``order-dispatch``)."""
        self._queues = queues
        self._names = names
        self._clock = clock
        self._scheduled = scheduled

    def send(self, order_id: str, delay_seconds: float = 0) -> None:
        self._send(order_id, self._clock(), delay_seconds)

    def _send(self, order_id: str, now: datetime, delay_seconds: float) -> None:
        delay = min(max(delay_seconds, 0.0), MAX_DELAY_SECONDS)
        body = json.dumps({"orderId": order_id}, separators=(",", ":"))
        if self._scheduled is not None and delay > NOW_SECONDS:
            at = now + timedelta(seconds=delay)
            self._scheduled.send_at(self._names.order_wakeups, body, at)
            return
        # A dispatch lost on its way is made good by the scheduler's sweep: it may wait for
        # the host's output binding (messaging/bound.py).
        with bound.recoverable():
            self._queues.send(self._names.order_dispatch, body, delay_seconds=delay)

    def __call__(self, order: Order) -> None:
        """Queue the order for when its next step may run (``Dispatcher``): the earliest
        Pending step's due time, or a delay's end (``Order.next_due``)."""
        now = self._clock()
        due = order.next_due() or now
        self._send(order.order_id, now, (due - now).total_seconds())
