"""docs/contracts.md §3.16: steps over the order's items (``ForEach``).

One record per item, ``<name>[<i>]``, keyed ``<orderId>:<name>:<i>``; at most
``max_concurrency`` in flight; the results as a list in item order; each applied item
undone with its own result; an item in doubt that cannot be undone blocks the unwinding
as any step does (3.15); ``items`` that raises, gives no list or too many fails the step
for good, not applied, told. The workflows are ``tests/fixtures/items.py``: the pure
model on a fake clock where a test counts what is in flight, the test kit elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from core.item_names import MAX_ITEMS
from core.model import Order
from core.plans import Plan
from core.states import OrderStatus, StepState
from core.steps import StepRecord
from core.workflows import (
    WORKFLOWS,
    Compensation,
    DeclarationError,
    Event,
    ForEach,
    Parallel,
    StepSpec,
    Workflow,
)
from messaging.wire import decode_reply
from testkit import answer, crash, refuse, run_workflow
from testkit.checks import given as kit_name
from testkit.checks import steps_of
from tests.support import declarations
from tests.unit.test_one_decision import POLICY, SECOND, T0, report

KIT = "tests.fixtures.items"
LINES = [{"sku": "A", "qty": 1}, {"sku": "B", "qty": 2}, {"sku": "C", "qty": 0}]
LINES += [{"sku": "D", "qty": 4}, {"sku": "E", "qty": 5}]


@pytest.fixture(autouse=True)
def items() -> Iterator[None]:
    with declarations(KIT):
        yield


def reserved(body: dict[str, Any]) -> dict[str, Any]:
    return {"reservation": f"r-{body['sku']}"}


def run(workflow: str = "lines", lines: Any = LINES, **remotes: Any) -> Any:
    given = {
        "charge": answer({"charge": "ch-1"}),
        "refund": answer(),
        "reserve": answer(reserved),
        "unreserve": answer(),
        "confirm": answer(),
        "mail": answer(),
    }
    given.update(remotes)
    has = steps_of(WORKFLOWS[workflow])
    return run_workflow(
        workflow,
        {"lines": lines},
        {k: v for k, v in given.items() if kit_name(k) in has},
        declarations=KIT,
    )


# --- going forward -----------------------------------------------------------------------


def test_each_item_is_a_step_of_its_own_with_its_own_key_and_the_results_come_in_order() -> None:
    done = run()
    assert done.status == "completed"
    assert done.keys("reserve[1]") == ["order-1:reserve:1"]
    assert done.received["reserve[3]"] == [{"sku": "D", "qty": 4, "line": 3}]
    assert done.steps["reserve[2]"].state == "skipped"  # its when: qty 0
    assert "reserve[2]" not in done.received
    listed: list[dict[str, str] | None] = [{"reservation": f"r-{s}"} for s in "ABDE"]
    listed.insert(2, None)
    assert done.results["reserve"] == listed
    assert done.received["confirm"] == [{"reserved": listed}]


def test_an_empty_list_succeeds_at_once_with_an_empty_result() -> None:
    done = run(lines=[])
    assert done.status == "completed"
    assert done.results["reserve"] == []
    assert done.received["confirm"] == [{"reserved": []}]
    assert not [c for c in done.calls if c.step.startswith("reserve")]


def test_no_more_items_are_in_flight_than_max_concurrency() -> None:
    """The pure model: two of five lines are started; each one that ends starts the next."""
    order = accepted_past_the_charge()
    assert running(order) == ["reserve[0]", "reserve[1]"]
    assert order.find("reserve[2]") is None
    now = T0 + 10 * SECOND
    finish(order, "reserve[0]", now)
    # the next line is C (qty 0): skipped at once, so D starts beside B
    assert running(order) == ["reserve[1]", "reserve[3]"]
    assert at(order, "reserve[2]").process_state is StepState.SKIPPED
    for name in ("reserve[1]", "reserve[3]", "reserve[4]"):
        now += 2 * SECOND
        finish(order, name, now)
        assert len(running(order)) <= 2
    assert order.find("confirm") is not None


# --- failing -------------------------------------------------------------------------------


def test_an_item_failing_for_good_undoes_every_applied_item_with_its_own_result() -> None:
    done = run("lines", LINES, **{"reserve[1]": refuse("out of stock")})
    assert done.status == "compensated"
    # A applied, and D (started when A ended, before B's refusal came); B refused; E,
    # not started when B failed, never ran
    assert done.received["unreserve[0]"] == [{"reservation": "r-A", "sku": "A", "line": 0}]
    assert done.received["unreserve[3]"] == [{"reservation": "r-D", "sku": "D", "line": 3}]
    assert "unreserve[1]" not in done.received
    assert "reserve[4]" not in done.received
    # latest first, one at a time
    undos = [c.step for c in done.calls if c.step.startswith("unreserve") or c.step == "refund"]
    assert undos == ["unreserve[3]", "unreserve[0]", "refund"]
    assert done.received["refund"]
    assert done.keys("unreserve[0]") == ["order-1:unreserve:0"]


def test_an_item_that_may_have_applied_and_cannot_be_undone_blocks_the_refund() -> None:
    given = {"mail[1]": crash(), "mail[2]": refuse("no such address")}
    done = run("mails", lines=LINES[:3], **given)
    assert done.status == "error"
    assert "refund" not in done.received  # nothing undone around the doubt
    (alert,) = done.alerts
    assert alert["step"] == "mail"
    assert "mail[1]" in alert["reason"] and "order-1:mail:1" in alert["reason"]


def test_an_operator_who_states_the_item_did_not_happen_lets_the_cancel_undo_the_rest() -> None:
    given = {"mail[1]": crash(), "mail[2]": refuse("no such address")}
    done = run("mails", LINES[:3], **given)
    assert done.status == "error"
    done.cancel(reason="the mail service never sent it", not_applied=["mail[1]"])
    assert done.received["refund"]  # undone now: nothing in doubt is left around it
    # mail[0] was sent and cannot be undone: its effect stands, told (not "cancelled")
    assert done.status == "error"
    assert "mail[0] applied and cannot be undone" in done.alerts[-1]["reason"]


def test_items_that_raise_fail_the_step_for_good_told_and_the_order_is_undone() -> None:
    done = run("lines-broken")
    assert done.status == "compensated"
    assert done.steps["reserve"].state == "error"
    (alert,) = done.alerts
    assert "items of reserve raised KeyError" in alert["reason"]
    assert done.received["refund"]


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ({"sku": "A"}, "items of reserve returned dict, not a list"),
        ([{"sku": str(n), "qty": 1} for n in range(101)], "returned 101 items"),
    ],
    ids=["not-a-list", "too-many"],
)
def test_items_that_give_no_list_or_too_many_fail_the_step_not_applied(
    lines: Any, said: str
) -> None:
    done = run(lines=lines)
    assert done.status == "compensated"
    assert said in done.alerts[0]["reason"]
    assert not [c for c in done.calls if c.step.startswith("reserve")]


def test_a_held_item_holds_the_order_and_a_resubmit_runs_it_and_the_rest() -> None:
    done = run("lines-held", **{"reserve[1]": [refuse("out of stock"), answer(reserved)]})
    assert done.status == "error"
    assert "refund" not in done.received and "unreserve[0]" not in done.received
    again = done.resubmit()  # the kit's remote for reserve[1] refuses once, then answers
    assert again.status == "completed"
    assert [again.steps[f"reserve[{i}]"].state for i in range(5)] == [
        "processed",
        "processed",
        "skipped",
        "processed",
        "processed",
    ]


def test_items_declared_continue_go_on_past_a_failure_and_the_list_says_none() -> None:
    done = run("lines-go-on", **{"reserve[1]": refuse("out of stock")})
    assert done.status == "completed"
    assert done.results["reserve"][1] is None
    assert done.steps["reserve[1]"].continued


def test_a_cancel_stops_the_items_not_started_and_undoes_those_that_applied() -> None:
    order = accepted_past_the_charge()
    now = T0 + 10 * SECOND
    order.claim("i-1", now, step="reserve[0]")  # in flight; reserve[1] not yet claimed
    order.cancel(now, "ops", "customer changed their mind")
    assert at(order, "reserve[1]").process_state is StepState.COMPENSATED  # stopped
    assert order.find("reserve[2]") is None  # never started
    assert order.status is OrderStatus.PROCESSING  # reserve[0] finishes its attempt first
    reply = report(order, "reserve[0]", result={"reservation": "r-A"})
    order.apply_reply(reply, now + SECOND, POLICY)
    undo = order.find("unreserve[0]")
    assert undo is not None and undo.is_active
    assert order.status.value == "compensating"
    assert order.find("unreserve[1]") is None  # reserve[1] never ran: nothing to undo


def test_an_item_run_again_keeps_its_key() -> None:
    done = run("lines-held", **{"reserve[1]": [refuse("out of stock"), answer(reserved)]})
    done.resubmit()
    assert done.keys("reserve[1]") == ["order-1:reserve:1", "order-1:reserve:1"]


def test_figures_count_items_under_the_for_each_s_name_not_one_per_item() -> None:
    from stores.activity import ATTEMPT, activities

    order = accepted_past_the_charge()
    finish(order, "reserve[0]", T0 + 10 * SECOND)
    steps = {a.step for _, a in activities(order, set()) if a.kind == ATTEMPT}
    assert steps == {"charge", "reserve"}


def test_a_hundred_items_at_the_widest_cap_fit_each_save_in_one_table_transaction() -> None:
    """The in-memory store refuses a transaction of more than 100 operations, as Azure
    does: claiming 25 items at once (and the next 25), with every search row an order can
    have, and halting them, each fit (33 at once would not)."""
    many = [{"sku": f"s{n}", "qty": 1} for n in range(MAX_ITEMS)]
    order = {"lines": many, **{f"field-{n}": f"v{n}" for n in range(8)}}
    remotes = {
        "charge": answer(),
        "refund": answer(),
        "reserve": answer(reserved),
        "reserve[60]": refuse("out of stock"),
        "unreserve": answer(),
    }
    halted = run_workflow("wide", order, remotes, declarations=KIT)
    assert halted.status == "compensated"
    assert len(halted.received["reserve[59]"]) == 1
    assert "reserve[99]" not in halted.received
    assert len([s for s in halted.steps if s.startswith("unreserve[")]) >= 60


# --- declaring -------------------------------------------------------------------------------


def fe(**kw: Any) -> ForEach:
    given: dict[str, Any] = {"items": lambda ctx: [], "step": StepSpec("line")}
    given.update(kw)
    return ForEach("lines", **given)


@pytest.mark.parametrize(
    ("element", "said"),
    [
        (fe(max_concurrency=0), "max_concurrency=0; it is a whole number 1-25"),
        (fe(max_concurrency=26), "max_concurrency=26"),
        (fe(items="lines"), "items must be a function of one argument"),
        (fe(step=Event("e", timeout_seconds=5)), "step must be a StepSpec"),
        (
            fe(step=StepSpec("line", completes_on="shipped")),
            "an item of a ForEach ends with its call",
        ),
        (ForEach("x" * 45, items=lambda c: [], step=StepSpec("line")), "at most 44 characters"),
    ],
)
def test_a_bad_for_each_is_refused_where_it_is_declared(element: Any, said: str) -> None:
    with pytest.raises(DeclarationError, match=r"test_for_each\.py") as info:
        Workflow("w", (element,))
    assert said in str(info.value)


def test_a_for_each_is_not_declared_inside_a_parallel() -> None:
    with pytest.raises(DeclarationError, match="a Parallel holds StepSpec, Event or Delay"):
        Workflow("w", (Parallel(fe(), StepSpec("b")),))  # type: ignore[arg-type]


def test_its_name_is_one_name_of_the_workflow() -> None:
    with pytest.raises(DeclarationError, match="repeats a step name: lines"):
        Workflow("w", (StepSpec("lines"), fe()))
    with pytest.raises(DeclarationError, match="repeats a step name: undo"):
        Workflow(
            "w",
            (
                StepSpec("a", compensation=Compensation("undo")),
                fe(step=StepSpec("line", compensation=Compensation("undo"))),
            ),
        )


def test_a_for_each_is_not_searched_by_its_result() -> None:
    with pytest.raises(DeclarationError, match="a ForEach's result is the list"):
        Workflow("w", (fe(),), search=("lines.sku",))


def test_the_plan_pins_it_and_reads_back_the_same() -> None:
    from core.workflows import WORKFLOWS

    plan = Plan.of(WORKFLOWS["lines"], 30)
    raw = plan.to_json()
    head = raw["steps"][1]
    assert head == {
        "name": "reserve",
        "path": "reserve",
        "timeout": 0,
        "kind": "items",
        "group": 1,
        "uses": ["items"],
        "maxConcurrency": 2,
    }
    assert raw["steps"][2]["name"] == "reserve[]"
    assert raw["steps"][2]["compensation"]["name"] == "unreserve[]"
    assert Plan.from_json(json.loads(json.dumps(raw))) == plan
    assert plan.planned("reserve[7]").path == "reserve-line"
    assert plan.agent_of("unreserve[7]") == "warehouse"


def test_describe_shows_it_for_the_api_and_the_cli() -> None:
    from core.workflows import WORKFLOWS

    shown = WORKFLOWS["lines"].describe()["steps"][1]
    assert shown["forEach"] == "reserve"
    assert shown["maxConcurrency"] == 2
    assert shown["items"].endswith("lines")
    assert shown["step"]["step"] == "reserve-line"
    assert shown["step"]["compensation"]["step"] == "unreserve"


def test_an_item_travels_on_the_wire_under_its_own_name() -> None:
    order = accepted_past_the_charge()
    order.claim("i-1", T0 + 3 * SECOND, step="reserve[1]")
    reply = report(order, "reserve[1]", result={"reservation": "r-B"})
    assert decode_reply(json.dumps(reply.to_json())).step == "reserve[1]"


# --- helpers -------------------------------------------------------------------------------


def accepted_past_the_charge() -> Order:
    from tests.unit.test_one_decision import new, succeed

    order = new("lines", lines=LINES)
    succeed(order, "charge", T0)
    return order


def at(order: Order, name: str) -> StepRecord:
    found = order.find(name)
    assert found is not None, f"no record of {name}"
    return found


def running(order: Order) -> list[str]:
    return [r.step for r in order.active_steps() if r.step.startswith("reserve[")]


def finish(order: Order, name: str, now: Any) -> None:
    if at(order, name).process_state is StepState.PENDING:
        order.claim("i-1", now, step=name)
    order.apply_reply(report(order, name, result={"reservation": name}), now + SECOND, POLICY)
    assert order.status in (OrderStatus.PROCESSING, OrderStatus.COMPLETED)
