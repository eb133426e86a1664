"""The operator console in a real browser, against its page contract (docs/console-dom.md).

The app runs once for the whole module (``console`` in conftest.py: two devhosts, the
second read-only) with orders already settled: completed ones, ``error`` ones, one that
completes when resubmitted, one with hostile markup, and a bulk group alone in its own
time window. Tests read the pages by the contract's ids and classes only, and check what
they show against the JSON operator API and the orders table.

Screenshots: ``test_screenshots_for_the_docs`` writes docs/console-list.png (the list of
``error`` orders) and docs/console-detail.png (a failed order's detail, with its
timeline) when ``UPDATE_SCREENSHOTS=1`` is set, or when a file is missing; otherwise it
leaves the committed ones alone, so that `make test` does not rewrite tracked files on
every run. It saves only after the pages passed their checks: never an error page.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from selenium.webdriver.support.ui import Select

from core.states import OrderStatus
from demo.stack import ROOT
from tests.browser.harness import (
    Browser,
    Console,
    console_post,
    csrf_pair,
    events,
    first_number,
    snapshot,
    squash,
)

pytestmark = pytest.mark.timeout(180)

RESUBMIT_REASON = "browser test: the remote is fixed, retry"
FIX_REASON = "browser test: the order named a simulated failure"
BULK_REASON = "browser test: bulk retry of the group"
DOCS = ROOT / "docs"
#: The cells of a tr.attempt-row.
CELLS = ("started", "ended", "instance", "outcome", "applied", "error")
#: The start of the hostile order's error (hostile(5)) that any page showing it shows,
#: even one that shortens long errors.
HOSTILE_ERROR = "<script>window.__pwned=5</script>"


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def path_of(url: str) -> str:
    return urlsplit(url).path


def rows(browser: Browser) -> dict[str, str]:
    """The list's rows: order id -> the text of its `.status` cell."""
    found = {}
    for row in browser.all("table#orders tr.order-row"):
        order_id = row.get_attribute("data-order-id")
        assert order_id, f"a tr.order-row without data-order-id: {row.get_attribute('outerHTML')}"
        status = row.find_elements("css selector", ".status")
        assert status, f"row {order_id} has no .status cell"
        found[order_id] = squash(status[0].text).lower()
    return found


def assert_only(browser: Browser, status: str) -> dict[str, str]:
    listed = rows(browser)
    wrong = {o: s for o, s in listed.items() if s != status}
    assert not wrong, f"{browser.driver.current_url} lists orders not in {status}: {wrong}"
    return listed


# --- the harness itself (passes without the console) ------------------------------------


def test_the_harness_runs_the_app_and_chromium(console: Console, browser: Browser) -> None:
    orders = console.orders
    # (subsets: the tests after this one change some of them)
    assert set(orders.failed) | {orders.guard} <= console.api_ids("error")
    assert set(orders.completed) <= console.api_ids("completed")
    # the read-only instance serves the same app
    listed = httpx.get(
        f"{console.read_only_base}/api/orders", params={"status": "compensated"}, timeout=10
    ).json()
    assert [o["orderId"] for o in listed["orders"]] == [orders.hostile]
    # Chromium reaches the devhost
    browser.open(f"{console.api}/orders?status=error", "body")
    assert orders.failed[0] in browser.body_text()


# --- (a) the list -------------------------------------------------------------------


