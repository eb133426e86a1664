"""devhost timers: NCRONTAB next times and the one-at-a-time rule."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker
from devhost.settings import ConfigError
from devhost.timers import IntervalSchedule, TimerRunner, parse_schedule

T0 = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)  # a Thursday


def nexts(expression: str, count: int, start: datetime = T0) -> list[datetime]:
    schedule = parse_schedule(expression)
    found, moment = [], start
    for _ in range(count):
        moment = schedule.next_after(moment)
        found.append(moment)
    return found


def at(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


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


def test_timespan_schedules() -> None:
    schedule = parse_schedule("00:00:05")
    assert isinstance(schedule, IntervalSchedule)
    assert schedule.next_after(T0) == T0 + timedelta(seconds=5)


@pytest.mark.parametrize("expression", ["* * * * *", "*/10 * * * * * *", "61 * * * * *", "x"])
def test_bad_schedules_are_refused(expression: str) -> None:
    with pytest.raises(ConfigError, match="schedule"):
        parse_schedule(expression, "function 'tick' schedule")


def spec(handler: Any) -> FunctionSpec:
    trigger = {"type": "timerTrigger", "name": "timer", "schedule": "*/1 * * * * *"}
    return FunctionSpec("tick", "timerTrigger", trigger, handler, "/app")


def test_a_tick_is_skipped_while_the_previous_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    calls: list[Any] = []

    def handler(timer: Any) -> None:
        calls.append(timer)
        release.wait(5)

    invoker = Invoker()
    runner = TimerRunner(spec(handler), parse_schedule("*/1 * * * * *"), invoker)
    assert runner.fire(T0, past_due=False) is True
    assert runner.fire(T0 + timedelta(seconds=1), past_due=True) is False
    assert "skipped" in caplog.text
    release.set()
    assert invoker.wait_idle(5)
    for _ in range(50):  # the lock is released just after the invocation ends
        if runner.fire(T0 + timedelta(seconds=2), past_due=True):
            break
        release.wait(0.01)
    else:
        pytest.fail("the timer never became free again")
    assert invoker.wait_idle(5)
    assert [c.past_due for c in calls] == [False, True]
    assert calls[1].schedule_status["Last"] == T0.isoformat()


def test_runner_fires_on_schedule_and_on_startup() -> None:
    fired = threading.Event()
    seen: list[bool] = []

    def handler(timer: Any) -> None:
        seen.append(timer.past_due)
        if len(seen) >= 2:
            fired.set()

    stop = threading.Event()
    runner = TimerRunner(
        spec(handler), parse_schedule("*/1 * * * * *"), Invoker(), run_on_startup=True
    )
    thread = runner.start(stop)
    try:
        assert fired.wait(4), "the timer did not fire twice within 4 s"
    finally:
        stop.set()
        thread.join(3)
    assert seen[0] is False
