"""Agents paused at runtime on real Azurite and a real simulator, the pipeline driven
in-process (``pump`` plays the host; a fake clock moves time): an order for a paused
agent waits, Pending, through an hour of sweeps and supervision with no attempt, no
alert and no call; a request already queued when the pause lands is deferred back
through the reply queue without a call; after the resume both complete, each applied
once. The controls' writes survive a lost answer and a 5xx after applying (their
``WriteId``), and the CLI drives the same use cases.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from admin.__main__ import main
from bootstrap import AppContext, bootstrap
from bootstrap.clients import retry_options
from core.control_cache import PERIOD, SETTLE
from core.errors import ConcurrencyConflict
from core.states import OrderStatus, StepState
from scheduler.service import Handled
from simulator import SimulatorServer, effects_by_order
from stores.tables import TableStateStore
from tests.integration.test_pipeline import pump, submit
from tests.integration.test_storage_faults import FaultyAdapter, faulty_transport, is_batch
from tests.support import (
    FakeClock,
    drain,
    drain_json,
    drain_requests,
    make_context,
    settings_from,
    status_queue,
)


def later(ctx: AppContext, clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    ctx.supervisor.run()
    ctx.scheduler.sweep()
    pump(ctx)


def calls_for(simulator: SimulatorServer, order_id: str) -> list[dict[str, Any]]:
    return [c for c in simulator.calls() if c["idempotencyKey"].startswith(f"{order_id}:")]


def test_orders_wait_for_a_paused_agent_and_complete_after_the_resume(
    ctx: AppContext, clock: FakeClock, simulator: SimulatorServer, tag: str
) -> None:
    queued, held = f"{tag}-queued", f"{tag}-held"
    assert submit(ctx, {"orderId": queued}) is Handled.ACCEPTED  # its request waits unread
    ctx.agents_admin.pause("orders", "alice", "the orders service is being migrated")
    assert submit(ctx, {"orderId": held, "replyTo": status_queue(ctx, tag)}) is Handled.ACCEPTED

    order = ctx.store.load(held)
    assert order is not None and order.status is OrderStatus.PENDING
    step = order.steps[0]
    assert (step.process_state, step.attempt, step.paused_for) == (StepState.PENDING, 0, "orders")

    clock.advance(PERIOD.total_seconds())  # the agent's own view has the pause now
    pump(ctx)  # the queued request: deferred back as paused, through agent-replies
    step = ctx.store.load(queued).steps[0]  # type: ignore[union-attr]
    assert (step.process_state, step.failure_count, step.paused_for) == (
        StepState.PENDING,
        0,
        "orders",
    )
    assert step.attempts.get(1).ending == "deferred"  # type: ignore[union-attr]

    for _ in range(60):  # an hour of sweeps and supervision
        later(ctx, clock, 60)
    for order_id, status in ((queued, OrderStatus.PROCESSING), (held, OrderStatus.PENDING)):
        order = ctx.store.load(order_id)
        assert order is not None and order.status is status, order_id
        step = order.steps[0]
        assert step.process_state is StepState.PENDING and step.failure_count == 0
        assert calls_for(simulator, order_id) == []
    assert drain_requests(ctx) == [] and drain(ctx, ctx.names.operator_alerts) == []
    shown = ctx.admin.show(held)
    assert shown["paused"]["agent"] == "orders" and shown["paused"]["by"] == "alice"

    ctx.agents_admin.resume("orders", "bob", "migration done")
    later(ctx, clock, SETTLE.total_seconds())
    for order_id in (queued, held):
        order = ctx.store.load(order_id)
        assert order is not None and order.status is OrderStatus.COMPLETED, order_id
        assert effects_by_order(simulator.effects())[order_id] == ["process"]
        assert len(calls_for(simulator, order_id)) == 1
    assert [m["status"] for m in drain_json(ctx, f"st-{tag}")] == [
        "received",
        "processing",
        "completed",
    ]
    audit = ctx.agents_admin.audit(agent="orders")["entries"]
    assert [(e["action"], e["by"]) for e in audit] == [("resume", "bob"), ("pause", "alice")]


@pytest.fixture
def adapter() -> FaultyAdapter:
    return FaultyAdapter()


@pytest.fixture
def faulty(storage_connection: str, tag: str, adapter: FaultyAdapter) -> AppContext:
    context = make_context(storage_connection, tag, clock=FakeClock())
    tables = TableServiceClient.from_connection_string(
        storage_connection, transport=faulty_transport(adapter), **retry_options("table")
    )
    context.__dict__["store"] = TableStateStore(tables.get_table_client(context.names.state_table))
    return context


@pytest.mark.parametrize("fault", ["lose", "applied-503"])
def test_a_control_change_whose_answer_was_lost_is_adopted_not_refused(
    faulty: AppContext, adapter: FaultyAdapter, fault: str
) -> None:
    adapter.add(is_batch, fault)
    view = faulty.agents_admin.pause("carrier", "alice", "their outage")
    assert view["paused"] is True and adapter.injected
    assert faulty.agents_admin.show("carrier")["paused"] is True
    assert len(faulty.agents_admin.audit()["entries"]) == 1  # applied once
    # and the next change is made on what is stored (its ETag was adopted)
    assert faulty.agents_admin.resume("carrier", "alice")["paused"] is False


def test_a_real_conflict_is_still_a_conflict(faulty: AppContext) -> None:
    store = faulty.store
    admin = faulty.agents_admin
    admin.pause("carrier", "alice", "first")
    before = store.read_controls()["carrier"]
    admin.resume("carrier", "bob", "second")
    from core import controls
    from core.controls import declared_limits
    from core.workflows import AGENTS

    stale, entry = controls.resume(
        before, declared_limits(AGENTS["carrier"]), "carol", "", faulty.clock()
    )
    with pytest.raises(ConcurrencyConflict):
        store.write_control(stale, entry)


# --- the CLI ----------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], connection: str, *args: str) -> tuple[int, Any]:
    code = main(["--connection", connection, *args])
    return code, json.loads(capsys.readouterr().out)


def test_the_cli_lists_pauses_limits_resumes_and_audits(
    storage_connection: str, capsys: pytest.CaptureFixture[str], tag: str
) -> None:
    """On the default table (the CLI's): ``inventory`` only, left running as declared."""
    context = bootstrap(
        settings_from({"AzureWebJobsStorage": storage_connection, "AGENT_TRANSPORT": "storage"})
    )
    context.provision()
    connection = storage_connection
    code, listed = run(capsys, connection, "agents")
    assert code == 0 and {a["name"] for a in listed["agents"]} >= {"orders", "inventory"}
    code, paused = run(
        capsys, connection, "agents", "pause", "inventory", "--reason", f"cli {tag}", "--as", "dora"
    )
    assert code == 0 and paused["paused"] and paused["pause"]["by"] == "dora"
    code, again = run(capsys, connection, "agents", "pause", "inventory", "--reason", "x")
    assert code == 1 and again["reason"] == "already-paused"
    code, limited = run(
        capsys, connection, "agents", "limits", "inventory", "--concurrency", "3", "--rate", "1.5"
    )
    assert code == 0 and limited["limits"] == {"concurrency": 3, "rate": 1.5}
    code, bad = run(capsys, connection, "agents", "limits", "inventory", "--concurrency", "0")
    assert code == 2 and "from 1 to 1000" in bad["error"]
    code, unknown = run(capsys, connection, "agents", "resume", "nobody")
    assert code == 4 and "no agent 'nobody'" in unknown["error"]
    code, reset = run(capsys, connection, "agents", "limits", "inventory", "--reset")
    assert code == 0 and reset["overrides"] == {}
    code, resumed = run(capsys, connection, "agents", "resume", "inventory")
    assert code == 0 and resumed["paused"] is False
    code, audit = run(capsys, connection, "agents", "audit", "--agent", "inventory")
    assert code == 0
    mine = audit["entries"][:4]
    assert [e["action"] for e in mine] == ["resume", "limits", "limits", "pause"]
    assert mine[3]["reason"] == f"cli {tag}" and mine[3]["by"] == "dora"
    assert mine[0]["by"] and mine[0]["by"] != "dora"  # the OS user
