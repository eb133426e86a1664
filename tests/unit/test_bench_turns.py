"""``bench.turns``' reading of the histories: when an order of a customer began and how
many of a customer's orders ran at once (no processes; the benchmark itself asserts no
speed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from bench.turns import began_at, gaps, order_of, overlaps
from core.model import Order

NONE = cast(Order, None)


def history_order(events: list[dict[str, Any]], steps: list[str]) -> Order:
    records = [SimpleNamespace(history=[{"at": at}]) for at in steps]
    return cast(Order, SimpleNamespace(order_id="o", history=events, steps=records))


def test_an_order_began_at_its_turn_or_else_at_its_first_step() -> None:
    waited = history_order(
        [
            {"event": "waiting", "at": "2026-11-29T10:00:00Z"},
            {"event": "turn-taken", "at": "2026-11-29T10:00:02Z"},
        ],
        ["2026-11-29T10:00:02.5Z"],
    )
    at_once = history_order(
        [{"event": "received", "at": "2026-11-29T10:00:00Z"}], ["2026-11-29T10:00:01Z"]
    )
    assert began_at(waited) - began_at(at_once) == 1  # 10:00:02 and 10:00:01


def test_one_after_the_other_is_no_overlap_and_each_gap_is_counted() -> None:
    runs = [(0.0, 1.0, NONE), (1.0, 2.0, NONE), (2.25, 3.0, NONE)]
    assert overlaps(runs) == 0
    assert gaps(runs) == [0.0, 250.0]


def test_two_running_at_once_are_an_overlap_unless_the_limit_allows_two() -> None:
    runs = [(0.0, 2.0, NONE), (1.0, 3.0, NONE)]
    assert overlaps(runs) == 1
    assert overlaps(runs, limit=2) == 0


def test_each_order_asks_the_remote_for_its_latency() -> None:
    assert order_of("o-1", "keyed", "c01", 300)["simulate"] == {"work": {"latencyMs": 300}}