def test_list_filters_by_status_in_the_url_and_the_form(console: Console, browser: Browser) -> None:
    orders = console.orders
    browser.open(console.page(status="error", refresh="off"), "table#orders")
    listed = assert_only(browser, "error")
    assert set(listed) == console.api_ids("error"), "the page and the JSON API disagree"
    assert not set(listed) & set(orders.completed)

    # the counts: one per status, linked, the current one marked
    for status in OrderStatus:
        link = browser.one(f'nav#counts a.count[data-status="{status.value}"]')
        text = squash(link.text)
        assert re.fullmatch(rf"{status.value} (\d+|1000\+)", text), (status, text)
        href = link.get_attribute("href") or ""
        assert query(href).get("status") == [status.value], (status, href)
        current = "current" in (link.get_attribute("class") or "").split()
        assert current == (status is OrderStatus.ERROR), (status, link.get_attribute("class"))
    for name in ("error", "completed", "compensated"):
        shown = browser.text(f'nav#counts a.count[data-status="{name}"]')
        assert first_number(shown) == len(console.api_ids(name)), (name, shown)

    # the form: completed orders, then back to the errors
    Select(browser.one("form#filters select[name=status]")).select_by_value("completed")
    browser.click_through("form#filters #apply", "table#orders")
    assert query(browser.driver.current_url).get("status") == ["completed"]
    completed = set(assert_only(browser, "completed"))
    assert completed == console.api_ids("completed") and set(orders.completed) <= completed
    browser.back("table#orders")
    assert query(browser.driver.current_url).get("status") == ["error"]
    assert set(assert_only(browser, "error")) == set(listed)

    # the URL: a workflow too
    browser.open(console.page(status="completed", workflow="fulfilment"), "table#orders")
    assert set(assert_only(browser, "completed")) == {"ok-3"}
    workflows = {squash(c.text) for c in browser.all("table#orders tr.order-row .workflow")}
    assert workflows == {"fulfilment"}, workflows
    selected = Select(browser.one("form#filters select[name=workflow]")).first_selected_option
    assert selected.get_attribute("value") == "fulfilment", "the form forgot the filter"

    # nothing to show
    browser.open(console.page(status="cancelled"), "body")
    assert browser.has("p#empty") and not rows(browser), "no p#empty for an empty list"

    # an order's link leads to its detail
    browser.open(console.page(status="error", refresh="off"), "table#orders")
    order_id = orders.failed[0]
    browser.click_through(f'tr.order-row[data-order-id="{order_id}"] a.order-link', "#order-status")
    assert path_of(browser.driver.current_url) == f"/api/console/orders/{order_id}"
    assert order_id in browser.text("h1")


def test_the_search_box_finds_orders_by_a_field_in_a_url_to_share(
    console: Console, browser: Browser
) -> None:
    """Contract 3.14: a search by a declared field, from the box to a URL that names it."""
    browser.open(console.page(status="error", refresh="off"), "form#search")
    Select(browser.one("form#search select#search-field")).select_by_value("customerId")
    browser.one("form#search input#search-value").send_keys("c-7")
    browser.click_through("form#search #search-button", "h1#search-title")
    assert query(browser.driver.current_url) == {"customerId": ["c-7"], "refresh": ["off"]}
    assert browser.text("#search-shown") == "c-7"
    listed = rows(browser)
    api = httpx.get(f"{console.api}/orders", params={"customerId": "c-7"}, timeout=10).json()
    assert list(listed) == [o["orderId"] for o in api["orders"]]
    assert set(listed) == {"ok-1", console.orders.failed[0]}, listed
    # the status narrows the search, and the search stays in the URL
    browser.click_through('nav#counts a.count[data-status="error"]', "table#orders")
    assert query(browser.driver.current_url).get("customerId") == ["c-7"]
    assert rows(browser) == {console.orders.failed[0]: "error"}
    browser.click_through("a#search-clear", "form#filters")
    assert "customerId" not in query(browser.driver.current_url)


def test_list_auto_refresh_can_be_paused(console: Console, browser: Browser) -> None:
    browser.open(console.page(status="error"), "a#refresh-toggle")
    toggle = browser.one("a#refresh-toggle")
    assert squash(toggle.text) == "Pause auto-refresh"
    href = toggle.get_attribute("href") or ""
    assert query(href).get("refresh") == ["off"] and query(href).get("status") == ["error"]
    browser.click_through("a#refresh-toggle", "a#refresh-toggle")
    assert squash(browser.one("a#refresh-toggle").text) == "Resume auto-refresh"


def test_lookup_finds_an_order_or_says_there_is_none(console: Console, browser: Browser) -> None:
    browser.open(console.page(status="error", refresh="off"), "form#lookup")
    browser.one("form#lookup input[name=orderId]").send_keys(console.orders.failed[1])
    browser.click_through("form#lookup #lookup-button", "#order-status")
    assert console.orders.failed[1] in browser.text("h1")
    browser.open(console.page(status="error", refresh="off"), "form#lookup")
    browser.one("form#lookup input[name=orderId]").send_keys("no-such-order")
    browser.click_through("form#lookup #lookup-button", "#message")
    message = browser.one("#message")
    assert "error" in (message.get_attribute("class") or "").split(), message.text
    assert "no-such-order" in message.text and "no order" in message.text.lower()


