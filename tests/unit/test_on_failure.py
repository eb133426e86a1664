"""docs/contracts.md §3.17: what a failure means, declared per step.

``on_failure="hold"``: a step that fails for good holds the order in ``error`` with one
alert, and nothing is undone until an operator decides (fix and resubmit runs the step
again; cancel unwinds). ``on_failure="continue"``: the failure is recorded on the step
(``continued``), nothing is undone, nobody is told, the workflow goes on, and later
steps see the reason in ``ctx.failures``. A declaration's own exception is told whatever
``on_failure`` says. The workflows are ``tests/fixtures/failures.py``; the pure model on a
fake clock, as ``test_one_decision`` runs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime

import pytest

from admin.service import step_view
from core.model import Order
from core.outcome import Outcome
from core.states import OrderStatus, StepState
from core.steps import StepRecord
from core.workflows import WORKFLOWS, DeclarationError, Plan, StepSpec, Workflow
from tests.support import declarations
from tests.unit.test_one_decision import (
    POLICY,
    SECOND,
    T0,
    alerts,
    claim,
    new,
    record,
    report,
    status,
    succeed,
    unwind_to_the_end,
)


@pytest.fixture(autouse=True)
def failures() -> Iterator[None]:
    with declarations("tests.fixtures.failures"):
        yield


def refuse(order: Order, step: str, now: datetime, error: str = "HTTP 422 no parcel") -> datetime:
    """Claim ``step`` and report that its remote refused it for good (nothing applied)."""
    at = claim(order, step, now)
    order.apply_reply(report(order, step, Outcome.REFUSED, error=error), at + SECOND, POLICY)
    return at + 2 * SECOND


def in_doubt(order: Order, step: str, now: datetime) -> datetime:
    """Every attempt of ``step`` ends with a 500 (it may have applied) until it gives up."""
    for _ in range(POLICY.max_failure_count + 1):
        found = record(order, step)
        if found.process_state is not StepState.PENDING:
            break
        at = claim(order, step, now)
        reply = report(order, step, Outcome.TRANSIENT, error="HTTP 500", applied="maybe")
        order.apply_reply(reply, at + SECOND, POLICY)
        now = at + 2 * SECOND
    found = record(order, step)
    if found.process_state is StepState.PROCESSING:  # it gives up once its deadline passed
        now = found.complete_by + SECOND
        order.expire(now, POLICY, step=step)
    assert record(order, step).process_state is StepState.ERROR, record(order, step).history
    return now


def undone(order: Order) -> list[str]:
    """The compensations the order has started."""
    return [s.step for s in order.steps if s.compensates]


# --- hold --------------------------------------------------------------------------------------


def test_a_held_step_that_fails_leaves_the_order_in_error_with_nothing_undone() -> None:
    order = new("held")
    now = succeed(order, "charge", T0)
    order.outbox.clear()

    refuse(order, "ship", now)

    assert status(order) is OrderStatus.ERROR
    assert undone(order) == [], "a held failure undid the charge before anyone decided"
    [alert] = alerts(order)
    assert alert["step"] == "ship"
    assert "HTTP 422 no parcel" in alert["reason"] and "it was not applied" in alert["reason"]
    assert "resubmit" in alert["reason"] and "cancel" in alert["reason"]


def test_fix_and_resubmit_runs_the_held_step_again_and_the_order_goes_on() -> None:
    order = new("held", address="nowhere")
    now = refuse(order, "ship", succeed(order, "charge", T0))
    order.outbox.clear()

    order.resubmit(now, "ops", "address fixed", patch={"address": "1 Main St"})
    now = succeed(order, "ship", now)
    now = succeed(order, "close", now)

    assert status(order) is OrderStatus.COMPLETED
    assert order.body["address"] == "1 Main St"
    assert alerts(order) == [], "a resubmit by itself alerts nobody"


def test_a_cancel_of_a_held_order_unwinds_what_succeeded() -> None:
    order = new("held")
    now = refuse(order, "ship", succeed(order, "charge", T0))

    order.cancel(now, "ops", "customer gave up")
    now = unwind_to_the_end(order, now)

    assert status(order) is OrderStatus.CANCELLED
    assert undone(order) == ["refund"]
    assert record(order, "charge").process_state is StepState.COMPENSATED


def test_a_held_step_in_doubt_is_held_and_says_it_may_have_been_applied() -> None:
    order = new("held")
    now = succeed(order, "charge", T0)
    order.outbox.clear()

    in_doubt(order, "ship", now)

    assert status(order) is OrderStatus.ERROR
    assert undone(order) == []
    [alert] = alerts(order)
    assert "may have been applied" in alert["reason"]


# --- continue ----------------------------------------------------------------------------------


def test_a_step_that_may_fail_fails_alone_and_the_workflow_goes_on() -> None:
    order = new("mailing")
    now = succeed(order, "charge", T0)
    order.outbox.clear()

    now = refuse(order, "mail", now, error="HTTP 400 mailbox full")
    now = succeed(order, "close", now)

    assert status(order) is OrderStatus.COMPLETED
    assert alerts(order) == [], "a failure the workflow goes on past is nobody's business"
    assert undone(order) == []
    mail = record(order, "mail")
    assert mail.process_state is StepState.ERROR and mail.continued
    assert any(h["event"] == "continued" for h in mail.history)
    # the steps after it see why, and no result of it
    assert record(order, "close").input == {
        "mailed": False,
        "why-not": {"mail": "mail was refused by its service: HTTP 400 mailbox full"},
    }
    view = step_view(mail, "mail", order)
    assert view["continued"] is True and view["onFailure"] == "continue"


def test_a_step_that_may_fail_in_doubt_neither_stops_nor_blocks_a_later_unwind() -> None:
    order = new("mailing")
    now = succeed(order, "charge", T0)
    now = in_doubt(order, "mail", now)
    assert record(order, "mail").continued
    assert status(order) is OrderStatus.PROCESSING

    now = refuse(order, "close", now)
    now = unwind_to_the_end(order, now)

    # the e-mail's doubt was declared acceptable: the charge is undone around it
    assert status(order) is OrderStatus.COMPENSATED
    assert undone(order) == ["refund"]


def test_a_step_that_may_fail_beside_one_that_fails_the_order_unwinds_once() -> None:
    order = new("mail-beside-ship")
    now = succeed(order, "charge", T0)
    now = refuse(order, "mail", now)
    assert status(order) is OrderStatus.PROCESSING, "the e-mail's failure halted its group"

    now = refuse(order, "ship", now)
    now = unwind_to_the_end(order, now)

    assert status(order) is OrderStatus.COMPENSATED
    assert undone(order) == ["refund"]


def test_a_resubmit_runs_again_what_held_the_order_not_what_it_went_on_past() -> None:
    workflow = Workflow(
        "held",  # the fixture's names, so that the functions resolve
        (
            StepSpec("charge", agent="payments"),
            StepSpec("mail", agent="mail", on_failure="continue"),
            StepSpec("ship", agent="carrier", on_failure="hold"),
        ),
    )
    order = new(workflow)
    now = refuse(order, "mail", succeed(order, "charge", T0))
    now = refuse(order, "ship", now)
    assert status(order) is OrderStatus.ERROR

    order.resubmit(now, "ops")

    assert record(order, "ship").process_state is StepState.PENDING
    assert record(order, "mail").process_state is StepState.ERROR
    assert record(order, "mail").continued


# --- a declaration's own bug is always told ----------------------------------------------------


@pytest.mark.parametrize(
    ("on_failure", "ends"),
    [
        ("unwind", OrderStatus.COMPENSATED),
        ("hold", OrderStatus.ERROR),
        ("continue", OrderStatus.COMPLETED),
    ],
)
def test_an_input_that_raises_is_told_whatever_on_failure_says(
    on_failure: str, ends: OrderStatus
) -> None:
    order = new(f"buggy-{on_failure}")
    now = succeed(order, "charge", T0)
    now = unwind_to_the_end(order, now)

    assert status(order) is ends
    ship = record(order, "ship")
    assert ship.process_state is StepState.ERROR and ship.attempt == 0, "it reached a remote"
    told = [a for a in alerts(order) if a.get("step") == "ship"]
    assert len(told) == 1, alerts(order)
    assert "KeyError" in told[0]["reason"] and "chargeId" in told[0]["reason"]
    assert "declaration" in told[0]["reason"]


# --- what is declared, kept and shown ----------------------------------------------------------


def test_on_failure_is_pinned_with_the_plan_and_shown_with_the_workflow() -> None:
    plan = Plan.of(WORKFLOWS["held"], 30)
    assert plan.planned("ship").on_failure == "hold"
    assert plan.to_json()["steps"][1]["onFailure"] == "hold"
    assert "onFailure" not in plan.to_json()["steps"][0], "the default is not stored"
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    shown = WORKFLOWS["mailing"].describe()["steps"]
    assert [s["onFailure"] for s in shown] == ["unwind", "continue", "unwind"]


def test_an_unknown_on_failure_is_refused_naming_the_choices() -> None:
    with pytest.raises(DeclarationError, match='"hold"') as raised:
        StepSpec("ship", agent="carrier", on_failure="retry").check()  # type: ignore[arg-type]
    assert "test_on_failure.py" in str(raised.value)


def test_a_continued_failure_is_kept_by_the_store() -> None:
    order = new("mailing")
    refuse(order, "mail", succeed(order, "charge", T0))
    mail = record(order, "mail")

    again = StepRecord(
        mail.order_id, mail.step, mail.seq, mail.kind, mail.path, 30, mail.process_state, "", T0
    )
    again.load_decision_state(json.loads(json.dumps(mail.decision_state())))

    assert again.continued


def test_a_step_the_order_went_on_past_that_applied_after_all_is_a_success() -> None:
    order = new("mailing")
    now = succeed(order, "charge", T0)
    at = claim(order, "mail", now)
    attempt = record(order, "mail").attempt
    order.expire(record(order, "mail").complete_by + SECOND, POLICY, step="mail")
    for _ in range(POLICY.max_failure_count):  # no answer, attempt after attempt
        mail = record(order, "mail")
        if mail.process_state is StepState.ERROR:
            break
        at = claim(order, "mail", mail.complete_by)
        order.expire(record(order, "mail").complete_by + SECOND, POLICY, step="mail")
    assert record(order, "mail").continued
    order.outbox.clear()

    late = report(order, "mail", attempt=attempt, result={"messageId": "m-1"})
    order.apply_reply(late, at + 120 * SECOND, POLICY)

    mail = record(order, "mail")
    assert mail.process_state is StepState.PROCESSED and not mail.continued
    assert mail.result == {"messageId": "m-1"}
    assert alerts(order) == []


def test_a_step_that_may_fail_stopped_in_doubt_is_gone_past_not_told() -> None:
    """The e-mail got a 500 that may have applied and waits for its next attempt when
    the shipment beside it is refused: the group halts, the e-mail is stopped in doubt,
    and, declared ``continue``, its doubt keeps nothing from being undone and tells
    nobody (as if it had given up a moment earlier)."""
    order = new("mail-beside-ship")
    now = succeed(order, "charge", T0)
    at = claim(order, "mail", now)
    reply = report(order, "mail", Outcome.TRANSIENT, error="HTTP 500", applied="maybe")
    order.apply_reply(reply, at + SECOND, POLICY)
    assert record(order, "mail").process_state is StepState.PENDING
    order.outbox.clear()

    now = refuse(order, "ship", at + 2 * SECOND)
    now = unwind_to_the_end(order, now)

    assert status(order) is OrderStatus.COMPENSATED
    assert undone(order) == ["refund"]
    assert alerts(order) == []
    assert record(order, "mail").continued


def test_a_cancel_is_not_refused_for_a_step_that_may_fail_in_doubt() -> None:
    """Its doubt may stand (``continue``), so a cancel undoes the charge around it; the
    e-mail is not marked as gone past: the order did not go on."""
    order = new("mail-beside-ship")
    now = succeed(order, "charge", T0)
    at = claim(order, "mail", now)
    reply = report(order, "mail", Outcome.TRANSIENT, error="HTTP 500", applied="maybe")
    order.apply_reply(reply, at + SECOND, POLICY)

    order.cancel(at + 2 * SECOND, "ops", "the customer withdrew")  # not refused: doubt
    unwind_to_the_end(order, at + 3 * SECOND)

    assert status(order) is OrderStatus.CANCELLED
    assert undone(order) == ["refund"]
    mail = record(order, "mail")
    assert not mail.continued, "a cancelled order did not go on past it"
