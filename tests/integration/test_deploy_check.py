"""The deploy guard on Azurite: orders taken to various steps by the real scheduler, then
checked against declarations about to deploy (``admin.inflight.read`` over the table
store, and ``python -m admin deploy-check`` itself: its exit codes and JSON)."""

from __future__ import annotations

import json
import sys
import types
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from admin import inflight
from admin.__main__ import main
from admin.deploycheck import DeployCheck, Target
from bootstrap import AppContext, bootstrap
from core import workflows
from core.messages import AgentRequest
from core.names import Names
from core.states import OrderStatus
from core.workflows import Agent, Compensation, StepSpec, Workflow, validate
from messaging.wire import decode_request
from tests import SUITE_DECLARATIONS
from tests.integration.test_upgrade import stored_as_before_agents
from tests.support import declarations, drain_requests, make_context, settings_from

AGENTS = [Agent("orders"), Agent("inventory"), Agent("payments"), Agent("carrier")]
ORDER = Workflow("order", (StepSpec("process", agent="orders"),))
RESERVE = StepSpec("reserve-stock", agent="inventory", compensation=Compensation("release-stock"))
CHARGE = StepSpec("charge-payment", agent="payments", compensation=Compensation("refund-payment"))
SHIP = StepSpec("ship", agent="carrier")
EXPRESS = Workflow("express", (StepSpec("process", agent="orders"),))
#: The declarations about to deploy, by what they change.
CHANGES = {
    # ship and its agent gone: what orders at or before ship still need
    "without_carrier": (AGENTS[:3], [ORDER, Workflow("fulfilment", (RESERVE, CHARGE))]),
    # ship gone from the workflow, its agent kept: orders in flight still ship
    "without_ship": (AGENTS, [ORDER, Workflow("fulfilment", (RESERVE, CHARGE))]),
    # nothing in flight is touched: a workflow added
    "with_express": (AGENTS, [ORDER, Workflow("fulfilment", (RESERVE, CHARGE, SHIP)), EXPRESS]),
}


@pytest.fixture
def modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Each change as an importable declarations module (its name, by change); the
    registry is put back to the suite's declarations afterwards."""
    names = {}
    for change, (agents, flows) in CHANGES.items():
        module = types.ModuleType(f"declarations_{change}_{uuid.uuid4().hex[:6]}")
        module.AGENTS = agents  # type: ignore[attr-defined]
        module.WORKFLOWS = flows  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module.__name__, module)
        names[change] = module.__name__
    try:
        yield names
    finally:
        workflows.use(SUITE_DECLARATIONS)


def target(change: str) -> Target:
    agents, flows = CHANGES[change]
    declared = validate(types.SimpleNamespace(AGENTS=agents, WORKFLOWS=flows))
    return Target(change, declared["AGENTS"], declared["WORKFLOWS"])


def submit_to(ctx: AppContext, order_id: str, workflow: str, step: str) -> AgentRequest:
    """Submit an order and succeed its steps until ``step`` is in flight; its request."""
    ctx.scheduler.submit(json.dumps({"orderId": order_id, "workflow": workflow}).encode())
    for _ in range(5):
        requests = [decode_request(t) for t in drain_requests(ctx)]
        [request] = [r for r in requests if r.order_id == order_id]
        if request.step == step:
            return request
        ctx.scheduler.apply_reply(request.succeeded({}))  # the next step is claimed and sent
    raise AssertionError(f"{order_id} never reached {step}")


def seed(ctx: AppContext, prefix: str) -> dict[str, str]:
    """Orders in flight at various points, by the scheduler itself: their ids, by where.
    Under the tests' own declarations (tests/fixtures/flows.py), whose fulfilment is the one
    ``CHANGES`` changes: steps and agents, no functions."""
    with declarations():
        return _seed(ctx, prefix)


def _seed(ctx: AppContext, prefix: str) -> dict[str, str]:
    ids = {where: f"{prefix}-{where}" for where in ("ship", "charge", "single", "unwinding")}
    submit_to(ctx, ids["ship"], "fulfilment", "ship")
    submit_to(ctx, ids["charge"], "fulfilment", "charge-payment")
    submit_to(ctx, ids["single"], "order", "process")
    shipping = submit_to(ctx, ids["unwinding"], "fulfilment", "ship")
    ctx.scheduler.apply_reply(shipping.refused("HTTP 422 no such address"))  # undo the rest
    drain_requests(ctx)
    loaded = {where: ctx.store.load(i) for where, i in ids.items()}
    statuses = {where: o.status if o else None for where, o in loaded.items()}
    assert statuses == {
        "ship": OrderStatus.PROCESSING,
        "charge": OrderStatus.PROCESSING,
        "single": OrderStatus.PROCESSING,
        "unwinding": OrderStatus.COMPENSATING,  # refund-payment in flight
    }
    return ids


@pytest.fixture
def ctx(storage_connection: str, tag: str) -> AppContext:
    return make_context(storage_connection, tag)


