"""Declarations for ``bench.foreach`` (``ORDERS_DECLARATIONS=bench.foreach_flows``): one
workflow, ``each``, a ``ForEach`` over the order's ``lines`` (docs/contracts.md §3.16),
``MAX_CONCURRENCY`` at a time, each line one call to the remote (path ``each-line``,
keyed ``<orderId>:each:<i>``) with the line as its body, so that a line's ``simulate``
sets how long the simulated remote takes.
"""

from __future__ import annotations

from typing import Any, Final

from core.workflows import Agent, Context, ForEach, StepSpec, Workflow

#: The benchmark's bound on lines in flight (the issue's figure: 10).
MAX_CONCURRENCY: Final = 10


def lines(ctx: Context) -> Any:
    return ctx.order["lines"]


def line_body(ctx: Context) -> dict[str, Any]:
    return {**ctx.item, "line": ctx.index}


AGENTS = [Agent("orders")]

WORKFLOWS = [
    Workflow("order", (StepSpec("process", agent="orders"),)),  # the default: required
    Workflow(
        "each",
        (
            ForEach(
                "each",
                items=lines,
                step=StepSpec("each-line", agent="orders", input=line_body),
                max_concurrency=MAX_CONCURRENCY,
            ),
        ),
    ),
]
