"""The dashboard and the stuck list in a real browser, against a stack of its own: the
figures the ``aggregate_dashboard`` timer keeps match the orders this test ran, and a
step made to hang past the stuck floor shows as stuck with its order id, and is alerted
once (docs/console-dom.md, "Dashboard").

Writes docs/console-dashboard.png when ``UPDATE_SCREENSHOTS=1`` is set or the file is
missing, after the page passed its checks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from demo.stack import ROOT, LocalStack
from tests.browser.harness import Browser, squash

pytestmark = pytest.mark.timeout(240)

SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "30",
    "MAX_FAILURE_COUNT": "2",
    "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
    "DASHBOARD_SCHEDULE": "*/2 * * * * *",
    "STUCK_FLOOR_SECONDS": "4",
}
#: Its one call hangs 20 s: Processing that long, far past the 4 s floor (its deadline is
#: 30 s away, so nothing else happens to it meanwhile).
HANG = {"fail": "hang", "times": 1, "seconds": 20}
ORDERS: list[dict[str, Any]] = [
    {"orderId": "d-ok-1"},
    {"orderId": "d-ok-2"},
    {"orderId": "d-ok-3"},
    {"orderId": "d-ful-1", "workflow": "fulfilment"},
    {"orderId": "d-ful-2", "workflow": "fulfilment"},
    {"orderId": "d-hang-1", "simulate": {"process": HANG}},
]


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(devhosts=1, settings=SETTINGS) as running:
        for body in ORDERS:
            running.submit(body)
        yield running


def dashboard_url(stack: LocalStack) -> str:
    base = stack.hosts[0].http_url
    assert base
    return f"{base}/api/console/dashboard"


def cell(browser: Browser, workflow: str, css: str) -> int:
    rows = browser.all(f'tr.totals-row[data-workflow="{workflow}"] {css}')
    return int(squash(rows[0].text)) if rows else 0


def test_the_dashboard_shows_what_the_orders_did_and_the_stuck_step(
    stack: LocalStack, browser: Browser
) -> None:
    url = dashboard_url(stack)
    browser.open(url, "main h1")

    def stuck_seen(_: object) -> bool:
        browser.open(url, "main h1")
        return browser.has('tr.stuck-row[data-order-id="d-hang-1"]')

    browser.until(stuck_seen, 40, "d-hang-1 listed as stuck")
    row = browser.one('tr.stuck-row[data-order-id="d-hang-1"]')
    assert row.get_attribute("data-step") == "process"
    assert "orders" in row.text and "Processing" in row.text
    assert [r.get_attribute("data-order-id") for r in browser.all("tr.stuck-row")] == ["d-hang-1"]

    def counted(_: object) -> bool:
        browser.open(url, "main h1")
        return (
            cell(browser, "order", ".finished-hour") == 3
            and cell(browser, "fulfilment", ".finished-hour") == 2
        )

    browser.until(counted, 40, "the finished orders counted")
    assert cell(browser, "order", ".started-hour") == 4  # d-hang-1 started, not finished
    assert cell(browser, "fulfilment", ".started-hour") == 2
    statuses = browser.all('tr.totals-row[data-workflow="order"] .by-status span')
    assert [s.get_attribute("data-status") for s in statuses] == ["completed"]
    steps = {
        (r.get_attribute("data-step"), r.get_attribute("data-agent")): int(
            squash(r.find_element("css selector", ".hour-count").text)
        )
        for r in browser.all("tr.duration-row")
    }
    assert steps[("process", "orders")] == 3 and steps[("ship", "carrier")] == 2
    bars = browser.all('svg#chart-started rect.dash-bar[data-series="order"]')
    assert bars, "no bar for the order workflow"
    assert browser.has("p#no-failures")

    path = ROOT / "docs" / "console-dashboard.png"
    if os.environ.get("UPDATE_SCREENSHOTS") == "1" or not path.exists():
        browser.driver.set_window_size(1280, 1500)
        assert browser.driver.save_screenshot(str(path))

    # The alerts page lists it too; its alert went out once, whatever the runs since.
    time.sleep(5)  # a few more runs of the 2 s timer, each seeing it stuck still
    alerts = url.replace("/dashboard", "/alerts")
    browser.open(alerts, "main h1")
    if browser.has("tr.stuck-row"):
        assert browser.has('tr.stuck-row[data-order-id="d-hang-1"]')
    mine = browser.all('tr.alert-row[data-order-id="d-hang-1"]')
    assert len(mine) == 1, [squash(r.text) for r in mine]
    assert "has been Processing for" in mine[0].text
