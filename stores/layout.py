"""How orders are laid out in the ``OrderState`` table.

One partition per shard of the order id; inside it, every record of an
order shares the prefix ``order|<orderId>|``, so one range query loads the
whole aggregate. Beside them, index rows that sweeps read as ranges (their
cost grows with the work in flight, not with history):

    order|<id>|order                       the order record
    order|<id>|step|<seq>|<step>           one state record per step (docs/contracts.md §3.2)
    pending|<due>|<id>|<step>              an active step, Pending, may run at <due>
                                           (``PausedFor``: it waits for that agent's pause)
    processing|<completeBy>|<id>|<step>    an active step, Processing, deadline <completeBy>
                                           (an event's timeout, a delay's end: ``Waits``)
    waiting|<event>|<newest>|<id>          an order waiting for the event <event> (an Event
                                           step, or a task that completes on it): the
                                           operators' inbox, newest first
    status|<status>|<newest>|<id>          every order, by status, newest first (listing.py)
    search|<field>|<digest>|<newest>|<id>  an order whose data (or a step's result, §3.17)
                                           has that value in <field>, a field its plan
                                           searches by (docs/contracts.md §3.14): <digest>
                                           stands for the value (``core.search.digest``),
                                           kept as ``Value``; ``Field`` is the declared name
    outbox|<createdAt>|<id>|<n>            notices committed but maybe not yet sent
    activity|<at>|<id>|<event>             what the order did, for the dashboard (activity.py)
    archived|<id>                          an archived order: where it went (retention.py)
    archived-at|<when>|<id>                its twin in time order, for their expiry

Activity rows are not index rows: no state implies them once the dashboard's
aggregator has counted (and deleted) them, so a repair never touches them.

Index rows move with the state in the same partition transaction. Their
properties use other names than the state fields (``OrderRef``, ``StepName``),
so exactly one entity per step carries ``OrderID``/``Step``/``ProcessState``.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Final

from core.model import Order, StepRecord
from core.search import digest, of_order, parameter
from core.states import StepKind, StepState
from core.timefmt import ensure_utc, sortable

SHARDS: Final = 16  # changing this re-homes every order: a migration, not a setting
HIGH: Final = "~"  # sorts after every character used in keys


def shard_of(order_id: str) -> str:
    digest = hashlib.sha256(order_id.encode("utf-8")).digest()
    return f"shard-{int.from_bytes(digest[:4], 'big') % SHARDS:02d}"


def all_shards() -> list[str]:
    return [f"shard-{i:02d}" for i in range(SHARDS)]


def order_prefix(order_id: str) -> str:
    return f"order|{order_id}|"


def order_row(order_id: str) -> str:
    return f"order|{order_id}|order"


def step_row(order_id: str, seq: int, step: str) -> str:
    return f"order|{order_id}|step|{seq:03d}|{step}"


def pending_row(due: datetime, order_id: str, step: str) -> str:
    return f"pending|{sortable(due)}|{order_id}|{step}"


def processing_row(deadline: datetime, order_id: str, step: str) -> str:
    return f"processing|{sortable(deadline)}|{order_id}|{step}"


def waiting_prefix(event: str) -> str:
    return f"waiting|{event}|"


def waiting_row(event: str, order_id: str, created_at: datetime) -> str:
    return f"{waiting_prefix(event)}{newest_first(created_at)}|{order_id}"


def status_prefix(status: str) -> str:
    return f"status|{status}|"


#: ``newest_first`` counts milliseconds down from here (13 digits until the year 2286).
_NEWEST_FIRST_BASE: Final = 10**13 - 1


def newest_first(at: datetime) -> str:
    """A fixed-width key part that sorts later times first (to the millisecond)."""
    millis = int(ensure_utc(at).timestamp() * 1000)
    return f"{_NEWEST_FIRST_BASE - millis:013d}"


def status_row(status: str, order_id: str, created_at: datetime) -> str:
    return f"{status_prefix(status)}{newest_first(created_at)}|{order_id}"


def created_of_status_row(row_key: str) -> datetime | None:
    """The creation time a status index row's key carries (to the millisecond)."""
    parts = row_key.split("|")
    if len(parts) < 4 or not parts[2].isdigit():
        return None
    return datetime.fromtimestamp((_NEWEST_FIRST_BASE - int(parts[2])) / 1000, UTC)


