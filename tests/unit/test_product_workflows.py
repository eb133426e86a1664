"""The shop's workflows (tests/fixtures/shop.py, as declarations/ first ships them) say
what their remotes need: compensations
name the ids their steps handed out, and ``checkout`` runs stock and payment at once,
waits for a person on big orders, holds a cooling-off window, and ships with a carrier
that calls back (docs/contracts.md §3.13). In memory, on a fake clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.inbox import run_of_capability
from core.links import events_url
from core.messages import AgentRequest
from core.outcome import Outcome
from core.states import OrderStatus, StepState
from tests.support import callback_token
from tests.unit.test_services_in_memory import Services, build, reply_to, stored

HOST = "127.0.0.1:7071"


@pytest.fixture
def s() -> Services:
    return build(
        host=HOST
    )  # WEBSITE_HOSTNAME, as devhost (and Azure) set it  # the shop's declarations (tests/fixtures/shop.py)


def submit(s: Services, order_id: str, workflow: str, **data: Any) -> dict[str, Any]:
    body = {"orderId": order_id, "workflow": workflow, "amount": 40, **data}
    s.scheduler.submit(json.dumps(body).encode())
    return body


def sent(s: Services, order_id: str) -> list[AgentRequest]:
    return [r for r in s.transport.requests if r.order_id == order_id]


def succeed(s: Services, request: AgentRequest, **result: Any) -> None:
    s.scheduler.apply_reply(reply_to(request, result={"step": request.step, **result}))


def test_fulfilment_compensations_name_the_ids_their_steps_handed_out(s: Services) -> None:
    order = submit(s, "f-1", "fulfilment")
    succeed(s, sent(s, "f-1")[-1], reservation="reservation-1")
    succeed(s, sent(s, "f-1")[-1], charge="charge-1")
    ship = sent(s, "f-1")[-1]
    assert ship.order == order  # no input: the order's JSON, as before
    s.scheduler.apply_reply(reply_to(ship, Outcome.REFUSED, error="HTTP 422"))
    refund = sent(s, "f-1")[-1]
    assert refund.step == "refund-payment" and refund.order == {**order, "charge": "charge-1"}
    succeed(s, refund)
    release = sent(s, "f-1")[-1]
    assert release.order == {**order, "reservation": "reservation-1"}


def test_a_step_that_never_answered_has_no_id_to_name(s: Services) -> None:
    order = submit(s, "f-2", "fulfilment")
    succeed(s, sent(s, "f-2")[-1], reservation="reservation-2")
    charge = sent(s, "f-2")[-1]
    s.scheduler.apply_reply(reply_to(charge, Outcome.REFUSED, error="HTTP 422"))
    release = sent(s, "f-2")[-1]
    assert release.order == {**order, "reservation": "reservation-2"}
    # (charge-payment refused: not applied, nothing to refund, no refund sent)
    assert [r.step for r in sent(s, "f-2")] == ["reserve-stock", "charge-payment", "release-stock"]


def run_checkout(s: Services, order_id: str, **data: Any) -> dict[str, Any]:
    """Submit a checkout and answer its parallel group; returns the order's JSON."""
    order = submit(s, order_id, "checkout", **data)
    reserve, charge = sent(s, order_id)
    assert (reserve.step, charge.step) == ("reserve-stock", "charge-payment")  # at once
    succeed(s, charge, charge=f"charge-{order_id}")
    succeed(s, reserve, reservation=f"reservation-{order_id}")
    return order


def test_a_small_checkout_skips_the_approval_waits_then_ships_asking_for_a_callback(
    s: Services,
) -> None:
    order = run_checkout(s, "c-1")
    record = stored(s, "c-1")
    approved, cooling = record.find("approved"), record.find("cooling-off")
    assert approved is not None and approved.process_state is StepState.SKIPPED
    assert cooling is not None and cooling.process_state is StepState.PROCESSING
    s.clock.advance(3)
    s.scheduler.dispatch("c-1")
    ship = sent(s, "c-1")[-1]
    token = callback_token(stored(s, "c-1"), "parcel-left")
    url = f"http://{HOST}/api/orders/c-1/events/parcel-left?token={token}"
    assert ship.order == {**order, "reservation": "reservation-c-1", "callback": {"url": url}}
    succeed(s, ship)  # the carrier's 202: acceptance, the order waits for the callback
    assert stored(s, "c-1").status is OrderStatus.PROCESSING
    s.admin.deliver_event(
        "c-1",
        "parcel-left",
        {"result": {"parcel": "parcel-1"}},
        "carrier",
        token=callback_token(stored(s, "c-1"), "parcel-left"),
    )
    done = stored(s, "c-1")
    assert done.status is OrderStatus.COMPLETED
    assert done.find("ship").result == {"parcel": "parcel-1"}  # type: ignore[union-attr]


