"""devhost's timer singleton: one instance fires each timer, as the host's blob lease does
(``devhost/singleton.py``). The leases here are the in-memory twin; the same contract runs
on Azurite blobs in tests/integration/test_timer_locks.py."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from devhost.app_loader import FunctionSpec
from devhost.singleton import (
    LEASE_SECONDS,
    SAFETY_SECONDS,
    MemoryLeases,
    TimerLocks,
    host_id,
    lock_blob_name,
)
from devhost.timers import TimerRunner, parse_schedule
from tests.support import direct_invoker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pair(clock: Clock) -> tuple[TimerLocks, TimerLocks, MemoryLeases]:
    leases = MemoryLeases(clock)
    first, second = (TimerLocks(leases, "app", name, clock) for name in ("one", "two"))
    for locks in (first, second):
        locks.add(["supervise", "sweep"])
    return first, second, leases


def test_the_first_instance_takes_each_timer_and_the_other_does_not_fire_it() -> None:
    clock = Clock()
    first, second, _ = pair(clock)
    first.try_all()
    second.try_all()
    assert first.holds("supervise") and first.holds("sweep")
    assert not second.holds("supervise") and not second.holds("sweep")
    # The holder keeps it round after round; the other keeps trying in vain.
    for _ in range(10):
        clock.now += 5
        second.try_all()
        first.try_all()
        assert first.holds("supervise") and not second.holds("supervise")


def test_a_dead_holders_timers_move_on_when_its_lease_lapses() -> None:
    clock = Clock()
    first, second, _ = pair(clock)
    first.try_all()
    clock.now += LEASE_SECONDS - 1  # first has died: no more rounds from it
    second.try_all()
    assert not second.holds("supervise")
    clock.now += 1
    second.try_all()
    assert second.holds("supervise")
    # And the dead one's clock says it no longer may fire, had it only stalled.
    assert not first.holds("supervise")


def test_the_holder_stops_firing_before_its_lease_ends_if_it_cannot_renew() -> None:
    clock = Clock()
    first, _, leases = pair(clock)
    first.try_all()

    def broken(*_: Any) -> bool:
        raise ConnectionError("storage unreachable")

    leases.acquire = broken  # type: ignore[method-assign,assignment]
    clock.now += LEASE_SECONDS - SAFETY_SECONDS - 0.1
    first.try_all()  # fails: what it took before still counts, no longer
    assert first.holds("supervise")
    clock.now += 0.2
    assert not first.holds("supervise")  # stopped 2 s before another may take it


def test_a_stopping_instance_releases_so_another_takes_over_at_its_next_round() -> None:
    clock = Clock()
    first, second, _ = pair(clock)
    first.try_all()
    first.release_all()
    assert not first.holds("supervise")
    second.try_all()
    assert second.holds("supervise") and second.holds("sweep")
    first.try_all()  # released for good: a last round after the release takes nothing
    assert not first.holds("supervise")


def test_a_function_without_a_lock_always_fires() -> None:
    first, _, _ = pair(Clock())
    assert first.holds("not-a-timer-with-a-lock")


def test_host_ids_follow_the_hosts_rules() -> None:
    assert host_id({"AzureFunctionsWebHost__hostid": "My_App.Prod"}, "/x") == "my-app-prod"
    assert len(host_id({"AzureFunctionsWebHost__hostid": "a" * 50}, "/x")) == 32
    derived = host_id({}, "/apps/orders/function_app")
    assert derived == host_id({}, "/apps/orders/function_app")  # stable for the folder
    assert derived != host_id({}, "/apps/other/function_app")
    assert lock_blob_name("h", "supervise") == "locks/h/Host.Functions.supervise.Listener"


T0 = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)


def test_a_timer_fires_only_while_its_gate_is_open() -> None:
    clock = [T0]
    seen: list[datetime] = []
    open_at = {T0 + timedelta(seconds=s) for s in (1, 2, 5)}

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            clock[0] += timedelta(seconds=timeout or 0)
            if clock[0] >= T0 + timedelta(seconds=6):
                self.set()
            return self.is_set()

    trigger = {"type": "timerTrigger", "name": "timer", "schedule": "*/1 * * * * *"}
    spec = FunctionSpec("tick", "timerTrigger", trigger, lambda timer: seen.append(clock[0]))
    runner = TimerRunner(
        spec,
        parse_schedule("*/1 * * * * *"),
        direct_invoker(),
        now=lambda: clock[0],
        gate=lambda: clock[0] in open_at,
        run_on_startup=True,  # the gate is shut at start: no startup run either
    )
    runner.run(Stop())
    assert seen == sorted(open_at)
    assert "one instance at a time" in runner.describe()
