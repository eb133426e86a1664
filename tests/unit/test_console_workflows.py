"""The console's side of what a workflow can say (docs/contracts.md §3.13, §3.10): parallel
steps side by side, skipped steps, waits, the events an order waits for and the forms
that send them (a confirmation, then a CSRF-checked POST), and the inbox of orders
waiting for an event. Through the console's own HTTP functions, on the in-memory store
and a fake clock, with the tests' declarations (``tests/fixtures/flows.py``).
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import azure.functions as func
import pytest

from bootstrap import reset_app_context
from console import layout, security, views
from console import triggers as console
from core.states import OrderStatus, StepState
from tests.support import DEV_OPERATOR, declarations, on_devhost
from tests.unit.test_agent_pause import App, build
from tests.unit.test_services_in_memory import reply_to

BASE = "http://h:7071/api/console"
HOSTILE = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>"


@pytest.fixture
def app() -> Iterator[App]:
    built = build()  # (the bootstrap puts the settings' declarations to use: then ours)
    reset_app_context(on_devhost(built.ctx))  # the console needs a principal: an operator
    with declarations():
        yield built
    reset_app_context(None)


def submit(app: App, order_id: str, workflow: str, **data: Any) -> None:
    body = {"orderId": order_id, "workflow": workflow, **data}
    app.ctx.scheduler.submit(json.dumps(body).encode())


def answer_all(app: App, order_id: str) -> None:
    """Every request of the order still unanswered succeeds (as its agents would)."""
    answered: set[tuple[str, int]] = set()
    while True:
        waiting = [
            r
            for r in app.transport.requests
            if r.order_id == order_id and (r.step, r.attempt) not in answered
        ]
        if not waiting:
            return
        for request in waiting:
            answered.add((request.step, request.attempt))
            app.ctx.scheduler.apply_reply(reply_to(request))


def waiting_for_approval(app: App, order_id: str = "a-1") -> None:
    submit(app, order_id, "approval", amount=5000)
    answer_all(app, order_id)  # reserve: then the approval waits
    assert app.order(order_id).awaited_events() == ["approved"]


def get(path: str, params: dict[str, str] | None = None, **route: str) -> func.HttpResponse:
    handlers = {
        "": console.console_list,
        "/inbox": console.console_inbox,
        "/orders": console.console_order,
        "/confirm": console.console_confirm,
    }
    key = path if path in handlers else "/orders" if path.count("/") == 2 else "/confirm"
    request = func.HttpRequest(
        "GET", f"{BASE}{path}", params=params or {}, route_params=route, body=b""
    )
    response: func.HttpResponse = handlers[key](request)
    return response


def text(response: func.HttpResponse) -> str:
    return response.get_body().decode()


def send(
    order_id: str, event: str, form: dict[str, str], token: str | None = None
) -> func.HttpResponse:
    """POST an event as the confirmation page's form does (with the CSRF cookie and field
    unless ``token`` is ""), straight to the console's function."""
    token = security.new_token() if token is None else token
    headers = {"host": "h:7071", "content-type": "application/x-www-form-urlencoded"}
    if token:
        headers["cookie"] = f"{security.COOKIE}={token}"
        form = {**form, "csrf": token}
    request = func.HttpRequest(
        "POST",
        f"{BASE}/orders/{order_id}/events/{event}",
        body=urlencode(form).encode(),
        route_params={"orderId": order_id, "name": event},
        headers=headers,
    )
    response: func.HttpResponse = console.console_event(request)
    return response


def message_of(response: func.HttpResponse) -> str:
    assert response.status_code == 303, text(response)[:500]
    location = str(response.headers["Location"])
    return parse_qs(urlsplit(location).query)["message"][0]


def confirm_form(page: str) -> dict[str, str]:
    """The hidden fields the confirmation page's form POSTs."""
    form = re.search(
        r'<form id="confirm-form" method="post" action="([^"]+)">(.*?)</form>', page, re.S
    )
    assert form is not None, page[:2000]
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form[2])
    return {k: html.unescape(v) for k, v in fields if k != "csrf"}


# --- the layout and the timeline (pure) --------------------------------------------------


