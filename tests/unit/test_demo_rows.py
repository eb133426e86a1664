"""The demo's live table (``make run``): a row says each step's state in a few words, and
a ForEach's items (docs/contracts.md §3.16) are counted on one token, not listed one by
one, so an order with many lines keeps a short row."""

from __future__ import annotations

from demo.__main__ import steps_text
from demo.scenarios import LINES, lined


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
