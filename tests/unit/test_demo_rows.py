"""The demo's live table (``make run``): a row says each step's state in a few words, and
a ForEach's items (docs/contracts.md §3.16) are counted on one token, not listed one by
one, so an order with many lines keeps a short row; an order waiting for its customer's
turn (§3.16) says so."""

from __future__ import annotations

from demo.__main__ import row_for, steps_text
from demo.progress import plain
from demo.scenarios import LINES, TURN_MS, Scenario, lined, queued
from tests.support import declarations
from tests.unit.test_services_in_memory import build, stored
from tests.unit.test_turns import send


def test_a_plain_row_names_each_step_and_attempts_past_the_first() -> None:
    records = [("reserve-stock", "Processed", 1), ("charge-payment", "Processing", 2)]
    assert steps_text(records) == "reserve-stock:Processed charge-payment:Processingx2"


def test_items_and_their_undos_are_counted_on_one_token_each() -> None:
    records = [
        ("charge-payment", "Compensated", 1),
        ("reserve-line", "Processed", 0),  # the head: its list, shown by its items
        ("reserve-line[0]", "Compensated", 1),
        ("reserve-line[1]", "Compensating", 1),
        ("reserve-line[2]", "Error", 1),
        ("release-line[0]", "Processed", 1),
        ("release-line[1]", "Processing", 1),
    ]
    assert steps_text(records) == (
        "charge-payment:Compensated reserve-line[3]:1 Compensated 1 Compensating 1 Error "
        "release-line[2]:1 Processed 1 Processing"
    )


def test_a_head_with_no_items_yet_is_shown_as_itself() -> None:
    assert steps_text([("reserve-line", "Processed", 0)]) == "reserve-line:Processed"


def test_the_demo_has_an_order_with_lines_and_one_whose_line_fails() -> None:
    ok, out = lined("d")
    assert ok.message("r")["lines"] == list(LINES) and ok.workflow == "order-lines"
    assert out.simulate == {"reserve-line[2]": "permanent"} and out.expected == "compensated"


def test_the_demo_queues_three_orders_of_one_customer_beside_one_of_another() -> None:
    cases = queued("d")
    assert {c.workflow for c in cases} == {"per-customer"}
    customers = [c.message("r")["customer"] for c in cases]
    assert customers == ["d-ann", "d-ann", "d-ann", "d-bob"]
    # each call takes long enough that the customer's next orders are seen waiting
    assert all(c.simulate == {"process": {"latencyMs": TURN_MS}} for c in cases)


def test_an_order_waiting_for_its_turn_says_so_in_its_row() -> None:
    s = build()
    with declarations("tests.fixtures.turns"):
        for order_id in ("a-1", "a-2"):
            send(s, order_id, account="ann")
    first, second = (stored(s, o) for o in ("a-1", "a-2"))
    case = Scenario("a-2", "ann's second", "completed", "serial")
    assert plain(row_for(case, second)[4]) == "waiting for its turn"
    assert plain(row_for(case, first)[4]) == "process"  # its turn: its step runs
