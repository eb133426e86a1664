"""What this deployment runs: its agents (one per remote service) and its workflows.

This package is yours: add an agent and a workflow here (docs/add-a-workflow.md walks
through it), without touching ``core/``, ``scheduler/``, ``supervisor/`` or ``stores/``.
It is read and checked when the app starts; an error names the file and line of the
declaration at fault. ``GET /api/workflows`` and ``python -m admin workflows`` show what
is deployed. ``infra/agents.json`` (for Bicep: one Service Bus queue, settings and role
assignments per agent) is generated from it: ``python -m admin agents-json``.

The product's own workflows, ``order``, ``fulfilment``, ``checkout``, ``order-lines`` and
``per-customer``, stand for four remote services, so they declare four agents
(docs/contracts.md §3.8). With no
``AGENT_<NAME>_URL`` setting, each calls ``REMOTE_SERVICE_URL``. Their compensations name
the ids their steps handed out, and ``checkout`` shows the rest of what a workflow can
say (§3.13): stock and payment at once, a person's approval for big orders, a cooling-off
window in which the customer may still cancel, and a carrier that confirms later
(``declarations/shop.py``); ``order-lines`` reserves each line of an order on its own, two
at a time, each released with its own reservation if the order is undone (§3.16);
``per-customer`` runs one order of a customer at a time, the next waiting its turn (§3.16).
"""

from __future__ import annotations

from core.workflows import (
    Agent,
    Compensation,
    Concurrency,
    Delay,
    Event,
    ForEach,
    Parallel,
    StepSpec,
    Workflow,
)
from declarations.shop import (
    customer,
    needs_approval,
    order_lines,
    refund_payment,
    release_line,
    release_stock,
    reserve_line,
    ship_and_call_back,
    ship_lines,
)

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
                "reserve-stock",
                agent="inventory",
                compensation=Compensation("release-stock", input=release_stock),
            ),
            StepSpec(
                "charge-payment",
                agent="payments",
                compensation=Compensation("refund-payment", input=refund_payment),
            ),
            StepSpec("ship", agent="carrier"),
        ),
    ),
    Workflow(
        "checkout",
        (
            Parallel(
                StepSpec(
                    "reserve-stock",
                    agent="inventory",
                    compensation=Compensation("release-stock", input=release_stock),
                ),
                StepSpec(
                    "charge-payment",
                    agent="payments",
                    compensation=Compensation("refund-payment", input=refund_payment),
                ),
            ),
            Event("approved", timeout_seconds=86_400, when=needs_approval),
            Delay("cooling-off", seconds=3),  # short, so that the demo shows it
            StepSpec("ship", agent="carrier", input=ship_and_call_back, completes_on="parcel-left"),
        ),
    ),
    Workflow(
        "order-lines",
        (
            StepSpec(
                "charge-payment",
                agent="payments",
                compensation=Compensation("refund-payment", input=refund_payment),
            ),
            ForEach(
                "reserve-line",
                items=order_lines,
                step=StepSpec(
                    "reserve-line",
                    agent="inventory",
                    input=reserve_line,
                    compensation=Compensation("release-line", input=release_line),
                ),
                max_concurrency=2,
            ),
            StepSpec("ship", agent="carrier", input=ship_lines),
        ),
    ),
    Workflow(
        "per-customer",
        (StepSpec("process", agent="orders"),),
        concurrency=Concurrency(key=customer, limit=1),
    ),
]
