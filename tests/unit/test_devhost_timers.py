"""devhost timers: NCRONTAB next times, what a tick passes, and ticks missed while running."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devhost.app_loader import FunctionSpec
from devhost.settings import ConfigError
from devhost.timers import TimerRunner, parse_schedule
from tests.support import direct_invoker

T0 = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)  # a Thursday


def nexts(expression: str, count: int, start: datetime = T0) -> list[datetime]:
    schedule = parse_schedule(expression)
    found, moment = [], start
    for _ in range(count):
        moment = schedule.next_after(moment)
        found.append(moment)
    return found


def at(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def test_every_ten_seconds() -> None:
    assert nexts("*/10 * * * * *", 3) == [
        at(2026, 1, 1, 0, 0, 10),
        at(2026, 1, 1, 0, 0, 20),
        at(2026, 1, 1, 0, 0, 30),
    ]


def test_every_second() -> None:
    assert nexts("*/1 * * * * *", 2) == [at(2026, 1, 1, 0, 0, 4), at(2026, 1, 1, 0, 0, 5)]


def test_every_five_minutes_and_weekday_mornings() -> None:
    assert nexts("0 */5 * * * *", 2) == [at(2026, 1, 1, 0, 5), at(2026, 1, 1, 0, 10)]
    # Thursday 1 Jan: 09:30 that day, then Friday, then Monday (weekend skipped).
    assert nexts("0 30 9 * * 1-5", 3) == [
        at(2026, 1, 1, 9, 30),
        at(2026, 1, 2, 9, 30),
        at(2026, 1, 5, 9, 30),
    ]
    assert nexts("0 0 9 * * Mon", 1) == [at(2026, 1, 5, 9, 0)]


def test_day_and_weekday_both_must_match_as_in_ncrontab() -> None:
    # Friday the 13th: February and March 2026 (classic cron would fire on every 13th OR Friday).
    assert nexts("0 0 0 13 * 5", 2) == [at(2026, 2, 13), at(2026, 3, 13)]


@pytest.mark.parametrize(
    "expression", ["* * * * *", "*/10 * * * * * *", "61 * * * * *", "x", "00:00:05"]
)
def test_bad_schedules_are_refused(expression: str) -> None:
    with pytest.raises(ConfigError, match="schedule"):
        parse_schedule(expression, "function 'tick' schedule")


def spec(handler: Any) -> FunctionSpec:
    trigger = {"type": "timerTrigger", "name": "timer", "schedule": "*/1 * * * * *"}
    return FunctionSpec("tick", "timerTrigger", trigger, handler)


def test_a_tick_passes_past_due_and_the_schedule_status() -> None:
    calls: list[Any] = []

    def handler(timer: Any) -> None:
        calls.append(timer)

    runner = TimerRunner(spec(handler), parse_schedule("*/1 * * * * *"), direct_invoker())
    runner.fire(T0, past_due=False)
    runner.fire(T0 + timedelta(seconds=1), past_due=True)
    assert [c.past_due for c in calls] == [False, True]
    assert calls[0].last is None
    assert calls[1].last == T0
    assert calls[1].next == T0 + timedelta(seconds=2)


def test_ticks_that_pass_while_the_function_runs_are_skipped() -> None:
    clock = [T0]
    seen: list[tuple[datetime, bool]] = []

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            clock[0] += timedelta(seconds=timeout or 0)
            return self.is_set()

    stop = Stop()

    def handler(timer: Any) -> None:
        seen.append((clock[0], timer.past_due))
        clock[0] += timedelta(seconds=3.5)  # runs through three ticks
        if len(seen) == 2:
            stop.set()

    schedule = parse_schedule("*/1 * * * * *")
    TimerRunner(spec(handler), schedule, direct_invoker(), now=lambda: clock[0]).run(stop)
    # The first tick at T0 + 1 s ends at T0 + 4.5 s: the next is T0 + 5 s, not a catch-up.
    assert seen == [(T0 + timedelta(seconds=1), False), (T0 + timedelta(seconds=5), False)]


def test_runner_fires_on_schedule_and_on_startup() -> None:
    fired = threading.Event()
    seen: list[bool] = []

    def handler(timer: Any) -> None:
        seen.append(timer.past_due)
        if len(seen) >= 2:
            fired.set()

    stop = threading.Event()
    runner = TimerRunner(
        spec(handler), parse_schedule("*/1 * * * * *"), direct_invoker(), run_on_startup=True
    )
    thread = runner.start(stop)
    try:
        assert fired.wait(4), "the timer did not fire twice within 4 s"
    finally:
        stop.set()
        thread.join(3)
    assert seen[0] is False
