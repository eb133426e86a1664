"""What operators see of a ``ForEach`` (docs/contracts.md §3.16): the order view
(``GET /api/orders/{id}``) shows each item as a step of its own with ``forEach`` and
``index``, and the head with how many items and where they stand; the console draws the
items as one group with those counts, each item collapsed and openable. On the pure model
(``tests/unit/test_for_each.py``'s helpers) and through the console's own HTTP function on
the in-memory store, with ``tests/fixtures/items.py`` as the declarations.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from admin.item_views import COUNTS
from admin.service import order_view, step_view
from bootstrap import reset_app_context
from console import layout, views
from core.model import Order
from core.outcome import Outcome
from core.states import OrderStatus
from tests.support import declarations, on_devhost
from tests.unit.test_agent_pause import App, build
from tests.unit.test_console_workflows import get, submit, text
from tests.unit.test_for_each import LINES, accepted_past_the_charge, finish
from tests.unit.test_one_decision import POLICY, SECOND, T0, new, report
from tests.unit.test_services_in_memory import reply_to

KIT = "tests.fixtures.items"


@pytest.fixture(autouse=True)
def items() -> Iterator[None]:
    with declarations(KIT):
        yield


def steps_of(order: Order) -> dict[str, dict[str, Any]]:
    return {s["step"]: s for s in order_view(order)["steps"]}


def counts(**given: int) -> dict[str, int]:
    return {name: given.get(name, 0) for name in COUNTS}


# --- the order view -----------------------------------------------------------------------


def test_each_item_is_a_step_that_names_its_for_each_and_index() -> None:
    order = accepted_past_the_charge()
    finish(order, "reserve[0]", T0 + 10 * SECOND)  # C skipped, D started beside B
    order.claim("i-1", T0 + 12 * SECOND, step="reserve[3]")
    shown = steps_of(order)

    item = shown["reserve[3]"]
    assert (item["forEach"], item["index"]) == ("reserve", 3)
    # a step like any other: every field a step has, its own agent, body and attempts
    assert set(step_view(order.steps[0], "payments", order)) <= set(item)
    assert (item["type"], item["agent"], item["ProcessState"]) == (
        "task",
        "warehouse",
        "Processing",
    )
    assert item["input"] == {"sku": "D", "qty": 4, "line": 3}
    assert [a["attempt"] for a in item["attempts"]] == [1]
    assert shown["reserve[0]"]["result"] == {"reservation": "reserve[0]"}
    assert (shown["charge"]["forEach"], shown["charge"]["index"]) == (None, None)


def test_the_head_says_how_many_items_and_where_they_stand() -> None:
    order = accepted_past_the_charge()
    head = steps_of(order)["reserve"]
    assert (head["type"], head["kind"]) == ("items", "action")  # kind: the record's, as ever
    assert (head["forEach"], head["index"]) == ("reserve", None)
    assert (head["items"], head["maxConcurrency"]) == (5, 2)
    assert head["counts"] == counts(running=2, waiting=3)

    finish(order, "reserve[0]", T0 + 10 * SECOND)
    head = steps_of(order)["reserve"]
    assert head["counts"] == counts(done=1, running=2, skipped=1, waiting=1)
    assert sum(head["counts"].values()) == head["items"]


def test_items_stopped_and_undone_by_a_cancel_are_counted_as_such() -> None:
    order = accepted_past_the_charge()
    now = T0 + 10 * SECOND
    order.claim("i-1", now, step="reserve[0]")
    order.cancel(now, "ops", "customer changed their mind")  # reserve[1] stopped
    order.apply_reply(report(order, "reserve[0]", result={"reservation": "r-A"}), now, POLICY)
    assert order.status is OrderStatus.COMPENSATING  # reserve[0] applied: being undone

    shown = steps_of(order)
    assert shown["reserve"]["counts"] == counts(undone=1, stopped=1, waiting=3)
    undo = shown["unreserve[0]"]
    assert (undo["forEach"], undo["index"], undo["compensates"]) == ("reserve", 0, "reserve[0]")


def test_items_that_fail_are_counted_failed() -> None:
    order = new("lines-go-on", lines=LINES[:2])
    now = T0 + SECOND
    order.claim("i-1", now, step="reserve[0]")
    refused = report(order, "reserve[0]", Outcome.REFUSED, error="out of stock")
    order.apply_reply(refused, now, POLICY)
    assert steps_of(order)["reserve"]["counts"] == counts(failed=1, running=1)


def test_not_started_names_the_for_each_never_the_step_of_its_items() -> None:
    order = new("lines", lines=LINES)
    assert order_view(order)["notStarted"] == ["reserve", "confirm"]
    order = accepted_past_the_charge()
    assert order_view(order)["notStarted"] == ["confirm"]


def test_items_that_raise_leave_the_head_in_error_with_no_count_of_items() -> None:
    order = new("lines-broken")
    now = T0
    order.claim("i-1", now, step="charge")
    order.apply_reply(report(order, "charge"), now + SECOND, POLICY)
    head = steps_of(order)["reserve"]
    assert head["ProcessState"] == "Error" and head["items"] is None
    assert head["counts"] == counts()


# --- the console --------------------------------------------------------------------------


@pytest.fixture
def app() -> Iterator[App]:
    built = build()  # (the bootstrap puts the settings' declarations to use: then ours)
    reset_app_context(on_devhost(built.ctx))
    with declarations(KIT):
        yield built
    reset_app_context(None)


def answer(app: App, order_id: str, step: str, result: dict[str, Any]) -> None:
    request = [r for r in app.transport.requests if r.order_id == order_id and r.step == step]
    app.ctx.scheduler.apply_reply(reply_to(request[-1], result=result))


def group_of(page: str, name: str) -> str:
    found = re.search(
        rf'<li class="step-row for-each" data-group="\d+" data-for-each="{name}">(.*?)\n</li>',
        page,
        re.S,
    )
    assert found is not None, page[:3000]
    return found[1]


def item_box(group: str, step: str) -> str:
    found = re.search(
        rf'<li class="step[^"]*item" data-step="{re.escape(step)}".*?</details></li>', group, re.S
    )
    assert found is not None, group[:3000]
    return found[0]


def test_the_console_draws_the_items_as_one_group_with_counts_each_openable(app: App) -> None:
    submit(app, "l-1", "lines", lines=LINES)
    answer(app, "l-1", "charge", {"charge": "ch-1"})
    answer(app, "l-1", "reserve[0]", {"reservation": "r-A"})
    order = app.order("l-1")
    page = text(get("/orders/l-1", orderId="l-1"))

    group = group_of(page, "reserve")
    head = re.search(
        r'<div class="for-each-head" data-step="reserve"[^>]*>(.*?)</div>', group, re.S
    )
    assert head is not None
    assert "5 item(s), at most 2 at once: <b>reserve-line</b> on agent <b>warehouse</b>" in head[1]
    shown = dict(re.findall(r'data-count="(\w+)">[a-z ]+<b>(\d+)</b>', head[1]))
    assert shown == {"done": "1", "running": "2", "waiting": "1", "failed": "0", "skipped": "1"}
    # each item once, in item order, collapsed; the step of the items is no step of its own
    listed = re.findall(r'data-step="(reserve\[\d\])"[^>]*data-index="(\d)"', group)
    assert listed == [(f"reserve[{i}]", str(i)) for i in range(4)]
    assert group.count('<details class="item-open">') == 4 and "<details open" not in group
    assert 'data-step="reserve[]"' not in page
    # opened, an item shows what any step does: its body, its result, its attempts
    done = item_box(group, "reserve[0]")
    summary = re.search(r"<summary>(.*?)</summary>", done, re.S)
    assert summary is not None and "Processed" in summary[1]
    assert json.loads(html.unescape(summary[1].split('class="item-value">')[1].split("<")[0])) == {
        "sku": "A",
        "qty": 1,
    }
    assert 'data-source="input"' in done and "r-A" in done
    assert re.search(r'<tr class="item-attempt" data-attempt="1">.*succeeded', done)
    # why says where the items stand
    assert views.why(order).startswith(
        "ForEach reserve: 2 of 5 item(s) in flight (at most 2 at once), 1 done, 1 waiting. "
        "Steps reserve[1], reserve[3] run side by side; at step reserve[1]"
    )
    # and the timeline draws them over one band, named for the ForEach
    assert re.search(r'<rect class="group-band" data-group="1" data-for-each="reserve"', page)
    drawn = views.timeline(order, app.clock())
    assert {r.step for r in drawn.rows if r.for_each == "reserve"} == {
        "reserve",
        *(f"reserve[{i}]" for i in range(4)),
    }


def test_a_for_each_not_reached_is_one_line_not_started(app: App) -> None:
    submit(app, "l-2", "lines", lines=LINES)
    page = text(get("/orders/l-2", orderId="l-2"))
    group = group_of(page, "reserve")
    assert re.search(r'<div class="for-each-head not-started" data-step="reserve"', group)
    assert "its items, at most 2 at once" in group and "item-counts" not in group
    rows = layout.step_rows(app.order("l-2"), app.ctx.admin.show("l-2")["steps"])
    assert [(r.for_each or {}).get("step") for r in rows] == [None, "reserve", None]


def test_a_finished_order_says_its_items_never_started_and_failed_ones_in_red(app: App) -> None:
    submit(app, "l-3", "lines", lines=LINES)
    answer(app, "l-3", "charge", {"charge": "ch-1"})
    request = [r for r in app.transport.requests if r.step == "reserve[1]"][-1]
    app.ctx.scheduler.apply_reply(reply_to(request, Outcome.REFUSED, error="out of stock"))
    answer(app, "l-3", "reserve[0]", {"reservation": "r-A"})
    for step in ("unreserve[0]", "refund"):
        answer(app, "l-3", step, {})
    assert app.order("l-3").status is OrderStatus.COMPENSATED

    group = group_of(text(get("/orders/l-3", orderId="l-3")), "reserve")
    said = re.findall(r'data-count="(\w+)">([a-z ]+) <b>(\d+)</b>', group)
    found = {name: (label, n) for name, label, n in said}
    assert found["waiting"] == ("not started", "3")
    assert found["failed"][1] == "1" and found["undone"][1] == "1"
    failed = item_box(group, "reserve[1]")
    assert "out of stock" in failed and 'data-state="Error"' in failed


# --- GET /api/workflows and python -m admin workflows -------------------------------------


def test_the_api_and_the_cli_show_a_for_each_in_one_readable_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from admin import __main__ as cli
    from admin.triggers import workflows_view
    from config.settings import DECLARATIONS

    monkeypatch.setenv(DECLARATIONS, KIT)
    assert cli.main(["workflows"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(workflows_view()))
    by_name = {w["workflow"]: w for w in printed["workflows"]}
    shown = by_name["lines"]["steps"][1]
    assert (shown["forEach"], shown["kind"], shown["maxConcurrency"]) == ("reserve", "items", 2)
    assert shown["summary"] == (
        "reserve: for each of items(lines), at most 2 at once: reserve-line@warehouse, "
        "undone by unreserve"
    )
    held = by_name["lines-held"]["steps"][1]["summary"]
    assert held.endswith("undone by unreserve, on failure: hold")
    assert by_name["mails"]["steps"][1]["summary"] == (
        "mail: for each of items(lines), at most 3 at once: mail-line@mail"
    )


def test_items_that_raise_are_told_on_the_for_each_head(app: App) -> None:
    submit(app, "l-4", "lines-broken", lines=LINES)
    answer(app, "l-4", "charge", {"charge": "ch-1"})
    answer(app, "l-4", "refund", {})
    assert app.order("l-4").status is OrderStatus.COMPENSATED

    group = group_of(text(get("/orders/l-4", orderId="l-4")), "reserve")
    head = re.search(
        r'<div class="for-each-head" data-step="reserve"[^>]*>(.*?)</div>', group, re.S
    )
    assert head is not None and 'data-state="Error"' in head[0]
    assert "its items, at most 10 at once" in head[1] and "item-counts" in head[1]
    assert re.search(r'class="last-error">[a-z ]+: items of reserve raised KeyError', head[1])
    assert "row-steps items" not in group  # no item ever ran
