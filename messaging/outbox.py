"""Delivery of the notices a transition committed (transactional outbox).

A transition stores its status messages and operator alerts in the same
table transaction as the state change; this module sends them and then
deletes their outbox rows. If the process dies in between, the scheduler's
sweep finds the rows and sends them again: at-least-once, never lost.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from datetime import datetime

from core.errors import ConcurrencyConflict, StorageUnavailable
from core.messages import alert_message
from core.names import Names
from core.ports import OutboxEntry, QueueSender, SavedNotices, StateStore
from observability.logs import get_logger, log_operator_alert
from observability.metrics import METRICS

log = get_logger(__name__)

#: How many order ids ``alert_once`` remembers (oldest forgotten first): bounded memory,
#: and an order forgotten is at worst alerted again.
ALERTED_MEMORY = 10_000


class NoticeSender:
    def __init__(self, store: StateStore, queues: QueueSender, names: Names):
        self._store = store
        self._queues = queues
        self._names = names
        self._alerted: OrderedDict[str, None] = OrderedDict()
        self._alerted_lock = threading.Lock()

    def deliver(self, saved: SavedNotices | Iterable[OutboxEntry]) -> int:
        """Send committed notices; returns how many went out. Failures stay in the outbox."""
        entries = list(saved.entries if isinstance(saved, SavedNotices) else saved)
        sent: list[OutboxEntry] = []
        for entry in entries:
            try:
                self._send(entry)
            except StorageUnavailable as exc:
                log.warning(
                    "notice for order %s not sent yet (the sweep retries): %s", entry.order_id, exc
                )
                continue
            except Exception as exc:  # noqa: BLE001 - one malformed row must not stop the rest
                log.error(
                    "notice %s for order %s cannot be sent (%s: %s); left in the outbox",
                    entry.row,
                    entry.order_id,
                    type(exc).__name__,
                    exc,
                )
                continue
            sent.append(entry)
        if sent:
            self._store.delete_outbox(sent)
        return len(sent)

    def alert_now(
        self, order_id: str, step: str, reason: str, now: datetime, failure_count: int = 0
    ) -> None:
        """An operator alert that no transition committed (a sweep met an order it cannot
        handle): the same ERROR record and ``operator-alerts`` message as an outbox alert.
        ``StorageUnavailable`` if the queue did not take it."""
        log_operator_alert(log, order_id, step, failure_count, reason)
        self._queues.send(
            self._names.operator_alerts, alert_message(order_id, step, reason, failure_count, now)
        )
        METRICS.inc("alerts")

    def alert_once(self, order_id: str, step: str, reason: str, now: datetime) -> bool:
        """``alert_now``, unless this sender already alerted about ``order_id``: one alert
        per bad order per process, not one per sweep. True if it sent one."""
        with self._alerted_lock:
            if order_id in self._alerted:
                self._alerted.move_to_end(order_id)
                return False
        self.alert_now(order_id, step, reason, now)  # remembered only once it went out
        with self._alerted_lock:
            self._alerted[order_id] = None
            while len(self._alerted) > ALERTED_MEMORY:
                self._alerted.popitem(last=False)
        return True

    def contain_failure(
        self, order_id: str, step: str, exc: Exception, now: datetime, *, who: str
    ) -> None:
        """A sweep (``who``) could not handle one order: storage trouble and lost races are
        retried by the next run; anything else (records that cannot be read, a bug) gets
        one operator alert per order per process and its traceback logged once."""
        if isinstance(exc, StorageUnavailable | ConcurrencyConflict):
            log.warning(
                "%s could not handle order %s (the next run retries): %s", who, order_id, exc
            )
            return
        reason = (
            f"the {who} cannot handle step {step} ({type(exc).__name__}: {exc})"[:1500]
            + "; it stays as it is until the order's records are repaired"
        )
        try:
            first = self.alert_once(order_id, step, reason, now)
        except Exception as alert_error:  # noqa: BLE001 - the next run alerts again
            first = False
            log.warning(
                "operator alert for order %s not sent (the next run tries again): %s",
                order_id,
                alert_error,
            )
        log.error(
            "%s cannot handle order %s: %s",
            who,
            order_id,
            exc,
            exc_info=exc if first else None,  # the traceback once, not every run
        )

    def _send(self, entry: OutboxEntry) -> None:
        if entry.kind == "alert":
            alert = json.loads(entry.body)
            log_operator_alert(
                log,
                alert.get("orderId"),
                alert.get("step"),
                alert.get("failureCount"),
                alert.get("reason"),
            )
            self._queues.send(self._names.operator_alerts, entry.body)
            METRICS.inc("alerts")
        elif entry.queue:
            self._queues.send(entry.queue, entry.body)
            METRICS.inc("notifications")
