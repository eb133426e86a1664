"""Counters the services bump: claims, conflicts, stale replies, retries, alerts, ...

Exported as OpenTelemetry counters named ``orders.<name>`` once a meter is
set (``observability/telemetry.py``, when Application Insights is configured);
until then ``inc`` does nothing. Their attributes become the custom dimensions of
``customMetrics`` rows, which the workbook in infra/ (``infra/app/workbook.json``)
reads: tests/infra/test_workbook.py checks its names against the calls here and
in the services.
"""

from __future__ import annotations

import threading
from typing import Any


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, Any] = {}
        self._meter: Any = None

    def use_meter(self, meter: Any) -> None:
        self._meter = meter

    def inc(self, name: str, amount: int = 1, **attributes: str) -> None:
        if self._meter is None:
            return
        with self._lock:
            counter = self._counters.get(name)
            if counter is None:
                counter = self._counters[name] = self._meter.create_counter(f"orders.{name}")
        counter.add(amount, attributes)


METRICS = Metrics()


def order_ended(workflow: str, status: str) -> None:
    """An order reached a terminal status (``OrderStatus.terminal``: completed,
    compensated, cancelled, or error, which waits for an operator). ``OrderChanges``
    calls it after the save that made the change, whichever role made it."""
    METRICS.inc("orders_ended", workflow=workflow, status=status)
