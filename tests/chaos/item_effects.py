"""What must hold of orders with a ``ForEach`` (docs/contracts.md §3.16) at the end of a
run, checked from outside: the orders in the table, the alerts, the simulator's ledger.

``demo.verify`` compares the ledger's effects with the plan's step names; an item is
called on its step's path under a key of its own (``<orderId>:<name>:<i>``), so the
ledger names the path of every item alike. Here each effect is put back on its record
by its key (``record_of``) and, for every order with a ForEach:

- ``lost``/``stuck``: not stored, or not ended;
- ``unexpected``: ended other than expected, unless it ran out of attempts on a step
  (``exhausted``) or ended ``error`` in doubt about a step, told so (``doubted``);
- ``applied_twice``: an item (or a step of its own, the pack) applied more than once:
  two keys for one record;
- ``foreign_effects``: an effect whose key names no record of the order;
- ``missing``: a completed order with an item (or the pack) not applied;
- ``not_undone``: an item applied in an order compensated or cancelled, never undone;
- ``undone_with_another``: a compensation whose body names another item's result;
- ``undone_around_doubt``: an item undone while a later step that may have applied, and
  cannot be undone, stood in doubt (contract 3.15: nothing is undone around a doubt; a
  doubt that came back after the undo began is not one it went around: ``_check_doubt``);
- ``not_applied_yet_done``: an item the system said was refused, yet applied;
- ``unalerted``: an order in ``error`` with no alert naming the ForEach (or the step);
- ``inconsistent_history``/``stale_applied``: ``demo.verify.check_history`` of each
  record but a ForEach's head (its list decided at once, no attempt: that replay reads
  its success as one for no attempt claimed).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from core.history import Happened
from core.item_names import declared_name, item_name, item_of
from core.model import Order
from core.outcome import Outcome
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.timefmt import parse_iso
from demo.verify import Verdict, check_history, said_not_applied
from simulator.ledger import applied

VIOLATIONS = (
    "lost",
    "stuck",
    "unexpected",
    "applied_twice",
    "foreign_effects",
    "missing",
    "not_undone",
    "undone_with_another",
    "undone_around_doubt",
    "not_applied_yet_done",
    "unalerted",
    "inconsistent_history",
    "stale_applied",
)

#: The attempt endings counted toward ``MAX_FAILURE_COUNT`` (as ``demo.verify`` counts).
_FAILURES = (Outcome.EXPIRED, Outcome.TRANSIENT)


@dataclass
class ItemsVerdict:
    orders: int = 0
    as_expected: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    exhausted: list[str] = field(default_factory=list)
    doubted: list[str] = field(default_factory=list)
    items: int = 0  # item records that ran (latest of each)
    effects: int = 0  # applied effects of items and their compensations
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    applied_twice: list[str] = field(default_factory=list)
    foreign_effects: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    not_undone: list[str] = field(default_factory=list)
    undone_with_another: list[str] = field(default_factory=list)
    undone_around_doubt: list[str] = field(default_factory=list)
    not_applied_yet_done: list[str] = field(default_factory=list)
    unalerted: list[str] = field(default_factory=list)
    inconsistent_history: list[str] = field(default_factory=list)
    stale_applied: list[str] = field(default_factory=list)

    def violations(self) -> dict[str, list[str]]:
        return {name: getattr(self, name) for name in VIOLATIONS if getattr(self, name)}

    def as_json(self) -> dict[str, Any]:
        return {
            "orders": self.orders,
            "statuses": dict(self.statuses),
            "endedAsExpected": self.as_expected,
            "exhausted": len(self.exhausted),
            "endedInDoubt": len(self.doubted),
            "items": self.items,
            "effects": self.effects,
            **{name: len(getattr(self, name)) for name in VIOLATIONS},
        }


def has_items(order: Order) -> bool:
    return any(p.kind == "items" for p in order.plan.steps)


def item_names(order: Order) -> set[str]:
    """The names under which the order's items and their compensations are keyed."""
    names = {p.name for p in order.plan.steps if p.kind == "items"}
    names |= {
        p.compensation[:-2]
        for p in order.plan.steps
        if p.compensation is not None and p.compensation.endswith("[]")
    }
    return names


