"""Declarations for ``bench.workflows`` (``ORDERS_DECLARATIONS=bench.flows``): one workflow
per figure it measures (docs/contracts.md §3.13), so the benchmark never depends on what
a deployment declares in ``declarations/``.

- ``par-2`` ... ``par-5``: a ``Parallel`` of 2 to 5 remote steps, each through its own
  agent (``p1`` ... ``p5``: the services a group books at once are different services);
  the orders ask the simulator for 1 s of latency per call (``simulate``).
- ``ev``: wait for the event ``go``, then one remote step.
- ``dl``: a ``Delay`` of ``DELAY_SECONDS`` after the order is accepted, then one remote
  step; ``dl-until``: the same with ``until=`` the order's ``wakeAt`` (a time of day an
  order names, with a fraction of a second).
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

from core.workflows import Agent, Context, Delay, Event, Parallel, StepSpec, Workflow

#: Agents of the parallel steps, one per step of the largest group.
PARALLEL_AGENTS: Final = tuple(f"p{n}" for n in range(1, 6))
DELAY_SECONDS: Final = 5
#: An event is waited for at most this long (far beyond any run).
EVENT_TIMEOUT_SECONDS: Final = 3600


def parallel_steps(width: int) -> tuple[str, ...]:
    """The step names of ``par-<width>``."""
    return tuple(f"s{n}" for n in range(1, width + 1))


def wake_at(ctx: Context) -> datetime:
    return datetime.fromisoformat(str(ctx.order["wakeAt"]))


AGENTS = [Agent("orders"), *(Agent(name) for name in PARALLEL_AGENTS)]

WORKFLOWS = [
    Workflow("order", (StepSpec("process", agent="orders"),)),
    *(
        Workflow(
            f"par-{width}",
            (
                Parallel(
                    *(
                        StepSpec(name, agent=agent)
                        for name, agent in zip(parallel_steps(width), PARALLEL_AGENTS, strict=False)
                    )
                ),
            ),
        )
        for width in range(2, 6)
    ),
    Workflow(
        "ev",
        (Event("go", timeout_seconds=EVENT_TIMEOUT_SECONDS), StepSpec("after", agent="orders")),
    ),
    Workflow("dl", (Delay("pause", seconds=DELAY_SECONDS), StepSpec("after", agent="orders"))),
    Workflow("dl-until", (Delay("pause", until=wake_at), StepSpec("after", agent="orders"))),
]
