"""How the detail page lays out an order's steps: as its pinned plan declares them, one
line per element of the workflow, the steps of a ``Parallel`` side by side (they run at
once), each step not reached yet in its place, then the compensations in the order they
ran. Pure: computed from the order and its view (``admin.service.order_view``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.model import Order
from core.states import StepKind


@dataclass(frozen=True)
class StepRow:
    """One line of the page's steps: an element of the workflow (the steps of a
    ``Parallel`` side by side, each record of a step in its place, the steps not reached
    yet as such), or one compensation."""

    group: int | None
    parallel: bool
    compensation: bool
    steps: list[dict[str, Any]]


def step_rows(order: Order, steps: list[dict[str, Any]]) -> list[StepRow]:
    """``steps``: the order view's step views (``admin.service.step_view``), one per record.
    The rows follow the order's pinned plan; a step not reached yet is
    ``{"step", "type", "agent", "completesOn", "notStarted": True}``."""
    by_group: dict[int | None, list[dict[str, Any]]] = {}
    undo: list[dict[str, Any]] = []
    for view in steps:
        if view.get("kind") == str(StepKind.COMPENSATION):
            undo.append(view)
        else:
            by_group.setdefault(view.get("group"), []).append(view)
    reached = {view["step"] for view in steps}
    rows: list[StepRow] = []
    for group in order.plan.groups():
        members = order.plan.group(group)
        place = {p.name: n for n, p in enumerate(members)}
        entries = by_group.pop(group, [])
        entries += [
            {
                "step": p.name,
                "type": p.kind,
                "agent": p.agent or None,
                "completesOn": p.completes_on,
                "onFailure": p.on_failure if p.kind == "task" else None,
                "notStarted": True,
            }
            for p in members
            if p.name not in reached
        ]
        # declaration order; the records of one step keep theirs (a stable sort)
        entries.sort(key=lambda v: place.get(v["step"], len(place)))
        rows.append(StepRow(group, len(members) > 1, False, entries))
    for views in by_group.values():  # pragma: no cover - a record its plan does not place
        rows.extend(StepRow(None, False, False, [v]) for v in views)
    rows.extend(StepRow(None, False, True, [v]) for v in undo)
    return rows
