"""Per-key concurrency under chaos (docs/contracts.md §3.16), for ``tests/chaos/runner.py``.

Some of the run's orders are keyed (``tests.fixtures.chaos_shop``: ``queued``, limit 1, and
``queued-pair``, limit 2, by ``account``): each account's orders are sent together, one of
them refused for good (its ``error`` gives the slot back), while processes are killed.
Once the run has settled, from the orders' histories and the slot rows:

- **never over the limit**: per key, the orders running at once (an order runs from its
  ``turn-taken`` event, or its first step's creation if it started at once, to its end,
  its last ``status`` event), at most the limit. One instance's clock runs ahead: every
  end is read that much earlier (an overlap shorter than the skew is not seen;
  ``overLimitAsWritten`` reads the times as they are);
- **every waiting order ran**: each keyed order has a step;
- **no slot leaked**: after one supervisor period more, every key's slot row holds, and
  lines up, only orders still running (here, none: they all ended).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from core.history import Happened
from core.model import Order
from core.timefmt import parse_iso
from core.turns import TurnStore
from tests.fixtures.chaos_shop import LIMITS

#: Orders ``n`` with ``n % KEYED_EVERY`` in ``KEYED_AT`` are one account's, sent together.
KEYED_EVERY: Final = 20
KEYED_AT: Final = range(11, 15)


def keyed(n: int) -> bool:
    return n % KEYED_EVERY in KEYED_AT


def keyed_order(order_id: str, n: int, seed: int) -> tuple[dict[str, Any], str]:
    """Order ``n``'s message and expected status: its group's account, its workflow
    (``queued`` and ``queued-pair`` in turn), the group's second refused for good."""
    group = n // KEYED_EVERY
    workflow = sorted(LIMITS)[group % len(LIMITS)]
    message: dict[str, Any] = {
        "orderId": order_id,
        "workflow": workflow,
        "account": f"acct-{seed % 1000:03d}-{group}",
    }
    if n % KEYED_EVERY == KEYED_AT[1]:
        message["simulate"] = {"process": "permanent"}
        return message, "error"
    return message, "completed"


def group_of(message: dict[str, Any]) -> str | None:
    """The key that sends ``message`` with its account's others (None: sent alone)."""
    return f"{message['workflow']}|{message['account']}" if "account" in message else None


def began_at(order: Order) -> datetime | None:
    for event in order.history:
        if event.get("event") == Happened.TURN_TAKEN:
            return parse_iso(event["at"])
    starts = [parse_iso(r.history[0]["at"]) for r in order.steps if r.history]
    return min(starts) if starts else None


def ended_at(order: Order) -> datetime | None:
    if not order.status.terminal:
        return None
    for event in reversed(order.history):
        if event.get("event") == Happened.STATUS and event.get("status") == str(order.status):
            return parse_iso(event["at"])
    return order.updated_at


def most_at_once(runs: list[tuple[datetime, datetime]]) -> int:
    """The most of ``runs`` (start, end) at once; an end before a start at one moment."""
    moments = sorted([(b, 1) for b, _ in runs] + [(e, -1) for _, e in runs])
    most = running = 0
    for _, change in moments:
        running += change
        most = max(most, running)
    return most


@dataclass
class TurnsVerdict:
    orders: int = 0
    keys: int = 0
    waited: int = 0
    most: dict[str, int] = field(default_factory=dict)
    over_limit: list[str] = field(default_factory=list)
    over_limit_as_written: list[str] = field(default_factory=list)
    never_ran: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "orders": self.orders,
            "keys": self.keys,
            "waited": self.waited,
            "mostAtOnce": self.most,
            "overLimit": self.over_limit,
            "overLimitAsWritten": self.over_limit_as_written,
            "neverRan": self.never_ran,
            "leaked": self.leaked,
        }


def check_turns(
    final: dict[str, Order | None],
    messages: dict[str, dict[str, Any]],
    slots: TurnStore,
    skew: timedelta,
) -> TurnsVerdict:
    """The keyed orders of ``messages`` (order id -> message sent), as they ended
    (``final``), and their keys' slots as ``slots`` reads them now."""
    verdict = TurnsVerdict()
    by_key: dict[tuple[str, str], list[str]] = defaultdict(list)
    for order_id, message in messages.items():
        if group_of(message) is not None:
            by_key[(message["workflow"], message["account"])].append(order_id)
    verdict.orders = sum(len(ids) for ids in by_key.values())
    verdict.keys = len(by_key)
    for (workflow, key), ids in sorted(by_key.items()):
        runs: list[tuple[datetime, datetime]] = []
        for order_id in ids:
            order = final.get(order_id)
            began = began_at(order) if order is not None else None
            ended = ended_at(order) if order is not None else None
            if order is None or began is None:
                verdict.never_ran.append(order_id)
                continue
            if ended is not None:
                runs.append((began, ended))
        # those that began only after another of their key had ended: they waited for it
        verdict.waited += sum(
            1
            for n, (b, _) in enumerate(runs)
            if any(e - skew <= b for _, e in runs[:n] + runs[n + 1 :])
        )
        limit = LIMITS[workflow]
        name = f"{workflow}|{key}"
        verdict.most[name] = most_at_once([(b, max(b, e - skew)) for b, e in runs])
        if verdict.most[name] > limit:
            verdict.over_limit.append(name)
        if most_at_once(runs) > limit:
            verdict.over_limit_as_written.append(name)
        slot = slots.read_slot(workflow, key)
        running = {
            o for o in ids if (order := final.get(o)) is not None and not order.status.terminal
        }
        kept = {h.order_id for h in slot.holders} | {w.order_id for w in slot.waiting}
        if kept - running:
            verdict.leaked.append(f"{name}: {sorted(kept - running)}")
    return verdict