def test_alerts_page_shows_what_needs_an_operator(console: Console, browser: Browser) -> None:
    dead = console.orders.failed[0]
    browser.open(console.page("/alerts"), "table#alerts")
    alert = browser.one(f'table#alerts tr.alert-row[data-order-id="{dead}"]')
    assert squash(alert.find_element("css selector", ".reason").text), "an alert with no reason"
    assert "process" in alert.find_element("css selector", ".step").text
    attention = browser.text("table#attention")
    assert dead in attention and console.orders.guard in attention, attention
    assert browser.has("table#rejected") and browser.has("table#kept")


# --- (b) the detail of a failed order -------------------------------------------------


def test_detail_of_a_failed_order_shows_every_attempt(console: Console, browser: Browser) -> None:
    order_id = console.orders.failed[0]
    shown = console.api_order(order_id)
    attempts = shown["steps"][0]["attempts"]
    assert len(attempts) >= 2, f"the harness made {order_id} fail only {attempts}"

    browser.open(console.page(f"/orders/{order_id}"), "#order-status")
    assert order_id in browser.text("h1")
    status = browser.one("#order-status")
    assert status.get_attribute("data-status") == "error" and "error" in status.text.lower()
    why = browser.text("#status-why")
    assert "process" in why, f"#status-why does not name the failed step: {why!r}"

    table = browser.all("table#attempts tr.attempt-row")
    assert len(table) == len(attempts), (len(table), attempts)
    by_number = {row.get_attribute("data-attempt"): row for row in table}
    assert set(by_number) == {str(a["attempt"]) for a in attempts}, set(by_number)
    for attempt in attempts:
        row = by_number[str(attempt["attempt"])]
        assert row.get_attribute("data-step") == "process"
        cells = {c: squash(row.find_element("css selector", f".{c}").text) for c in CELLS}
        # the error as recorded (its start: a page may shorten long ones)
        assert squash(attempt.get("error") or "")[:40] in cells["error"], (cells, attempt)
        assert attempt["outcome"] in cells["outcome"], (cells, attempt)
        assert attempt["instance"] in cells["instance"], (cells, attempt)
        assert cells["started"], (cells, attempt)
    shown_errors = [squash(r.find_element("css selector", ".error").text) for r in table]
    assert any("HTTP 503" in e for e in shown_errors), shown_errors

    bars = browser.all("svg#timeline rect.attempt")
    assert len(bars) == len(attempts), f"{len(bars)} rect.attempt for {len(attempts)} attempts"
    drawn = sorted(
        tuple(b.get_attribute(f"data-{a}") or "" for a in ("step", "attempt", "outcome"))
        for b in bars
    )
    assert drawn == sorted(("process", str(a["attempt"]), a["outcome"]) for a in attempts)
    assert all(float(b.get_attribute("width") or 0) > 0 for b in bars), "a bar of no width"
    assert len(browser.all("svg#timeline line.gap")) == len(attempts) - 1

    step = browser.one('ul#steps li.step[data-step="process"]')
    assert "error" in step.find_element("css selector", ".step-state").text.lower()
    assert json.loads(browser.one("#order-data").text) == console.bodies[order_id]
    assert browser.has("details#raw-history")
    assert browser.has("form#resubmit-form") and browser.has("form#cancel-form")


# --- (h) screenshots for the docs --------------------------------------------------------


def test_screenshots_for_the_docs(console: Console, browser: Browser) -> None:
    update = os.environ.get("UPDATE_SCREENSHOTS") == "1"
    browser.open(console.page(status="error"), "table#orders")
    assert len(rows(browser)) >= len(console.orders.failed)
    save(browser, DOCS / "console-list.png", update)
    browser.open(console.page(f"/orders/{console.orders.failed[0]}"), "svg#timeline")
    assert browser.all("svg#timeline rect.attempt"), "a timeline without attempts"
    save(browser, DOCS / "console-detail.png", update)


def save(browser: Browser, path: Path, update: bool) -> None:
    if update or not path.exists():
        assert browser.driver.save_screenshot(str(path)), f"could not write {path}"


# --- (c) resubmit -----------------------------------------------------------------------


