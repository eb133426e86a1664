"""``bench.capacity``'s pure parts: the backlog rebuilt from submit and done times, the
sustained rule, the search's next rate, and which stack a measured phase runs on (no
stack is started; the benchmark asserts no speed)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest

from bench import capacity as capacity_module
from bench.capacity import (
    BISECTIONS,
    FACTOR,
    Step,
    backlog_series,
    bisections_done,
    capacity,
    judge,
    main,
    next_rate,
    on_stack,
    slope,
)
from demo.stack import LocalStack


def stream(
    rate: float, seconds: float, latency: float, served: float | None = None
) -> tuple[list[float], list[float]]:
    """Submit times of an open loop at ``rate`` for ``seconds`` and when each was done:
    ``latency`` after its submit, or, with ``served``, one at a time at that rate (a
    server slower than the stream builds a queue)."""
    sent = [n / rate for n in range(round(rate * seconds))]
    if served is None:
        return sent, [t + latency for t in sent]
    done: list[float] = []
    free = 0.0
    for t in sent:
        free = max(free, t) + 1 / served
        done.append(free + latency)
    return sent, done


def test_the_backlog_is_what_was_sent_and_not_yet_done_at_each_sample() -> None:
    series = backlog_series([0.0, 0.5, 1.5, 2.5], [1.0, 3.5], 0.0, 3.0)
    assert series == [(0.0, 1), (1.0, 1), (2.0, 2), (3.0, 3)]


def test_the_series_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="end > start"):
        backlog_series([], [], 5.0, 5.0)


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([(0.0, 1), (1.0, 3), (2.0, 5)]) == pytest.approx(2.0)
    assert slope([(0.0, 4), (1.0, 2), (2.0, 4), (3.0, 2)]) == pytest.approx(-0.4)
    with pytest.raises(ValueError, match="at least two"):
        slope([(0.0, 1)])


def test_a_stream_served_with_a_steady_latency_is_sustained() -> None:
    sent, done = stream(20, 60, latency=0.3)
    verdict = judge(20, sent, done, 0.0, 60.0)
    assert verdict["sustained"]
    assert verdict["servedFraction"] == pytest.approx(1.0, abs=0.02)
    assert not verdict["senderBehind"]


def test_a_long_but_steady_latency_is_still_sustained() -> None:
    # Many orders in flight at once, but as many finishing as arriving: no growth.
    sent, done = stream(20, 60, latency=5.0)
    assert judge(20, sent, done, 0.0, 60.0)["sustained"]


def test_a_server_slower_than_the_stream_is_not_sustained() -> None:
    sent, done = stream(20, 60, latency=0.1, served=17)
    verdict = judge(20, sent, done, 0.0, 60.0)
    assert not verdict["sustained"]
    assert verdict["backlogSlopePerSecond"] == pytest.approx(3.0, abs=0.2)


def test_a_rate_that_was_not_offered_is_not_sustained() -> None:
    # The sender fell behind (15 orders/s of the 20 asked): the backlog is flat, but
    # fewer orders were served than the rate claims.
    sent, done = stream(15, 60, latency=0.2)
    verdict = judge(20, sent, done, 0.0, 60.0)
    assert verdict["backlogSlopePerSecond"] <= verdict["slopeBound"]
    assert verdict["servedFraction"] == pytest.approx(0.75, abs=0.02)
    assert verdict["sentPerSecond"] == pytest.approx(15, abs=0.5)
    assert verdict["senderBehind"]
    assert not verdict["sustained"]


def test_the_first_third_of_the_hold_is_left_out() -> None:
    # The pipeline fills over the first 20 s (the latency grows to 4 s), then serves
    # at the offered rate: judged over the whole hold, the backlog would be growing.
    sent, _ = stream(20, 60, latency=0)
    done = [t + 0.2 * min(t, 20.0) for t in sent]
    assert slope(backlog_series(sent, done, 0.0, 60.0)) > 0.6  # 3 % of 20/s
    assert judge(20, sent, done, 0.0, 60.0)["sustained"]


def steps(*pairs: tuple[float, bool]) -> list[Step]:
    return [Step(rate, ok) for rate, ok in pairs]


def test_the_search_starts_at_the_given_rate_and_rises_while_sustained() -> None:
    assert next_rate([], 5.0) == 5.0
    assert next_rate(steps((5, True)), 5.0) == pytest.approx(5 * FACTOR)
    assert next_rate(steps((5, True), (7.5, True)), 5.0) == pytest.approx(7.5 * FACTOR)


def test_then_it_bisects_between_the_last_sustained_and_the_first_unsustained() -> None:
    history = steps((10, True), (15, True), (22.5, False))
    assert next_rate(history, 10) == pytest.approx(math.sqrt(15 * 22.5))


def test_it_stops_after_its_bisections() -> None:
    history = steps((10, True), (15, True), (22.5, False), (18.4, True), (20.3, False))
    assert bisections_done(history) == BISECTIONS == 2
    assert next_rate(history, 10) is None
    assert capacity(history) == 18.4


def test_it_stops_once_the_bracket_is_narrow() -> None:
    assert next_rate(steps((20, True), (21, False)), 20) is None


def test_a_sustained_rate_above_an_unsustained_one_does_not_count() -> None:
    # Noise: the lowest unsustained rate bounds the capacity.
    history = steps((10, True), (15, False), (12.2, True), (13.5, True))
    assert capacity(history) == 13.5
    history = steps((10, True), (15, False), (16, True))
    assert capacity(history) == 10


def test_when_even_the_first_rate_fails_it_goes_lower_a_few_times() -> None:
    assert next_rate(steps((9, False)), 9) == pytest.approx(9 / FACTOR)
    none_held = steps((9, False), (6, False), (4, False), (2.7, False))
    assert next_rate(none_held, 9) is None
    assert capacity(none_held) is None


def test_bad_options_are_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--hold", "5"])
    assert "--hold must be at least 10 seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--start", "0"])
    assert "--start must be a positive rate" in capsys.readouterr().err


class Recorder:
    """What happened to the stacks of one phase, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.made = 0

    @contextmanager
    def fresh(self) -> Iterator[LocalStack]:
        self.made += 1
        name = f"fresh{self.made}"
        self.events.append(f"start {name}")
        try:
            yield cast(LocalStack, name)
        finally:
            self.events.append(f"stop {name}")

    def warm(self, stack: LocalStack) -> None:
        self.events.append(f"warm {stack}")

    def measure(self, stack: LocalStack) -> str:
        self.events.append(f"measure {stack}")
        return f"measured on {stack}"


