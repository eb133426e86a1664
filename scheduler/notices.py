"""Delivery of the notices a transition committed (transactional outbox).

A transition stores its status messages and operator alerts in the same
table transaction as the state change; this module sends them and then
deletes their outbox rows. If the process dies in between, the scheduler's
sweep finds the rows and sends them again: at-least-once, never lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from core.errors import StorageUnavailable
from core.names import Names
from core.ports import QueueSender
from runtime.logs import get_logger, order_context
from runtime.metrics import METRICS
from stores.tables import OutboxEntry, SavedNotices, TableStateStore

log = get_logger(__name__)


class NoticeSender:
    def __init__(self, store: TableStateStore, queues: QueueSender, names: Names):
        self._store = store
        self._queues = queues
        self._names = names

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
            sent.append(entry)
        if sent:
            self._store.delete_outbox(sent)
        return len(sent)

    def _send(self, entry: OutboxEntry) -> None:
        if entry.kind == "alert":
            alert = json.loads(entry.body)
            with order_context(order_id=alert.get("orderId"), step=alert.get("step")):
                # The alert rule in infra/ matches this text; keep it stable.
                log.error(
                    "OPERATOR ALERT order=%s step=%s failureCount=%s: %s",
                    alert.get("orderId"),
                    alert.get("step"),
                    alert.get("failureCount"),
                    alert.get("reason"),
                    extra={
                        "event": "operator_alert",
                        "failureCount": alert.get("failureCount"),
                        "reason": alert.get("reason"),
                    },
                )
            self._queues.send(self._names.operator_alerts, entry.body)
            METRICS.inc("alerts")
        elif entry.queue:
            self._queues.send(entry.queue, entry.body)
            METRICS.inc("notifications")
