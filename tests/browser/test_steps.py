"""What an operator sees of an order's steps (issue 41, section 3), in a real browser
against the running app (``console`` in conftest.py, on ``tests/fixtures/flows.py``):
each step's body sent and result received, cut with the whole JSON one click away; what
an approver decides on (the order's data, why the step waits); an event a machine sends
offered to no one; an unwound order's sentence naming what was undone; and a parallel
step stopped before it was ever called shown as such, not "Compensated". Pages are read
by the ids and classes of docs/console-dom.md and checked against the JSON API.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.remote.webelement import WebElement

from core.control_cache import PERIOD
from core.states import OrderStatus, StepState
from tests.browser.harness import DECLINED, Browser, Console, squash

pytestmark = pytest.mark.timeout(120)

APPROVED = "approved"
#: The agent a paused-then-stopped parallel step runs on (book-flight's; no later test
#: calls it, so its ramp after the resume delays nothing), and how long an order may take
#: to unwind once its group failed.
HELD_AGENT = "carrier"
UNWIND_SECONDS = 30


def step(name: str) -> str:
    return f'ul#steps li.step[data-step="{name}"]'


def whole_json(browser: Browser, container: WebElement) -> object:
    """The JSON a cut block holds, after the click that opens it (hidden before)."""
    details = container.find_element("css selector", "details.json-full")
    inside = details.find_element("css selector", "pre")
    assert details.get_attribute("open") is None and inside.text == "", "open before a click"
    details.find_element("css selector", "summary").click()
    browser.until(lambda _: inside.text != "", 5, "the whole JSON to show")
    return json.loads(inside.text)


def test_each_step_shows_the_body_it_sent_and_the_result_it_received(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.parallel
    shown = {s["step"]: s for s in console.api_order(order_id)["steps"]}
    browser.open(console.page(f"/orders/{order_id}"), "ul#steps")

    for name in ("book-flight", "book-hotel", "charge"):
        box = browser.one(step(name))
        sent = box.find_element("css selector", ".step-io .step-sent")
        assert sent.get_attribute("data-source") == "order"  # no input: the order's data
        assert "the order's data" in squash(sent.find_element("css selector", ".io-label").text)
        body = json.loads(sent.find_element("css selector", "pre.json-preview").text)
        assert body == console.api_order(order_id)["order"]
        got = box.find_element("css selector", ".step-io .step-received")
        assert squash(got.find_element("css selector", ".io-label").text) == "result received"
        result = json.loads(got.find_element("css selector", "pre.json-preview").text)
        assert shown[name]["result"] is not None and result == shown[name]["result"], name


def test_a_long_body_is_cut_and_the_whole_is_one_click_away(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.inbox[1]
    body = console.bodies[order_id]
    browser.open(console.page(f"/orders/{order_id}", refresh="off"), "ul#steps")

    sent = browser.one(f"{step('reserve')} .step-sent")
    preview = sent.find_element("css selector", "pre.json-preview").text
    assert preview.endswith("…") and len(preview) < len(json.dumps(body, indent=2))
    assert whole_json(browser, sent) == body


def test_the_approval_panel_shows_the_orders_data_and_why_the_step_waits(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.inbox[1]
    for read_only in (True, False):
        browser.open(
            console.page(f"/orders/{order_id}", read_only=read_only, refresh="off"),
            "section#waiting",
        )
        panel = browser.one(f'div.decision[data-event="{APPROVED}"]')
        assert squash(panel.find_element("css selector", ".why-it-waits").text) == (
            "Its condition big_order said yes for this order: Orders over 1000 need a "
            "person's approval."
        )
        data = panel.find_element("css selector", ".decision-data")
        assert "the order's data" in data.text
        assert whole_json(browser, data) == console.bodies[order_id]
        forms = panel.find_elements("css selector", ".event-actions form.approve-form")
        assert len(forms) == (0 if read_only else 1), read_only


def test_an_event_a_machine_sends_is_offered_to_no_one(console: Console, browser: Browser) -> None:
    order_id = console.orders.machine
    browser.open(console.page(f"/orders/{order_id}", refresh="off"), "section#waiting")
    awaited = browser.one('ul#waiting-for li.awaited[data-event="delivered"]')
    by = awaited.find_element("css selector", ".awaited-by")
    assert by.get_attribute("data-by") == "machine"
    note = browser.one('p.machine-wait[data-event="delivered"]')
    assert "no person sends it" in squash(note.text)
    for offered in (".event-actions", "div.decision", "form.approve-form"):
        assert not browser.has(offered), f"{offered} for a machine's event"

    browser.open(console.page("/inbox"), "table#inbox-events")
    assert not browser.has('tr.inbox-row[data-event="delivered"]'), "a machine's event listed"
    assert browser.has(f'tr.inbox-row[data-event="{APPROVED}"]')

    browser.open(console.page(waiting="delivered", refresh="off"), "table#orders")
    assert browser.has("p#machine-event") and not browser.has("p#unknown-event")
    assert browser.has(f'tr.order-row[data-order-id="{order_id}"]')
    assert console.api_waiting("delivered") == [order_id]


def test_an_unwound_orders_sentence_says_what_was_undone(
    console: Console, browser: Browser
) -> None:
    """xss-1 (fulfilment) was refused at its first step: nothing had applied."""
    browser.open(console.page(f"/orders/{console.orders.hostile}"), "#status-why")
    assert browser.one("#order-status").get_attribute("data-status") == "compensated"
    assert squash(browser.text("#status-why")) == (
        "Step reserve-stock failed without effect. Nothing had applied, so nothing was undone."
    )


@pytest.fixture
def held_agent(console: Console) -> Iterator[None]:
    """``carrier`` paused (every instance has read it) for the test, resumed after."""
    response = httpx.post(
        f"{console.api}/agents/{HELD_AGENT}/pause",
        json={"reason": "browser test: hold book-flight"},
        timeout=10,
    )
    assert response.status_code == 200, response.text[:300]
    try:
        time.sleep(PERIOD.total_seconds() + 1)
        yield
    finally:
        httpx.post(
            f"{console.api}/agents/{HELD_AGENT}/resume", json={"reason": "test cleanup"}, timeout=10
        )


def test_a_parallel_step_stopped_before_it_was_called_says_so(
    console: Console, browser: Browser, held_agent: None
) -> None:
    """trip: book-hotel is refused while book-flight waits for its paused agent (never
    called); the group halts, book-flight is stopped: stored Compensated, undone by
    nothing."""
    order_id = f"stopped-{int(time.time())}"
    console.stack.submit(
        {"orderId": order_id, "workflow": "trip", "simulate": {"book-hotel": DECLINED}}
    )

    def unwound(_: object) -> bool:
        order = console.stack.context.store.load(order_id)
        return order is not None and order.status.terminal

    browser.until(unwound, UNWIND_SECONDS, f"{order_id} to end")
    order = console.load(order_id)
    flight = order.find("book-flight")
    assert order.status is OrderStatus.COMPENSATED, order.status
    assert flight is not None and flight.process_state is StepState.COMPENSATED
    assert (flight.undone_by, flight.attempt) == (None, 0)

    browser.open(console.page(f"/orders/{order_id}"), "ul#steps")
    box = browser.one(step("book-flight"))
    assert box.get_attribute("data-state") == "Compensated"  # the record's own state
    assert "stopped" in (box.get_attribute("class") or "").split()
    assert squash(box.find_element("css selector", ".step-state").text) == "Stopped, not started"
    assert box.find_element("css selector", ".step-sent").get_attribute("data-source") == "unsent"
    assert "Stopped before they applied anything: book-flight." in browser.text("#status-why")
