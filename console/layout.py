"""How the detail page lays out an order's steps: as its pinned plan declares them, one
line per element of the workflow, the steps of a ``Parallel`` side by side (they run at
once), a ``ForEach`` as one group (its head, with the counts of its items, over its items
in item order), each step not reached yet in its place, then the compensations in the
order they ran. Pure: computed from the order and its view (``admin.service.order_view``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from core.model import Order
from core.plans import PlannedStep
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
    #: a ForEach's line: its head's step view (not reached yet: ``{"step", "type",
    #: "agent", "maxConcurrency", "notStarted": True}``); ``steps`` are then its items'
    for_each: dict[str, Any] | None = None


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
        heads = [p for p in members if p.kind == "items"]
        if heads:
            rows.append(_for_each(heads[0], members, by_group.pop(group, []), reached))
            continue
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


def _for_each(
    head: PlannedStep,
    members: tuple[PlannedStep, ...],
    views: list[dict[str, Any]],
    reached: set[str],
) -> StepRow:
    """A ForEach's line: its head's view over its items' records, in item order (the
    records of one item in the order they were made)."""
    step = next(p for p in members if p.name == head.template)
    shown = next((v for v in views if v["step"] == head.name), None)
    if shown is None or head.name not in reached:
        shown = {
            "step": head.name,
            "type": head.kind,
            "agent": step.agent or None,
            "maxConcurrency": head.max_concurrency,
            "items": None,
            "onFailure": step.on_failure,
            "notStarted": True,
        }
    shown = {**shown, "itemStep": step.path, "itemAgent": step.agent or None}
    result = shown.get("result")
    values = result.get("items") if isinstance(result, dict) else None
    listed = [
        {
            **v,
            "itemValue": _short(values[v["index"]]) if values and v["index"] < len(values) else "",
        }
        for v in views
        if v.get("index") is not None
    ]
    listed.sort(key=lambda v: int(v["index"]))  # stable: an item's records keep their order
    return StepRow(head.group, False, False, listed, for_each=shown)


#: How much of an item's value its collapsed line shows.
ITEM_PREVIEW = 80


def _short(value: Any) -> str:
    """An item's value as one line of compact JSON, cut to ``ITEM_PREVIEW`` characters."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= ITEM_PREVIEW else text[: ITEM_PREVIEW - 1] + "…"
