"""What this process last wrote of each order, kept so that it need not read it back.

An order's path goes through one process more often than not: ``submit_order`` writes the
order with its first step claimed, and the same instance's agent applies the reply; the
reply's save claims the next step, whose reply the same instance applies again. Each of
those applications began with a read of the order (a range query: about 1 ms of CPU in
the SDK, and a round trip) that returned exactly what this process had just written.

``RecentWrites`` keeps, per order, the order record and step records as a read would
return them (the entities written, with the ETags the transaction answered), bounded in
number and age. It is a hint, never the truth: ``TableStateStore.recent`` parses it into
an Order that may be stale, and a save of that Order is conditional on its ETags like any
other, so if another writer came first the save is refused (412) and the caller reads the
order and decides again (``core.unit_of_work.OrderChanges``). Every save of an order
rewrites its order record (a new ``WriteId``, so a new ETag), so an order record whose
ETag still matches means no record of the order changed since.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final

#: Orders kept (least recently written dropped first): enough for the orders in flight on
#: one instance; a miss only costs the read it would have saved.
MAX_ORDERS: Final = 2048
#: Older than this, an entry is not used (a step's reply normally comes within seconds).
MAX_AGE_SECONDS: Final = 120.0
#: Orders with larger bodies are not kept (a body is up to 64 KiB: 2,048 of them would be
#: memory for little CPU; they are read back as before).
MAX_BODY_CHARS: Final = 8_000


class RecentWrites:
    def __init__(
        self,
        *,
        max_orders: int = MAX_ORDERS,
        max_age: float = MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_orders = max_orders
        self._max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._rows: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    def remember(self, order_id: str, rows: Mapping[str, Any]) -> None:
        """``rows``: RowKey -> entity, the order's order record and step records as stored."""
        with self._lock:
            self._rows[order_id] = (self._clock(), dict(rows))
            self._rows.move_to_end(order_id)
            while len(self._rows) > self._max_orders:
                self._rows.popitem(last=False)

    def forget(self, order_id: str) -> None:
        with self._lock:
            self._rows.pop(order_id, None)

    def rows(self, order_id: str) -> dict[str, Any] | None:
        """The rows last remembered for ``order_id`` (a copy of the mapping), if not too old."""
        with self._lock:
            found = self._rows.get(order_id)
            if found is None:
                return None
            at, rows = found
            if self._clock() - at > self._max_age:
                del self._rows[order_id]
                return None
            return dict(rows)

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)
