"""What this deployment runs: its agents (one per remote service) and its workflows.

This package is yours: add an agent and a workflow here (docs/add-a-workflow.md walks
through it), without touching ``core/``, ``scheduler/``, ``supervisor/`` or ``stores/``.
It is read and checked when the app starts; an error names the file and line of the
declaration at fault. ``GET /api/workflows`` and ``python -m admin workflows`` show what
is deployed. ``infra/agents.json`` (for Bicep: one Service Bus queue, settings and role
assignments per agent) is generated from it: ``python -m admin agents-json``.

The product's own ``order`` and ``fulfilment`` workflows stand for four remote services,
so they declare four agents (docs/contracts.md §3.8). With no ``AGENT_<NAME>_URL``
setting, each calls ``REMOTE_SERVICE_URL``.
"""

from __future__ import annotations

from core.workflows import Agent, Compensation, StepSpec, Workflow

AGENTS = [
    Agent("orders"),
    Agent("inventory"),
    Agent("payments"),
    Agent("carrier"),
]

WORKFLOWS = [
    Workflow("order", (StepSpec("process", agent="orders"),)),
    Workflow(
        "fulfilment",
        (
            StepSpec(
                "reserve-stock", agent="inventory", compensation=Compensation("release-stock")
            ),
            StepSpec(
                "charge-payment", agent="payments", compensation=Compensation("refund-payment")
            ),
            StepSpec("ship", agent="carrier"),
        ),
    ),
]
