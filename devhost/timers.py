"""Timer triggers: six-field NCRONTAB schedules (or a TimeSpan), in UTC.

``{second} {minute} {hour} {day} {month} {day-of-week}``, as the Functions host reads
them (NCrontab: day and day-of-week must both match, unlike classic cron's "either").
A ``%SETTING%`` schedule is resolved before it gets here. ``hh:mm:ss`` (a TimeSpan, which
Azure accepts on App Service plans) fires at that interval after start.

Differences from Azure, on purpose:

- Timers run in **every** devhost process: there is no cross-process singleton lock (the
  host takes a blob lease so one instance fires). Start one devhost with the timers and
  ``--exclude`` them in the others if that matters; the project's supervisor is safe either
  way (its writes are conditional).
- No schedule monitor: nothing is persisted, so ``past_due`` is only true when a tick
  fires more than a second late in this process (e.g. the machine slept), never for ticks
  missed while devhost was down.
- One invocation of a function at a time per process: a tick that comes while the previous
  invocation still runs is skipped and logged.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from azure.functions.timer import TimerRequest
from croniter import croniter

from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker
from devhost.settings import ConfigError, parse_timespan

log = logging.getLogger("devhost.timers")
#: A tick later than this counts as past due.
LATE_TOLERANCE = timedelta(seconds=1)


class Schedule(Protocol):
    @property
    def text(self) -> str: ...

    def next_after(self, moment: datetime) -> datetime: ...


@dataclass(frozen=True)
class CronSchedule:
    text: str

    def next_after(self, moment: datetime) -> datetime:
        it = croniter(self.text, moment, second_at_beginning=True, day_or=False)
        result: datetime = it.get_next(datetime)
        return result


@dataclass(frozen=True)
class IntervalSchedule:
    text: str
    interval: timedelta

    def next_after(self, moment: datetime) -> datetime:
        return moment + self.interval


def parse_schedule(text: str, where: str = "schedule") -> Schedule:
    text = text.strip()
    if re.fullmatch(r"(\d+\.)?\d+:\d+(:\d+)?", text):
        seconds = parse_timespan(text, where)
        if seconds <= 0:
            raise ConfigError(f"{where}: the interval {text!r} must be positive")
        return IntervalSchedule(text, timedelta(seconds=seconds))
    fields = text.split()
    if len(fields) != 6:
        raise ConfigError(
            f"{where}: {text!r} has {len(fields)} fields; NCRONTAB needs six: "
            "{second} {minute} {hour} {day} {month} {day-of-week}, e.g. '0 */5 * * * *'"
        )
    if not croniter.is_valid(text, second_at_beginning=True):
        raise ConfigError(f"{where}: {text!r} is not a valid NCRONTAB expression")
    return CronSchedule(text)


def utc_now() -> datetime:
    return datetime.now(UTC)


class TimerRunner:
    """Fires one timer function on its schedule until ``stop`` is set."""

    def __init__(
        self,
        spec: FunctionSpec,
        schedule: Schedule,
        invoker: Invoker,
        run_on_startup: bool = False,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        self.spec = spec
        self.schedule = schedule
        self.invoker = invoker
        self.run_on_startup = run_on_startup
        self._now = now
        self._running = threading.Lock()
        self._last: datetime | None = None

    def describe(self) -> str:
        startup = "runOnStartup, " if self.run_on_startup else ""
        return (
            f"schedule {self.schedule.text!r} (UTC; {startup}next {self.next_fire():%H:%M:%S}; "
            "fires in every devhost process)"
        )

    def next_fire(self) -> datetime:
        return self.schedule.next_after(self._now())

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, args=(stop,), name=f"timer-{self.spec.name}", daemon=True
        )
        thread.start()
        return thread

    def run(self, stop: threading.Event) -> None:
        if self.run_on_startup:
            self.fire(self._now(), past_due=False)
        due = self.next_fire()
        while not stop.is_set():
            wait = (due - self._now()).total_seconds()
            if wait > 0:
                # Short waits, so a wall-clock jump cannot put a tick hours away.
                stop.wait(min(wait, 1.0))
                continue
            now = self._now()
            self.fire(due, past_due=now - due > LATE_TOLERANCE)
            due = self.schedule.next_after(max(now, due))

    def fire(self, scheduled: datetime, past_due: bool) -> bool:
        """Start an invocation in its own thread; False (logged) if one is still running."""
        if not self._running.acquire(blocking=False):
            log.warning(
                "timer %s: skipped the %s tick: the previous invocation is still running",
                self.spec.name,
                scheduled.isoformat(),
            )
            return False
        request = TimerRequest(
            past_due=past_due,
            schedule_status={
                "Last": self._last.isoformat() if self._last else None,
                "Next": self.schedule.next_after(scheduled).isoformat(),
                "LastUpdated": self._now().isoformat(),
            },
            schedule={"AdjustForDST": True},
        )
        self._last = scheduled
        threading.Thread(
            target=self._invoke, args=(request,), name=f"run-{self.spec.name}", daemon=True
        ).start()
        return True

    def _invoke(self, request: TimerRequest) -> None:
        try:
            detail = f"past due {request.past_due}"
            self.invoker.call(self.spec, request, detail=detail)  # logs a failure itself
        finally:
            self._running.release()
