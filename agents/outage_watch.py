"""What one instance tells the shared outage record of an agent (docs/contracts.md §3.14;
the rules: ``core.outages``; the record and its alerts: ``messaging.outages``).

The runner tells the watch of every call's end (``failed``: unanswered, and not an order
known to fail on its own; ``answered``): that is memory only. A report to the shared
record (a read and a conditional write) is made only when this instance's view changes,
never per call:

- its calls have failed, with no answer, for ``report_after`` (a blip costs nothing);
- while they still fail, at most every ``heartbeat``, and once when a failure comes
  ``alert_after`` past the shared ``since`` (that report is what makes the outage alert
  due);
- the first answer after it reported, or after it saw the shared record failing.

So an instance writes a few times per outage (about ``alert_after / heartbeat`` + 3),
whatever the traffic; a report the store did not take is not tried again for
``report_after``. Reports run in order on a thread of their own (``SerialWorker``),
off the event loop and off the orders' path: a slow store delays the report, not a call.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from core.outages import Outage, OutagePolicy
from observability.logs import get_logger

log = get_logger(__name__)

Job = Callable[[], None]


class Reporter(Protocol):
    """``messaging.outages.OutageBook``."""

    def failing(self, agent: str, first: datetime, at: datetime, reason: str) -> Outage: ...

    def answered(self, agent: str, at: datetime) -> Outage: ...


class SerialWorker:
    """Runs jobs one after the other on a daemon thread of its own, started on the first
    job; a job that raises is logged, and the next one runs."""

    def __init__(self, name: str = "outage-reports"):
        self._name = name
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Job) -> None:
        self._jobs.put(job)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - a report lost is made again later
                log.warning("outage report failed (the next one tries again): %s", exc)


class OutageWatch:
    """One agent's calls as this instance sees them, reported as the rules say."""

    def __init__(
        self,
        agent: str,
        reporter: Reporter,
        shared: Callable[[], Outage | None],
        policy: OutagePolicy,
        run: Callable[[Job], None],
    ):
        """``shared``: the agent's record as this instance last read or wrote it (no I/O);
        ``run``: where a report runs (a ``SerialWorker``'s ``submit``; tests run it at
        once)."""
        self.agent = agent
        self._reporter = reporter
        self._shared = shared
        self._policy = policy
        self._run = run
        self._lock = threading.Lock()
        #: the first failure since the last answer here, and the last error
        self._first: datetime | None = None
        self._reason = ""
        #: when this instance last reported its current streak (None: not yet)
        self._reported: datetime | None = None
        #: counts answers: a report of an earlier streak does not mark the current one
        self._streak = 0
        self._busy = False
        self._answering = False
        #: a report that failed (the store did not answer) is not tried again before this
        self._quiet_until: datetime | None = None

    def failed(self, at: datetime, reason: str) -> None:
        """A call ended unanswered at ``at`` (memory only, unless a report is due)."""
        with self._lock:
            if self._first is None:
                self._first = at
            self._reason = reason
            if self._busy or self._quiet(at) or not self._due(at):
                return
            self._busy = True
            first, streak = self._first, self._streak

        def report() -> None:
            try:
                self._reporter.failing(self.agent, first, at, reason)
                with self._lock:
                    if self._streak == streak:
                        self._reported = at
            except Exception:
                self._hush(at)
                raise
            finally:
                with self._lock:
                    self._busy = False

        self._run(report)

    def _quiet(self, at: datetime) -> bool:
        """(With the lock held.) Is it too soon after a report that failed?"""
        return self._quiet_until is not None and at < self._quiet_until

    def _hush(self, at: datetime) -> None:
        with self._lock:
            self._quiet_until = at + self._policy.report_after

    def _due(self, at: datetime) -> bool:
        """(With the lock held.) Is a report of the failures due at ``at``?"""
        assert self._first is not None
        if self._reported is None:
            if at - self._first >= self._policy.report_after:
                return True
        elif at - self._reported >= self._policy.heartbeat:
            return True
        shared = self._shared()
        return (
            shared is not None
            and shared.failing
            and not shared.alerted
            and shared.since is not None
            and at - shared.since >= self._policy.alert_after
        )

    def answered(self, at: datetime) -> None:
        """The remote answered at ``at``: the end of this instance's failures (reported if
        it told of them, or if the shared record says the agent is failing)."""
        with self._lock:
            told = self._reported is not None
            self._first, self._reported = None, None
            self._streak += 1
            if self._answering or self._quiet(at):
                return
            shared = self._shared()
            failing = (
                shared is not None
                and shared.failing
                and shared.since is not None
                and shared.since < at
            )
            if not (told or failing):
                return
            self._answering = True

        def report() -> None:
            try:
                self._reporter.answered(self.agent, at)
            except Exception:
                self._hush(at)
                raise
            finally:
                with self._lock:
                    self._answering = False

        self._run(report)
