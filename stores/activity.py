"""Activity rows: one time-ordered row per thing an order did, written in the same
transaction as the transition that did it, for the dashboard's aggregator to count.

    activity|<at>|<orderId>|start              the order was accepted
    activity|<at>|<orderId>|a-<seq>-<n>        attempt n of step record seq ended
    activity|<at>|<orderId>|end-<status>-<v>   the order reached a terminal status (in its
                                               save number v: an error order resubmitted
                                               can reach error again, at the same time on
                                               a coarse or frozen clock)
    activity|<at>|<orderId>|alert-<v>-<n>      an operator alert was committed (outbox)
    activity|<at>|~poison|<id>                 a poisoned message became an alert

They live in the order's shard partition, so they commit with the transition (no event
is counted that did not happen, none is missed that did); the aggregator reads each
shard's ``activity|`` range up to a little before now, a bounded page a run, and deletes
the rows it counted (``supervisor/aggregator.py``). Which events a save adds is a diff,
like the index rows': the events the loaded state already implies (``tags``, kept in
``store_meta`` at load) against those the new state implies. So an order written before
this existed adds only what happens from now on, and a restored order (written back row
by row, not through a save) adds nothing.

They are not index rows (``layout.INDEX_PREFIXES``): no state implies them once they
are counted, so the index repair leaves them alone, and the retention purge does not
look for them (the aggregator deletes them within minutes; one left after its order was
purged is still counted once, then deleted).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Final

from core.item_names import declared_name
from core.model import Order
from core.timefmt import ensure_utc, sortable
from dashboard.figures import ALERT, ATTEMPT, FINISHED, KINDS, POISON, STARTED, Activity
from stores import layout

PREFIX: Final = "activity|"
#: Properties of an activity row besides its keys.
FIELDS: Final = [
    "RowKey",
    "OrderRef",
    "Kind",
    "At",
    "Workflow",
    "StepName",
    "Agent",
    "Outcome",
    "Applied",
    "Millis",
    "Status",
]


def tags(order: Order) -> set[str]:
    """The events the order's state implies have happened (alerts aside: they are
    counted from the outbox of the save that commits them)."""
    out = {"start"}
    if order.status.terminal:
        out.add(f"end-{order.status}")
    for step in order.steps:
        for attempt in step.attempts.items:
            if attempt.ending is not None:
                out.add(f"a-{step.seq}-{attempt.number}")
    return out


def row_key(at: datetime, order_id: str, tag: str) -> str:
    return f"{PREFIX}{sortable(at)}|{order_id}|{tag}"


def _agent(order: Order, step: str) -> str:
    try:
        return order.plan.agent_of(step)
    except KeyError:
        return ""


def activities(order: Order, before: set[str]) -> list[tuple[str, Activity]]:
    """The activity rows a save of ``order`` adds (key, activity), given the events its
    loaded state implied (``before``; empty for a new order)."""
    out: list[tuple[str, Activity]] = []
    new = tags(order) - before
    oid, wf = order.order_id, order.workflow
    if "start" in new:
        at = ensure_utc(order.created_at)
        out.append((row_key(at, order.order_id, "start"), Activity(at, STARTED, oid, wf)))
    for step in order.steps:
        for attempt in step.attempts.items:
            tag = f"a-{step.seq}-{attempt.number}"
            if tag not in new or attempt.ending is None:
                continue
            at = ensure_utc(attempt.ended_at or order.updated_at)
            millis = max(0, int((at - attempt.claimed_at).total_seconds() * 1000))
            activity = Activity(
                at,
                ATTEMPT,
                oid,
                wf,
                step=declared_name(step.step),  # one figure per declared step, not per item
                agent=_agent(order, step.step),
                ending=str(attempt.ending),
                applied=str(attempt.applied),
                millis=millis,
            )
            out.append((row_key(at, order.order_id, tag), activity))
    end = f"end-{order.status}"
    if end in new:
        at = ensure_utc(order.updated_at)
        activity = Activity(at, FINISHED, oid, wf, status=str(order.status))
        out.append((row_key(at, order.order_id, f"{end}-{order.version}"), activity))
    for n, notice in enumerate(order.outbox):
        if notice.kind == "alert":
            at = ensure_utc(order.updated_at)
            tag = f"alert-{order.version}-{n}"
            out.append((row_key(at, order.order_id, tag), Activity(at, ALERT, oid, wf)))
    return out


def poison_row(at: datetime) -> tuple[str, str]:
    """Where a poisoned message's activity row goes: (partition, RowKey), spread over the
    shards by a random id."""
    ident = uuid.uuid4().hex
    return layout.shard_of(ident), f"{PREFIX}{sortable(at)}|~poison|{ident}"


def entity(partition: str, key: str, activity: Activity) -> dict[str, Any]:
    """An activity row's properties (only those the kind uses)."""
    out: dict[str, Any] = {
        "PartitionKey": partition,
        "RowKey": key,
        "Kind": activity.kind,
        "At": activity.at,
    }
    if activity.order_id:
        out["OrderRef"] = activity.order_id
    for name, value in (
        ("Workflow", activity.workflow),
        ("StepName", activity.step),
        ("Agent", activity.agent),
        ("Outcome", activity.ending),
        ("Applied", activity.applied),
        ("Status", activity.status),
    ):
        if value:
            out[name] = value
    if activity.kind == ATTEMPT:
        out["Millis"] = activity.millis
    return out


def parse(row: dict[str, Any]) -> Activity | None:
    """An activity row read back; None if it is malformed (skipped, then deleted)."""
    try:
        kind = str(row["Kind"])
        at = row["At"]
        if kind not in KINDS or not isinstance(at, datetime):
            return None
        return Activity(
            ensure_utc(at),
            kind,
            order_id=str(row.get("OrderRef") or ""),
            workflow=str(row.get("Workflow") or ""),
            step=str(row.get("StepName") or ""),
            agent=str(row.get("Agent") or ""),
            ending=str(row.get("Outcome") or ""),
            applied=str(row.get("Applied") or ""),
            millis=int(row.get("Millis") or 0),
            status=str(row.get("Status") or ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


__all__ = ["ALERT", "ATTEMPT", "FINISHED", "POISON", "STARTED"]
