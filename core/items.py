"""What the decision reads of a ``ForEach`` (docs/contracts.md §3.16): its head (the record
whose ``items`` decided the list) and its items, each a record like any other, named
``<name>[<i>]``; ``core.course`` starts them, at most ``max_concurrency`` at once.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from core.item_names import item_name, item_of
from core.plans import PlannedStep
from core.states import StepKind, StepState
from core.steps import StepRecord

if TYPE_CHECKING:
    from core.model import Order


def heads(order: Order) -> list[PlannedStep]:
    """The ``ForEach`` heads of the order's current group."""
    current = order.current_group()
    if current is None:
        return []
    return [p for p in order.plan.group(current) if p.kind == "items"]


def unreached(order: Order) -> bool:
    """Some item of a ``ForEach`` of the current group has no record yet."""
    for planned in heads(order):
        listed = decided(order, planned.name)
        if listed is not None and len(items_of(order, planned.name)) < len(listed):
            return True
    return False


def compensation_of(step: str, compensation: str) -> str:
    """The record name of the compensation undoing ``step``: an item's (``<name>[<i>]``)
    is ``<undo>[<i>]`` (its plan names it ``<undo>[]``)."""
    found = item_of(step)
    return item_name(compensation[:-2], found[1]) if found is not None else compensation


#: The states of an item that succeeded (and may be being undone since).
_SUCCEEDED = frozenset({StepState.PROCESSED, StepState.COMPENSATING, StepState.COMPENSATED})


def records_of(order: Order, planned: PlannedStep) -> list[StepRecord]:
    """The latest record of ``planned``: one, none (not reached), or, for the step of a
    ``ForEach`` (``<name>[]``), one per item reached, in item order."""
    if not planned.name.endswith("[]"):
        record = order.find(planned.name)
        return [record] if record is not None else []
    return items_of(order, planned.name[:-2])


def items_of(order: Order, name: str) -> list[StepRecord]:
    """The latest record of each item of the ``ForEach`` ``name`` reached, in item order."""
    latest: dict[int, StepRecord] = {}
    for record in order.steps:
        found = item_of(record.step) if record.kind is StepKind.ACTION else None
        if found is None or found[0] != name:
            continue
        held = latest.get(found[1])
        if held is None or record.seq > held.seq:
            latest[found[1]] = record
    return [latest[i] for i in sorted(latest)]


def decided(order: Order, name: str) -> list[Any] | None:
    """The items the ``ForEach`` ``name`` decided (None: not yet)."""
    head = order.find(name)
    if head is None or "items" not in head.decided or head.result is None:
        return None
    listed = head.result.get("items")
    return list(listed) if isinstance(listed, list) else None


def items_result(order: Order, name: str) -> list[Any] | None:
    """``ctx.results[name]`` of the ``ForEach`` ``name``: once every item has ended, their
    results in item order (None for an item skipped or gone past)."""
    listed = decided(order, name)
    records = items_of(order, name)
    if listed is None or len(records) < len(listed) or any(r.is_active for r in records):
        return None
    return [copy.deepcopy(r.result) if r.process_state in _SUCCEEDED else None for r in records]


def item_for(order: Order, record: StepRecord) -> tuple[Any, int | None]:
    """The item and index ``record`` runs for: an item's, or its compensation's; else
    ``(None, None)``."""
    found = item_of(record.compensates or record.step)
    if found is None:
        return None, None
    listed = decided(order, found[0]) or []
    index = found[1]
    return (copy.deepcopy(listed[index]) if index < len(listed) else None), index