def record_of(order: Order, key: str) -> str:
    """The record a call's key belongs to: ``<name>[<i>]`` for ``<orderId>:<name>:<i>``
    (and its rounds) of one of the order's ForEach names, else the key's step."""
    parts = key.split(":")
    if len(parts) in (3, 4) and parts[1] in item_names(order) and parts[2].isdigit():
        return item_name(parts[1], int(parts[2]))
    return parts[1] if len(parts) > 1 else key


def check_items(
    orders: dict[str, Order | None],
    ledger: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    expected: dict[str, str],
    max_failures: int | None = None,
    skew: timedelta = timedelta(0),
) -> ItemsVerdict:
    """The verdict on ``orders`` (each expected to end as ``expected`` says); ``skew``:
    how far the clocks of the instances that wrote the records may be apart."""
    verdict = ItemsVerdict(orders=len(orders))
    effects: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in sorted(applied(ledger), key=lambda e: e["seq"]):
        if entry["orderId"] in orders:
            effects[entry["orderId"]].append(entry)
    for order_id, order in orders.items():
        if order is None:
            verdict.lost.append(order_id)
            continue
        verdict.statuses[str(order.status)] += 1
        if not order.status.terminal:
            verdict.stuck.append(f"{order_id}({order.status})")
            continue
        _check_end(order, expected.get(order_id), alerts, max_failures, verdict)
        _check_steps(order, effects[order_id], verdict)
        _check_effects(order, effects[order_id], verdict, skew)
        heads = {p.name for p in order.plan.steps if p.kind == "items"}
        for record in order.steps:
            if record.step in heads:
                continue  # decided when its group starts, never claimed: no attempt to replay
            stale, wrong = check_history(order, record)
            verdict.stale_applied += stale
            verdict.inconsistent_history += wrong
    return verdict


def _alerted_in_doubt(order: Order, alerts: list[dict[str, Any]]) -> bool:
    doubtful = {declared_name(s.step) for s in order.steps if s.may_have_applied}
    return any(
        a.get("orderId") == order.order_id
        and a.get("step") in doubtful
        and "may have been applied" in str(a.get("reason"))
        for a in alerts
    )


def _check_end(
    order: Order,
    wanted: str | None,
    alerts: list[dict[str, Any]],
    max_failures: int | None,
    verdict: ItemsVerdict,
) -> None:
    order_id = order.order_id
    if order.status is OrderStatus.ERROR:
        failed = [s for s in order.steps if s.process_state is StepState.ERROR]
        latest = max(failed, key=lambda s: s.seq) if failed else None
        named = {a.get("step") for a in alerts if a.get("orderId") == order_id}
        if latest is not None and declared_name(latest.step) not in named:
            verdict.unalerted.append(f"{order_id}:{latest.step}")
    if wanted is None or str(order.status) == wanted:
        verdict.as_expected += wanted is not None
        return
    exhausted = max_failures is not None and any(
        s.process_state is StepState.ERROR
        and sum(1 for a in s.attempts.items if a.counted and a.ending in _FAILURES) >= max_failures
        for s in order.steps
    )
    if exhausted:
        verdict.exhausted.append(order_id)
    elif order.status is OrderStatus.ERROR and _alerted_in_doubt(order, alerts):
        verdict.doubted.append(order_id)
    else:
        verdict.unexpected.append(f"{order_id}: {order.status}, expected {wanted}")


