"""The chaos suite's check of keyed orders (``tests.chaos.turn_checks``), on orders run by
the real services in memory (no processes: these run in a second): an honest run passes,
and each way a run could go wrong (two of a key at once over its limit, an order that
never ran, a slot left held by an order that ended) is named."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from core.model import Order
from core.turns import Holder, Slot
from tests.chaos.turn_checks import check_turns, keyed, keyed_order, most_at_once
from tests.fixtures.chaos_shop import LIMITS
from tests.support import declarations
from tests.unit.test_services_in_memory import T0, Services, build, reply_to

ACCOUNT = "acct-1"


@pytest.fixture
def s() -> Iterator[Services]:
    services = build()  # (the bootstrap puts the settings' declarations to use: then ours)
    with declarations("tests.fixtures.chaos_shop"):
        yield services


def messages(n: int = 3, workflow: str = "queued") -> dict[str, dict[str, Any]]:
    return {
        f"k-{i}": {"orderId": f"k-{i}", "workflow": workflow, "account": ACCOUNT} for i in range(n)
    }


def run_in_turn(s: Services, sent: dict[str, dict[str, Any]]) -> dict[str, Order | None]:
    """Send every order at once, then answer each request as it comes, a second apart."""
    for message in sent.values():
        s.scheduler.submit(json.dumps(message).encode())
    answered: set[tuple[str, int]] = set()
    while len(answered) < len(s.transport.requests):
        request = next(r for r in s.transport.requests if (r.order_id, r.attempt) not in answered)
        answered.add((request.order_id, request.attempt))
        s.clock.advance(1)
        s.scheduler.apply_reply(reply_to(request))
    return {o: s.store.load(o) for o in sent}


def test_orders_that_took_turns_pass(s: Services) -> None:
    sent = messages()
    final = run_in_turn(s, sent)

    verdict = check_turns(final, sent, s.store, timedelta(0))

    assert verdict.as_json() == {
        "orders": 3,
        "keys": 1,
        "waited": 2,
        "mostAtOnce": {f"queued|{ACCOUNT}": 1},
        "overLimit": [],
        "overLimitAsWritten": [],
        "neverRan": [],
        "leaked": [],
    }


def test_two_running_at_once_over_the_limit_are_named(s: Services) -> None:
    sent = messages()
    final = run_in_turn(s, sent)
    late = final["k-0"]
    assert late is not None
    for event in late.history:  # k-0 ends after k-1 took its turn
        if event.get("event") == "status" and event.get("status") == "completed":
            event["at"] = (T0 + timedelta(seconds=30)).isoformat()

    verdict = check_turns(final, sent, s.store, timedelta(0))

    assert verdict.over_limit == [f"queued|{ACCOUNT}"]
    assert verdict.over_limit_as_written == [f"queued|{ACCOUNT}"]
    # read as early as a clock's skew allows, an overlap shorter than it is not seen
    assert check_turns(final, sent, s.store, timedelta(seconds=60)).over_limit == []


def test_an_order_that_never_ran_and_a_slot_left_held_are_named(s: Services) -> None:
    sent = messages()
    final = run_in_turn(s, sent)
    final["k-2"] = None  # lost
    slot = s.store.read_slot("queued", ACCOUNT)
    held = Slot("queued", ACCOUNT, holders=(Holder("k-1", T0),), etag=slot.etag, limit=1)
    leaky = _Slots(held)

    verdict = check_turns(final, sent, leaky, timedelta(0))

    assert verdict.never_ran == ["k-2"]
    assert verdict.leaked == [f"queued|{ACCOUNT}: ['k-1']"]


class _Slots:
    """A ``TurnStore`` whose every read returns ``slot`` (only reads are used)."""

    def __init__(self, slot: Slot) -> None:
        self._slot = slot

    def read_slot(self, workflow: str, key: str) -> Slot:
        return self._slot

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"check_turns must only read slots, not call {name}")


def test_a_limit_of_two_allows_two() -> None:
    at = [T0 + timedelta(seconds=n) for n in range(4)]
    assert most_at_once([(at[0], at[2]), (at[1], at[3])]) == 2
    assert most_at_once([(at[0], at[1]), (at[1], at[2])]) == 1  # one ends as the next starts
    assert LIMITS == {"queued": 1, "queued-pair": 2}


def test_each_account_has_four_orders_one_refused_for_good() -> None:
    made = [keyed_order(f"o-{n}", n, 7) for n in range(40) if keyed(n)]
    assert len(made) == 8
    assert [e for _, e in made].count("error") == 2
    assert {m["account"] for m, _ in made} == {"acct-007-0", "acct-007-1"}
    assert {m["workflow"] for m, _ in made} == set(LIMITS)
