"""Agents paused at runtime from the console, in a real browser against a running stack
(docs/contracts.md §3.7; the page structure in docs/console-dom.md).

An operator pauses the ``orders`` agent from the Agents page (a reason, a confirmation
page that changes nothing, then the POST); orders submitted for it then wait,
``Pending``, with no attempt counted and no alert for longer than the harness's whole
failure budget (2 attempts of 6 s, a 3 s deferral window) while the simulated remote
receives no call and its ledger no effect; each order's page shows the pause; the
operator resumes the agent the same way, and the orders complete, each applied once.
The audit on the page lists both changes, newest first, with who and why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest

from core.control_cache import HOLD_MIN, PERIOD, SETTLE
from core.states import OrderStatus, StepState
from scheduler.service import SWEEP_GRACE
from tests.browser.harness import Browser, Console, squash
from tests.browser.test_console import DOCS, save

pytestmark = pytest.mark.timeout(300)

AGENT = "orders"
PAUSE_REASON = "browser test: the orders service is down for maintenance"
RESUME_REASON = "browser test: maintenance over"
#: Longer than any failure the harness allows a step (2 attempts of 6 s, and a 3 s
#: deferral window): a step that was counted, expired or deferred would be `error` by
#: now. And longer than a held step's first look again (``HOLD_MIN`` + the sweep's
#: grace): held again then, the next look is far off, so only the release after the
#: resume can make the orders complete within ``RELEASE_SECONDS``.
WAIT_SECONDS = HOLD_MIN.total_seconds() + SWEEP_GRACE.total_seconds() + 5
RELEASE_SECONDS = SETTLE.total_seconds() + 15


def agents(console: Console) -> list[dict[str, object]]:
    """The agents as the JSON operator API lists them."""
    listed: list[dict[str, object]] = httpx.get(f"{console.api}/agents", timeout=10).json()[
        "agents"
    ]
    return listed


def row(browser: Browser) -> str:
    return f'table#agents tr.agent-row[data-agent="{AGENT}"]'


def paused_on_page(browser: Browser) -> str | None:
    return browser.one(row(browser)).get_attribute("data-paused")


def keys_called(console: Console, order_ids: list[str]) -> list[str]:
    calls = console.stack.remote_calls()
    return [c["idempotencyKey"] for c in calls if c["idempotencyKey"].split(":")[0] in order_ids]


def effects_of(console: Console, order_ids: list[str]) -> list[str]:
    ledger = httpx.get(f"{console.stack.simulator_url}/_ledger", timeout=10).json()["effects"]
    return [e["idempotencyKey"] for e in ledger if e["idempotencyKey"].split(":")[0] in order_ids]


def alerts_for(console: Console, order_ids: list[str]) -> list[str]:
    ctx = console.stack.context
    client = ctx.queues.client(ctx.names.operator_alerts)
    return [
        m.content
        for m in client.peek_messages(max_messages=32)
        if any(o in m.content for o in order_ids)
    ]


@pytest.fixture
def resumed_after(console: Console) -> Iterator[None]:
    """Whatever happens, the agent runs again for the tests after this one."""
    yield
    if any(a["name"] == AGENT and a["paused"] for a in agents(console)):
        httpx.post(
            f"{console.api}/agents/{AGENT}/resume", json={"reason": "test cleanup"}, timeout=10
        )


def test_a_paused_agent_calls_nothing_and_its_orders_go_on_after_the_resume(
    console: Console, browser: Browser, resumed_after: None
) -> None:
    order_ids = [f"paused-{n}-{int(time.time())}" for n in range(3)]

    # the Agents page: every declared agent, running
    browser.open(console.page("/agents"), "table#agents")
    listed = {r.get_attribute("data-agent") for r in browser.all("table#agents tr.agent-row")}
    assert listed == {a["name"] for a in agents(console)} >= {AGENT}
    assert paused_on_page(browser) == "false"

    # pause: a reason, a confirmation that changes nothing, then the change
    browser.one(f"{row(browser)} form.pause-form textarea[name=reason]").send_keys(PAUSE_REASON)
    browser.click_through(f"{row(browser)} button.pause-button", "form#agent-confirm-form")
    assert browser.text("#agent-after td:nth-of-type(1)") == "paused"
    assert not any(a["paused"] for a in agents(console)), "the confirmation page paused it"
    browser.click_through("#agent-confirm-button", "#message")
    assert "paused by" in browser.text("#message")
    assert paused_on_page(browser) == "true"
    assert PAUSE_REASON in browser.text(f"{row(browser)} .state")
    first_audit = browser.one("table#agent-audit tr.audit-row")
    assert (first_audit.get_attribute("data-agent"), first_audit.get_attribute("data-action")) == (
        AGENT,
        "pause",
    )
    assert PAUSE_REASON in squash(first_audit.text)

    # every instance has read it within a period; then orders come for the agent
    time.sleep(PERIOD.total_seconds() + 1)
    began = time.monotonic()
    for order_id in order_ids:
        console.stack.submit({"orderId": order_id, "amount": 1})
    while time.monotonic() - began < WAIT_SECONDS:
        for order_id in order_ids:
            if not console.stack.context.store.load(order_id):
                continue
            order = console.load(order_id)
            assert not order.status.terminal, f"{order_id} ended {order.status} while paused"
            step = order.steps[0]
            assert (step.process_state, step.attempt, step.failure_count) == (
                StepState.PENDING,
                0,
                0,
            ), f"{order_id} was claimed or counted while paused: {step.history}"
        time.sleep(1)
    for order_id in order_ids:
        order = console.load(order_id)
        step = order.steps[0]
        assert order.status is OrderStatus.PENDING and step.paused_for == AGENT
        looked_again = step.complete_by - step.paused_since  # type: ignore[operator]
        assert looked_again > HOLD_MIN, f"{order_id} was not looked at again while paused"
    assert keys_called(console, order_ids) == [], "the remote was called while paused"
    assert effects_of(console, order_ids) == [], "the ledger shows an effect while paused"
    assert alerts_for(console, order_ids) == [], "an alert was raised for a paused order"

    # each order's page (and the API) says what it waits for
    browser.open(console.page(f"/orders/{order_ids[0]}"), "#order-status")
    assert browser.one("#order-status").get_attribute("data-status") == "pending"
    note = browser.one("#agent-paused")
    assert note.get_attribute("data-agent") == AGENT and PAUSE_REASON in squash(note.text)
    assert "waiting for agent orders to be resumed" in browser.text("#status-why").lower()
    shown = console.api_order(order_ids[0])
    assert shown["paused"]["agent"] == AGENT and shown["paused"]["reason"] == PAUSE_REASON
    assert DOCS.exists()
    save(browser, DOCS / "console-paused-order.png", os.environ.get("UPDATE_SCREENSHOTS") == "1")

    # resume the same way; the orders go on, each applied once
    browser.open(console.page("/agents"), "table#agents")
    save(browser, DOCS / "console-agents.png", os.environ.get("UPDATE_SCREENSHOTS") == "1")
    browser.one(f"{row(browser)} form.pause-form textarea[name=reason]").send_keys(RESUME_REASON)
    browser.click_through(f"{row(browser)} button.resume-button", "form#agent-confirm-form")
    browser.click_through("#agent-confirm-button", "#message")
    assert "resumed by" in browser.text("#message")
    assert paused_on_page(browser) == "false"
    actions = [
        (r.get_attribute("data-agent"), r.get_attribute("data-action"))
        for r in browser.all("table#agent-audit tr.audit-row")[:2]
    ]
    assert actions == [(AGENT, "resume"), (AGENT, "pause")]
    assert RESUME_REASON in browser.text("table#agent-audit tr.audit-row .reason")

    def completed(_: object) -> bool:
        return all(console.load(o).status is OrderStatus.COMPLETED for o in order_ids)

    browser.until(completed, RELEASE_SECONDS, "the paused orders to complete after the resume")
    assert sorted(effects_of(console, order_ids)) == sorted(f"{o}:process" for o in order_ids)
    assert len(keys_called(console, order_ids)) == len(order_ids)
    assert alerts_for(console, order_ids) == []
    for order_id in order_ids:
        step = console.load(order_id).steps[0]
        assert step.failure_count == 0 and step.paused_for == ""
    browser.open(console.page("/agents"), "table#agent-audit")
    assert paused_on_page(browser) == "false"