def _check_effects(
    order: Order, effects: list[dict[str, Any]], verdict: ItemsVerdict, skew: timedelta
) -> None:
    order_id = order.order_id
    names = item_names(order)
    by_record: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in effects:
        record = record_of(order, entry["idempotencyKey"])
        if item_of(record) is None or item_of(record)[0] not in names:  # type: ignore[index]
            continue  # a step of its own: demo.verify's business
        by_record[record].append(entry)
        verdict.effects += 1
        if order.find(record) is None:
            verdict.foreign_effects.append(f"{order_id}:{entry['idempotencyKey']}")
    heads = [p.name for p in order.plan.steps if p.kind == "items"]
    for record, entries in by_record.items():
        # an undo may run again as a new effect under its key's next round (3.11): only
        # an item itself applied twice is a double effect
        if len(entries) > 1 and _head(record) in heads:
            keys = [e["idempotencyKey"] for e in entries]
            verdict.applied_twice.append(f"{order_id}:{record} {keys}")
    items = [s for s in order.steps if s.kind is StepKind.ACTION and _head(s.step) in heads]
    verdict.items += len(items)
    undone_by = {s.compensates: s.step for s in order.steps if s.kind is StepKind.COMPENSATION}
    for item in items:
        done = by_record.get(item.step, [])
        if said_not_applied(item) and done:
            verdict.not_applied_yet_done.append(f"{order_id}:{item.step}")
        if order.status is OrderStatus.COMPLETED:
            if item.process_state is StepState.PROCESSED and len(done) != 1:
                verdict.missing.append(f"{order_id}:{item.step}")
            continue
        undo = undone_by.get(item.step)
        undos = by_record.get(undo, []) if undo is not None else []
        if order.status in (OrderStatus.COMPENSATED, OrderStatus.CANCELLED) and done and not undos:
            verdict.not_undone.append(f"{order_id}:{item.step}")
        own = done[0]["response"].get("confirmation") if done else None
        for entry in undos:
            named = (entry.get("request") or {}).get("confirmation")
            if named is not None and named != own:
                verdict.undone_with_another.append(f"{order_id}:{undo} named {named}, not {own}")
    _check_doubt(order, by_record, verdict, skew)


def _check_steps(order: Order, effects: list[dict[str, Any]], verdict: ItemsVerdict) -> None:
    """The order's steps that are not items (``picking``'s pack), as ``demo.verify``
    checks them: applied at most once, never when the system said it was not, and, in a
    completed order, once."""
    names = item_names(order)
    applied_steps: dict[str, int] = defaultdict(int)
    for entry in effects:
        record = record_of(order, entry["idempotencyKey"])
        if _head(record) not in names:
            applied_steps[record] += 1
    for step in order.steps:
        if step.kind is not StepKind.ACTION or _head(step.step) is not None:
            continue
        if order.planned(step.step).kind != "task":
            continue  # a ForEach's head: no call of its own
        times = applied_steps.get(step.step, 0)
        if times > 1:
            verdict.applied_twice.append(f"{order.order_id}:{step.step} x{times}")
        if said_not_applied(step) and times:
            verdict.not_applied_yet_done.append(f"{order.order_id}:{step.step}")
        completed = order.status is OrderStatus.COMPLETED
        if completed and step.process_state is StepState.PROCESSED and times != 1:
            verdict.missing.append(f"{order.order_id}:{step.step}")


def _head(step: str) -> str | None:
    found = item_of(step)
    return found[0] if found is not None else None


