"""Declarations: what the product declares (docs/contracts.md §3.8), how a bad declaration
is refused (naming its file and line), and GET /api/workflows."""

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
    EntraToken,
    Plan,
    StepSpec,
    Workflow,
    validate,
)

HERE = Path(__file__).name


def handler(order: dict[str, object], **call: object) -> dict[str, object]:
    return {}


def test_the_product_declares_four_agents_one_per_remote_service() -> None:
    assert sorted(AGENTS) == ["carrier", "inventory", "orders", "payments"]
    agent_of = {
        step: spec.agent
        for workflow in WORKFLOWS.values()
        for s in workflow.steps
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