def test_resubmit_with_a_reason_completes_the_order(console: Console, browser: Browser) -> None:
    order_id = console.orders.retry
    browser.open(console.page(status="error", refresh="off"), "table#orders")
    browser.click_through(
        f'tr.order-row[data-order-id="{order_id}"] a.order-link', "form#resubmit-form"
    )
    assert browser.one("#order-status").get_attribute("data-status") == "error"
    browser.one("form#resubmit-form textarea[name=reason]").send_keys(RESUBMIT_REASON)
    assert squash(browser.one("#resubmit-button").text) == "Resubmit"
    browser.click_through("#resubmit-button", "form#confirm-form")

    assert path_of(browser.driver.current_url) == f"/api/console/orders/{order_id}/confirm"
    assert browser.text("#confirm"), "#confirm does not explain anything"
    form = browser.one("form#confirm-form")
    assert path_of(form.get_attribute("action") or "") == (
        f"/api/console/orders/{order_id}/resubmit"
    )
    assert (form.get_attribute("method") or "").lower() == "post"
    reason = form.find_element("css selector", "[name=reason]")
    assert reason.get_attribute("value") == RESUBMIT_REASON
    assert form.find_element("css selector", "[name=csrf]").get_attribute("value")
    assert any(c["name"] == "console_csrf" for c in browser.driver.get_cookies())
    assert browser.has("a#confirm-back")
    assert console.load(order_id).status is OrderStatus.ERROR, "the confirm page changed it"
    assert not events(console.load(order_id), "resubmitted")

    browser.click_through("#confirm-button", "#message")
    assert path_of(browser.driver.current_url) == f"/api/console/orders/{order_id}"
    message = browser.one("#message")
    assert "error" not in (message.get_attribute("class") or "").split(), message.text
    assert "Resubmitted by" in message.text, f"#message: {message.text!r}"
    resubmitted = events(console.load(order_id), "resubmitted")
    assert [e.get("reason") for e in resubmitted] == [RESUBMIT_REASON], resubmitted
    operator = str(resubmitted[0].get("by") or "")
    assert operator and operator in message.text, (operator, message.text)
    # the person signed in (devhost's development principal), never the key
    assert operator != "function-key" and operator in browser.text("#principal"), operator

    def completed(_: object) -> bool:
        browser.reload("#order-status")
        return browser.one("#order-status").get_attribute("data-status") == "completed"

    browser.until(completed, 30, f"{order_id} to complete after the resubmit")
    browser.one("details#raw-history summary").click()
    raw = browser.one("details#raw-history").get_attribute("textContent") or ""
    assert RESUBMIT_REASON in raw, "the reason is not in the raw history"
    assert operator in raw, f"the operator {operator!r} is not in the raw history"


