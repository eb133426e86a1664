"""``bench.isolation``'s reading of the slow orders: when their window may open (every one
at its ship step) and what their steps did in it (no processes; the benchmark itself
asserts no speed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from bench.isolation import slow_steps, wait_at_ship
from demo.stack import LocalStack


def stack(orders: dict[str, list[Any]]) -> LocalStack:
    return cast(LocalStack, Stack(orders))


def order(*steps: tuple[str, list[dict[str, Any]]]) -> Any:
    return SimpleNamespace(steps=[SimpleNamespace(step=s, history=h) for s, h in steps])


class Stack:
    """A stack whose store answers from ``orders`` (order id -> a list of answers, one a
    read, the last kept)."""

    def __init__(self, orders: dict[str, list[Any]]) -> None:
        self.orders = orders
        self.context = SimpleNamespace(store=SimpleNamespace(load=self.load))

    def load(self, order_id: str) -> Any:
        answers = self.orders[order_id]
        return answers.pop(0) if len(answers) > 1 else answers[0]


def test_the_window_waits_until_every_slow_order_has_reached_its_ship_step() -> None:
    early = order(("payments", []), ("inventory", []))
    shipping = order(("payments", []), ("inventory", []), ("ship", []))
    fake = stack({"a": [shipping], "b": [early, early, shipping], "c": [None, shipping]})
    slept: list[float] = []
    left = wait_at_ship(fake, ["a", "b", "c"], timeout=60, sleep=slept.append, clock=lambda: 0)
    assert left == 0
    assert slept == [1, 1]  # "b" reached it at the third look


def test_the_window_opens_anyway_after_the_timeout_and_says_how_many_had_not() -> None:
    early = order(("payments", []))
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    fake = stack({"a": [early], "b": [order(("ship", []))]})
    left = wait_at_ship(fake, ["a", "b"], timeout=5, sleep=sleep, clock=lambda: now[0])
    assert left == 1 and now[0] == 5


def test_the_slow_orders_steps_are_counted_by_step_and_event_inside_the_window() -> None:
    def at(second: int, event: str) -> dict[str, Any]:
        return {"at": f"2026-11-29T10:00:{second:02d}Z", "event": event}

    t0 = 1795946400.0  # 2026-11-29T10:00:00Z
    fake = stack(
        {
            "a": [
                order(
                    ("inventory", [at(1, "claimed"), at(12, "succeeded")]),
                    ("ship", [at(12, "created"), at(13, "claimed"), at(14, "deferred")]),
                )
            ],
            "b": [order(("ship", [at(15, "claimed"), at(30, "deferred")]))],
        }
    )
    counts = slow_steps(fake, ["a", "b"], (t0 + 10, t0 + 20))
    assert {k: dict(v) for k, v in counts.items()} == {
        "inventory": {"succeeded": 1},
        "ship": {"created": 1, "claimed": 2, "deferred": 1},
    }