def test_dropping_an_agent_in_use_is_refused_naming_the_orders(ctx: AppContext, tag: str) -> None:
    ids = seed(ctx, tag)
    check = inflight.read(ctx.store, DeployCheck(target("without_carrier"), sample=50))
    report = check.report()
    assert check.refused and report["verdict"] == "refused"
    assert report["read"]["inFlight"] == 4 and report["read"]["complete"]
    assert report["read"]["byStatus"] == {
        "pending": 0,
        "processing": 3,
        "compensating": 1,
        "error": 0,
    }
    [refusal] = report["refusals"]
    # the unwinding order's ship, refused, ran: a report that it may have applied after
    # all would have it asked again (docs/contracts.md §3.15), so it needs the carrier too
    assert (refusal["problem"], refusal["agent"], refusal["orders"]) == (
        "agent-removed",
        "carrier",
        3,
    )
    assert sorted((o["orderId"], o["steps"]) for o in refusal["sample"]) == sorted(
        [(ids["charge"], ["ship"]), (ids["ship"], ["ship"]), (ids["unwinding"], ["ship"])]
    )
    assert refusal["steps"] == [
        {"workflow": "fulfilment", "step": "ship", "why": "later", "orders": 1},
        {"workflow": "fulfilment", "step": "ship", "why": "retry", "orders": 1},
        {"workflow": "fulfilment", "step": "ship", "why": "running", "orders": 1},
    ]
    assert [p["workflow"] for p in refusal["plannedBy"]] == ["fulfilment"]
    plans = {p["workflow"]: p for p in report["plans"]}
    assert plans["fulfilment"]["orders"] == 3 and plans["order"]["orders"] == 1
    assert plans["fulfilment"]["byStatus"] == {"compensating": 1, "processing": 2}


def test_dropping_a_step_but_keeping_its_agent_passes_and_an_unrelated_change_too(
    ctx: AppContext, tag: str
) -> None:
    ids = seed(ctx, tag)
    check = inflight.read(ctx.store, DeployCheck(target("without_ship")))
    report = check.report()
    assert not check.refused and report["refusals"] == []
    notes = {n["note"]: n for n in report["notes"]}
    assert notes["plan-differs"]["differences"] == ["step ship (carrier) is no longer declared"]
    assert notes["agent-unused"]["ordersNeedingIt"] == 3  # ship, charge, unwinding
    unrelated = inflight.read(ctx.store, DeployCheck(target("with_express"))).report()
    assert unrelated["verdict"] == "safe" and unrelated["refusals"] == []
    assert unrelated["notes"] == []
    assert sorted(s for p in unrelated["plans"] for s in p["sample"]) == sorted(ids.values())


def test_a_plan_stored_before_agents_is_stranded_by_its_step_removed(
    ctx: AppContext, tag: str, modules: dict[str, str]
) -> None:
    """Such a plan finds its agents by step name in today's declarations: removing ship
    from every workflow (even keeping the carrier agent) leaves the order unreadable."""
    ids = seed(ctx, tag)
    stored_as_before_agents(ctx, ids["charge"])
    workflows.use(modules["without_ship"])  # what the app would read it with
    check = inflight.read(ctx.store, DeployCheck(target("without_ship")))
    [refusal] = check.report()["refusals"]
    assert (refusal["problem"], refusal["step"], refusal["sample"]) == (
        "step-removed",
        "ship",
        [ids["charge"]],
    )
    workflows.use(modules["with_express"])
    assert not inflight.read(ctx.store, DeployCheck(target("with_express"))).refused


# --- the command ---------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(list(args))
    return code, json.loads(capsys.readouterr().out)


def test_the_command_refuses_with_exit_1_and_passes_with_0(
    storage_connection: str, modules: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The default table, as the command reads it (other tests' orders may be there too)."""
    ids = seed(default_names(storage_connection), f"dc-{uuid.uuid4().hex[:8]}")
    base = ["--connection", storage_connection, "deploy-check", "--sample", "100"]

    code, refused = run(capsys, *base, "--declarations", modules["without_carrier"])
    assert code == 1 and refused["verdict"] == "refused"
    assert refused["declarations"] == modules["without_carrier"]
    [carrier] = [r for r in refused["refusals"] if r.get("agent") == "carrier"]
    named = {o["orderId"] for o in carrier["sample"]}
    assert {ids["ship"], ids["charge"], ids["unwinding"]} <= named
    assert ids["single"] not in named
    assert "SKIP_DEPLOY_CHECK=true" in str(refused["override"])

    code, passed = run(capsys, *base, "--declarations", modules["with_express"])
    assert code == 0 and passed["verdict"] == "safe" and passed["refusals"] == []
    assert "override" not in passed
    listed = {o for p in passed["plans"] for o in p["sample"]}
    assert set(ids.values()) <= listed

    code, bad = run(capsys, *base, "--declarations", "no_such_declarations_module")
    assert code == 2 and "no_such_declarations_module" in str(bad["error"])


def test_the_command_exits_3_when_storage_does_not_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    nowhere = (
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        "TableEndpoint=http://127.0.0.1:9/devstoreaccount1;"
        "QueueEndpoint=http://127.0.0.1:9/devstoreaccount1;"
    )
    code, out = run(capsys, "--connection", nowhere, "deploy-check")
    assert code == 3 and out["retryable"] is True


def default_names(storage_connection: str) -> AppContext:
    """The app on the default table and queue names (``make_context`` makes its own)."""
    settings = settings_from(
        {
            "AzureWebJobsStorage": storage_connection,
            "AGENT_TRANSPORT": "storage",
            "REMOTE_SERVICE_URL": "http://127.0.0.1:9",
        }
    )
    context = bootstrap(replace(settings, inline_replies=False), names=Names())
    context.provision()
    return context