def test_fix_the_data_previews_each_change_and_the_fixed_order_completes(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.fix
    browser.open(console.page(f"/orders/{order_id}"), "details#fix")
    assert browser.one("#order-status").get_attribute("data-status") == "error"
    browser.one("details#fix summary").click()
    data = browser.one("#fix-data")
    shown = json.loads(data.get_attribute("value") or "")
    assert shown == console.bodies[order_id], shown
    fixed = {k: v for k, v in shown.items() if k != "simulate"} | {"amount": 5}
    data.clear()
    data.send_keys(json.dumps(fixed))
    browser.one("form#fix-form textarea[name=reason]").send_keys(FIX_REASON)
    browser.click_through("#fix-button", "#fix-confirm")

    changes = {
        row.get_attribute("data-field"): (
            squash(row.find_element("css selector", "td.old").text),
            squash(row.find_element("css selector", "td.new").text),
        )
        for row in browser.all("#fix-changes tr.change")
    }
    assert changes == {
        "amount": ("4", "5"),
        "simulate": (json.dumps(shown["simulate"], separators=(",", ":")), "removed"),
    }, changes
    assert browser.text("#fix-reason") == FIX_REASON
    assert console.load(order_id).status is OrderStatus.ERROR, "the preview changed it"

    browser.click_through("#fix-confirm-button", "#message")
    assert path_of(browser.driver.current_url) == f"/api/console/orders/{order_id}"
    assert "Fixed and resubmitted by" in browser.text("#message")
    [patched] = events(console.load(order_id), "patched")
    assert patched.get("reason") == FIX_REASON, patched

    def completed(_: object) -> bool:
        browser.reload("#order-status")
        return browser.one("#order-status").get_attribute("data-status") == "completed"

    browser.until(completed, 30, f"{order_id} to complete after the fix")
    assert console.load(order_id).body == fixed


# --- (d) bulk ---------------------------------------------------------------------------


def test_bulk_resubmit_previews_then_changes_exactly_the_group(
    console: Console, browser: Browser
) -> None:
    group = set(console.orders.bulk)
    window = {"status": "error", "from": console.bulk_from, "to": console.bulk_to}
    browser.open(console.page(refresh="off", query=window), "form#bulk")
    assert set(assert_only(browser, "error")) == group, (window, rows(browser))
    for name, value in window.items():
        kept = browser.one(f'form#bulk input[name="{name}"]').get_attribute("value")
        assert kept == value, f"form#bulk does not carry {name}={value!r} (has {kept!r})"
    before = {o: snapshot(console.load(o)) for o in group}

    Select(browser.one("form#bulk select[name=action]")).select_by_value("resubmit")
    browser.one("form#bulk input[name=reason]").send_keys(BULK_REASON)
    browser.click_through("#bulk-preview-button", "#bulk-count")
    count = first_number(browser.text("#bulk-count"))
    assert count == len(group), f"#bulk-count {count}, the group has {len(group)}"
    previewed = {squash(li.text) for li in browser.all("ul#bulk-orders li")}
    assert previewed == group, previewed
    assert {o: snapshot(console.load(o)) for o in group} == before, "the preview changed orders"

    browser.click_through("#bulk-confirm-button", "#bulk-result")
    done = first_number(browser.text("#bulk-done"))
    refused = first_number(browser.text("#bulk-refused"))
    problems = [squash(li.text) for li in browser.all("ul#bulk-problems li")]
    assert (done, refused, problems) == (count, 0, []), (done, refused, problems)
    for order_id in sorted(group):
        reasons = [e.get("reason") for e in events(console.load(order_id), "resubmitted")]
        assert reasons == [BULK_REASON], (order_id, reasons)


# --- (e) read-only --------------------------------------------------------------------


def test_read_only_mode_shows_no_actions_and_refuses_posts(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.guard
    browser.open(console.page(status="error", refresh="off", read_only=True), "table#orders")
    assert browser.has("#read-only"), "no #read-only banner on the list"
    assert not browser.has("form#bulk"), "form#bulk in read-only mode"
    assert order_id in rows(browser)
    browser.open(console.page(f"/orders/{order_id}", read_only=True), "#order-status")
    assert browser.one("#order-status").get_attribute("data-status") == "error"
    assert browser.has("#read-only"), "no #read-only banner on the detail"
    for form in ("#resubmit-form", "#cancel-form"):
        assert not browser.has(form), f"{form} in read-only mode"

    # well-formed POSTs, as the forms would send them, with a token from a confirm page
    pair = csrf_pair(console.read_only_url, order_id) or csrf_pair(console.url, order_id)
    assert pair, "no confirm page hands out a console_csrf cookie and a csrf field"
    cookie, token = pair
    before = snapshot(console.load(order_id))
    bulk = {"status": "error", "action": "resubmit", "reason": "read-only probe", "csrf": token}
    posts = {
        f"/orders/{order_id}/resubmit": {"reason": "read-only probe", "csrf": token},
        f"/orders/{order_id}/cancel": {"reason": "read-only probe", "csrf": token},
        "/bulk/preview": bulk,
        "/bulk/run": {**bulk, "orderIds": order_id},
    }
    for path, data in posts.items():
        response = console_post(
            console.page(path, read_only=True),
            data,
            cookie=cookie,
            headers={"Origin": console.read_only_base, "Sec-Fetch-Site": "same-origin"},
        )
        assert response.status_code == 403, (path, response.status_code, response.text[:300])
    assert snapshot(console.load(order_id)) == before, "a read-only POST changed the order"
    # the control: the same dry run on the writable console is accepted
    writable = csrf_pair(console.url, order_id)
    assert writable, "the writable console's confirm page hands out no CSRF token"
    response = console_post(
        console.page("/bulk/preview"),
        {**bulk, "csrf": writable[1]},
        cookie=writable[0],
        headers={"Origin": console.base, "Sec-Fetch-Site": "same-origin"},
    )
    assert response.status_code == 200 and 'id="bulk-count"' in response.text, (
        "the control (a bulk preview on the writable console) was refused too",
        response.status_code,
        response.text[:300],
    )


# --- (e') roles ----------------------------------------------------------------------

READER = "rita; roles=Orders.Reader"


def test_a_reader_sees_no_action_and_every_change_is_refused(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.guard
    before = snapshot(console.load(order_id))
    with browser.signed_in_as(READER):
        browser.open(console.page(status="error", refresh="off"), "table#orders")
        assert browser.one("#principal").get_attribute("data-roles") == "Orders.Reader"
        assert "rita" in browser.text("#principal")
        assert "Orders.Operator" in browser.text("#read-only"), "the banner says why"
        assert not browser.has("form#bulk"), "form#bulk for a reader"
        assert order_id in rows(browser), "a reader reads the list"
        browser.open(console.page(f"/orders/{order_id}"), "#order-status")
        assert browser.one("#order-status").get_attribute("data-status") == "error"
        for form in ("#resubmit-form", "#cancel-form", "#fix-form", "div.event-actions"):
            assert not browser.has(form), f"{form} for a reader"
        browser.open(console.page("/agents"), "table#agents")
        assert not browser.has("form.pause-form") and not browser.has("form.limits-form")
        # typed in by hand, a confirmation page is refused too
        browser.open(
            console.page(f"/orders/{order_id}/confirm", action="resubmit", reason="probe"),
            "#message",
        )
        assert "Orders.Operator" in browser.text("#message")

    # what the forms would send, forced, with a valid CSRF pair: every one refused
    pair = csrf_pair(console.url, order_id)
    assert pair, "the operator's confirm page hands out no CSRF token"
    cookie, token = pair
    as_reader = {"X-Dev-Principal": READER}
    same_origin = {**as_reader, "Origin": console.base, "Sec-Fetch-Site": "same-origin"}
    reason = {"reason": "reader probe", "csrf": token}
    bulk = {**reason, "status": "error", "action": "resubmit", "ids": order_id}
    posts = {
        f"/orders/{order_id}/resubmit": reason,
        f"/orders/{order_id}/cancel": reason,
        f"/orders/{order_id}/fix/preview": {**reason, "data": "{}"},
        f"/orders/{order_id}/fix": {**reason, "data": "{}"},
        f"/orders/{order_id}/events/approved": {**reason, "action": "approve", "result": "{}"},
        "/bulk/preview": bulk,
        "/bulk/run": bulk,
        "/agents/orders/change": {**reason, "action": "pause"},
    }
    for path, data in posts.items():
        response = console_post(console.page(path), data, cookie=cookie, headers=same_origin)
        assert response.status_code == 403, (path, response.status_code, response.text[:300])
        assert "Orders.Operator" in response.text, (path, response.text[:300])
    # and the operator API, for the same reader
    for path, body in {
        f"orders/{order_id}/resubmit": {"reason": "reader probe"},
        f"orders/{order_id}/cancel": {"reason": "reader probe"},
        f"orders/{order_id}/events/approved": {"result": {}},
        "agents/orders/pause": {"reason": "reader probe"},
        "agents/orders/limits": {"concurrency": 1, "reason": "reader probe"},
    }.items():
        response = httpx.post(f"{console.api}/{path}", json=body, headers=as_reader, timeout=10)
        assert response.status_code == 403, (path, response.status_code, response.text[:300])
        assert response.json()["role"] == "Orders.Operator", response.text
    # a key caller (a machine with the function key, no principal) delivers no event either
    # (docs/contracts.md §3.15: a key alone delivers nothing)
    keyed = httpx.post(
        f"{console.api}/orders/{order_id}/events/approved",
        json={"result": {}},
        headers={"x-functions-key": "k3y"},
        timeout=10,
    )
    assert keyed.status_code == 403, (keyed.status_code, keyed.text[:300])
    assert "function key alone delivers nothing" in keyed.json()["error"]
    reads = httpx.get(f"{console.api}/orders/{order_id}", headers=as_reader, timeout=10)
    assert reads.status_code == 200, "a reader reads through the API"
    assert snapshot(console.load(order_id)) == before, "a reader changed the order"
    audit = httpx.get(f"{console.api}/agents/audit", timeout=10).json()["entries"]
    assert not [e for e in audit if "rita" in json.dumps(e)], "a reader changed an agent"

    # the control: the operator (the devhost's own principal) is offered the actions
    browser.open(console.page(f"/orders/{order_id}"), "#order-status")
    assert browser.one("#principal").get_attribute("data-roles") == "Orders.Operator"
    assert browser.has("#resubmit-form") and not browser.has("#read-only")


def test_no_page_carries_a_key_and_the_key_opens_no_page(
    console: Console, browser: Browser
) -> None:
    response = httpx.get(console.page(status="error", code="k3y"), timeout=10)
    assert response.status_code == 403 and "function key" in response.text, response.text[:300]
    for url in (
        console.page(status="error", refresh="off"),
        console.page(f"/orders/{console.orders.guard}"),
        console.page("/agents"),
    ):
        browser.open(url, "#principal")
        source = browser.driver.page_source
        assert "code=" not in source and 'name="code"' not in source, url
    css = httpx.get(f"{console.url}/assets/console.css", timeout=10)
    assert css.status_code == 200
    assert css.headers["cache-control"].startswith("private"), css.headers["cache-control"]


# --- (f) escaping -------------------------------------------------------------------------


INJECTED = "script:not([src]), img[src='x'], [onerror]"


def test_hostile_order_data_is_shown_as_text(console: Console, browser: Browser) -> None:
    order_id = console.orders.hostile
    body = console.bodies[order_id]
    browser.open(console.page(f"/orders/{order_id}"), "#order-data")
    assert json.loads(browser.one("#order-data").text) == body, "the body is not shown as is"
    errors = [squash(c.text) for c in browser.all("table#attempts tr.attempt-row .error")]
    assert any(HOSTILE_ERROR in e for e in errors), f"the error is not shown literally: {errors}"
    assert browser.js("return window.__pwned") is None
    assert_nothing_injected(browser)

    browser.open(console.page(status="compensated", refresh="off"), "table#orders")
    last_error = browser.text(f'tr.order-row[data-order-id="{order_id}"] .last-error')
    assert HOSTILE_ERROR in last_error, f"the list shows {last_error!r}"
    assert browser.js("return window.__pwned") is None
    assert_nothing_injected(browser)


def assert_nothing_injected(browser: Browser) -> None:
    """No element made from order data: the CSP would stop it running, not existing."""
    injected = [
        e.get_attribute("outerHTML")
        for e in browser.all(INJECTED)
        if "__pwned" in (e.get_attribute("outerHTML") or "")
    ]
    assert not injected, f"markup from the order became elements: {injected}"


def test_pages_allow_only_their_own_origin(console: Console) -> None:
    for url in (console.page(status="error"), console.page(f"/orders/{console.orders.hostile}")):
        response = httpx.get(url, timeout=10)
        assert response.status_code == 200, (url, response.status_code, response.text[:200])
        policy = response.headers.get("content-security-policy", "")
        assert "'self'" in policy and "unsafe-inline" not in policy, (url, policy)
        assert response.headers.get("content-type", "").startswith("text/html")


# --- (g) CSRF -----------------------------------------------------------------------------


def test_posts_without_a_valid_csrf_token_are_refused(console: Console) -> None:
    order_id = console.orders.guard
    pair = csrf_pair(console.url, order_id)
    assert pair, "the confirm page hands out no console_csrf cookie and csrf field"
    cookie, token = pair
    same_origin = {"Origin": console.base, "Sec-Fetch-Site": "same-origin"}
    cross_site = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    preview = {"status": "error", "action": "resubmit", "reason": "csrf probe"}
    # (form field, cookie, headers): every one lacks a valid token or is cross-site
    refused: dict[str, tuple[str | None, str | None, dict[str, str]]] = {
        "no token at all": (None, None, same_origin),
        "cookie, no field": (None, cookie, same_origin),
        "field, no cookie": (token, None, same_origin),
        "field and cookie differ": (token + "x", cookie, same_origin),
        "another origin": (token, cookie, cross_site),
    }
    before = snapshot(console.load(order_id))
    for path, data in (
        (f"/orders/{order_id}/resubmit", {"reason": "csrf probe"}),
        ("/bulk/preview", preview),
    ):
        for what, (field, with_cookie, headers) in refused.items():
            sent = {**data, "csrf": field} if field is not None else data
            response = console_post(console.page(path), sent, cookie=with_cookie, headers=headers)
            assert response.status_code == 403, (
                path,
                what,
                response.status_code,
                response.text[:300],
            )
    after = console.load(order_id)
    assert snapshot(after) == before, "a refused POST changed the order"
    assert after.status is OrderStatus.ERROR and not events(after, "resubmitted")
    # the control: with the token, same-origin, the dry run is accepted
    response = console_post(
        console.page("/bulk/preview"),
        {**preview, "csrf": token},
        cookie=cookie,
        headers=same_origin,
    )
    assert response.status_code == 200 and 'id="bulk-count"' in response.text, (
        "a valid token was refused too: the refusals above prove nothing",
        response.status_code,
        response.text[:300],
    )
