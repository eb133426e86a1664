"""The test kit (``testkit/``) a team tests its own workflows with: each thing a fake
remote or a person can do, what a run reports, and the mistakes it refuses with a message
that says what to change. Every run is in process, on the fake clock."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

import pytest

from agents.python import NotApplied, Refused
from core import links, workflows
from core.timefmt import parse_iso
from testkit import (
    KitError,
    answer,
    approve,
    calls_back,
    crash,
    decline,
    no_answer,
    no_decision,
    refuse,
    run_workflow,
    runs,
    unavailable,
    undecided,
)
from testkit.remotes import RemoteSpec

FLOWS = "tests.fixtures.kit_flows"
ORDER = {"chargeId": "ch-1", "amount": 40, "items": ["boots"], "email": "ann@example.com"}
#: Every remote of ``returns`` answering.
RETURNS: dict[str, RemoteSpec] = {
    "receive-return": answer({"rma": "R-1"}),
    "refund": answer(id="refundId"),
    "reverse-refund": answer(),
    "restock": answer(),
    "notify-customer": calls_back({"messageId": "m-1"}),
}


def returns(order: dict[str, Any] | None = None, **remotes: RemoteSpec) -> Any:
    """A ``returns`` order of ``ORDER`` (updated by ``order``), its remotes answering
    unless ``remotes`` says otherwise (by step name, ``_`` for ``-``)."""
    given = {k.replace("_", "-"): v for k, v in remotes.items()}
    return run_workflow(
        "returns", {**ORDER, **(order or {})}, {**RETURNS, **given}, declarations=FLOWS
    )


# --- answers -------------------------------------------------------------------------


def test_answers_flow_from_step_to_step_and_the_run_says_what_each_remote_received() -> None:
    run = returns()

    assert run.status == "completed"
    assert run.results["receive-return"] == {"rma": "R-1"}
    assert run.results["inspect"] == {"condition": "fine"}  # the Python agent, as declared
    assert run.received["refund"] == [{"chargeId": "ch-1", "rma": "R-1", "amount": 40}]
    assert run.keys("refund") == ["order-1:refund"]
    assert run.steps["refund-approved"].state == "skipped"  # 40 is under 200
    assert run.received["notify-customer"][0]["rma"] == "R-1"
    assert run.statuses == ["received", "processing", "completed"]
    assert run.alerts == []
    assert repr(run).startswith("<Run order-1 completed: receive-return processed, inspect")


def test_an_answer_can_be_computed_from_the_body_and_hand_out_ids() -> None:
    run = returns(
        refund=answer(lambda body: {"refunded": body["amount"] * 2}, id="refundId"),
    )
    assert run.results["refund"] == {"refunded": 80, "refundId": "refundId-1"}


# --- refusals and failures -------------------------------------------------------------


def test_a_refusal_fails_the_step_and_the_workflow_unwinds_with_the_ids_handed_out() -> None:
    run = returns({"damaged": False}, restock=refuse("the shelf is full"))

    assert run.step("restock").state == "error"
    assert run.step("restock").error == "restock: HTTP 422 the shelf is full"
    assert run.received["reverse-refund"] == [{"refundId": "refundId-1"}]
    assert run.step("refund").state == "compensated"
    assert "notify-customer" not in run.received


def test_a_refusal_where_nothing_is_undone_alerts_an_operator() -> None:
    run = run_workflow("order", ORDER, {"process": refuse("no such sku")}, declarations=FLOWS)

    assert run.status == "error"
    [alert] = run.alerts
    assert alert["step"] == "process" and "no such sku" in alert["reason"]


def test_an_unavailable_remote_is_tried_again_with_the_same_idempotency_key() -> None:
    run = run_workflow(
        "order", ORDER, {"process": [unavailable(), answer({"ok": True})]}, declarations=FLOWS
    )

    assert run.status == "completed"
    assert [c.attempt for c in run.calls] == [1, 2]
    assert run.keys("process") == ["order-1:process"] * 2
    assert run.calls[1].at > run.calls[0].at  # the retry came later, on the kit's clock


def test_a_remote_that_keeps_crashing_leaves_the_order_in_doubt_for_an_operator() -> None:
    run = run_workflow(
        "order",
        ORDER,
        {"process": crash()},
        declarations=FLOWS,
        settings={"MAX_FAILURE_COUNT": "2"},
    )

    assert run.status == "error"
    assert len(run.calls) == 2
    [alert] = run.alerts
    assert "may have been applied" in alert["reason"]


def test_no_answer_lets_the_deadline_pass_and_the_supervisor_retries() -> None:
    run = run_workflow(
        "order",
        ORDER,
        {"process": [no_answer(), answer({"ok": True})]},
        declarations=FLOWS,
        settings={"STEP_TIMEOUT_SECONDS": "20"},
    )

    assert run.status == "completed"
    first, second = run.calls
    assert (second.at - first.at).total_seconds() > 20  # after the first deadline
    assert first.key == second.key


# --- callbacks -------------------------------------------------------------------------


def test_a_remote_that_accepts_then_calls_back_completes_its_step_with_the_callback() -> None:
    run = returns(notify_customer=calls_back({"messageId": "m-9"}, after=60))

    assert run.status == "completed"
    assert run.results["notify-customer"] == {"messageId": "m-9"}
    assert [c.step for c in run.calls].count("notify-customer") == 1


def test_a_refused_callback_fails_its_step_and_on_failure_continue_goes_on() -> None:
    run = returns(notify_customer=calls_back(refused="mailbox full"))

    assert run.status == "completed"
    notified = run.step("notify-customer")
    assert notified.state == "error" and notified.continued
    assert "mailbox full" in str(notified.error)
    assert run.alerts == []


def test_on_failure_hold_keeps_the_order_for_an_operator_who_fixes_and_resubmits() -> None:
    run = returns(refund=[refuse("card expired"), answer(id="refundId")])

    assert run.status == "error"
    [alert] = run.alerts
    assert alert["step"] == "refund" and "card expired" in alert["reason"]
    assert "reverse-refund" not in run.received  # nothing undone while it is held
    assert "notify-customer" not in run.received

    run.resubmit({"chargeId": "ch-2"})

    assert run.status == "completed"
    assert [b["chargeId"] for b in run.received["refund"]] == ["ch-1", "ch-2"]


def test_a_callback_later_than_the_deadline_is_asked_for_again_with_the_same_key() -> None:
    run = returns(notify_customer=calls_back({"messageId": "m-1"}, after=200))  # deadline 120

    assert run.status == "completed"
    assert run.keys("notify-customer") == ["order-1:notify-customer"] * 2


def test_a_callback_needs_the_url_in_the_body_and_the_kit_says_how_to_give_it() -> None:
    with pytest.raises(KitError, match=r"no events_url\(ctx.order_id, 'sent'\)"):
        run_workflow("forgets-the-url", ORDER, {"notify": calls_back()}, declarations=FLOWS)


def test_a_remote_delivers_an_event_of_its_own_on_the_url_it_was_given() -> None:
    run = run_workflow(
        "paid-later",
        ORDER,
        {"invoice": answer()},
        events={"paid": approve({"amount": 40})},
        declarations=FLOWS,
    )
    assert run.status == "completed" and run.results["paid"] == {"amount": 40}


# --- a person's decisions --------------------------------------------------------------


def big(**events: Any) -> Any:
    return run_workflow(
        "returns", {**ORDER, "amount": 300}, RETURNS, events=events, declarations=FLOWS
    )


def test_an_approval_is_given_after_a_wait_and_its_result_is_the_steps() -> None:
    run = big(**{"refund-approved": approve({"by": "ann"}, after=3600)})

    assert run.status == "completed"
    assert run.results["refund-approved"] == {"by": "ann"}
    assert run.calls[-1].at - run.calls[0].at >= timedelta(hours=1)


def test_a_declined_approval_unwinds() -> None:
    run = big(**{"refund-approved": decline("not this time")})

    assert run.step("refund-approved").state == "error"
    assert "refund" not in run.received


def test_with_no_decision_the_timeout_passes_on_the_kits_clock() -> None:
    run = big(**{"refund-approved": no_decision()})

    approval = run.step("refund-approved")
    assert approval.state == "error"
    assert "no event refund-approved" in str(approval.error)  # its timeout passed
    assert "refund" not in run.received


def test_an_undecided_event_stops_the_run_there_and_decide_goes_on() -> None:
    run = big(**{"refund-approved": undecided()})

    assert run.status == "processing"
    assert run.waiting_for == [
        {"step": "refund-approved", "event": "refund-approved", "by": "person"}
    ]
    run.decide("refund-approved", approve({"by": "bob"}))
    assert run.status == "completed"
    assert run.results["refund-approved"] == {"by": "bob"}


def test_time_passes_on_an_undecided_event_until_its_timeout() -> None:
    run = big(**{"refund-approved": undecided()})

    run.advance(86_400)  # a day: still waiting
    assert run.status == "processing"
    assert [w["step"] for w in run.waiting_for] == ["refund-approved"]

    run.advance(86_400 + 1)  # past the two days
    assert run.step("refund-approved").state == "error"
    assert "refund" not in run.received


def test_deciding_an_event_the_workflow_lacks_says_which_it_has() -> None:
    run = big(**{"refund-approved": undecided()})
    with pytest.raises(KitError, match=r"has no event 'approved' \(its events: refund-approved\)"):
        run.decide("approved", approve())


# --- Python agents ---------------------------------------------------------------------


def test_a_python_agent_runs_as_declared_and_its_refusal_fails_the_step() -> None:
    run = returns({"items": []})

    assert run.step("inspect").error == "inspect: refused: nothing to inspect"
    assert "refund" not in run.received


def test_a_python_agent_can_be_replaced_by_an_answer_or_a_function() -> None:
    damaged = returns(inspect=answer({"condition": "damaged"}))
    assert damaged.steps["restock"].state == "skipped"

    seen: list[dict[str, Any]] = []

    def inspect(order: dict[str, Any], **call: Any) -> dict[str, Any]:
        seen.append({"order": order["orderId"], **call})
        if call["attempt"] == 1:
            raise NotApplied("the desk is closed")
        return {"condition": "fine"}

    run = run_workflow(
        "returns",
        ORDER,
        {**RETURNS, "inspect": runs(inspect)},
        declarations=FLOWS,
        settings={"STEP_TIMEOUT_SECONDS": "45"},
    )
    assert run.status == "completed"
    assert [s["attempt"] for s in seen] == [1, 2]
    assert {s["idempotency_key"] for s in seen} == {"order-1:inspect"}

    # the deadline a handler is given is its step's (STEP_TIMEOUT_SECONDS after its
    # attempt began), as its agent gives it
    calls = [c for c in run.calls if c.step == "inspect"]
    assert [s["deadline"] - c.at for s, c in zip(seen, calls, strict=True)] == [
        timedelta(seconds=45)
    ] * 2

    def refuses(order: dict[str, Any], **call: Any) -> None:
        raise Refused("no inspector today")

    assert "no inspector today" in str(returns(inspect=runs(refuses)).step("inspect").error)


# --- delays, declaration bugs, operators -------------------------------------------------


def test_a_delay_passes_on_the_kits_clock() -> None:
    run = run_workflow("wait", ORDER, {"go": answer()}, declarations=FLOWS)

    assert run.status == "completed"
    [waited] = [h for h in run.step("cool-off").view["history"] if h["event"] == "waiting"]
    assert run.calls[0].at >= parse_iso(waited["deadline"])  # not before the delay ended
    until = run_workflow(
        "wait-until", {"until": "2030-02-01T00:00:00+00:00"}, {"go": answer()}, declarations=FLOWS
    )
    assert until.calls[0].at.isoformat() >= "2030-02-01T00:00:00+00:00"


def test_a_declarations_bug_shows_as_an_alert_naming_the_exception() -> None:
    run = run_workflow(
        "charge-twice",
        ORDER,
        {"charge": answer(), "refund-charge": answer()},
        declarations=FLOWS,
    )

    assert run.step("total").state == "error"
    assert "total" not in run.received  # a bug in a declaration never reaches a remote
    assert any("ZeroDivisionError" in a["reason"] for a in run.alerts), run.alerts


def test_an_operator_fixes_and_resubmits_and_the_run_goes_on() -> None:
    run = run_workflow(
        "order",
        {"sku": "typo"},
        {"process": [refuse("no such sku"), answer({"ok": True})]},
        declarations=FLOWS,
    )
    assert run.status == "error"

    run.resubmit({"sku": "boots"})

    assert run.status == "completed"
    assert [body["sku"] for body in run.received["process"]] == ["typo", "boots"]


def test_an_operator_cancels_a_waiting_order_and_the_history_says_who() -> None:
    run = big(**{"refund-approved": undecided()})

    run.cancel(reason="the customer kept it")

    # receive-return has no compensation: its effect stands, and an operator is told
    assert run.status == "error"
    assert "effect stands" in run.alerts[0]["reason"]
    assert {"by": "ops@testkit", "reason": "the customer kept it"}.items() <= next(
        h for h in run.history if h["event"] == "cancel-requested"
    ).items()
    assert "refund" not in run.received


# --- mistakes in use ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: run_workflow("retruns", declarations=FLOWS), "declares no workflow 'retruns'"),
        (
            lambda: run_workflow("returns", ORDER, {"refnd": answer()}, declarations=FLOWS),
            "has no step or compensation 'refnd'",
        ),
        (
            lambda: run_workflow(
                "returns", ORDER, {"refund-approved": answer()}, declarations=FLOWS
            ),
            "'refund-approved' is an Event",
        ),
        (
            lambda: run_workflow(
                "returns", ORDER, events={"refund": approve()}, declarations=FLOWS
            ),
            "'refund' is a remote's step",
        ),
        (
            lambda: run_workflow("returns", ORDER, {"refund": approve()}, declarations=FLOWS),  # type: ignore[dict-item]
            "a decision is for an Event",
        ),
        (
            lambda: run_workflow("returns", ORDER, {"refund": calls_back()}, declarations=FLOWS),
            "'refund' declares no completes_on",
        ),
        (
            lambda: run_workflow("wait", ORDER, {"cool-off": answer()}, declarations=FLOWS),
            "'cool-off' is a Delay",
        ),
        (
            lambda: run_workflow("order", ORDER, declarations=FLOWS),
            "the run called 'process' (agent 'orders'), for which remotes= declares nothing",
        ),
        (
            lambda: run_workflow("returns", {**ORDER, "amount": 300}, RETURNS, declarations=FLOWS),
            "the order waits for event 'refund-approved', for which events= declares nothing",
        ),
        (lambda: refuse("busy", status=503), "a refusal is a 4xx"),
        (
            lambda: run_workflow("order", {"orderId": ""}, declarations=FLOWS),
            "the order was refused: ",
        ),
    ],
)
def test_a_mistake_in_using_the_kit_says_what_to_change(call: Any, says: str) -> None:
    with pytest.raises((KitError, ValueError), match=re.escape(says)):
        call()


def test_the_orders_own_id_is_the_runs() -> None:
    run = run_workflow("order", {"orderId": "o-7"}, {"process": answer()}, declarations=FLOWS)
    assert run.order_id == "o-7" and run.keys("process") == ["o-7:process"]


def test_a_run_leaves_the_declarations_and_the_environment_as_it_found_them() -> None:
    before = workflows.in_use()
    host = os.environ.get("WEBSITE_HOSTNAME")
    links.serve_at("app.example:7071")
    try:
        returns()

        assert workflows.in_use() == before
        assert os.environ.get("WEBSITE_HOSTNAME") == host
        assert links.served_at() == "app.example:7071"  # the app's host name, as it was
    finally:
        links.serve_at("")
