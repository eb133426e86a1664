"""Declarations for ``bench.turns`` (``ORDERS_DECLARATIONS=bench.turns_flows``): the same
one-step order twice, ``keyed`` (per-key concurrency, docs/contracts.md §3.16: one order
per ``customer`` at a time) and ``plain`` (no limit machinery: the baseline the client
runs one after another itself). The step is one call to the remote (path ``work``) with
the order as its body, so that the order's ``simulate`` sets how long it takes.
"""

from __future__ import annotations

from typing import Any, Final

from core.workflows import Agent, Concurrency, Context, StepSpec, Workflow

#: The benchmark's limit per customer (the issue's figure: 1).
LIMIT: Final = 1


def customer(ctx: Context) -> Any:
    return ctx.order["customer"]


AGENTS = [Agent("orders")]

WORKFLOWS = [
    Workflow("order", (StepSpec("process", agent="orders"),)),  # the default: required
    Workflow("plain", (StepSpec("work", agent="orders"),)),
    Workflow(
        "keyed",
        (StepSpec("work", agent="orders"),),
        concurrency=Concurrency(key=customer, limit=LIMIT),
    ),
]
