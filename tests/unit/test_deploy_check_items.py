"""The deploy guard and a ``ForEach`` (docs/contracts.md §3.16): the differences between a
pinned plan and the declarations about to deploy name a ForEach's ``max_concurrency``, its
items' step (agent, path, compensation), its removal and its arrival; what an order in
flight still needs (``core.needs``) counts the items not started yet (their step's agent
and functions) and a ForEach whose list is not decided (its ``items``); a function an
item or an item's compensation will call is found under its ForEach's step. Pure: orders
of the model, on the declarations of this module (a workflow whose ``input`` raises for
one line) beside ``tests/fixtures/items.py``'s.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest

from admin.deploycheck import DeployCheck, Target
from admin.plans import describe_step, differences
from core.model import Order
from core.needs import still_needed
from core.states import OrderStatus
from core.workflows import (
    Compensation,
    Context,
    ForEach,
    Plan,
    StepSpec,
    Workflow,
    validate,
)
from tests.fixtures import items as kit
from tests.support import declarations
from tests.unit.test_for_each import LINES, accepted_past_the_charge, finish
from tests.unit.test_one_decision import SECOND, T0, new, succeed


def fragile(ctx: Context) -> dict[str, Any]:
    """The second line's body cannot be built (a declaration's bug)."""
    if ctx.index == 1:
        raise ValueError("no such sku")
    return {"sku": ctx.item["sku"]}


AGENTS = kit.AGENTS
WORKFLOWS = [
    *kit.WORKFLOWS,
    Workflow(
        "lines-fragile",
        (
            ForEach(
                "reserve",
                items=kit.lines,
                step=StepSpec(
                    "reserve-line",
                    agent="warehouse",
                    input=fragile,
                    on_failure="hold",
                    compensation=Compensation("unreserve", input=kit.unreserve_body),
                ),
                max_concurrency=2,
            ),
        ),
    ),
    Workflow(
        "lines-broken-held",
        (
            kit.charge(),
            ForEach(
                "reserve",
                items=kit.broken,
                step=StepSpec("reserve-line", agent="warehouse", on_failure="hold"),
            ),
        ),
    ),
]


@pytest.fixture(autouse=True)
def own() -> Iterator[None]:
    with declarations(__name__):
        yield


def declared(name: str, **changes: Any) -> Workflow:
    """Workflow ``name`` of the kit with its ForEach ``reserve`` changed: ``max_concurrency``,
    ``step`` (keyword arguments of its StepSpec), or removed (``removed=True``)."""
    flow = next(w for w in kit.WORKFLOWS if w.name == name)
    steps: list[Any] = []
    for element in flow.steps:
        if not (isinstance(element, ForEach) and element.name == "reserve"):
            steps.append(element)
            continue
        if changes.get("removed"):
            continue
        step = element.step
        spec = {
            "agent": step.agent,
            "path": step.path,
            "input": step.input,
            "when": step.when,
            "compensation": step.compensation,
            "on_failure": step.on_failure,
            **changes.get("step", {}),
        }
        steps.append(
            ForEach(
                "reserve",
                items=element.items,
                step=StepSpec(step.name, **spec),
                max_concurrency=changes.get("max_concurrency", element.max_concurrency),
            )
        )
    return Workflow(name, tuple(steps))


def target(*flows: Workflow) -> Target:
    """The kit's agents and ``order`` workflow (every deployment declares one), and
    ``flows``."""
    order = next(w for w in kit.WORKFLOWS if w.name == "order")
    module = types.SimpleNamespace(AGENTS=list(kit.AGENTS), WORKFLOWS=[order, *flows])
    checked = validate(module)
    return Target("next", checked["AGENTS"], checked["WORKFLOWS"])


def refusals(order: Order, *flows: Workflow) -> list[dict[str, Any]]:
    check = DeployCheck(target(*flows))
    check.in_flight(order)
    return list(check.report()["refusals"])


def removed_functions(order: Order, *flows: Workflow) -> set[tuple[str, str]]:
    return {
        (r["step"], r["function"])
        for r in refusals(order, *flows)
        if r["problem"] == "function-removed"
    }


PLAN = Plan.of(next(w for w in kit.WORKFLOWS if w.name == "lines"), 30)


# --- differences --------------------------------------------------------------------------


def test_a_for_each_as_declared_differs_in_nothing() -> None:
    assert differences(PLAN, declared("lines")) == []


def test_max_concurrency_changed_is_a_difference() -> None:
    assert differences(PLAN, declared("lines", max_concurrency=5)) == [
        "ForEach reserve: max_concurrency 2 -> 5"
    ]


def test_its_items_step_moved_or_undone_otherwise_is_a_difference() -> None:
    moved = declared("lines", step={"agent": "mail", "path": "hold-line"})
    assert differences(PLAN, moved) == [
        "ForEach reserve, each item's step: agent warehouse -> mail",
        "ForEach reserve, each item's step: path reserve-line -> hold-line",
        # the compensation declares no agent of its own: it moved with its step
        "ForEach reserve, each item's step: undone by unreserve@warehouse -> unreserve@mail",
    ]
    assert differences(PLAN, declared("lines", step={"compensation": None})) == [
        "ForEach reserve, each item's step: undone by unreserve@warehouse -> nothing"
    ]
    other = Compensation("release", agent="mail", path="release-line")
    assert differences(PLAN, declared("lines", step={"compensation": other})) == [
        "ForEach reserve, each item's step: undone by unreserve@warehouse -> "
        "release@mail /release-line"
    ]


def test_a_for_each_removed_or_new_is_one_difference() -> None:
    assert differences(PLAN, declared("lines", removed=True)) == [
        "ForEach reserve is no longer declared"
    ]
    before = Plan.of(declared("lines", removed=True), 30)
    assert differences(before, declared("lines")) == ["ForEach reserve is new"]


def test_the_plan_lines_say_what_a_for_each_does() -> None:
    head, step = PLAN.steps[1], PLAN.steps[2]
    assert describe_step(head) == (
        "reserve: for each of its items, at most 2 at once, each running reserve[]"
    )
    assert describe_step(step) == (
        "reserve[]@warehouse /reserve-line, undone by unreserve[]@warehouse"
    )


# --- what an order in flight still needs --------------------------------------------------


def test_an_order_before_its_for_each_needs_its_items_function() -> None:
    order = new("lines", lines=LINES)  # at charge: the list is not decided
    needs = {n.step: n.functions for n in still_needed(order)}
    assert needs["reserve"] == ("items",)
    assert set(needs["reserve[]"]) == {"input", "when"}
    assert removed_functions(order, declared("lines", removed=True)) >= {
        ("reserve", "items"),
        ("reserve[]", "input"),
        ("reserve[]", "when"),
    }
    # declared as it was: nothing refused
    assert refusals(order, declared("lines")) == []


def test_items_not_started_yet_need_their_steps_functions_and_agent() -> None:
    order = accepted_past_the_charge()  # two of five lines started
    needs = {(n.step, str(n.why)): n for n in still_needed(order)}
    later = needs[("reserve[]", "later")]
    assert (later.agent, set(later.functions)) == ("warehouse", {"input", "when"})
    assert removed_functions(order, declared("lines", step={"input": None})) == {
        ("reserve[]", "input")
    }
    agents = {r["agent"] for r in refusals(order, declared("lines")) if "agent" in r}
    assert agents == set()


def test_once_every_item_started_their_functions_are_needed_no_more() -> None:
    order = accepted_past_the_charge()
    now = T0 + 10 * SECOND
    for name in ("reserve[0]", "reserve[1]", "reserve[3]"):
        now += 2 * SECOND
        finish(order, name, now)
    assert order.find("reserve[4]") is not None  # the last line is in flight
    assert not [n for n in still_needed(order) if n.step == "reserve[]" and n.why == "later"]
    # removing the ForEach now strands nothing: the items run from the plan
    removed = declared("lines", removed=True)
    assert not [r for r in refusals(order, removed) if r["step"].startswith("reserve")]
    assert "ForEach reserve is no longer declared" in differences(order.plan, removed)


def test_a_cancel_stops_the_items_not_started_so_they_need_nothing() -> None:
    order = accepted_past_the_charge()
    order.claim("i-1", T0 + 10 * SECOND, step="reserve[0]")
    order.cancel(T0 + 10 * SECOND, "ops", "changed their mind")
    assert not [n for n in still_needed(order) if n.step == "reserve[]" and n.why == "later"]


def test_a_function_of_an_item_is_found_under_its_for_each_step() -> None:
    """The second line's input raised: the order holds at reserve[1], whose input a
    resubmit calls again; deployed as it is, that is no refusal (the item is looked up as
    its ForEach's step), and without the input it is."""
    order = new("lines-fragile", lines=LINES[:2])
    assert order.status is OrderStatus.ERROR, order.status
    held = next(n for n in still_needed(order) if n.step == "reserve[1]")
    assert held.functions == ("input",)
    fragile_flow = next(w for w in WORKFLOWS if w.name == "lines-fragile")
    assert refusals(order, fragile_flow) == []
    without = Workflow(
        "lines-fragile",
        (
            ForEach(
                "reserve",
                items=kit.lines,
                step=StepSpec("reserve-line", agent="warehouse", on_failure="hold"),
            ),
        ),
    )
    assert ("reserve[1]", "input") in removed_functions(order, without)


def test_the_undo_of_the_items_needs_its_input_and_agent() -> None:
    order = accepted_past_the_charge()
    finish(order, "reserve[0]", T0 + 10 * SECOND)
    undo = next(n for n in still_needed(order) if n.step == "unreserve[]")
    assert (undo.agent, undo.undoes, undo.functions) == ("warehouse", "reserve[]", ("input",))
    bare = Compensation("unreserve")  # no input: the undo could not be built
    assert ("unreserve[]", "input") in removed_functions(
        order, declared("lines", step={"compensation": bare})
    )


def test_an_order_held_at_a_for_each_whose_items_raised_still_needs_its_items_agent() -> None:
    """Its items raised (a declaration's bug) and its step holds: a resubmit decides the
    list again and runs every item, on the items' agent."""
    order = new("lines-broken-held", lines=LINES)
    succeed(order, "charge", T0)
    assert order.status is OrderStatus.ERROR
    needs = {n.step: n for n in still_needed(order)}
    assert needs["reserve"].functions == ("items",)
    assert needs["reserve[]"].agent == "warehouse"
    without_warehouse = validate(
        types.SimpleNamespace(
            AGENTS=[a for a in kit.AGENTS if a.name != "warehouse"],
            WORKFLOWS=[next(w for w in kit.WORKFLOWS if w.name == "order")],
        )
    )
    check = DeployCheck(Target("next", without_warehouse["AGENTS"], without_warehouse["WORKFLOWS"]))
    check.in_flight(order)
    [refused] = [r for r in check.report()["refusals"] if r.get("agent") == "warehouse"]
    assert refused["steps"] == [
        {"workflow": "lines-broken-held", "step": "reserve[]", "why": "later", "orders": 1}
    ]