def outbox_row(created: datetime, order_id: str, n: str) -> str:
    return f"outbox|{sortable(created)}|{order_id}|{n}"


def search_prefix(field: str, text: str) -> str:
    """The rows of the orders whose ``field`` has the value ``text`` (``core.search``)."""
    return f"search|{field}|{digest(text)}|"


def search_row(field: str, text: str, order_id: str, created_at: datetime) -> str:
    return f"{search_prefix(field, text)}{newest_first(created_at)}|{order_id}"


def search_rows(order: Order) -> dict[str, dict[str, str]]:
    """One row per name the order's plan searches by that it carries a searchable value
    in (its data's, or a succeeded step's result's: ``core.search.of_order``), keyed by the
    query parameter it is searched by; whatever its status (a finished order is found too).
    They move with the order's state in its transactions: a fix that changes the value
    moves its row, and a step's result comes with its row in the save that records it."""
    return {
        search_row(parameter(name), text, order.order_id, order.created_at): {
            "OrderRef": order.order_id,
            "Workflow": order.workflow,
            "Field": name,
            "Value": text,
        }
        for name, text in of_order(order).items()
    }


#: The RowKey prefixes of index rows: what ``index_rows`` writes, what a repair may delete.
INDEX_PREFIXES: Final = ("pending|", "processing|", "status|", "waiting|", "search|")


def is_index_row(row_key: str) -> bool:
    return row_key.startswith(INDEX_PREFIXES)


def index_rows(order: Order) -> dict[str, dict[str, str]]:
    """The index rows this order's state implies: RowKey -> extra properties."""
    rows: dict[str, dict[str, str]] = {
        status_row(str(order.status), order.order_id, order.created_at): {
            "OrderRef": order.order_id,
            "Workflow": order.workflow,
        },
        **search_rows(order),
    }
    if order.status.terminal:
        return rows
    for step in order.active_steps():
        rows.update(_step_rows(order, step))
    return rows


def _step_rows(order: Order, step: StepRecord) -> dict[str, dict[str, str]]:
    try:
        agent = order.plan.agent_of(step.step)
    except KeyError:
        agent = ""
    rows: dict[str, dict[str, str]] = {}
    # Agent and Since are for the stuck-step check (supervisor/aggregator.py): a Pending
    # step is late from its due time (the key), a Processing one from its claim.
    if step.process_state is StepState.PENDING:
        rows[pending_row(step.complete_by, order.order_id, step.step)] = {
            "OrderRef": order.order_id,
            "StepName": step.step,
            # waiting for its agent's pause: the sweep finds it after a resume
            **({"PausedFor": step.paused_for} if step.paused_for else {}),
            "Agent": agent,
        }
    elif step.process_state is StepState.PROCESSING:
        current = step.current
        since = current.claimed_at if current is not None else step.complete_by
        waits = order.waits(step)
        rows[processing_row(step.complete_by, order.order_id, step.step)] = {
            "OrderRef": order.order_id,
            "StepName": step.step,
            "Agent": agent,
            "Since": sortable(since),
            **({"Waits": order.kind_of(step)} if waits else {}),
        }
    event = _awaited_event(order, step)
    if event is not None:
        rows[waiting_row(event, order.order_id, order.created_at)] = {
            "OrderRef": order.order_id,
            "StepName": step.step,
            "Workflow": order.workflow,
        }
    return rows


def _awaited_event(order: Order, step: StepRecord) -> str | None:
    """The event an active step waits for: an Event step's own, or a ``completes_on``
    task's once the remote accepted (the operators' inbox lists both)."""
    if step.kind is not StepKind.ACTION:
        return None
    try:
        planned = order.plan.planned(step.step)
    except KeyError:
        return None
    if planned.kind == "event" and step.process_state is StepState.PROCESSING:
        return planned.name
    current = step.current
    if planned.completes_on and current is not None and current.accepted:
        return planned.completes_on
    return None
