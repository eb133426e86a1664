"""``bench.capacity``'s pure parts: the backlog rebuilt from submit and done times, the
sustained rule, and the search's next rate (no stack; the benchmark asserts no speed)."""

from __future__ import annotations

import math

import pytest

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
    slope,
)


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
