"""A ForEach in the console (docs/contracts.md §3.16), in a real browser against the running
app (``console`` in conftest.py): the `lines` order (``Orders.lines``: a ForEach `pick`
over its three lines, each picked by a Python agent, settled before the first test) shows
its items as one group with their counts, each item collapsed; an operator opens one and
sees what any step shows: the body it sent, the result it received, its attempts. Read by
the contract's ids and classes (docs/console-dom.md) and checked against the JSON API.
"""

from __future__ import annotations

import json

import pytest

from tests.browser.harness import Browser, Console

pytestmark = pytest.mark.timeout(120)

GROUP = 'ul#steps li.step-row.for-each[data-for-each="pick"]'


def item(index: int) -> str:
    return f'{GROUP} li.step.item[data-index="{index}"]'


def test_the_items_are_one_group_with_counts_and_an_operator_opens_one(
    console: Console, browser: Browser
) -> None:
    order_id = console.orders.lines
    steps = {s["step"]: s for s in console.api_order(order_id)["steps"]}
    head = steps["pick"]
    assert (head["type"], head["items"], head["maxConcurrency"]) == ("items", 3, 2)
    assert head["counts"]["done"] == 3 and head["counts"]["waiting"] == 0
    assert (steps["pick[1]"]["forEach"], steps["pick[1]"]["index"]) == ("pick", 1)

    browser.open(console.page(f"/orders/{order_id}"), GROUP)
    assert browser.one("#order-status").get_attribute("data-status") == "completed"
    counts = {
        c.get_attribute("data-count"): c.find_element("css selector", "b").text
        for c in browser.all(f"{GROUP} .item-count")
    }
    assert counts == {"done": "3", "running": "0", "waiting": "0", "failed": "0"}
    items = browser.all(f"{GROUP} li.step.item")
    assert [i.get_attribute("data-step") for i in items] == ["pick[0]", "pick[1]", "pick[2]"]
    # collapsed: each item's line says its state; what it sent is not shown yet
    assert not browser.one(f"{item(1)} .step-io").is_displayed()
    assert "Processed" in browser.one(f"{item(1)} summary").text

    browser.one(f"{item(1)} summary").click()
    sent = browser.one(f"{item(1)} .step-sent[data-source=input] pre.json-preview")
    browser.until(lambda _: sent.is_displayed(), 5, "the opened item to show its body")
    assert json.loads(sent.text) == {"sku": "B", "qty": 2, "line": 1}
    received = json.loads(browser.text(f"{item(1)} .step-received pre.json-preview"))
    assert received == {"picked": "B", "key": f"{order_id}:pick:1"}
    [attempt] = browser.all(f"{item(1)} tr.item-attempt")
    assert attempt.find_element("css selector", ".outcome").text == "succeeded"
    # the others stay closed
    assert not browser.one(f"{item(0)} .step-io").is_displayed()
