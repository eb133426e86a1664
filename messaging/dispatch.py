"""The ``order-dispatch`` queue: an order's next step, delivered when it is due.

A message ``{"orderId": ...}`` whose initial visibility is the time until the active
step may run; ``dispatch_order`` (scheduler) receives it and claims the step. Used by
the supervisor (a retry after its backoff, a compensation to run) and the operator
(a resubmitted step), which do not claim steps themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime

from core.model import Order
from core.names import Names
from core.ports import QueueSender

#: A Storage queue message can stay invisible for 7 days at most.
MAX_DELAY_SECONDS = 7 * 86_400 - 60


class DispatchQueue:
    def __init__(self, queues: QueueSender, names: Names, clock: Callable[[], datetime]):
        self._queues = queues
        self._names = names
        self._clock = clock

    def send(self, order_id: str, delay_seconds: float = 0) -> None:
        delay = min(max(delay_seconds, 0.0), MAX_DELAY_SECONDS)
        body = json.dumps({"orderId": order_id}, separators=(",", ":"))
        self._queues.send(self._names.order_dispatch, body, delay_seconds=delay)

    def __call__(self, order: Order) -> None:
        """Queue the order for when its next step may run (``Dispatcher``): the earliest
        Pending step's due time, or a delay's end (``Order.next_due``)."""
        due = order.next_due() or self._clock()
        self.send(order.order_id, (due - self._clock()).total_seconds())
