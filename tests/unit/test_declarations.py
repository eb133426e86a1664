"""Declarations: what the suite's shop declares (tests/fixtures/shop.py, as declarations/
first ships it; docs/contracts.md §3.8), how a bad declaration is refused (naming its file
and line), and GET /api/workflows."""

from __future__ import annotations

import json
import types
from pathlib import Path

import azure.functions as func
import pytest

from admin import triggers
from core.workflows import (
    AGENTS,
    WORKFLOWS,
    Agent,
    ApiKey,
    Compensation,
    DeclarationError,
    Delay,
    EntraToken,
    Event,
    Parallel,
    Plan,
    StepSpec,
    Workflow,
    validate,
)
from tests.support import declarations, settings_only

HERE = Path(__file__).name


def handler(order: dict[str, object], **call: object) -> dict[str, object]:
    return {}


def test_the_shop_declares_four_agents_one_per_remote_service() -> None:
    assert sorted(AGENTS) == ["carrier", "inventory", "orders", "payments"]
    agent_of = {
        step: spec.agent
        for workflow in WORKFLOWS.values()
        for s in workflow.tasks()
        for step, spec in [(s.name, s)]
    }
    assert agent_of == {
        "process": "orders",
        "reserve-stock": "inventory",
        "charge-payment": "payments",
        "ship": "carrier",
    }
    plan = Plan.of(WORKFLOWS["fulfilment"], 30)
    assert plan.agent_of("release-stock") == "inventory"  # a compensation: its step's agent
    assert plan.agent_of("refund-payment") == "payments"
    assert Plan.from_json(plan.to_json()) == plan


def test_a_plan_from_before_agents_gets_its_agents_when_read() -> None:
    """The upgrade: a plan stored before agents names none; read, each step gets the agent
    the declarations give it now (its requests then go to that agent's own queue)."""
    old = {"workflow": "order", "steps": [{"name": "process", "path": "process", "timeout": 30}]}
    assert Plan.from_json(old).agent_of("process") == "orders"
    fulfilment = {
        "workflow": "fulfilment",
        "steps": [
            {
                "name": "charge-payment",
                "path": "charge-payment",
                "timeout": 30,
                "compensation": {"name": "refund-payment", "path": "refund-payment"},
            }
        ],
    }
    plan = Plan.from_json(fulfilment)
    assert (plan.agent_of("charge-payment"), plan.agent_of("refund-payment")) == (
        "payments",
        "payments",
    )
    gone = {"workflow": "order", "steps": [{"name": "teleport", "path": "x", "timeout": 30}]}
    with pytest.raises(ValueError, match="teleport"):
        Plan.from_json(gone)


def module(**attributes: object) -> types.ModuleType:
    m = types.ModuleType("declared")
    m.__dict__.update(attributes)
    return m


def test_an_error_names_the_file_and_line_of_the_declaration() -> None:
    with pytest.raises(DeclarationError) as error:
        Workflow("bad", (StepSpec("Not_Kebab"),))
    assert f"{HERE}:" in str(error.value) and "kebab-case" in str(error.value)
    line = test_an_error_names_the_file_and_line_of_the_declaration.__code__.co_firstlineno + 2
    assert f"{HERE}:{line}" in str(error.value)


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: Agent("Bad Name"), "a name is"),
        (lambda: Agent("x" * 30), "a name is"),
        (lambda: Agent("py", kind="python"), "needs handler"),
        (lambda: Agent("web", handler=print), "has no handler"),
        (lambda: Agent("web", concurrency=0), "concurrency"),
        (lambda: Agent("py", kind="python", handler=handler, auth=ApiKey()), "own code"),
        (lambda: Agent("py", kind="python", handler=lambda order: {}), "handler must take"),
        (lambda: Agent("web", auth=EntraToken(" ")), "needs a scope"),
        (lambda: Workflow("w", ()), "has no steps"),
        (lambda: Workflow("w", (StepSpec("a"), StepSpec("a"))), "repeats a step name"),
        (lambda: Workflow("w", (StepSpec("a", timeout_seconds=9999),)), "timeout"),
        (lambda: Workflow("w", (StepSpec("a", path="Bad Path"),)), "path"),
    ],
)
def test_bad_declarations_are_refused_with_a_reason(build: object, fragment: str) -> None:
    with pytest.raises(DeclarationError, match=fragment) as error:
        build()  # type: ignore[operator]
    assert f"{HERE}:" in str(error.value)


def test_the_set_is_checked_together() -> None:
    order = Workflow("order", (StepSpec("process", agent="orders"),))
    with pytest.raises(DeclarationError, match="names agent 'nobody', which is not declared"):
        validate(
            module(
                AGENTS=[Agent("orders")],
                WORKFLOWS=[order, Workflow("w", (StepSpec("a", agent="nobody"),))],
            )
        )
    with pytest.raises(DeclarationError, match="names agent 'gone', which is not declared"):
        validate(
            module(
                AGENTS=[Agent("orders")],
                WORKFLOWS=[
                    order,
                    Workflow(
                        "w",
                        (
                            StepSpec(
                                "a", agent="orders", compensation=Compensation("b", agent="gone")
                            ),
                        ),
                    ),
                ],
            )
        )
    with pytest.raises(DeclarationError, match="declared twice"):
        validate(module(AGENTS=[Agent("orders"), Agent("orders")], WORKFLOWS=[order]))
    with pytest.raises(DeclarationError, match="default workflow 'order' is missing"):
        validate(module(AGENTS=[Agent("orders")], WORKFLOWS=[]))
    with pytest.raises(DeclarationError, match="not an Agent"):
        validate(module(AGENTS=["orders"], WORKFLOWS=[order]))
    declared = validate(module(AGENTS=[Agent("orders")], WORKFLOWS=[order]))
    assert list(declared["WORKFLOWS"]) == ["order"]