def test_the_steps_of_a_parallel_share_a_row_and_a_band_of_the_timeline(app: App) -> None:
    submit(app, "t-1", "trip")
    running = views.why(app.order("t-1"))
    assert running.startswith("Steps book-flight, book-hotel run side by side; at step book-")
    answer_all(app, "t-1")
    order = app.order("t-1")
    assert order.status is OrderStatus.COMPLETED
    view = app.ctx.admin.show("t-1")

    rows = layout.step_rows(order, view["steps"])

    assert [(r.parallel, [s["step"] for s in r.steps]) for r in rows] == [
        (True, ["book-flight", "book-hotel"]),
        (False, ["charge"]),
    ]
    drawn = views.timeline(order, app.clock())
    assert [(r.step, r.group, r.parallel) for r in drawn.rows] == [
        ("book-flight", 0, True),
        ("book-hotel", 0, True),
        ("charge", 1, False),
    ]
    [band] = drawn.bands
    assert (band.group, band.y, band.height) == (0, drawn.rows[0].y, 2 * views.ROW_HEIGHT)

    page = text(get("/orders/t-1", orderId="t-1"))
    group = re.search(
        r'<li class="step-row parallel" data-group="0">(.*?)</ul>\s*</li>', page, re.S
    )
    assert group is not None
    assert re.findall(r'class="step" data-step="([^"]+)"', group[1]) == [
        "book-flight",
        "book-hotel",
    ]
    assert 'class="group-band" data-group="0"' in page
    assert len(re.findall(r'<g class="row parallel" data-step="book-', page)) == 2


def test_a_skipped_step_a_delay_and_the_step_not_reached_are_each_shown_as_such(app: App) -> None:
    submit(app, "s-1", "approval", amount=5)  # too small to need the approval
    answer_all(app, "s-1")
    page = text(get("/orders/s-1", orderId="s-1"))

    approved = re.search(
        r'<li class="step skipped" data-step="approved"[^>]*>(.*?)</li>', page, re.S
    )
    assert (
        approved is not None
        and "never run" in approved[1]
        and 'badge skipped">Skipped' in approved[1]
    )
    assert 'data-type="event"' in approved[0] and "agent" not in approved[1].replace("no agent", "")
    hold = re.search(
        r'<li class="step waiting" data-step="hold" data-type="delay"[^>]*>(.*?)</li>', page, re.S
    )
    assert hold is not None and 'data-until="2030-01-01T12:10:00.000Z"' in hold[1]
    assert re.search(
        r'<li class="step not-started" data-step="capture" data-type="task">.*completes on event <b>captured',
        page,
    )
    assert re.search(
        r'<g class="row skipped" data-step="approved" data-kind="event" data-state="Skipped"', page
    )
    assert 'class="skipped-note"' in page
    assert re.search(r'<rect class="wait waiting open" data-step="hold" data-kind="delay"', page)
    assert "Step hold waits until 2030-01-01T12:10:00.000Z (a delay)." in page  # why
    # a delay is waited for, not sent: no form
    assert 'data-until="2030-01-01T12:10:00.000Z"' in page and "approve-form" not in page


def test_why_and_the_timeline_for_a_remote_that_calls_back(app: App) -> None:
    submit(app, "c-1", "approval", amount=5)
    answer_all(app, "c-1")
    app.clock.advance(600)
    app.ctx.scheduler.dispatch("c-1")  # the hold's wake-up: capture is claimed and sent
    capture_request = app.transport.requests[-1]
    assert capture_request.step == "capture"
    app.ctx.scheduler.apply_reply(reply_to(capture_request, result={"accepted": True}))
    order = app.order("c-1")
    capture = order.find("capture")
    assert capture is not None and capture.waiting_for == {"event": "captured"}
    assert "waits for its callback, event captured" in views.why(order)
    page = text(get("/orders/c-1", orderId="c-1"))
    # a remote's answer: no person sends it (docs/contracts.md §3.15)
    assert 'class="event-actions" data-event="captured"' not in page
    assert re.search(r'data-step="capture" data-type="task" data-state="Processing"', page)


# --- sending an event -----------------------------------------------------------------------


