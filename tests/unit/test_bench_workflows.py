"""bench.workflows' pure helpers: a parallel group's span from its steps' histories, the
whole-second rounding of a wake-up's visibility delay, the spread of send times, and
the index phase's requests per tick (bench/workflows.py, bench/waitindex.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from bench.flows import WORKFLOWS, parallel_steps
from bench.waitindex import requests_summary
from bench.workflows import (
    event_times,
    group_span,
    irregular_gaps,
    share_within,
    thirds,
    verdicts,
    visibility_round_up,
)


def at(seconds: float) -> str:
    whole, frac = divmod(seconds, 1)
    return f"2026-11-27T08:00:{int(whole):02d}.{round(frac * 1000):03d}Z"


T0 = event_times([{"event": "claimed", "at": at(0)}], "claimed")[0]


def history(*events: tuple[str, float]) -> list[dict[str, Any]]:
    return [{"event": name, "at": at(seconds)} for name, seconds in events]


def test_a_group_runs_from_its_claim_to_the_last_of_its_steps_first_success() -> None:
    steps = [
        history(("created", 0.0), ("claimed", 0.010), ("succeeded", 1.050)),
        history(("created", 0.0), ("claimed", 0.010), ("succeeded", 1.200), ("succeeded", 3)),
    ]
    span = group_span(steps)
    assert span is not None
    assert span[0] - T0 == pytest.approx(0.010)
    assert span[1] - T0 == pytest.approx(1.200)


def test_a_group_with_a_step_never_claimed_or_never_succeeded_has_no_span() -> None:
    done = history(("claimed", 0.0), ("succeeded", 1.0))
    assert group_span([done, history(("claimed", 0.0), ("expired", 30.0))]) is None
    assert group_span([done, history(("created", 0.0), ("skipped", 0.0))]) is None
    assert group_span([]) is None


def test_share_within_counts_the_limit_itself() -> None:
    assert share_within([0.5, 1.0, 1.5, 2.0], 1.0) == 0.5
    assert share_within([], 1.0) == 1.0


def test_the_visibility_delay_rounds_up_to_a_whole_second() -> None:
    # Delay(seconds=5) sent as it starts: no rounding; until= 4.3 s ahead: 0.7 s late.
    assert visibility_round_up(100.0, 105.0) == pytest.approx(0.0)
    assert visibility_round_up(100.0, 104.3) == pytest.approx(0.7)
    assert visibility_round_up(100.0, 99.0) == pytest.approx(1.0)  # past: visible at once


def test_irregular_gaps_stay_in_range_and_spread_over_it() -> None:
    gaps = irregular_gaps(40, 0.15, 0.65)
    assert len(gaps) == 40
    assert all(0.15 <= g <= 0.65 for g in gaps)
    # every tenth of the range is hit (the golden ratio's sequence is evenly spread)
    assert {int((g - 0.15) / 0.05) for g in gaps} == set(range(10))


def test_requests_per_tick_by_kind_when_every_run_made_the_same() -> None:
    same = [Counter({"app:table.query": 16}), Counter({"app:table.query": 16})]
    assert requests_summary(same) == {"total": 16, "byKind": {"table.query": 16}}
    varied = [Counter({"app:table.query": 16}), Counter({"app:table.query": 17})]
    assert requests_summary(varied)["total"] == {"min": 16, "max": 17}


def test_verdicts_read_each_phase() -> None:
    widths = {
        str(n): {
            "groupMs": {"p50": 1080, "p90": 1200, "p99": 1400, "max": 1500},
            "withinTarget": 0.97,
        }
        for n in (2, 5)
    }
    delay = {"all": {"fireLagMs": {"p50": 100, "p90": 900, "max": 1900}, "withinTarget": 0.8}}
    result = {
        "parallel": {"widths": widths},
        "events": {"eventToRequestMs": {"p50": 3}},
        "delays": {"idle": delay, "busy": delay},
    }
    out = verdicts(result)
    assert out["parallelGroup"]["holdsAtP50"] is True
    assert out["parallelGroup"]["holdsAtP99"] is False
    assert out["eventToRequest"]["holds"] is True
    assert out["delayFires"]["holds"] is False
    assert "waitingAddNothing" not in out


def test_the_bench_declarations_have_a_group_of_each_width() -> None:
    names = {w.name for w in WORKFLOWS}
    assert {"par-2", "par-3", "par-4", "par-5", "ev", "dl", "dl-until", "order"} <= names
    assert parallel_steps(3) == ("s1", "s2", "s3")


def test_thirds_show_a_backlog_building_up() -> None:
    assert thirds([1.0, 1.1, 1.0, 1.2, 1.0, 1.1]) == [1100, 1200, 1100]
    assert thirds([1.0, 1.0, 2.0, 2.0, 3.0, 3.5, 4.0]) == [1000, 2000, 3500]
    assert thirds([1.0, 2.0]) == []
