"""What the order view (``GET /api/orders/{id}``, ``python -m admin show``) says of a
``ForEach`` (docs/contracts.md §3.16): each item's record is a step like any other, named
``<name>[<i>]``, that also says ``forEach`` and ``index``; the head record (the one whose
``items`` decided the list) says how many items there are and where they stand.
"""

from __future__ import annotations

from typing import Any, Final

from core import items
from core.item_names import item_of
from core.model import Order, StepRecord
from core.states import StepKind, StepState

#: What ``counts`` holds, in the order a page shows it: every item is in exactly one, so
#: they add up to ``items``. ``waiting``: not started yet (no record); ``running``: a
#: record that is Pending or Processing; ``failed``: Error (also one the order went on
#: past); ``undone``: it succeeded and is undone, or being undone; ``stopped``: stopped by
#: an unwinding or a cancel before it applied anything.
COUNTS: Final = ("done", "running", "waiting", "failed", "skipped", "undone", "stopped")

_BUCKET: Final = {
    StepState.PROCESSED: "done",
    StepState.PENDING: "running",
    StepState.PROCESSING: "running",
    StepState.ERROR: "failed",
    StepState.SKIPPED: "skipped",
    StepState.COMPENSATING: "undone",
}


def item_fields(order: Order | None, record: StepRecord) -> dict[str, Any]:
    """The fields a ForEach adds to ``record``'s step view: ``forEach`` (the ForEach's
    name: on its head, each of its items and each item's compensation) and ``index`` (an
    item's, or the item an item's compensation undoes); both None for any other record.
    The head also has ``items`` (how many were decided; None: not decided, e.g. its
    ``items`` raised), ``maxConcurrency`` and ``counts`` (``COUNTS``)."""
    found = item_of(record.compensates or record.step)
    if found is not None:
        return {"forEach": found[0], "index": found[1]}
    if order is None or record.kind is not StepKind.ACTION or order.kind_of(record) != "items":
        return {"forEach": None, "index": None}
    listed = items.decided(order, record.step)
    return {
        "forEach": record.step,
        "index": None,
        "items": len(listed) if listed is not None else None,
        "maxConcurrency": order.planned(record.step).max_concurrency,
        "counts": item_counts(order, record.step),
    }


def item_counts(order: Order, name: str) -> dict[str, int]:
    """How many items of the ForEach ``name`` stand where (``COUNTS``), from the latest
    record of each item and the list its head decided."""
    counts = dict.fromkeys(COUNTS, 0)
    records = items.items_of(order, name)
    for record in records:
        counts[bucket(record)] += 1
    listed = items.decided(order, name)
    counts["waiting"] = max(len(listed) - len(records), 0) if listed is not None else 0
    return counts


def bucket(record: StepRecord) -> str:
    """Which of ``COUNTS`` an item's latest record is in."""
    if record.process_state is StepState.COMPENSATED:
        return "undone" if record.undone_by else "stopped"
    return _BUCKET[record.process_state]