def test_approve_goes_through_a_confirmation_then_the_order_goes_on(app: App) -> None:
    waiting_for_approval(app)
    detail = text(get("/orders/a-1", orderId="a-1"))
    assert re.search(r'<li class="awaited" data-step="approved" data-event="approved">', detail)
    assert 'class="approve-form"' in detail and 'class="refuse-form"' in detail
    assert 'name="result" maxlength="4000" rows="1" cols="28">{}</textarea>' in detail  # default
    assert 'href="/api/console?waiting=approved"' in detail

    params = {"action": "approve", "event": "approved", "result": '{"approver": "maria"}'}
    confirm = text(
        get("/orders/a-1/confirm", {**params, "reason": "checked the stock"}, orderId="a-1")
    )
    assert "Approve event approved for order a-1?" in confirm
    assert "&#34;approver&#34;: &#34;maria&#34;" in confirm  # the result, escaped
    form = confirm_form(confirm)
    assert form == {
        "action": "approve",
        "reason": "checked the stock",
        "result": '{"approver": "maria"}',
    }
    assert 'action="/api/console/orders/a-1/events/approved"' in confirm
    assert app.order("a-1").awaited_events() == ["approved"]  # the GET changed nothing

    done = send("a-1", "approved", form)

    assert (
        message_of(done)
        == f"Approved by {DEV_OPERATOR.name}: event approved was taken and the order goes on."
    )
    assert done.headers["Location"].startswith("/api/console/orders/a-1?")
    order = app.order("a-1")
    approved, hold = order.find("approved"), order.find("hold")
    assert approved is not None and approved.process_state is StepState.PROCESSED
    assert approved.result == {"approver": "maria"}
    assert hold is not None and hold.process_state is StepState.PROCESSING
    [taken] = [h for h in approved.history if h["event"] == "event-taken"]
    assert (taken["by"], taken["reason"]) == (DEV_OPERATOR.name, "checked the stock")
    after = text(get("/orders/a-1", orderId="a-1"))
    row = re.search(
        r'<tr class="event-row" data-event="approved" data-kind="result">(.*?)</tr>', after, re.S
    )
    assert row is not None and "checked the stock" in row[1] and DEV_OPERATOR.name in row[1]
    assert 'class="approve-form"' not in after  # nothing waits for an event any more
    assert "Step hold waits until" in after
    waited = re.search(
        r'<rect class="wait succeeded" data-step="approved"[^>]*><title>([^<]*)', after
    )
    assert waited is not None and f"sent by {DEV_OPERATOR.name}: checked the stock" in waited[1]


def test_an_event_that_never_came_is_the_reason_the_order_is_in_error(app: App) -> None:
    """parallel-waits has nothing to undo: its event's timeout puts the order in error,
    and the page says which event did not come."""
    submit(app, "w-1", "parallel-waits")
    app.clock.advance(30)
    app.ctx.scheduler.dispatch("w-1")  # the delay beside it ends
    app.clock.advance(91)
    app.ctx.supervisor.run()
    order = app.order("w-1")
    assert order.status is OrderStatus.ERROR
    assert "no event signed within 120 s" in views.why(order)
    page = text(get("/orders/w-1", orderId="w-1"))
    signed = re.search(r'<li class="step" data-step="signed"[^>]*>(.*?)</li>', page, re.S)
    assert signed is not None and "signed: no event signed within 120 s" in signed[1]
    assert re.search(r'<rect class="wait refused" data-step="signed"', page)
    assert re.search(r'<rect class="wait succeeded" data-step="cool-off"', page)


def test_refuse_needs_a_reason_and_unwinds_at_once(app: App) -> None:
    waiting_for_approval(app)
    no_reason = get("/orders/a-1/confirm", {"action": "refuse", "event": "approved"}, orderId="a-1")
    assert no_reason.status_code == 303 and "reason" in message_of(no_reason)
    assert "failed=1" in no_reason.headers["Location"]
    assert message_of(send("a-1", "approved", {"action": "refuse", "reason": "  "})).startswith(
        "Give the reason"
    )
    assert app.order("a-1").awaited_events() == ["approved"]

    confirm = text(
        get(
            "/orders/a-1/confirm",
            {"action": "refuse", "event": "approved", "reason": "too risky"},
            orderId="a-1",
        )
    )
    assert "fails for good" in confirm and 'class="danger">Confirm refuse' in confirm
    done = send("a-1", "approved", confirm_form(confirm))

    assert message_of(done).startswith(f"Refused by {DEV_OPERATOR.name}: event approved was taken")
    order = app.order("a-1")
    assert order.status is OrderStatus.COMPENSATING
    approved = order.find("approved")
    assert approved is not None and approved.process_state is StepState.ERROR
    assert approved.gave_up is not None and "refused: too risky" in approved.gave_up.reason
    # through the API's own path: the compensation was claimed and requested at once
    assert app.transport.requests[-1].step == "release"
    assert order.events["approved"]["reason"] == "too risky"


