"""Gentle release (docs/contracts.md §3.14), on a fake clock: steps held by a pause or an
outage go on at a rate that starts at one call a second and doubles every few seconds up
to the agent's limits (``core.outages.ramp_rate``), applied by each agent's runner from
the release time every instance reads with the controls (``core.control_cache``); an
order that cannot have a call in time during the ramp comes back later, spread.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime, timedelta
from typing import Any

import pytest

from agents.limits import Ramp
from agents.outcomes import Try
from agents.pacing import RemotePolicy
from agents.runner import AttemptRunner
from core.control_cache import SETTLE, AgentRuntime, ControlView
from core.controls import AgentControl, Limits, Pause
from core.outages import RAMP_DOUBLING, Outage
from core.outcome import Applied
from core.workflows import AGENTS
from tests.unit.test_remote_client import T0, CountingThreads, FakeClock, MaxRng, make_request
from tests.unit.test_runner import ScriptedKind

OK = Try(Applied.YES, False, result={"ok": True})


def ramped_runner(
    released_at: datetime | None, limits: Limits
) -> tuple[AttemptRunner[ScriptedKind], ScriptedKind, FakeClock]:
    clock = FakeClock(T0)
    kind = ScriptedKind([OK] * 500, clock)
    runner = AttemptRunner(
        kind,
        RemotePolicy(),
        clock=clock,
        sleep=clock.asleep,
        rng=MaxRng(),
        runtime=lambda: AgentRuntime("orders", None, limits, released_at),
    )
    return runner, kind, clock


def call_times(runner: AttemptRunner[ScriptedKind], clock: FakeClock, n: int) -> list[float]:
    """``n`` held orders, each with a minute to run, one after the other (the fake clock
    moves only by the waits): when each reached the remote, in seconds after T0."""
    times = []
    for i in range(n):
        outcome = asyncio.run(runner.call(make_request(60 + i, order_id=f"o-{i}")))
        assert outcome.kind == "succeeded"
        times.append((clock.now - T0).total_seconds())
    return times


def before(times: list[float], seconds: float) -> int:
    return sum(1 for t in times if t < seconds)


def test_attempts_released_together_take_turns_at_a_doubling_rate() -> None:
    """Every held step comes at the release: their attempts take turns from one ramp."""
    ramp = Ramp()
    waits = [ramp.reserve(0.0, 0.0, 60.0)[0] for _ in range(60)]
    assert all(w is not None for w in waits)
    times = [w for w in waits if w is not None]
    assert times == sorted(times) and times[0] == 0.0
    # One a second at first, doubling every 3 s: 1 + 3/ln2 * (2^(t/3) - 1) calls by t.
    assert [before(times, t) for t in (1, 3, 6, 9)] == [2, 5, 13, 31]
    # The calls in each 3 s: about twice as many as in the 3 s before.
    assert [before(times, t + 3) - before(times, t) for t in (0, 3, 6)] == [5, 8, 18]


def test_a_turn_that_comes_too_late_is_not_taken() -> None:
    ramp = Ramp()
    for _ in range(5):
        ramp.reserve(0.0, 0.0, 60.0)
    wait, next_turn = ramp.reserve(0.0, 0.0, 1.0)  # the 6th turn is 3.3 s away
    assert wait is None and next_turn == pytest.approx(3.32, abs=0.01)
    again, _ = ramp.reserve(0.0, 0.0, 60.0)
    assert again == pytest.approx(3.32, abs=0.01)  # the turn was not used up


def test_calls_that_come_late_in_the_ramp_get_no_burst() -> None:
    ramp = Ramp()
    waits = [ramp.reserve(0.0, 12.0, 60.0)[0] for _ in range(40)]  # nobody called for 12 s
    times = [w for w in waits if w is not None]
    assert before(times, 0.01) <= 17  # a second's worth at 16 a second, not the 90 allowed
    assert before(times, 1.0) <= 36


def test_a_new_release_starts_the_turns_again() -> None:
    ramp = Ramp()
    for _ in range(10):
        ramp.reserve(0.0, 0.0, 60.0)
    assert ramp.reserve(100.0, 100.0, 60.0)[0] == 0.0


def test_held_orders_reach_the_remote_at_a_doubling_rate_then_the_agent_s_own() -> None:
    runner, _, clock = ramped_runner(T0, Limits(32, 20.0))
    times = call_times(runner, clock, 120)

    assert [before(times, t) for t in (1, 3, 6, 9)] == [2, 5, 13, 31]
    # log2(20) doublings (13 s) in, the ramp is over: 20 calls a second, the agent's rate.
    late = [t for t in times if t >= 14]
    assert late and all(b - a == pytest.approx(0.05) for a, b in itertools.pairwise(late))


def test_without_a_release_the_same_orders_go_at_the_agent_s_own_rate() -> None:
    runner, _, clock = ramped_runner(None, Limits(32, 20.0))
    times = call_times(runner, clock, 60)
    assert before(times, 3) >= 55  # 20 a second from the start


def test_the_ramp_is_counted_from_the_release_not_from_the_first_call() -> None:
    runner, _, clock = ramped_runner(T0 - timedelta(seconds=9), Limits(32, 100.0))
    times = call_times(runner, clock, 20)
    # 9 s in: 8 calls a second, then more (a second's worth at once at most).
    assert before(times, 1.0) <= 8 + 1 + 11


def test_the_ramp_is_over_at_the_agent_s_limits() -> None:
    runner, _, clock = ramped_runner(T0 - timedelta(seconds=60), Limits(32, 20.0))
    times = call_times(runner, clock, 21)
    assert before(times, 0.001) == 1 and times[-1] == pytest.approx(1.0)  # 20 a second


def test_an_order_with_no_call_free_in_time_during_the_ramp_comes_back_spread() -> None:
    runner, kind, _ = ramped_runner(T0, Limits(32, 20.0))
    for _ in range(5):  # five orders ahead take the first three seconds' turns
        runner.ramp.reserve(T0.timestamp(), T0.timestamp(), 60.0)
    late = make_request(4, order_id="o-late")  # 4 s left: stops a second before
    outcome = asyncio.run(runner.call(late))

    assert outcome.kind == "deferred" and "released gently" in outcome.error
    assert outcome.not_before is not None  # about the next free turn (3.3 s), spread
    next_turn = T0 + timedelta(seconds=3.32)
    assert next_turn <= outcome.not_before < next_turn + RAMP_DOUBLING + timedelta(seconds=0.01)
    assert kind.calls == []  # the remote never heard of it


# --- the release time every instance reads --------------------------------------------------


class Source:
    def __init__(self) -> None:
        self.controls: dict[str, AgentControl] = {}
        self.outages: dict[str, Outage] = {}

    def read_controls(self) -> dict[str, AgentControl]:
        return dict(self.controls)

    def read_outages(self) -> dict[str, Outage]:
        return dict(self.outages)


def test_a_resume_releases_once_every_instance_has_read_it() -> None:
    clock, source = FakeClock(T0), Source()
    view = ControlView(source, clock, outages=source)
    spec = AGENTS["orders"]
    source.controls["orders"] = AgentControl("orders", pause=Pause(T0, "alice", "maintenance"))
    assert view.runtime(spec).released_at is None  # paused: nothing released

    resumed = T0 + timedelta(minutes=5)
    source.controls["orders"] = AgentControl("orders", resumed_at=resumed)
    view.forget()
    assert view.runtime(spec).released_at == resumed + SETTLE


def test_the_end_of_an_outage_releases_and_the_later_release_counts() -> None:
    clock, source = FakeClock(T0), Source()
    view = ControlView(source, clock, outages=source)
    spec = AGENTS["orders"]
    ended = T0 + timedelta(minutes=8)
    source.outages["orders"] = Outage("orders", failing=True, since=T0)
    assert view.runtime(spec).released_at is None  # still failing: held by the breaker

    source.outages["orders"] = Outage("orders", since=T0, ended_at=ended)
    view.forget()
    assert view.runtime(spec).released_at == ended

    source.controls["orders"] = AgentControl("orders", resumed_at=ended + timedelta(minutes=1))
    view.forget()
    assert view.runtime(spec).released_at == ended + timedelta(minutes=1) + SETTLE


def test_a_record_this_process_wrote_is_used_at_once_and_never_read_on_the_event_loop() -> None:
    clock, source = FakeClock(T0), Source()
    view = ControlView(source, clock, outages=source)
    view.controls()
    source.outages["orders"] = Outage("orders", failing=True, since=T0)
    assert view.outage("orders") is None  # not read again before the period
    mine = Outage("orders", since=T0, ended_at=T0 + timedelta(seconds=3))
    view.learn(mine)
    assert view.outage("orders") == mine


def test_an_outage_record_that_cannot_be_read_keeps_the_last_one_read() -> None:
    clock, source = FakeClock(T0), Source()
    warnings: list[str] = []
    view = ControlView(source, clock, outages=source, warn=warnings.append)
    source.outages["orders"] = Outage("orders", failing=True, since=T0)
    view.controls()

    def broken() -> dict[str, Outage]:
        raise OSError("no storage")

    source.read_outages = broken  # type: ignore[method-assign]
    clock.advance(10)
    view.controls()
    assert view.outage("orders") == Outage("orders", failing=True, since=T0)
    assert warnings and "outage records could not be read" in warnings[0]


def test_the_runtime_at_hand_takes_no_thread_and_a_due_read_runs_on_the_agents() -> None:
    """Before each attempt the runner asks what is in force: ``runtime_at_hand`` on the
    event loop when it answers, else ``runtime`` on the agent's own threads; either way the
    attempt obeys the answer (here: paused, so nothing is called)."""
    paused = AgentRuntime("orders", Pause(T0, "ops", "maintenance"), Limits(4), None)

    def runner(hand: bool, threads: CountingThreads, reads: list[str]) -> AttemptRunner[Any]:
        def read() -> AgentRuntime:
            reads.append("read")
            return paused

        clock = FakeClock(T0)
        return AttemptRunner(
            ScriptedKind([OK], clock),
            RemotePolicy(),
            clock=clock,
            sleep=clock.asleep,
            runtime=read,
            runtime_at_hand=lambda: paused if hand else None,
            threads=threads,
        )

    for hand in (True, False):
        threads, reads = CountingThreads(), list[str]()
        outcome = asyncio.run(runner(hand, threads, reads).call(make_request(60)))
        assert outcome.kind == "deferred" and outcome.paused
        assert threads.ran == ([] if hand else ["controls read"])
        assert reads == ([] if hand else ["read"])
