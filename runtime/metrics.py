"""Counters the services bump: claims, conflicts, stale replies, retries, alerts, ...

In-process and cheap. When OpenTelemetry is configured (Application Insights),
each counter is also exported as an OTel counter named ``orders.<name>``.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


class Metrics:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._otel: dict[str, Any] = {}
        self._meter: Any = None

    def use_meter(self, meter: Any) -> None:
        self._meter = meter

    def inc(self, name: str, amount: int = 1, **attributes: str) -> None:
        with self._lock:
            self._counts[name] += amount
            if self._meter is not None:
                counter = self._otel.get(name)
                if counter is None:
                    counter = self._otel[name] = self._meter.create_counter(f"orders.{name}")
                counter.add(amount, attributes)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


METRICS = Metrics()
