"""Workflows that say more (docs/contracts.md §3.13) in the console, in a real browser
against the running app (``console`` in conftest.py; the orders are ``Orders``'s
contract 3.13 ones, settled before the first test): a parallel order's steps side by side
and overlapping in its timeline, a skipped step and a delay, an approval sent and one
refused from an order's page (the history keeps the note and who), and the inbox of
orders waiting for an event, filtered in the URL. Pages are read by the contract's ids
and classes (docs/console-dom.md) and checked against the JSON API and the orders table.

Screenshot: docs/console-waiting-order.png (an order waiting for its approval, with the
forms that send it) when ``UPDATE_SCREENSHOTS=1`` is set or the file is missing.
"""

from __future__ import annotations

import json
import os
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from core.states import OrderStatus, StepState
from demo.stack import ROOT
from tests.browser.harness import Browser, Console, first_number, squash

pytestmark = pytest.mark.timeout(120)

RESULT = {"approver": "browser test", "limit": 5000}
NOTE = "browser test: stock checked, approved"
REFUSAL = "browser test: over the customer's credit limit"
APPROVED = "approved"
SCREENSHOT = ROOT / "docs" / "console-waiting-order.png"


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def path_of(url: str) -> str:
    return urlsplit(url).path


def step(name: str) -> str:
    """The CSS of a step's box in the page's steps."""
    return f'ul#steps li.step[data-step="{name}"]'


def event_taken(console: Console, order_id: str, name: str) -> dict[str, object]:
    record = console.load(order_id).find(name)
    assert record is not None, f"{order_id} has no step {name}"
    taken = [h for h in record.history if h.get("event") == "event-taken"]
    assert len(taken) == 1, f"{order_id}/{name}: event-taken entries {taken}"
    return taken[0]


