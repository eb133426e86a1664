"""Timer triggers: six-field NCRONTAB schedules (``{second} {minute} {hour} {day} {month}
{day-of-week}``, day and day-of-week both matching, as the host reads them), in UTC.

Where devhost differs: no schedule monitor, so ``past_due`` is true only for a tick fired
over a second late in this process, never for ticks missed while it was down; ticks that
pass while the last invocation runs are skipped. Which process fires: ``devhost/singleton.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from croniter import croniter

from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker, start_thread
from devhost.settings import ConfigError
from hostrun.shapes import TimerInfo

LATE_TOLERANCE = timedelta(seconds=1)  # a tick later than this is past due


@dataclass(frozen=True)
class CronSchedule:
    text: str

    def next_after(self, moment: datetime) -> datetime:
        it = croniter(self.text, moment, second_at_beginning=True, day_or=False)
        return it.get_next(datetime)  # type: ignore[no-any-return]


def parse_schedule(text: str, where: str = "schedule") -> CronSchedule:
    fields = text.split()
    if len(fields) != 6:
        raise ConfigError(
            f"{where}: {text!r} has {len(fields)} fields; NCRONTAB needs six: "
            "{second} {minute} {hour} {day} {month} {day-of-week}, e.g. '0 */5 * * * *'"
        )
    if not croniter.is_valid(text, second_at_beginning=True):
        raise ConfigError(f"{where}: {text!r} is not a valid NCRONTAB expression")
    return CronSchedule(" ".join(fields))


class TimerRunner:
    """Fires one timer function on its schedule until ``stop`` is set, in its own thread,
    while ``gate`` says this process may (it holds the timer's singleton lock; None: always)."""

    def __init__(
        self,
        spec: FunctionSpec,
        schedule: CronSchedule,
        invoker: Invoker,
        run_on_startup: bool = False,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        gate: Callable[[], bool] | None = None,
    ) -> None:
        self.spec, self.schedule, self.invoker, self._now = spec, schedule, invoker, now
        self.run_on_startup, self.gate = run_on_startup, gate
        self._last: datetime | None = None

    def describe(self) -> str:
        startup = "runOnStartup, " if self.run_on_startup else ""
        next_fire = self.schedule.next_after(self._now())
        where = "every devhost process" if self.gate is None else "one instance at a time"
        when = f"UTC; {startup}next {next_fire:%H:%M:%S}; fires in {where}"
        return f"schedule {self.schedule.text!r} ({when})"

    def start(self, stop: threading.Event) -> threading.Thread:
        return start_thread(f"timer-{self.spec.name}", self.run, stop)

    def run(self, stop: threading.Event) -> None:
        may_fire = self.gate or (lambda: True)
        if self.run_on_startup and may_fire():
            self.fire(self._now(), past_due=False)
        due = self.schedule.next_after(self._now())
        while not stop.is_set():
            wait = (due - self._now()).total_seconds()
            if wait > 0:  # in short waits: a wall-clock jump cannot put a tick hours away
                stop.wait(min(wait, 1.0))
                continue
            if may_fire():  # else another instance holds the timer: its tick, not ours
                self.fire(due, past_due=self._now() - due > LATE_TOLERANCE)
            # Ticks that passed while the function ran are skipped, not caught up.
            due = self.schedule.next_after(max(self._now(), due))

    def fire(self, scheduled: datetime, past_due: bool) -> None:
        """One invocation (a failure is logged by the invoker)."""
        info = TimerInfo(past_due, self._last, self.schedule.next_after(scheduled), self._now())
        self._last = scheduled
        self.invoker.call(self.spec, info, detail=f"past due {past_due}")