def test_a_big_checkout_refused_by_its_approver_undoes_both_with_their_ids(s: Services) -> None:
    order = run_checkout(s, "c-2", amount=1500)
    approved = stored(s, "c-2").find("approved")
    assert approved is not None and approved.waiting_for == {"event": "approved"}
    s.admin.deliver_event("c-2", "approved", {"refused": "too big"}, "ann")
    for _ in range(2):  # one undo at a time (the group's: latest first)
        s.scheduler.dispatch("c-2")
        succeed(s, sent(s, "c-2")[-1])
    assert stored(s, "c-2").status is OrderStatus.COMPENSATED
    undo = {r.step: r.order for r in sent(s, "c-2")[2:]}
    assert undo == {
        "release-stock": {**order, "reservation": "reservation-c-2"},
        "refund-payment": {**order, "charge": "charge-c-2"},
    }


def test_without_its_own_address_the_app_cannot_ask_for_a_callback() -> None:
    s = build()  # no WEBSITE_HOSTNAME
    run_checkout(s, "c-3")
    s.clock.advance(3)
    s.scheduler.dispatch("c-3")
    ship = stored(s, "c-3").find("ship")
    assert ship is not None and ship.process_state is StepState.ERROR
    assert "WEBSITE_HOSTNAME" in (ship.last_error or "")
    assert [r.step for r in sent(s, "c-3")][-1] != "ship"  # never reached the carrier


def test_events_url_is_a_capability_of_the_run_and_only_inside_its_step(s: Services) -> None:
    """docs/contracts.md §3.15: the URL a step gives its remote carries an unguessable token
    bound to the order, the event and the run; outside a step of that order it is not
    given (a LookupError says why)."""
    with pytest.raises(LookupError, match="called from a step's input"):
        events_url("o-1", "parcel-left")
    run_checkout(s, "c-url")
    s.clock.advance(3)
    s.scheduler.dispatch("c-url")
    url = sent(s, "c-url")[-1].order["callback"]["url"]  # type: ignore[index]
    order = stored(s, "c-url")
    base, _, token = url.partition("?token=")
    assert base == f"http://{HOST}/api/orders/c-url/events/parcel-left"
    assert token == callback_token(order, "parcel-left", run=1)
    assert run_of_capability(order.event_key, "c-url", "parcel-left", token) == 1
    assert run_of_capability(order.event_key, "c-url", "approved", token) is None
    assert run_of_capability(order.event_key, "c-other", "parcel-left", token) is None


def test_an_alert_goes_on_after_a_reason_that_ends_a_sentence(s: Services) -> None:
    """A remote's or a handler's reason ends with a full stop; the alert's next clause
    follows it without one ("...'refund-payment'.; it was not applied" read badly)."""
    submit(s, "f-3", "fulfilment")
    succeed(s, sent(s, "f-3")[-1], reservation="reservation-3")
    succeed(s, sent(s, "f-3")[-1], charge="charge-3")
    ship = sent(s, "f-3")[-1]
    s.scheduler.apply_reply(reply_to(ship, Outcome.REFUSED, error="HTTP 422: no such road."))
    refund = sent(s, "f-3")[-1]
    s.scheduler.apply_reply(
        reply_to(refund, Outcome.REFUSED, error="HTTP 409: unknown charge 'charge-3'.")
    )
    alerts = [a["reason"] for a in s.queues.on(s.names.operator_alerts)]
    assert alerts and all(".;" not in a and "., " not in a for a in alerts), alerts
    assert any("unknown charge 'charge-3'; it was not applied" in a for a in alerts), alerts
