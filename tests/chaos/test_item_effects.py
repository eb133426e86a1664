"""The chaos and e2e suites' check of orders with items (``tests.chaos.item_effects``), on
an order built with the real state machine and a ledger written by hand (no processes:
these run in a second): an honest run passes, and each way a run could go wrong is named.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from core.errors import TransitionRefused
from core.model import Order
from core.outcome import Outcome
from core.timefmt import iso
from simulator.engine import confirmation
from tests.chaos.item_effects import check_items, most_in_flight, record_of
from tests.support import declarations
from tests.unit.test_one_decision import POLICY, SECOND, T0, new, report, succeed

LINES = [{"sku": "A"}, {"sku": "B"}, {"sku": "C"}]


@pytest.fixture(autouse=True)
def items() -> Iterator[None]:
    with declarations("tests.fixtures.shop_items"):
        yield


def unwound() -> Order:
    """Three lines picked, the pack refused for good, every line undone: compensated."""
    order = new("picking", lines=LINES)
    now = T0
    for i in range(3):
        now = succeed(order, f"pick[{i}]", now)  # pick's result: {} (the kit's report)
    order.claim("i-1", now, step="pack")
    order.apply_reply(report(order, "pack", Outcome.REFUSED), now + SECOND, POLICY)
    for i in (2, 1, 0):
        now = succeed(order, f"unpick[{i}]", now + SECOND)
    assert str(order.status) == "compensated"
    return order


def effect(seq: int, key: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "seq": seq,
        "at": iso(T0 + seq * SECOND),
        "orderId": key.split(":", maxsplit=1)[0],
        "step": path,
        "idempotencyKey": key,
        "kind": "effect",
        "compensates": None,
        "undid": None,
        "request": body or {},
        "response": {"confirmation": confirmation(path, key)},
    }


def honest() -> list[dict[str, Any]]:
    picks = [effect(i + 1, f"o-1:pick:{i}", "pick-line") for i in range(3)]
    undos = [
        effect(4 + n, f"o-1:unpick:{i}", "unpick-line", {"line": i, "confirmation": None})
        for n, i in enumerate((2, 1, 0))
    ]
    return picks + undos


def verdict_of(ledger: list[dict[str, Any]]) -> dict[str, list[str]]:
    order = unwound()
    return check_items({"o-1": order}, ledger, [], {"o-1": "compensated"}).violations()


def test_an_honest_run_passes_and_each_key_is_put_back_on_its_record() -> None:
    assert verdict_of(honest()) == {}
    order = unwound()
    assert record_of(order, "o-1:pick:2") == "pick[2]"
    assert record_of(order, "o-1:unpick:1:2") == "unpick[1]"
    assert record_of(order, "o-1:pack") == "pack"
    assert most_in_flight(order, "pick") == 1  # the test ran them one after the other


def test_an_item_ended_by_a_late_success_is_not_in_flight_while_its_retry_is_out() -> None:
    """What the chaos run counted (and the model, asked to count attempts, found): pick[0]'s
    first attempt expires and its retry is claimed; then the first attempt's success
    comes: pick[0] has ended, and pick[3] starts beside pick[1] and pick[2]. The retry
    (the same key: nothing is applied twice) is out until its own report or deadline, but
    the item is no longer in flight (docs/contracts.md §3.16, "As built")."""
    order = new("picking", lines=[*LINES, {"sku": "D"}])
    first = order.claim("i-1", T0, step="pick[0]")
    for name in ("pick[1]", "pick[2]"):
        order.claim("i-1", T0 + 25 * SECOND, step=name)
    early = report(order, "pick[0]")  # attempt 1's success, held back
    now = first.complete_by + SECOND
    order.expire(now, POLICY, step="pick[0]")
    order.claim("i-1", now + SECOND, step="pick[0]")  # attempt 2 out
    order.apply_reply(early, now + 2 * SECOND, POLICY)  # attempt 1's success, late
    settled = order.find("pick[0]")
    assert settled is not None and str(settled.process_state) == "Processed"
    assert settled.attempts.get(2) is not None and settled.attempts.get(2).in_flight  # type: ignore[union-attr]
    order.claim("i-1", now + 3 * SECOND, step="pick[3]")
    assert most_in_flight(order, "pick") == 3
    assert attempts_out_at_most(order) == 4  # the retry's call, counted until its deadline


def attempts_out_at_most(order: Order) -> int:
    moments = []
    for record in order.steps:
        if record.step.startswith("pick["):
            for a in record.attempts.items:
                moments += [(a.claimed_at, 1), (a.ended_at or a.deadline, -1)]
    most = running = 0
    for _, change in sorted(moments):
        running += change
        most = max(most, running)
    return most


def test_an_item_applied_under_two_keys_is_applied_twice() -> None:
    ledger = [*honest(), effect(9, "o-1:pick:1:2", "pick-line")]
    assert list(verdict_of(ledger)) == ["applied_twice"]


def test_an_applied_item_never_undone_in_a_compensated_order_is_named() -> None:
    ledger = [e for e in honest() if e["idempotencyKey"] != "o-1:unpick:1"]
    assert verdict_of(ledger) == {"not_undone": ["o-1:pick[1]"]}


def test_an_item_undone_with_another_items_result_is_named() -> None:
    ledger = honest()
    other = confirmation("pick-line", "o-1:pick:1")
    ledger[-1]["request"]["confirmation"] = other  # unpick[0] names pick[1]'s
    assert list(verdict_of(ledger)) == ["undone_with_another"]


def test_an_order_not_ended_is_stuck_and_one_not_stored_lost() -> None:
    order = new("picking", lines=LINES)
    found = check_items({"o-1": order, "o-2": None}, [], [], {}).violations()
    assert found == {"stuck": ["o-1(pending)"], "lost": ["o-2"]}


def test_an_item_undone_while_the_pack_after_it_may_have_applied_is_named() -> None:
    """The pack cannot be undone: in doubt about it, the order stops (error), told, and
    nothing before it may be undone (contract 3.15)."""
    order = new("picking", lines=LINES)
    now = T0
    for i in range(3):
        now = succeed(order, f"pick[{i}]", now)
    for _ in range(POLICY.max_failure_count):
        step = order.claim("i-1", now, step="pack")
        now = step.complete_by + SECOND
        order.expire(now, POLICY, step="pack")
        now += 60 * SECOND
    assert str(order.status) == "error" and order.find("pack").may_have_applied  # type: ignore[union-attr]
    alert = {"orderId": "o-1", "step": "pack", "reason": "pack may have been applied"}
    picks = honest()[:3]
    told = check_items({"o-1": order}, picks, [alert], {"o-1": "completed"})
    assert told.violations() == {} and told.doubted == ["o-1"]
    undone = [*picks, effect(4, "o-1:unpick:2", "unpick-line")]
    found = check_items({"o-1": order}, undone, [alert], {"o-1": "completed"}).violations()
    # (and an effect of no record: the engine never started that compensation)
    assert sorted(found) == ["foreign_effects", "undone_around_doubt"]


def doubt_back_while_unwinding() -> tuple[Order, Any]:
    """The pack's first attempt expired (in doubt); its second was refused by the service
    after looking the key up, which settles the first: the unwinding begins, line 2 is
    undone, line 1's undo is created. Then a report of the first attempt says it may have
    applied after all: the doubt is back (``reclassified``). Returns the order and the
    time."""
    order = new("picking", lines=LINES)
    now = T0
    for i in range(3):
        now = succeed(order, f"pick[{i}]", now)
    step = order.claim("i-1", now, step="pack")
    now = step.complete_by + SECOND
    order.expire(now, POLICY, step="pack")
    now += 60 * SECOND
    order.claim("i-1", now, step="pack")
    refused = replace(report(order, "pack", Outcome.REFUSED), settled=True)
    order.apply_reply(refused, now + SECOND, POLICY)
    now = succeed(order, "unpick[2]", now + 2 * SECOND)
    late = report(order, "pack", Outcome.TRANSIENT, attempt=1, applied="maybe")
    order.apply_reply(late, now, POLICY)
    assert order.find("pack").may_have_applied  # type: ignore[union-attr]
    return order, now


def test_an_item_undo_begun_before_the_packs_doubt_came_back_was_not_undone_around_it() -> None:
    """What was undone before the doubt came back was decided on what was known then: not
    a violation; what was set to be undone and not yet sent is not sent (the order ends
    ``error``, told)."""
    order, _ = doubt_back_while_unwinding()
    assert str(order.status) == "error" and order.find("unpick[0]") is None
    alert = {"orderId": "o-1", "step": "pack", "reason": "pack may have been applied"}
    ledger = [*honest()[:3], honest()[3]]  # unpick[2] only
    verdict = check_items({"o-1": order}, ledger, [alert], {"o-1": "compensated"})
    assert verdict.violations() == {} and verdict.doubted == ["o-1"]


def test_an_undo_not_yet_requested_when_a_doubt_comes_back_is_not_requested() -> None:
    """Found by a chaos run (contract 3.15: no undo is decided, or sent, while a record
    is in doubt): line 1's undo, created before the pack's doubt came back and not sent
    yet, is withdrawn; line 1 stands succeeded, to be undone once the doubt is settled."""
    order, now = doubt_back_while_unwinding()
    withdrawn = order.find("unpick[1]")
    assert withdrawn is not None and not withdrawn.is_active and withdrawn.attempt == 0
    assert str(order.find("pick[1]").process_state) == "Processed"  # type: ignore[union-attr]
    with pytest.raises(TransitionRefused):
        order.claim("i-1", now + 2 * SECOND, step="unpick[1]")
    assert str(order.status) == "error"


def test_the_step_after_the_items_is_checked_too() -> None:
    order = new("picking", lines=LINES)
    now = T0
    for name in ("pick[0]", "pick[1]", "pick[2]", "pack"):
        now = succeed(order, name, now)
    assert str(order.status) == "completed"
    picks = honest()[:3]
    pack = effect(4, "o-1:pack", "pack")
    assert check_items({"o-1": order}, [*picks, pack], [], {"o-1": "completed"}).violations() == {}
    found = check_items({"o-1": order}, picks, [], {"o-1": "completed"}).violations()
    assert found == {"missing": ["o-1:pack"]}
    again = effect(5, "o-1:pack:2", "pack")
    twice = check_items({"o-1": order}, [*picks, pack, again], [], {"o-1": "completed"})
    assert list(twice.violations()) == ["applied_twice", "missing"]