def _check_doubt(
    order: Order,
    by_record: dict[str, list[dict[str, Any]]],
    verdict: ItemsVerdict,
    skew: timedelta,
) -> None:
    """No item undone (by the ledger: its compensation's key applied, whether the order
    has its record or not) while a later step that may have applied, and has no
    compensation, stood in error: its doubt stops the unwinding before it (3.15).

    A doubt can also come back after the unwinding began (a report of an earlier
    attempt, "may have applied", after the service's refusal had settled it: the order
    notes it ``reclassified``); what was undone before that was undone on what was known.
    So an undo counts only if it began after the doubt was last known (its record's
    creation, else the ledger's time, later than the reclassification by more than
    ``skew``, how far the instances' clocks may be apart)."""
    undoes = {
        p.compensation[:-2]: p.name[:-2]
        for p in order.plan.steps
        if p.compensation is not None and p.compensation.endswith("[]")
    }
    doubts = [
        s
        for s in order.steps
        if s.kind is StepKind.ACTION
        and s.may_have_applied
        and s.process_state is StepState.ERROR
        and order.planned(s.step).compensation is None
        and not order.planned(s.step).may_stand
    ]
    for doubt in doubts:
        since = _doubt_known_since(order, doubt.step)
        for undo, entries in by_record.items():
            found = item_of(undo)
            if found is None or found[0] not in undoes:
                continue
            item = order.find(item_name(undoes[found[0]], found[1]))
            if item is None or item.seq > doubt.seq:
                continue
            record = order.find(undo)
            began = (
                parse_iso(record.history[0]["at"])
                if record is not None and record.history
                else parse_iso(entries[0]["at"])
            )
            if since is None or began > since + skew:
                verdict.undone_around_doubt.append(
                    f"{order.order_id}:{undo} (begun {began.isoformat()}) undone around "
                    f"{doubt.step} in doubt (attempts {doubt.maybe_applied}; known since "
                    f"{since.isoformat() if since else 'it failed'})"
                )


def _doubt_known_since(order: Order, step: str) -> datetime | None:
    """When the order last learnt that ``step`` may have applied after decisions had
    assumed it had not (``reclassified``); None: it was in doubt when it failed."""
    found = [
        parse_iso(h["at"])
        for h in order.history
        if h.get("event") == Happened.RECLASSIFIED and h.get("step") == step
    ]
    return max(found) if found else None


def most_in_flight(order: Order, name: str, skew: timedelta = timedelta(0)) -> int:
    """The most items of the ForEach ``name`` in flight at once, from their records: each
    attempt from its claim to its end (or its deadline if it never ended), but no later
    than the moment its item ended (docs/contracts.md §3.16, "As built": an item that
    succeeded by a late report has ended, even while a retry of it, under the same key,
    is still out). ``skew``: how far the clocks of the instances that wrote them may run
    apart (the chaos run's one instance ahead): an end is read as early as that, so that
    an attempt that ended on a clock ahead does not seem to overlap the next one started
    elsewhere."""
    moments: list[tuple[datetime, int]] = []
    for record in order.steps:
        if record.kind is StepKind.ACTION and _head(record.step) == name:
            settled = _ended_at(record)
            for attempt in record.attempts.items:
                end = attempt.ended_at or attempt.deadline
                if settled is not None:
                    end = min(end, settled)
                end -= skew
                if end > attempt.claimed_at:
                    moments += [(attempt.claimed_at, 1), (end, -1)]
    most = running = 0
    for _, change in sorted(moments):  # an end before a start at the same moment
        running += change
        most = max(most, running)
    return most


def _ended_at(record: StepRecord) -> datetime | None:
    """When the item ended for good (its first success, or its failure for good), from
    its history; None while it has not."""
    for event in record.history:
        if event.get("event") in (Happened.SUCCEEDED, Happened.ERROR):
            return parse_iso(str(event["at"]))
    return None


def merge(verdict: Verdict, items: ItemsVerdict) -> None:
    """Add the items' verdict to ``demo.verify``'s on the run's other orders: one verdict,
    each violation under the name ``demo.verify`` gives its kind (an item applied twice is
    a double effect; one missing, not undone, undone with another's result or around a
    doubt, a wrong effect)."""
    verdict.orders += items.orders
    verdict.statuses.update(items.statuses)
    verdict.as_expected += items.as_expected
    verdict.exhausted += items.exhausted
    verdict.doubted += items.doubted
    verdict.effects += items.effects
    verdict.lost += items.lost
    verdict.stuck += items.stuck
    verdict.unexpected += items.unexpected
    verdict.double_effects += items.applied_twice
    verdict.wrong_effects += (
        items.foreign_effects
        + items.missing
        + items.not_undone
        + items.undone_with_another
        + items.undone_around_doubt
    )
    verdict.effects_after_definite_failure += items.not_applied_yet_done
    verdict.unalerted += items.unalerted
    verdict.stale_applied += items.stale_applied
    verdict.inconsistent_history += items.inconsistent_history
