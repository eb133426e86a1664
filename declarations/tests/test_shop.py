"""The product's own workflows (``order``, ``fulfilment``, ``checkout``, ``order-lines``,
``per-customer``), tested with the kit: a team's tests of its own workflows look like
these (docs/add-a-workflow.md, "Test it"). Each runs the workflow in process, its remotes
faked, in milliseconds. Change them with the workflows they test (and delete them with
them)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from testkit import (
    KitError,
    answer,
    approve,
    calls_back,
    decline,
    refuse,
    run_workflow,
    unavailable,
)

ORDER = {"sku": "boots", "amount": 120}
#: fulfilment's and checkout's remotes, each answering with the id its undo names
SHOP = {
    "reserve-stock": answer(id="reservation"),
    "charge-payment": answer(id="charge"),
    "ship": answer({"tracking": "T-1"}),
    "release-stock": answer(),
    "refund-payment": answer(),
}


def test_an_order_is_processed_once_under_its_idempotency_key() -> None:
    run = run_workflow("order", ORDER, {"process": [unavailable(), answer({"done": True})]})

    assert run.status == "completed"
    assert run.keys("process") == ["order-1:process", "order-1:process"]
    assert run.received["process"][0]["sku"] == "boots"


def test_a_refused_shipment_undoes_the_charge_and_the_reservation_by_their_ids() -> None:
    run = run_workflow("fulfilment", ORDER, {**SHOP, "ship": refuse("no carrier today")})

    assert run.status == "compensated"
    assert run.received["refund-payment"][0]["charge"] == "charge-1"
    assert run.received["release-stock"][0]["reservation"] == "reservation-1"
    assert run.step("ship").error == "ship: HTTP 422 no carrier today"


def test_a_small_checkout_skips_the_approval_and_ships_once_the_carrier_calls_back() -> None:
    run = run_workflow("checkout", ORDER, {**SHOP, "ship": calls_back({"parcel": "P-1"}, after=20)})

    assert run.status == "completed"
    assert run.steps["approved"].state == "skipped"
    assert run.results["ship"] == {"parcel": "P-1"}
    assert run.received["ship"][0]["reservation"] == "reservation-1"
    assert run.received["ship"][0]["callback"]["url"].startswith("https://")


def test_a_big_checkout_waits_for_a_person_then_cools_off() -> None:
    run = run_workflow(
        "checkout",
        {**ORDER, "amount": 5000},
        {**SHOP, "ship": calls_back({"parcel": "P-2"})},
        events={"approved": approve({"by": "ann"}, after=3600)},
    )

    assert run.status == "completed"
    assert run.results["approved"] == {"by": "ann"}
    shipped = run.calls[-1].at - run.calls[0].at
    assert shipped >= timedelta(hours=1, seconds=3)  # the approval, then the cooling-off


def test_a_refused_approval_refunds_and_releases() -> None:
    run = run_workflow(
        "checkout",
        {**ORDER, "amount": 5000},
        SHOP,
        events={"approved": decline("looks like fraud")},
    )

    assert run.status == "compensated"
    assert "ship" not in run.received
    assert run.received["refund-payment"][0]["charge"] == "charge-1"


LINES = [{"sku": "boots", "qty": 1}, {"sku": "socks", "qty": 3}, {"sku": "tent", "qty": 1}]
#: order-lines' remotes: each line's reserve-line hands out its own reservation
LINED = {
    "charge-payment": answer(id="charge"),
    "refund-payment": answer(),
    "reserve-line": answer(id="reservation"),
    "release-line": answer(),
    "ship": answer({"tracking": "T-3"}),
}


def test_each_line_is_reserved_on_its_own_and_the_parcel_names_every_reservation() -> None:
    run = run_workflow("order-lines", {**ORDER, "lines": LINES}, LINED)

    assert run.status == "completed"
    assert run.received["reserve-line[1]"][0]["item"] == {"sku": "socks", "qty": 3}
    assert run.keys("reserve-line[2]") == ["order-1:reserve-line:2"]
    reservations = [line["reservation"] for line in run.results["reserve-line"]]
    assert len(set(reservations)) == 3
    assert run.received["ship"][0]["reservations"] == reservations


def test_a_line_out_of_stock_releases_the_others_by_their_own_reservations() -> None:
    out = refuse("out of stock")
    run = run_workflow("order-lines", {**ORDER, "lines": LINES}, {**LINED, "reserve-line[2]": out})

    assert run.status == "compensated"
    for i in (0, 1):
        [released] = run.received[f"release-line[{i}]"]
        assert released["reservation"] == run.results[f"reserve-line[{i}]"]["reservation"]
    assert "release-line[2]" not in run.received  # refused: nothing to release
    assert run.received["refund-payment"][0]["charge"] == "charge-1"
    assert "ship" not in run.received


def test_a_per_customer_order_takes_its_customers_turn_and_a_bad_key_is_refused() -> None:
    """The kit runs one order: it takes its customer's turn at once (its history says
    so); waiting behind another order is the product's to test (tests/unit/test_turns.py)."""
    run = run_workflow("per-customer", {**ORDER, "customer": "c-1"}, {"process": answer()})

    assert run.status == "completed"
    taken = [h for h in run.history if h["event"] == "turn-taken"]
    assert [h["turn"] for h in taken] == ["c-1"]
    with pytest.raises(KitError, match=r"concurrency key \(declarations.shop.customer\)"):
        run_workflow("per-customer", {**ORDER, "customer": 42}, {"process": answer()})
