"""What an operator sees of an order's steps in the console (issue 41, section 3): each
step's body sent and result received (cut, the whole one click away), what an approver
decides on, a machine's answer never offered to a person, and labels that say what the
records say. Through the console's own HTTP functions on the in-memory store and a fake
clock (``tests/fixtures/flows.py``), and the pure view functions on the model
(``tests/fixtures/decisions.py``).
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest

from admin.service import OrderAdmin
from bootstrap import reset_app_context
from console import bodies, event_pages, views
from core.errors import TransitionRefused
from core.outcome import Applied, Outcome
from core.states import OrderStatus, StepState
from tests.fixtures.decisions import may_stand_workflow
from tests.support import declarations, on_devhost
from tests.unit.test_agent_pause import App, build
from tests.unit.test_console_workflows import BASE, answer_all, get, submit, text
from tests.unit.test_one_decision import (
    POLICY,
    SECOND,
    T0,
    claim,
    dispatched_beside_a_refused_bill,
    new,
    report,
)
from tests.unit.test_services_in_memory import reply_to


@pytest.fixture
def app() -> Iterator[App]:
    built = build()
    reset_app_context(on_devhost(built.ctx))
    with declarations():
        yield built
    reset_app_context(None)


def step_box(page: str, step: str) -> str:
    """The HTML of a step's box in the page's steps (its latest record)."""
    boxes = re.findall(rf'<li class="step[^"]*" data-step="{step}".*?</li>', page, re.S)
    assert boxes, f"no box for step {step}"
    return str(boxes[-1])


def json_of(fragment: str, cls: str) -> Any:
    """The JSON of the first ``<pre class="cls">`` in ``fragment``."""
    found = re.search(rf'<pre class="{cls}">(.*?)</pre>', fragment, re.S)
    assert found is not None, fragment[:1000]
    return json.loads(html.unescape(found[1]))


def reply(app: App, step: str, result: dict[str, Any] | None = None, **kw: Any) -> None:
    """The latest request of ``step`` gets its answer."""
    request = [r for r in app.transport.requests if r.step == step][-1]
    if result is not None:
        kw["result"] = result
    app.ctx.scheduler.apply_reply(reply_to(request, **kw))


# --- 1. the body each step sent and the result it received ---------------------------------


def test_shown_json_cuts_at_a_line_end_and_keeps_the_whole() -> None:
    small = bodies.shown_json({"rma": "RMA-1"})
    assert (small.preview, small.cut) == ('{\n  "rma": "RMA-1"\n}', False)
    items = {"items": [{"sku": f"sku-{n}", "qty": n} for n in range(40)]}
    cut = bodies.shown_json(items)
    assert cut.cut and json.loads(cut.whole) == items
    assert cut.preview.endswith("\n…") and len(cut.preview) <= bodies.PREVIEW_CHARS + 2
    assert cut.whole.startswith(cut.preview[:-2])  # whole lines of the start
    assert len(cut.preview) > bodies.PREVIEW_CHARS // 2


def test_each_step_shows_the_body_it_sent_and_the_result_it_received(app: App) -> None:
    """returns: the desk hands out an RMA (receive-return sends the order's data); restock
    sends what its input built from it. Both bodies and both results are on the page."""
    submit(app, "r-1", "returns", items=[{"sku": "kettle", "qty": 1}])
    reply(app, "receive-return", {"rma": "RMA-r-1"})
    reply(app, "restock", {"restocked": 1, "slip": "W-77"})
    assert app.order("r-1").status is OrderStatus.COMPLETED

    page = text(get("/orders/r-1", orderId="r-1"))

    received = step_box(page, "receive-return")
    sent = re.search(r'<div class="step-sent" data-source="order">(.*?)</div>', received, re.S)
    assert sent is not None and "the order&#39;s data (the step declares no input)" in sent[1]
    assert json_of(sent[1], "json-preview") == app.order("r-1").body
    got = re.search(r'<div class="step-received">(.*?)</div>', received, re.S)
    assert got is not None and json_of(got[1], "json-preview") == {"rma": "RMA-r-1"}
    restock = step_box(page, "restock")
    built = re.search(r'<div class="step-sent" data-source="input">(.*?)</div>', restock, re.S)
    assert built is not None and "built by its input" in built[1]
    assert json_of(built[1], "json-preview") == {
        "rma": "RMA-r-1",
        "items": [{"sku": "kettle", "qty": 1}],
    }
    assert "W-77" in restock and 'class="json-full"' not in page  # short: nothing cut


def test_a_long_body_is_cut_with_the_whole_of_it_one_click_away(app: App) -> None:
    items = [{"sku": f"sku-{n}", "qty": n, "note": "fragile"} for n in range(30)]
    submit(app, "r-2", "returns", items=items)
    reply(app, "receive-return", {"rma": "RMA-r-2"})
    page = text(get("/orders/r-2", orderId="r-2"))

    restock = step_box(page, "restock")
    preview = re.search(r'<pre class="json-preview">(.*?)</pre>', restock, re.S)
    assert preview is not None and preview[1].endswith("…")
    assert len(html.unescape(preview[1])) <= bodies.PREVIEW_CHARS + 2
    full = re.search(
        r'<details class="json-full"><summary>the whole JSON \(([\d,]+) characters\)</summary>'
        r"<pre>(.*?)</pre></details>",
        restock,
        re.S,
    )
    assert full is not None
    assert json.loads(html.unescape(full[2])) == {"rma": "RMA-r-2", "items": items}
    assert int(full[1].replace(",", "")) == len(html.unescape(full[2]))
    # restock's call went out and is not answered yet
    assert '<div class="step-received none"><span class="io-label">no result yet' in restock


def test_a_body_sent_before_a_fix_says_the_data_shown_is_the_fixed_one(app: App) -> None:
    """returns has nothing to undo: restock refused puts it in error; a fix changes the
    data; receive-return sent the data before the fix, and its box says so."""
    submit(app, "r-3", "returns", items=[{"sku": "kettle", "qty": 1}])
    reply(app, "receive-return", {"rma": "RMA-r-3"})
    reply(app, "restock", outcome=Outcome.REFUSED, error="HTTP 422: unknown sku")
    assert app.order("r-3").status is OrderStatus.ERROR
    before = step_box(text(get("/orders/r-3", orderId="r-3")), "receive-return")
    assert "a fix changed the data" not in before

    app.clock.advance(5)
    app.ctx.admin.resubmit("r-3", "ops", "sku fixed", {"items": [{"sku": "kettle-2"}]})

    after = step_box(text(get("/orders/r-3", orderId="r-3")), "receive-return")
    assert "shown as it is now: a fix changed the data after this step was sent" in after


# --- 2. what an approver decides on -----------------------------------------------------------


def decision_of(page: str, event: str) -> str:
    found = re.search(rf'<div class="decision" data-event="{event}"[^>]*>(.*?)</form>', page, re.S)
    if found is None:  # read-only: no forms
        found = re.search(
            rf'<div class="decision" data-event="{event}"[^>]*>(.*?)</div>\s*</div>', page, re.S
        )
    assert found is not None, page[:3000]
    return str(found[1])


def test_the_approval_panel_shows_the_orders_data_and_why_the_step_waits(app: App) -> None:
    submit(app, "a-1", "approval", amount=5000, customerId="c-9")
    answer_all(app, "a-1")

    page = text(get("/orders/a-1", orderId="a-1"))

    panel = decision_of(page, "approved")
    assert (
        '<p class="why-it-waits">Its condition big_order said yes for this order: Orders over '
        "1000 need a person&#39;s approval.</p>"
    ) in panel
    assert json_of(panel, "json-preview") == app.order("a-1").body
    assert 'class="event-actions" data-event="approved"' in panel  # the forms, inside it
    params = {"action": "approve", "event": "approved", "result": "{}"}
    confirm = text(get("/orders/a-1/confirm", params, orderId="a-1"))
    assert '<p id="confirm-why">Its condition big_order said yes' in confirm
    # read-only: what is decided on is shown, no form
    app.ctx.settings = dataclasses.replace(app.ctx.settings, console_read_only=True)
    read_only = text(get("/orders/a-1", orderId="a-1"))
    assert '<div class="decision" data-event="approved"' in read_only
    assert "approve-form" not in read_only and "big_order" in read_only


def test_an_event_without_a_condition_says_every_order_waits_for_it(app: App) -> None:
    submit(app, "w-1", "parallel-waits")
    page = text(get("/orders/w-1", orderId="w-1"))
    assert (
        '<p class="why-it-waits">It has no condition (when): every order waits for it.</p>'
        in decision_of(page, "signed")
    )


def test_a_condition_no_longer_declared_is_said_so(app: App) -> None:
    submit(app, "a-2", "approval", amount=5000)
    answer_all(app, "a-2")
    order = app.order("a-2")
    planned = order.plan.step_for_event("approved")
    with declarations("tests.fixtures.shop"):  # no approval workflow today
        why = event_pages.why_it_waits(order, planned)
    assert why == (
        "Its condition (when) said yes when the step started; today's declarations no longer "
        "give it."
    )


# --- 3. a machine's answer is no person's decision ----------------------------------------------


def test_a_remotes_callback_is_never_offered_to_a_person(app: App) -> None:
    """approval's capture completes on ``captured``, its remote's callback: the page says
    who sends it and offers no Approve; the inbox does not list it; its list of orders
    says it is a machine's."""
    submit(app, "c-1", "approval", amount=5)
    answer_all(app, "c-1")
    app.clock.advance(600)
    app.ctx.scheduler.dispatch("c-1")
    reply(app, "capture", {"accepted": True})
    assert app.order("c-1").awaited_events() == ["captured"]

    page = text(get("/orders/c-1", orderId="c-1"))

    assert re.search(
        r'<li class="awaited" data-step="capture" data-event="captured">Step <b>capture</b> '
        r'waits for <span class="awaited-by" data-by="machine">',
        page,
    )
    assert (
        '<p class="machine-wait" data-event="captured">Event <b>captured</b> comes from the '
        "callback of payments (its remote)"
    ) in page
    for offered in ("event-actions", 'class="decision"', "approve-form", "refuse-form"):
        assert offered not in page, offered
    inbox = text(get("/inbox"))
    assert 'data-event="captured"' not in inbox and 'data-event="approved"' in inbox
    listed = text(get("", {"waiting": "captured"}))
    assert 'id="machine-event"' in listed and 'id="unknown-event"' not in listed
    assert 'data-order-id="c-1"' in listed
    params = {"action": "approve", "event": "captured"}
    confirm = text(get("/orders/c-1/confirm", params, orderId="c-1"))
    assert "confirm-form" not in confirm and "No person sends it" in confirm


def test_an_event_a_machine_sends_is_never_offered_to_a_person(app: App) -> None:
    submit(app, "d-1", "delivery")
    assert app.order("d-1").awaited_events() == ["delivered"]

    page = text(get("/orders/d-1", orderId="d-1"))

    assert '<span class="awaited-by" data-by="machine">' in page
    assert "comes from a machine, on the capability URL its step gave it" in page
    assert "event-actions" not in page and 'class="decision"' not in page
    assert 'data-event="delivered"' not in text(get("/inbox"))
    assert event_pages.machine_events() >= {"delivered", "captured"}
    assert "delivered" not in event_pages.declared_events()


# --- 4. labels that say what the records say ------------------------------------------------------


def booked_then_refused(app: App, order_id: str) -> None:
    """A trip whose two bookings succeed, then charge is sent."""
    submit(app, order_id, "trip")
    reply(app, "book-flight", {"booking": f"F-{order_id}"})
    reply(app, "book-hotel", {"booking": f"H-{order_id}"})


def undo_all(app: App, order_id: str) -> None:
    """Every compensation the order asks for succeeds, one after the other."""
    undos = {"cancel-flight", "cancel-hotel", "refund"}
    answered: set[tuple[str, int]] = set()
    for _ in range(10):
        app.clock.advance(5)
        app.ctx.scheduler.sweep()
        asked = [
            r
            for r in app.transport.requests
            if r.order_id == order_id and r.step in undos and (r.step, r.attempt) not in answered
        ]
        for request in asked:
            answered.add((request.step, request.attempt))
            app.ctx.scheduler.apply_reply(reply_to(request))
        if app.order(order_id).status.finished:
            return


def test_an_unwound_orders_summary_names_what_was_undone(app: App) -> None:
    booked_then_refused(app, "t-1")
    no = Applied.NO
    reply(app, "charge", outcome=Outcome.REFUSED, error="HTTP 422: card declined", applied=no)
    undo_all(app, "t-1")
    order = app.order("t-1")
    assert order.status is OrderStatus.COMPENSATED

    said = views.why(order)

    assert said == (
        "Step charge failed without effect. Undone: book-flight (by cancel-flight), "
        "book-hotel (by cancel-hotel)."
    )
    assert "every completed step" not in text(get("/orders/t-1", orderId="t-1"))


def test_a_step_that_failed_and_may_have_applied_is_named_among_the_undone(app: App) -> None:
    booked_then_refused(app, "t-4")
    for attempt in (1, 2, 3):  # every attempt of charge may have applied; then it gives up
        charge = app.order("t-4").find("charge")
        assert charge is not None and charge.attempt == attempt
        reply(app, "charge", outcome=Outcome.TRANSIENT, error="HTTP 503", applied=Applied.MAYBE)
        app.clock.advance(600)
        app.ctx.scheduler.sweep()
    undo_all(app, "t-4")
    order = app.order("t-4")
    assert order.status is OrderStatus.COMPENSATED, order.status

    said = views.why(order)

    assert said == (
        "Step charge failed and may have applied. Undone: book-flight (by cancel-flight), "
        "book-hotel (by cancel-hotel), charge (by refund)."
    )


@pytest.mark.parametrize(
    ("how", "first"),
    [("failure", "Step bill failed without effect."), ("cancel", "Cancelled.")],
)
def test_an_effect_that_stands_by_declaration_is_named_not_called_undone(
    how: str, first: str
) -> None:
    with declarations("tests.fixtures.decisions"):
        order = new(may_stand_workflow())
        dispatched_beside_a_refused_bill(order, how)
        assert order.status in (OrderStatus.COMPENSATED, OrderStatus.CANCELLED)

        said = views.why(order)

    assert said.startswith(first)
    assert "Undone: reserve (by release)." in said
    assert "Its effect stands, as declared (may_stand): dispatch." in said
    assert "bill" not in said.removeprefix(first)  # refused: nothing of it to undo


def test_a_parallel_step_stopped_before_it_was_called_says_so() -> None:
    """dispatch-then-bill: bill is refused while dispatch was never claimed; dispatch is
    stored Compensated with no undo and no attempt: stopped, never undone."""
    with declarations("tests.fixtures.decisions"):
        order = new("dispatch-then-bill")
        claim(order, "bill", T0)
        order.apply_reply(report(order, "bill", Outcome.REFUSED), T0 + SECOND, POLICY)
        dispatch = order.find("dispatch")
        assert dispatch is not None and dispatch.process_state is StepState.COMPENSATED
        assert (dispatch.undone_by, dispatch.attempt) == (None, 0)

        label = views.state_label(order, dispatch)
        said = views.why(order)

    assert (label.css, label.text) == ("stopped", "Stopped, not started")
    assert "never called" in label.note
    assert order.status is OrderStatus.COMPENSATED
    assert said == (
        "Step bill failed without effect. Stopped before they applied anything: dispatch. "
        "Nothing had applied, so nothing was undone."
    )


def test_the_steps_list_labels_a_stopped_step_and_an_undone_one(app: App) -> None:
    """trip, with the hotel's agent paused: book-hotel is held (never claimed) while
    book-flight is refused; the page shows it stopped, not started."""
    app.ctx.agents_admin.pause("inventory", "ops", "maintenance")
    app.clock.advance(60)  # every instance has read the pause
    submit(app, "t-2", "trip")
    hotel = app.order("t-2").find("book-hotel")
    assert hotel is not None and hotel.attempt == 0
    reply(app, "book-flight", outcome=Outcome.REFUSED, error="HTTP 422: no seats")
    order = app.order("t-2")
    stopped = order.find("book-hotel")
    assert stopped is not None and stopped.process_state is StepState.COMPENSATED

    page = text(get("/orders/t-2", orderId="t-2"))

    box = step_box(page, "book-hotel")
    assert 'class="step stopped"' in box and 'data-state="Compensated"' in box
    assert '<span class="step-state badge stopped">Stopped, not started</span>' in box
    assert "Compensated</span>" not in box
    assert '<div class="step-sent" data-source="unsent">' in box


def test_an_undone_step_says_by_what(app: App) -> None:
    booked_then_refused(app, "t-3")
    reply(app, "charge", outcome=Outcome.REFUSED, error="HTTP 422: card declined")
    undo_all(app, "t-3")
    box = step_box(text(get("/orders/t-3", orderId="t-3")), "book-flight")
    assert '<span class="step-state badge compensated">Compensated</span>' in box
    assert '<span class="state-note">undone by cancel-flight</span>' in box


def test_a_refusal_the_order_records_moves_its_updated_at(app: App) -> None:
    """An event that comes too late is refused, and the refusal is written in the order's
    history (``core.inbox``): the order changed, so its ``updatedAt`` moves, as for every
    transition it records."""
    submit(app, "a-3", "approval", amount=5000)
    answer_all(app, "a-3")
    app.clock.advance(3601)
    app.ctx.supervisor.run()  # no approval within the hour: the step fails
    admin: OrderAdmin = app.ctx.admin
    before = app.order("a-3").updated_at
    app.clock.advance(30)

    with pytest.raises(TransitionRefused) as refused:
        admin.deliver_event("a-3", "approved", {"result": {}}, "maria")

    assert refused.value.reason == "too-late"
    order = app.order("a-3")
    assert order.history[-1]["event"] == "event-refused"
    assert order.updated_at == app.clock() > before
    assert admin.show("a-3")["updatedAt"] == order.history[-1]["at"]


def test_an_attempt_says_accepted_while_its_callback_is_awaited_and_never_runs_after(
    app: App,
) -> None:
    """approval's capture: its remote accepted (202) and calls back later. While the step
    waits, its attempt is "accepted", drawn to its deadline; once the step has ended, no
    attempt of it is "running", whatever the attempt lacks (the label follows the record)."""
    submit(app, "c-3", "approval", amount=5)
    answer_all(app, "c-3")
    app.clock.advance(600)
    app.ctx.scheduler.dispatch("c-3")
    reply(app, "capture", {"accepted": True})

    page = text(get("/orders/c-3", orderId="c-3"))

    row = re.search(
        r'<tr class="attempt-row" data-step="capture" data-attempt="1">(.*?)</tr>', page, re.S
    )
    assert row is not None and '<span class="badge accepted">accepted</span>' in row[1]
    assert re.search(r'<rect class="attempt accepted open" data-step="capture"', page)

    order = app.order("c-3")
    capture = order.find("capture")
    assert capture is not None
    capture.process_state = StepState.PROCESSED  # its record ended; the attempt has no end
    [entry] = next(e for e in app.ctx.admin.show("c-3")["steps"] if e["step"] == "capture")[
        "attempts"
    ]
    assert views.attempt_outcome(capture, entry) == "unreported"
    [bar] = next(r for r in views.timeline(order, app.clock()).rows if r.step == "capture").bars
    assert (bar.outcome, bar.open_ended) == ("unreported", False)
    assert "running" not in bar.title


@pytest.fixture
def failing() -> Iterator[App]:
    """The console on the declarations of contract 3.17's tests (``on_failure``)."""
    built = build()
    reset_app_context(on_devhost(built.ctx))
    with declarations("tests.fixtures.failures"):
        yield built
    reset_app_context(None)


def test_what_a_failure_means_is_on_each_step_and_a_failure_gone_past_says_so(
    failing: App,
) -> None:
    """Contract 3.17: a step declared ``on_failure="continue"`` that failed is ``Error``
    with ``continued``: its label says the order went on; each step says what its
    failure would mean (hold, go on), before it started too."""
    app = failing
    submit(app, "m-1", "mailing")
    reply(app, "charge", {"charge": "ch-1"})
    reply(app, "mail", outcome=Outcome.REFUSED, error="HTTP 400: mailbox full", applied=Applied.NO)
    submit(app, "h-1", "held")

    mailing = text(get("/orders/m-1", orderId="m-1"))
    held = text(get("/orders/h-1", orderId="h-1"))

    mail = step_box(mailing, "mail")
    assert 'data-state="Error"' in mail and "failed, the order went on" in mail
    assert "on failure: <b>the order goes on</b>" in mail
    assert "on failure:" not in step_box(mailing, "charge")  # unwind, the default
    assert app.order("m-1").status is not OrderStatus.ERROR
    ship = step_box(held, "ship")  # not started yet: the plan says it
    assert "not started" in ship and "on failure: <b>holds the order</b>" in ship


def test_a_step_nothing_undid_is_named_not_undone() -> None:
    """The issue's order: it reads ``compensated`` while a step without a compensation
    had applied (the engine of the time ended it so; today's ends it ``error``, told).
    The sentence says what its records say: what was undone, and what was not."""
    with declarations("tests.fixtures.decisions"):
        order = new("reserve-dispatch-bill")
        dispatched_beside_a_refused_bill(order, "failure")
        assert order.status is OrderStatus.ERROR  # today: the effect that stands is told
        order.status = OrderStatus.COMPENSATED

        said = views.why(order)

    assert said == (
        "Step bill failed without effect. Undone: reserve (by release). "
        "Not undone: dispatch (no compensation)."
    )


def test_the_dashboard_page_reads_its_rows_by_the_apps_clock(app: App) -> None:
    """The figures the dashboard timer kept for this minute by the app's clock show on
    the page, whatever the wall clock says (it reads them through ``admin.watch``)."""
    from console.triggers import console_dashboard
    from dashboard.figures import Figures, minute_row
    from dashboard.ports import RowWrite

    now = app.clock()
    figures = Figures(started={"checkout": 3})
    row = minute_row(now)
    app.store.write_dashboard(
        [RowWrite(row, {"Figures": json.dumps(figures.to_json()), "Start": now})]
    )
    request = func.HttpRequest("GET", f"{BASE}/dashboard", params={}, route_params={}, body=b"")
    page = text(console_dashboard(request))
    assert f"{now.strftime('%H:%M')}: 3 checkout started" in page