def test_a_parallel_orders_steps_are_side_by_side_and_ran_at_once(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.parallel
    groups = {s["step"]: s["group"] for s in console.api_order(order_id)["steps"]}
    assert groups["book-flight"] == groups["book-hotel"] != groups["charge"], groups

    browser.open(console.page(f"/orders/{order_id}"), "ul#steps")
    assert browser.one("#order-status").get_attribute("data-status") == "completed"
    [row] = browser.all("ul#steps li.step-row.parallel")
    assert row.get_attribute("data-group") == str(groups["book-flight"])
    boxes = row.find_elements("css selector", "li.step")
    assert [b.get_attribute("data-step") for b in boxes] == ["book-flight", "book-hotel"]
    left, right = (b.rect for b in boxes)
    assert abs(left["y"] - right["y"]) < 1, f"not on one line: {left} {right}"
    assert right["x"] >= left["x"] + left["width"] - 1, f"not side by side: {left} {right}"
    charge = browser.one(step("charge"))
    assert charge.rect["y"] >= left["y"] + left["height"], "charge is not after the group"

    # the timeline: both rows over the group's band, their attempts overlapping in time
    band = browser.one(f'svg#timeline rect.group-band[data-group="{groups["book-flight"]}"]')
    top, height = float(band.get_attribute("y") or 0), float(band.get_attribute("height") or 0)
    spans = {}
    for name in ("book-flight", "book-hotel"):
        [bar] = browser.all(f'svg#timeline g.row.parallel rect.attempt[data-step="{name}"]')
        assert top <= float(bar.get_attribute("y") or -1) < top + height, (name, top, height)
        x, width = float(bar.get_attribute("x") or 0), float(bar.get_attribute("width") or 0)
        spans[name] = (x, x + width)
    (a1, a2), (b1, b2) = spans["book-flight"], spans["book-hotel"]
    assert a1 < b2 and b1 < a2, f"the two bookings did not overlap in time: {spans}"
    assert not browser.all('svg#timeline g.row.parallel[data-step="charge"]')


def test_a_skipped_step_and_a_delay_are_shown_as_such(console: Console, browser: Browser) -> None:
    order_id = console.orders.small
    hold = next(s for s in console.api_order(order_id)["steps"] if s["step"] == "hold")
    until = hold["waitingFor"]["until"]

    browser.open(console.page(f"/orders/{order_id}", refresh="off"), "ul#steps")
    skipped = browser.one(step(APPROVED))
    assert "skipped" in (skipped.get_attribute("class") or "").split()
    assert skipped.get_attribute("data-state") == "Skipped"
    assert skipped.get_attribute("data-type") == "event" and not skipped.find_elements(
        "css selector", ".agent"
    ), "an event step shows an agent"
    assert "never run" in squash(skipped.find_element("css selector", ".skipped-note").text)
    assert browser.has(f'svg#timeline g.row.skipped[data-step="{APPROVED}"] text.skipped-note')

    delay = browser.one(step("hold"))
    assert delay.get_attribute("data-type") == "delay"
    waits = delay.find_element("css selector", ".waiting-for")
    assert waits.get_attribute("data-until") == until and until in waits.text
    assert (
        browser.one('ul#waiting-for li.awaited[data-step="hold"]').get_attribute("data-until")
        == until
    )
    assert "Step hold waits until" in browser.text("#status-why")
    assert browser.has('svg#timeline rect.wait.open[data-step="hold"][data-kind="delay"]')
    assert not browser.has(".event-actions"), "a form to send an event nobody waits for"
    later = browser.one(step("capture"))
    assert "not-started" in (later.get_attribute("class") or "").split()
    assert "captured" in later.find_element("css selector", ".completes-on").text


def test_an_operator_approves_with_a_note_and_the_order_goes_on(
    console: Console, browser: Browser
) -> None:
    # the read-only console shows the wait, and no way to send the event
    browser.open(
        console.page(f"/orders/{console.orders.inbox[0]}", read_only=True, refresh="off"),
        "section#waiting",
    )
    assert browser.has(f'li.awaited[data-event="{APPROVED}"]')
    assert not browser.has(".event-actions"), "event forms in read-only mode"

    order_id = console.orders.approve
    browser.open(console.page(f"/orders/{order_id}", refresh="off"), "section#waiting")
    assert browser.one("#order-status").get_attribute("data-status") == "processing"
    awaited = browser.one(f'ul#waiting-for li.awaited[data-event="{APPROVED}"]')
    assert awaited.get_attribute("data-step") == APPROVED
    assert f"waits for event {APPROVED}" in browser.text("#status-why")
    form = f'.event-actions[data-event="{APPROVED}"] form.approve-form'
    result = browser.one(f"{form} textarea[name=result]")
    assert result.get_attribute("value") == "{}", "the result is not {} by default"
    result.clear()
    result.send_keys(json.dumps(RESULT))
    browser.one(f"{form} textarea[name=reason]").send_keys(NOTE)
    assert squash(browser.one(f"{form} .approve-button").text) == "Approve"
    browser.click_through(f"{form} .approve-button", "form#confirm-form")

    assert path_of(browser.driver.current_url) == f"/api/console/orders/{order_id}/confirm"
    assert json.loads(browser.one("pre#confirm-result").text) == RESULT
    assert browser.text("#confirm-reason") == NOTE
    confirm = browser.one("form#confirm-form")
    assert path_of(confirm.get_attribute("action") or "") == (
        f"/api/console/orders/{order_id}/events/{APPROVED}"
    )
    assert (confirm.get_attribute("method") or "").lower() == "post"
    assert confirm.find_element("css selector", "[name=csrf]").get_attribute("value")
    assert console.load(order_id).awaited_events() == [APPROVED], "the confirm page sent it"

    browser.click_through("#confirm-button", "#message")
    assert path_of(browser.driver.current_url) == f"/api/console/orders/{order_id}"
    message = browser.one("#message")
    assert "error" not in (message.get_attribute("class") or "").split(), message.text
    assert "Approved by" in message.text, message.text
    taken = event_taken(console, order_id, APPROVED)
    operator = str(taken.get("by") or "")
    assert operator and operator in message.text and taken.get("reason") == NOTE, taken

    # the page shows the order went on: approved done with its result, the hold waiting
    approved = browser.one(step(APPROVED))
    assert approved.get_attribute("data-state") == "Processed"
    shown = approved.find_element("css selector", ".step-result code").text
    assert json.loads(shown) == RESULT
    assert browser.one(step("hold")).find_elements("css selector", ".waiting-for[data-until]")
    assert not browser.has(".event-actions"), "it still offers to send the event"
    row = browser.one(f'table#events tr.event-row[data-event="{APPROVED}"]')
    assert row.get_attribute("data-kind") == "result"
    cells = {c: squash(row.find_element("css selector", f".{c}").text) for c in ("by", "reason")}
    assert cells == {"by": operator, "reason": NOTE}, cells
    order = console.load(order_id)
    record = order.find(APPROVED)
    assert record is not None and record.result == RESULT
    assert order.status is OrderStatus.PROCESSING and order.awaited_events() == []


def test_an_operator_refuses_with_a_reason_and_the_order_unwinds(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.refuse
    browser.open(console.page(f"/orders/{order_id}", refresh="off"), "section#waiting")
    form = f'.event-actions[data-event="{APPROVED}"] form.refuse-form'
    reason = browser.one(f"{form} textarea[name=reason]")
    assert reason.get_attribute("required") is not None, "a refusal without a reason"
    reason.send_keys(REFUSAL)
    browser.click_through(f"{form} .refuse-button", "form#confirm-form")
    assert "fails for good" in browser.text("#confirm-effect")
    assert browser.text("#confirm-reason") == REFUSAL
    assert console.load(order_id).awaited_events() == [APPROVED], "the confirm page sent it"

    browser.click_through("#confirm-button", "#message")
    assert "Refused by" in browser.text("#message")

    def undone(_: object) -> bool:
        browser.reload("#order-status")
        return browser.one("#order-status").get_attribute("data-status") == "compensated"

    browser.until(undone, 30, f"{order_id} to be compensated after the refusal")
    failed = browser.one(step(APPROVED))
    assert failed.get_attribute("data-state") == "Error"
    assert REFUSAL in failed.find_element("css selector", ".last-error").text
    assert browser.one(step("reserve")).get_attribute("data-state") == "Compensated"
    assert browser.has('ul#steps li.step-row.compensation li.step[data-step="release"]')
    row = browser.one(f'table#events tr.event-row[data-event="{APPROVED}"]')
    assert row.get_attribute("data-kind") == "refused"
    assert squash(row.find_element("css selector", ".reason").text) == REFUSAL
    taken = event_taken(console, order_id, APPROVED)
    assert taken.get("reason") == REFUSAL and taken.get("by"), taken
    record = console.load(order_id).find(APPROVED)
    assert record is not None and record.process_state is StepState.ERROR


def test_the_inbox_lists_the_orders_waiting_for_an_event_in_the_url(
    console: Console, browser: Browser
) -> None:
    orders = console.orders
    browser.open(console.page(status="error", refresh="off"), "a#nav-inbox")
    browser.click_through("a#nav-inbox", "table#inbox-events")
    waiting = console.api_waiting(APPROVED)
    assert set(orders.inbox) <= set(waiting), waiting
    row = f'tr.inbox-row[data-event="{APPROVED}"]'
    assert first_number(browser.text(f"{row} .count")) == len(waiting)
    assert "approval" in browser.text(f"{row} .workflows")

    browser.click_through(f"{row} a.inbox-link", "table#orders")
    assert query(browser.driver.current_url).get("waiting") == [APPROVED]
    assert APPROVED in browser.text("h1#inbox-title")
    current = browser.one("nav#waiting-events a.event-link.current")
    assert current.get_attribute("data-event") == APPROVED
    listed = [r.get_attribute("data-order-id") for r in browser.all("table#orders tr.order-row")]
    assert listed == waiting, "the page and the JSON API disagree"
    # newest first to the millisecond, the index key's grain; orders made in the same
    # millisecond come in id order
    millis = {o: int(console.load(str(o)).created_at.timestamp() * 1000) for o in listed}
    assert listed == sorted(listed, key=lambda o: (-millis[o], o)), "not newest first"
    assert orders.small not in listed and orders.parallel not in listed
    for order_id in listed:
        badge = f'tr.order-row[data-order-id="{order_id}"] .waiting-for[data-event="{APPROVED}"]'
        assert browser.has(badge), f"{order_id}'s row does not say what it waits for"

    # the filter is the URL: a shared link shows the same; bad values are a 400 page
    browser.open(console.page(waiting=APPROVED, refresh="off"), "table#orders")
    again = [r.get_attribute("data-order-id") for r in browser.all("table#orders tr.order-row")]
    assert again == listed
    for bad in ({"waiting": "Not An Event!"}, {"waiting": APPROVED, "page": "not-a-token"}):
        response = httpx.get(console.page(query=bad), timeout=10)
        assert response.status_code == 400, (bad, response.status_code, response.text[:200])
        browser.open(console.page(query=bad), "#message")
        assert "error" in (browser.one("#message").get_attribute("class") or "").split()

    # an order's link leads to its page, which says what it waits for
    inbox = orders.inbox[0]
    browser.open(console.page(waiting=APPROVED, refresh="off"), "table#orders")
    browser.click_through(f'tr.order-row[data-order-id="{inbox}"] a.order-link', "section#waiting")
    assert browser.has(f'li.awaited[data-event="{APPROVED}"]')
    assert browser.has(f'.event-actions[data-event="{APPROVED}"] form.approve-form')
    if os.environ.get("UPDATE_SCREENSHOTS") == "1" or not SCREENSHOT.exists():
        assert browser.driver.save_screenshot(str(SCREENSHOT)), f"could not write {SCREENSHOT}"