def test_get_workflows_lists_each_step_with_its_agent() -> None:
    with declarations(), settings_only():  # the tests' own (tests/fixtures/flows.py)
        response = triggers.list_workflows(func.HttpRequest("GET", "/api/workflows", body=b""))
    body = json.loads(response.get_body())
    fulfilment = next(w for w in body["workflows"] if w["workflow"] == "fulfilment")
    ship = next(s for s in fulfilment["steps"] if s["step"] == "ship")
    assert ship["agent"] == "carrier" and ship["path"] == "ship"
    reserve = fulfilment["steps"][0]
    assert reserve["compensation"] == {
        "step": "release-stock",
        "agent": "inventory",
        "path": "release-stock",
        "timeout": None,
    }
    agents = {a["agent"]: a for a in body["agents"]}
    assert agents["carrier"]["function"] == "run_agent_carrier"
    assert agents["carrier"]["baseUrlSetting"] == "AGENT_CARRIER_URL"


# --- what a workflow can say (docs/contracts.md §3.13) ---------------------------------------


def two_args(ctx: object, extra: object) -> object:
    return {}


def no_args() -> object:
    return {}


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: Workflow("w", (Parallel(StepSpec("a")),)), "needs at least two"),
        (lambda: Workflow("w", (Parallel(),)), "needs at least two"),
        (
            lambda: Workflow(
                "w",
                (Parallel(StepSpec("a"), Parallel(StepSpec("b"), StepSpec("c"))),),  # type: ignore[arg-type]
            ),
            "a Parallel inside a Parallel",
        ),
        (lambda: Workflow("w", (Event("approval"),)), "needs timeout_seconds"),
        (lambda: Workflow("w", (Event("approval", timeout_seconds=0),)), "1-31536000"),
        (lambda: Workflow("w", (Delay("d"),)), "seconds=... or until=..."),
        (lambda: Workflow("w", (Delay("d", seconds=5, until=lambda c: 1),)), "one of them"),
        (lambda: Workflow("w", (StepSpec("a", input={"x": 1}),)), "input must be a function"),  # type: ignore[arg-type]
        (lambda: Workflow("w", (StepSpec("a", when=two_args),)), "exactly one argument"),  # type: ignore[arg-type]
        (lambda: Workflow("w", (Delay("d", until=no_args),)), "exactly one argument"),  # type: ignore[arg-type]
        (lambda: Workflow("w", (StepSpec("a"), Event("a", timeout_seconds=5))), "repeats"),
        (
            lambda: Workflow("w", (StepSpec("a", completes_on="a"),)),
            "must name an event of its own",
        ),
        (
            lambda: Workflow(
                "w",
                (Event("done", timeout_seconds=5), StepSpec("a", completes_on="done")),
            ),
            "must name an event of its own",
        ),
        (lambda: Workflow("w", ("a",)), "a workflow's steps are StepSpec"),  # type: ignore[arg-type]
    ],
)
def test_a_workflow_that_cannot_work_is_refused_naming_its_line(
    build: object, fragment: str
) -> None:
    with pytest.raises(DeclarationError, match=fragment) as error:
        build()  # type: ignore[operator]
    assert f"{HERE}:" in str(error.value)


def test_completes_on_is_refused_on_a_python_agent() -> None:
    order = Workflow("order", (StepSpec("process", agent="orders"),))
    python = Agent("desk", kind="python", handler=handler)
    flow = Workflow("w", (StepSpec("a", agent="desk", completes_on="done"),))
    with pytest.raises(DeclarationError, match="completes_on on a python agent") as error:
        validate(module(AGENTS=[Agent("orders"), python], WORKFLOWS=[order, flow]))
    assert f"{HERE}:" in str(error.value)


def test_get_workflows_shows_groups_conditions_events_and_delays() -> None:
    flow = Workflow(
        "w",
        (
            Parallel(StepSpec("a", agent="orders", when=lambda c: True), Delay("d", seconds=9)),
            Event("ok", timeout_seconds=60),
            StepSpec("b", agent="orders", completes_on="b-done"),
        ),
    )
    described = flow.describe()
    assert described["events"] == ["ok", "b-done"]
    [group, event, callback] = described["steps"]
    assert [s["step"] for s in group["parallel"]] == ["a", "d"]
    assert group["parallel"][0]["when"].endswith("<lambda>")
    assert group["parallel"][1] == {"step": "d", "kind": "delay", "seconds": 9}
    assert event == {"step": "ok", "kind": "event", "event": "ok", "timeout": 60, "by": "person"}
    assert callback["completesOn"] == "b-done"