def test_every_refusal_is_a_page_that_says_why_never_a_500(app: App) -> None:
    waiting_for_approval(app)
    approve = {"action": "approve", "result": "{}"}
    assert message_of(send("a-1", "approved", approve)).startswith("Approved")
    # another answer to an event already taken: 409, the page says why
    again = send("a-1", "approved", {"action": "approve", "result": '{"x": 1}'})
    assert again.status_code == 409 and "delivered before" in text(again)
    assert 'id="message" class="error"' in text(again)
    # the same answer again changes nothing
    assert "nothing changed" in message_of(send("a-1", "approved", approve))
    # an event its workflow does not declare: 400
    undeclared = send("a-1", "shipped", approve)
    assert undeclared.status_code == 400 and "declares no event" in text(undeclared)
    # bad input: back to the page with what to fix, nothing sent
    for form, phrase in [
        ({"action": "approve", "result": "[1]"}, "JSON object"),
        ({"action": "approve", "result": "{nope"}, "not JSON"),
        ({"action": "approve", "result": "{" * 10_000}, "characters"),
        ({"action": "dance"}, "Approve or Refuse"),
    ]:
        assert phrase in message_of(send("a-1", "approved", form)), form
    assert "kebab-case" in message_of(send("a-1", "Bad%20Name", approve))
    assert send("missing", "approved", approve).status_code == 404
    bad_id = send("a b", "approved", approve)
    assert bad_id.status_code == 400
    # a forged POST: 403, nothing sent
    submit(app, "a-2", "approval", amount=5000)
    answer_all(app, "a-2")
    assert send("a-2", "approved", approve, token="").status_code == 403
    assert app.order("a-2").awaited_events() == ["approved"]


def test_a_read_only_console_offers_no_event_form_and_refuses_the_post(app: App) -> None:
    waiting_for_approval(app)
    app.ctx.settings = dataclasses.replace(app.ctx.settings, console_read_only=True)
    page = text(get("/orders/a-1", orderId="a-1"))
    assert 'class="awaited"' in page and "approve-form" not in page and "refuse-form" not in page
    params = {"action": "approve", "event": "approved"}
    assert get("/orders/a-1/confirm", params, orderId="a-1").status_code == 403
    assert send("a-1", "approved", {"action": "approve", "result": "{}"}).status_code == 403
    assert app.order("a-1").awaited_events() == ["approved"]


def test_an_event_payload_from_outside_is_shown_as_text(app: App) -> None:
    submit(app, "h-1", "approval", amount=5000)  # reserve is out: an early event is kept
    effect, _ = app.ctx.admin.deliver_event(
        "h-1", "approved", {"result": {"note": HOSTILE}, "reason": HOSTILE}, HOSTILE
    )
    assert effect == "kept"
    page = text(get("/orders/h-1", orderId="h-1"))
    assert "<script>window" not in page and "<img src=x" not in page
    row = re.search(
        r'<tr class="event-row" data-event="approved" data-kind="result">(.*?)</tr>', page, re.S
    )
    assert row is not None and "kept: its step has not started" in row[1]
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in row[1]


# --- the inbox -------------------------------------------------------------------------------


def test_the_inbox_lists_the_orders_waiting_for_an_event_newest_first(app: App) -> None:
    for n in range(3):
        waiting_for_approval(app, f"a-{n}")
        app.clock.advance(1)
    submit(app, "s-1", "approval", amount=5)  # skips the approval: never waits for it
    answer_all(app, "s-1")

    listed = text(get("", {"waiting": "approved", "pageSize": "2"}))

    assert re.findall(r'class="order-row" data-order-id="([^"]+)"', listed) == ["a-2", "a-1"]
    assert 'id="inbox-title"' in listed and 'data-event="approved">waits for approved' in listed
    assert 'class="event-link current" data-event="approved"' in listed
    assert (
        'name="waiting" value="approved"' in listed
        and 'name="status"' not in listed.split('id="bulk"')[0]
    )
    link = re.search(r'id="next-page" href="([^"]+)"', listed)
    assert link is not None
    query = {k: v[0] for k, v in parse_qs(urlsplit(html.unescape(link[1])).query).items()}
    assert query["waiting"] == "approved"
    assert re.findall(r'data-order-id="([^"]+)"', text(get("", query))) == ["a-0"]

    inbox = text(get("/inbox"))
    assert re.search(
        r'data-event="approved">\s*<td><a class="inbox-link" href="/api/console\?waiting=approved">approved</a></td>\s*<td class="count">3</td>',
        inbox,
    )
    assert 'data-event="go-ahead"' in inbox and 'id="nav-inbox"' in inbox

    # an event no deployed workflow declares, well-formed: an empty list that says so
    unknown = get("", {"waiting": "nobody-sends-this"})
    assert unknown.status_code == 200 and 'id="unknown-event"' in text(unknown)
    assert 'id="empty"' in text(unknown)


@pytest.mark.parametrize(
    "params",
    [
        {"waiting": "Bad<Name>"},
        {"waiting": "x" * 49},
        {"waiting": "approved", "status": "error"},
        {"waiting": "approved", "page": "not-a-token"},
        {"waiting": "approved", "pageSize": "many"},
    ],
)
def test_bad_inbox_urls_are_a_400_page(app: App, params: dict[str, str]) -> None:
    response = get("", params)
    assert response.status_code == 400 and response.mimetype == "text/html"
    assert "<script" not in text(response).split("</head>")[1]
