"""The agents' shared outage records and the alerts they owe (docs/contracts.md §3.14;
the rules: ``core.outages``).

``OutageBook`` is where an instance's reports land (``agents.outage_watch``): each is a
read of the agent's record and a conditional write of the record after it, decided
again on a conflict. A write that makes an alert owed (an outage: failed calls for
``OUTAGE_ALERT_SECONDS``; its end: the first answer after it) is the one that sends it,
at once, and then removes it from the record. Whatever is still owed after
``OutagePolicy.grace`` (the sender died between its write and its send, or the queue did
not take it) is sent by ``finish``, which the supervisor's timer runs: it takes the alert
on first (a conditional write), so two timers never both send it. At least once: a
sender that dies after its send and before the removal makes ``finish`` send it again.

An outage alert says how many orders wait for the agent: the distinct orders with an
active step on it, counted once per alert from the sweep index (``in_flight``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from core.errors import ConcurrencyConflict, StorageUnavailable
from core.messages import outage_alert_message, recovered_alert_message
from core.names import Names
from core.outages import (
    OUTAGE,
    RAMP_DOUBLING,
    Outage,
    OutagePolicy,
    Owed,
    report_answer,
    report_failing,
    sent,
    stale_owed,
    take,
)
from core.ports import Clock, QueueSender
from core.timefmt import iso
from dashboard.figures import ALERT, Activity, InFlight
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)

#: A report that keeps meeting other instances' writes gives up (the next one tries again).
CONFLICT_ATTEMPTS = 10


class OutageRecords(Protocol):
    def read_outages(self) -> dict[str, Outage]: ...

    def write_outage(self, outage: Outage) -> Outage: ...

    def in_flight(self, limit_per_shard: int = 1000) -> list[InFlight]: ...


@dataclass
class FinishReport:
    sent: int = 0
    errors: list[str] = field(default_factory=list)


class OutageBook:
    def __init__(
        self,
        store: OutageRecords,
        queues: QueueSender,
        names: Names,
        clock: Clock,
        policy: OutagePolicy | None = None,
        *,
        learn: Callable[[Outage], None] | None = None,
        record: Callable[[Activity], None] | None = None,
    ):
        """``learn``: told every record this process reads or writes (the instance's view,
        ``core.control_cache``); ``record``: counts each alert for the dashboard."""
        self._store = store
        self._queues = queues
        self._names = names
        self._clock = clock
        self.policy = policy or OutagePolicy()
        self._learn = learn
        self._record = record

    # --- the reports (an agent's instance) ---------------------------------------------

    def failing(self, agent: str, first: datetime, at: datetime, reason: str) -> Outage:
        """This instance's calls to ``agent`` have failed since ``first``, the latest at
        ``at``: the record after the report (and the outage alert sent, if this made it
        due)."""
        return self._report(
            agent, lambda o: report_failing(o, first, at, reason, self._clock(), self.policy)
        )

    def answered(self, agent: str, at: datetime) -> Outage:
        """``agent``'s remote answered this instance at ``at``: the streak ends (and the
        recovered alert is sent, if it was an outage)."""
        return self._report(agent, lambda o: report_answer(o, at, self._clock()))

    def _report(self, agent: str, decide: Callable[[Outage], Outage | None]) -> Outage:
        before, after = self._change(agent, decide)
        if after is None:
            return before
        for owed in after.owed:
            if not any(owed.same(o) for o in before.owed):
                self._deliver(agent, owed)  # ours to send: this write made it owed
        return after

    # --- the alerts left owed (the supervisor's timer) ------------------------------------

    def finish(self) -> FinishReport:
        """Send the alerts owed for longer than the grace: each taken on first, so only
        one timer sends it."""
        report = FinishReport()
        now = self._clock()
        try:
            outages = self._store.read_outages()
        except StorageUnavailable as exc:
            report.errors.append(str(exc))
            log.warning("outage alerts: the records could not be read (next run): %s", exc)
            return report
        for outage in outages.values():
            for owed in stale_owed(outage, now, self.policy):
                try:
                    _, taken = self._change(outage.agent, _taking(owed, now))
                except (ConcurrencyConflict, StorageUnavailable) as exc:
                    report.errors.append(f"{outage.agent}: {exc}")
                    continue
                if taken is None:
                    continue  # sent meanwhile
                log.warning(
                    "outage alert (%s) for agent %s owed since %s: sending it now",
                    owed.kind,
                    outage.agent,
                    iso(owed.taken_at),
                )
                if self._deliver(outage.agent, owed):
                    report.sent += 1
        return report

    # --- the parts --------------------------------------------------------------------

    def _change(
        self, agent: str, decide: Callable[[Outage], Outage | None]
    ) -> tuple[Outage, Outage | None]:
        """Read the record, decide, write it If-Match; again on a conflict. The record
        read and the one written (None: nothing to write)."""
        for _ in range(CONFLICT_ATTEMPTS):
            current = self._store.read_outages().get(agent) or Outage(agent)
            changed = decide(current)
            if changed is None:
                self._tell(current)
                return current, None
            try:
                stored = self._store.write_outage(changed)
            except ConcurrencyConflict:
                METRICS.inc("outage_conflicts")
                continue  # another instance wrote it first: decide again on theirs
            self._tell(stored)
            return current, stored
        raise ConcurrencyConflict(f"the outage record of agent {agent} kept changing")

    def _tell(self, outage: Outage) -> None:
        if self._learn is not None:
            self._learn(outage)

    def _deliver(self, agent: str, owed: Owed) -> bool:
        """Send one owed alert, then remove it from the record. False if it was not sent
        (it stays owed: the timer sends it after the grace)."""
        waiting = self._waiting(agent) if owed.kind == OUTAGE else None
        body = self._body(agent, owed, waiting)
        try:
            self._queues.send(self._names.operator_alerts, body)
        except Exception as exc:  # noqa: BLE001 - owed still: the timer sends it
            log.warning("outage alert for agent %s not sent yet (the timer will): %s", agent, exc)
            return False
        self._log(agent, owed, waiting)
        METRICS.inc("outage_alerts", kind=owed.kind, agent=agent)
        if self._record is not None:
            try:  # the dashboard's count of alerts; the alert itself is sent
                self._record(Activity(self._clock(), ALERT, "", agent=agent))
            except Exception as exc:  # noqa: BLE001 - never fail an alert for a figure
                log.warning("could not count the outage alert for the dashboard: %s", exc)
        try:
            self._change(agent, lambda o: sent(o, owed, waiting))
        except Exception as exc:  # noqa: BLE001 - owed still: sent again after the grace
            log.warning(
                "outage alert for agent %s sent, but not yet marked sent (it may be sent "
                "again after %s s): %s",
                agent,
                self.policy.grace.total_seconds(),
                exc,
            )
        return True

    def _waiting(self, agent: str) -> int | None:
        """The orders with an active step on ``agent`` (None: they could not be counted)."""
        try:
            return len({e.order_id for e in self._store.in_flight() if e.agent == agent})
        except Exception as exc:  # noqa: BLE001 - the alert goes without the count
            log.warning("could not count the orders waiting for agent %s: %s", agent, exc)
            return None

    def _body(self, agent: str, owed: Owed, waiting: int | None) -> str:
        if owed.kind == OUTAGE:
            held = "an unknown number of" if waiting is None else str(waiting)
            reason = (
                f"every call to agent {agent}'s remote has failed since {iso(owed.since)} "
                f"({_seconds(owed.at, owed.since)}); the last error: {owed.reason}. "
                f"{held} orders wait for it (Pending, not counted against them, no alert "
                "each) and go on when it answers; one more alert says when it does"
            )
            return outage_alert_message(agent, owed.since, waiting, reason, owed.at)
        reason = (
            f"agent {agent}'s remote answered again at {iso(owed.at)}, after failed calls "
            f"since {iso(owed.since)} ({_seconds(owed.at, owed.since)}); the orders that "
            "waited go on, released gently (one call a second at first, doubling every "
            f"{RAMP_DOUBLING.total_seconds():.0f} s up to the agent's limits)"
        )
        return recovered_alert_message(agent, owed.since, owed.at, reason)

    def _log(self, agent: str, owed: Owed, waiting: int | None) -> None:
        fields = {
            "event": "outage_alert",
            "kind": owed.kind,
            "agent": agent,
            "since": iso(owed.since),
            "waiting": waiting,
            "reason": owed.reason,
        }
        if owed.kind == OUTAGE:
            log.error(
                "OUTAGE ALERT agent=%s since=%s waiting=%s: %s",
                agent,
                iso(owed.since),
                waiting,
                owed.reason,
                extra=fields,
            )
        else:
            log.warning(
                "OUTAGE RECOVERED agent=%s since=%s at=%s", agent, iso(owed.since), iso(owed.at)
            )


def _taking(owed: Owed, now: datetime) -> Callable[[Outage], Outage | None]:
    return lambda outage: take(outage, owed, now)


def _seconds(at: datetime, since: datetime) -> str:
    return f"{max((at - since).total_seconds(), 0):.0f} s"