def test_a_phase_runs_on_a_fresh_stack_warmed_up_first_and_stopped_after() -> None:
    seen = Recorder()
    assert on_stack(None, seen.fresh, seen.warm, seen.measure) == "measured on fresh1"
    assert seen.events == ["start fresh1", "warm fresh1", "measure fresh1", "stop fresh1"]
    on_stack(None, seen.fresh, seen.warm, seen.measure)
    assert seen.made == 2  # each phase its own stack


def test_with_same_stack_a_phase_runs_on_the_searchs_stack_as_it_is() -> None:
    seen = Recorder()
    search_stack = cast(LocalStack, "search")
    assert on_stack(search_stack, seen.fresh, seen.warm, seen.measure) == "measured on search"
    assert seen.events == ["measure search"]  # no new stack, no second warm-up


def test_a_fresh_stack_stops_even_when_its_phase_fails() -> None:
    seen = Recorder()

    def failing(stack: LocalStack) -> None:
        raise SystemExit("the backlog did not drain")

    with pytest.raises(SystemExit):
        on_stack(None, seen.fresh, seen.warm, failing)
    assert seen.events[-1] == "stop fresh1"


def test_fresh_stacks_by_default_same_stack_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[argparse.Namespace] = []

    def fake_run(args: argparse.Namespace) -> dict[str, Any]:
        asked.append(args)
        return {"cutShort": None, "latencyAtHalf": {}}

    monkeypatch.setattr(capacity_module, "run", fake_run)
    assert main([]) == 0
    assert main(["--same-stack", "--transport", "servicebus"]) == 0
    assert [a.same_stack for a in asked] == [False, True]
    assert asked[1].transport == "servicebus"


def test_a_fresh_stack_has_the_searchs_options() -> None:
    args = argparse.Namespace(devhosts=3, transport="servicebus")
    one, two = capacity_module.new_stack(args), capacity_module.new_stack(args)  # not started
    assert one is not two
    assert (one.devhosts, one.transport, one.settings) == (3, "servicebus", two.settings)
    assert one.settings == capacity_module.SETTINGS
