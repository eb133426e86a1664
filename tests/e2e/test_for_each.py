"""Steps over an order's items (docs/contracts.md §3.16) end to end, on both agent
transports: real processes (Azurite, the simulator, two devhosts; Service Bus on
localbus), ``tests.fixtures.shop_items``'s ``picking`` (pick each line, three at a time,
then pack with the picked lines).

An order whose five lines all succeed completes, and ``pack`` gets their results in
item order; in another, one line refused for good unwinds it: every item that applied is
undone with its own result, the refused one is not, and the remote saw each item under
its own key, ``<orderId>:pick:<i>``. Checked from outside: the orders in the table, the
simulator's ledger and its log of calls, and ``tests.chaos.item_effects``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from demo.stack import LocalStack
from demo.verify import drain_alerts_for
from simulator import load_ledger
from simulator.engine import confirmation
from tests.chaos.item_effects import check_items, most_in_flight
from tests.e2e.conftest import FAST
from tests.e2e.test_processes import TRANSPORTS, log_tail, wait_terminal
from tests.fixtures.shop_items import PICKING_CONCURRENCY
from tests.support import declarations

pytestmark = pytest.mark.timeout(240)
ITEMS = "tests.fixtures.shop_items"
LINES = 5


@pytest.fixture(params=TRANSPORTS)
def items_stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    with (
        declarations(ITEMS),
        LocalStack(settings={**FAST, "ORDERS_DECLARATIONS": ITEMS}, transport=request.param) as s,
    ):
        yield s


def picking(order_id: str, refused: int | None = None) -> dict[str, Any]:
    lines: list[dict[str, Any]] = [{"sku": f"S-{i}", "qty": i + 1} for i in range(LINES)]
    if refused is not None:
        lines[refused]["simulate"] = {"pick-line": "permanent"}
    return {"orderId": order_id, "workflow": "picking", "customerId": "c-1", "lines": lines}


def test_each_item_once_under_its_own_key_and_every_applied_one_undone_with_its_own_result(
    items_stack: LocalStack,
) -> None:
    stack = items_stack
    stack.submit(picking("fe-ok"))
    stack.submit(picking("fe-bad", refused=3))
    orders = wait_terminal(stack, ["fe-ok", "fe-bad"], 90)
    assert {k: str(o.status) for k, o in orders.items()} == {
        "fe-ok": "completed",
        "fe-bad": "compensated",
    }, log_tail(stack)
    ledger = load_ledger(stack.ledger_path)
    alerts = drain_alerts_for(stack.context, ["fe-bad"])  # it leaves after the save
    verdict = check_items(
        dict(orders), ledger, alerts, {"fe-ok": "completed", "fe-bad": "compensated"}
    )
    assert not verdict.violations(), verdict.violations()
    calls = stack.remote_calls()

    # all succeed: each line picked once, under its own key; pack got the results in order
    ok = [e for e in ledger if e["orderId"] == "fe-ok"]
    # the simulator names an item's effect by its record, pick[<i>] (path pick-line)
    picks = {e["idempotencyKey"]: e for e in ok if e["step"].startswith("pick[")}
    assert sorted(picks) == [f"fe-ok:pick:{i}" for i in range(LINES)]
    assert all(picks[f"fe-ok:pick:{i}"]["request"]["line"] == i for i in range(LINES))
    (pack,) = [e for e in ok if e["step"] == "pack"]
    assert pack["request"]["picked"] == [
        confirmation(f"pick[{i}]", f"fe-ok:pick:{i}") for i in range(LINES)
    ]
    assert orders["fe-ok"].find("pick").result == {  # type: ignore[union-attr]
        "items": [line for line in picking("fe-ok")["lines"]]
    }
    assert most_in_flight(orders["fe-ok"], "pick") <= PICKING_CONCURRENCY

    # line 3 refused for good: every line that applied undone with its own result
    bad = [e for e in ledger if e["orderId"] == "fe-bad"]
    applied = sorted(
        int(e["idempotencyKey"].split(":")[2]) for e in bad if e["step"].startswith("pick[")
    )
    undone = {
        int(e["idempotencyKey"].split(":")[2]): e for e in bad if e["step"].startswith("unpick[")
    }
    assert 3 not in applied and {0, 1, 2} <= set(applied), applied
    assert sorted(undone) == applied
    for i in applied:
        assert undone[i]["idempotencyKey"] == f"fe-bad:unpick:{i}"
        assert undone[i]["request"]["confirmation"] == confirmation(
            f"pick[{i}]", f"fe-bad:pick:{i}"
        )
        assert undone[i]["request"]["line"] == i
    # the remote saw line 3 under its own key, refused (422), never applied
    refused = [c for c in calls if c["idempotencyKey"] == "fe-bad:pick:3"]
    assert refused and all(c["answer"] == 422 and not c["applied"] for c in refused), refused
    assert "pack" not in [e["step"] for e in bad]
    assert most_in_flight(orders["fe-bad"], "pick") <= PICKING_CONCURRENCY
