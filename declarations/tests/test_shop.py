"""The product's own workflows (``order``, ``fulfilment``, ``checkout``), tested with the
kit: a team's tests of its own workflows look like these (docs/add-a-workflow.md, "Test
it"). Each runs the workflow in process, its remotes faked, in milliseconds. Change them
with the workflows they test (and delete them with them)."""

from __future__ import annotations

from datetime import timedelta

from testkit import answer, approve, calls_back, decline, refuse, run_workflow, unavailable

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
