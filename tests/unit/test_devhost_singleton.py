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
    TimerLocks,
    host_id,
    lock_blob_name,
)
from devhost.timers import TimerRunner, parse_schedule
from tests.support import MemoryLeases, direct_invoker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pair(
    clock: Clock, names: tuple[str, str] = ("one", "two")
) -> tuple[TimerLocks, TimerLocks, MemoryLeases]:
    leases = MemoryLeases(clock)
    first, second = (TimerLocks(leases, "app", name, clock, clock) for name in names)
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
    assert (LEASE_SECONDS, SAFETY_SECONDS) == (15, 2.0)
    clock = Clock()
    first, _, leases = pair(clock)
    taken = leases.acquire

    def slow(*args: Any) -> bool:  # the answer comes 1 s after the request left
        clock.now += 1
        return taken(*args)

    leases.acquire = slow  # type: ignore[method-assign,assignment]
    first.try_all()  # asked at 1000 (answered at 1001 and 1002): held until 1013

    def broken(*_: Any) -> bool:
        raise ConnectionError("storage unreachable")

    leases.acquire = broken  # type: ignore[method-assign,assignment]
    clock.now = 1012.9
    first.try_all()  # fails: what it took before still counts, no longer
    assert first.holds("supervise")
    clock.now = 1013.1
    assert not first.holds("supervise")  # 2 s before the lease, asked at 1000, ends


def test_a_holder_whose_machine_slept_stops_by_the_wall_clock() -> None:
    mono, wall = Clock(), Clock()
    locks = TimerLocks(MemoryLeases(mono), "app", "one", mono, wall)
    locks.add(["supervise"])
    locks.try_all()
    wall.now += 60  # asleep: the monotonic clock stood still, Storage's lease ran out
    assert not locks.holds("supervise")


def test_two_processes_given_the_same_instance_id_still_take_turns() -> None:
    clock = Clock()
    first, second, _ = pair(clock, ("same", "same"))
    first.try_all()
    second.try_all()
    assert first.holds("supervise") and not second.holds("supervise")


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
    second.release_all()
    first.try_all()  # nobody holds them now, and still it takes nothing
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
