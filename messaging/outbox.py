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

from core.errors import ConcurrencyConflict, QueueMissing, StorageUnavailable
from core.messages import alert_message
from core.names import Names
from core.ports import OutboxEntry, QueueSender, SavedNotices, StateStore
from core.reply_queues import SETTING as REPLY_QUEUES
from core.reply_queues import ReplyQueues
from observability.logs import get_logger, log_operator_alert
from observability.metrics import METRICS

log = get_logger(__name__)

#: How many order ids ``alert_once`` remembers (oldest forgotten first): bounded memory,
#: and an order forgotten is at worst alerted again.
ALERTED_MEMORY = 10_000


class NoticeSender:
    def __init__(
        self,
        store: StateStore,
        queues: QueueSender,
        names: Names,
        reply_queues: ReplyQueues | None = None,
    ):
        """``reply_queues``: the queues status notices may go to (``REPLY_QUEUES``; None:
        none). A notice for another queue, or for one that does not exist, is not sent
        (a WARNING says why) and leaves the outbox: the app never creates a replyTo queue."""
        self._store = store
        self._queues = queues
        self._names = names
        self._reply_queues = reply_queues or ReplyQueues()
        self._alerted: OrderedDict[str, None] = OrderedDict()
        self._alerted_lock = threading.Lock()

    def deliver(self, saved: SavedNotices | Iterable[OutboxEntry]) -> int:
        """Send committed notices; returns how many went out. Failures stay in the outbox."""
        entries = list(saved.entries if isinstance(saved, SavedNotices) else saved)
        done: list[OutboxEntry] = []
        dropped = 0
        for entry in entries:
            try:
                if not self._send(entry):
                    done.append(entry)  # never to be sent: out of the outbox, not counted
                    dropped += 1
                    continue
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
            done.append(entry)
        if done:
            self._store.delete_outbox(done)
        return len(done) - dropped

    def alert_now(
        self, order_id: str, step: str, reason: str, now: datetime, failure_count: int = 0
    ) -> None:
        """An operator alert that no transition committed (a sweep met an order it cannot
        handle): the same ERROR record and ``operator-alerts`` message as an outbox alert.
        ``StorageUnavailable`` if the queue did not take it."""
        body = alert_message(order_id, step, reason, failure_count, now)
        alert = json.loads(body)
        log_operator_alert(log, order_id, alert["step"], failure_count, alert["reason"])
        self._queues.send(self._names.operator_alerts, body)
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

    def _refusal(self, queue: str) -> str | None:
        if self._names.is_own_queue(queue):
            return f"{queue} is one of this app's own queues"
        return self._reply_queues.refusal(queue)

    def _send(self, entry: OutboxEntry) -> bool:
        """Send one notice; False: it can never be sent (its queue is not allowed, or does
        not exist), which a WARNING says."""
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
            refusal = self._refusal(entry.queue)
            if refusal is not None:
                METRICS.inc("notifications_refused")
                log.warning("status notice for order %s not sent: %s", entry.order_id, refusal)
                return False
            try:
                self._queues.send(entry.queue, entry.body, create=False)
            except QueueMissing:
                METRICS.inc("notifications_refused")
                log.warning(
                    "status notice for order %s not sent: its replyTo queue %s does not "
                    "exist, and the app never creates one (%s lists it: create the queue)",
                    entry.order_id,
                    entry.queue,
                    REPLY_QUEUES,
                )
                return False
            METRICS.inc("notifications")
        return True
