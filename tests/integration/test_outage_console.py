"""Outages in the console (docs/contracts.md §3.14, docs/console-dom.md), through its HTTP
functions on real Azurite: the dashboard lists the agents failing now and the outages
that ended, with agent, since, orders waiting and reason (escaped); the alerts page shows
an outage alert by its agent and kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import azure.functions as func
import pytest

from bootstrap import AppContext
from console import triggers as console
from core.timefmt import iso
from tests.integration.orders import accept
from tests.support import installed

BASE = "http://h:7071/api/console"
HOSTILE = "<script>window.__pwned=1</script>"


@pytest.fixture
def ctx(storage_connection: str, tag: str) -> Iterator[AppContext]:
    yield from installed(storage_connection, tag)


def page(handler: Callable[[func.HttpRequest], func.HttpResponse], path: str) -> str:
    request = func.HttpRequest("GET", f"{BASE}{path}", params={}, route_params={}, body=b"")
    response = handler(request)
    assert response.mimetype == "text/html", response.get_body()[:300]
    return str(response.get_body().decode())


def test_the_dashboard_lists_current_and_past_outages(ctx: AppContext) -> None:
    now = datetime.now(UTC)
    start = now - timedelta(minutes=20)
    for n in range(3):  # three orders wait for the orders agent
        ctx.store.create(accept(f"w-{n}", start))
    # orders: failing since 20 minutes ago, told to operators, still down
    ctx.outages.failing("orders", start, start + timedelta(seconds=10), f"HTTP 503 {HOSTILE}")
    ctx.outages.failing("orders", start, now - timedelta(minutes=10), f"HTTP 503 {HOSTILE}")
    # carrier: an outage that ended an hour ago
    old = now - timedelta(hours=2)
    ctx.outages.failing("carrier", old, old + timedelta(seconds=10), "connection refused")
    ctx.outages.failing("carrier", old, old + timedelta(seconds=400), "connection refused")
    ctx.outages.answered("carrier", now - timedelta(hours=1))

    html = page(console.console_dashboard, "/dashboard")

    [current] = re.findall(r'<tr class="outage-row"[^>]*>.*?</tr>', html, re.S)
    assert 'data-agent="orders"' in current and 'data-alerted="true"' in current
    assert f'<td class="since">{iso(start)}</td>' in current
    assert '<td class="waiting">3</td>' in current
    assert "HTTP 503 &lt;script&gt;" in current and "<script>window" not in html
    [past] = re.findall(r'<tr class="past-outage-row"[^>]*>.*?</tr>', html, re.S)
    assert 'data-agent="carrier"' in past and "connection refused" in past
    assert f'<td class="until">{iso(now - timedelta(hours=1))}</td>' in past
    assert 'id="no-outages"' not in html and 'id="no-past-outages"' not in html


def test_without_outages_the_dashboard_says_so(ctx: AppContext) -> None:
    html = page(console.console_dashboard, "/dashboard")
    assert 'id="no-outages"' in html and 'id="no-past-outages"' in html
    assert 'id="dash-outages"' not in html


def test_the_alerts_page_shows_an_outage_alert_by_its_agent(ctx: AppContext) -> None:
    start = datetime.now(UTC) - timedelta(minutes=6)
    ctx.outages.failing("carrier", start, start + timedelta(seconds=10), "HTTP 502")
    ctx.outages.failing("carrier", start, start + timedelta(seconds=301), "HTTP 502")

    html = page(console.console_alerts, "/alerts")

    [row] = re.findall(r'<tr class="alert-row"[^>]*data-kind="outage">.*?</tr>', html, re.S)
    assert '<td class="step">carrier</td>' in row
    assert "every call to agent carrier" in row
