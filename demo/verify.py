"""What must hold at the end of a run, checked from the outside (table, queues, ledger).

One checker for the demo's summary, the e2e tests and the chaos suite, built
only on what an outsider can see: the orders in the table, the alerts on
their queue, and the simulator's ledger of applied effects.

Violations: an order lost or stuck; an order that ended other than expected
(unless it ran out of attempts, which is reported apart); an effect applied
twice, missing, in the wrong order, or left standing in a compensated order;
an effect for a step the system said was not applied (refused, failed for good
with nothing applied, cancelled before it ran); an order in error without an
alert naming its step; a report applied for an attempt that was over (a
success is the exception: it is evidence whenever it arrives); a step whose
history does not replay to its state; a compensation that undid an effect
without naming the id that effect handed out (the ledger's ``ids``).

The steps of one parallel group (docs/contracts.md §3.13) may apply in any order
among themselves, and so may their compensations: effects are compared with that
order left free, every other order kept. So may the items of one ``ForEach`` (§3.16),
``<name>[<i>]``, up to its ``max_concurrency`` at once; its head record (``<name>``)
decides the list at once and applies nothing, and an item's alert names the ForEach.

Orders of a workflow with a ``Concurrency`` (§3.16): more orders of one key running at
once than its limit is a violation (``overlapping_turns``), read from each order's own
history: it ran from taking its turn (``turn-taken``) to the status that gave its slot
back (``completed``, ``compensated``, ``cancelled``, or ``error`` unless it holds on error).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from bootstrap import AppContext
from core import turns
from core.history import ATTEMPT_ENDINGS, Happened
from core.item_names import declared_name, template_of
from core.items import compensation_of
from core.model import Order, StepRecord
from core.outcome import Outcome
from core.states import OrderStatus, StepKind, StepState
from core.timefmt import parse_iso
from simulator import double_effects, effects_by_order

VIOLATIONS = (
    "lost",
    "stuck",
    "unexpected",
    "double_effects",
    "wrong_effects",
    "effects_after_definite_failure",
    "unalerted",
    "stale_applied",
    "inconsistent_history",
    "ids_not_carried",
    "overlapping_turns",
)


@dataclass
class Verdict:
    orders: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    as_expected: int = 0
    exhausted: list[str] = field(default_factory=list)  # Error after MAX deadline failures
    #: Error because a step may have applied (a report of a redelivered request, say),
    #: alerted so, though its service applied nothing: doubt told, not a wrong end
    doubted: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    double_effects: list[str] = field(default_factory=list)
    wrong_effects: list[str] = field(default_factory=list)
    effects_after_definite_failure: list[str] = field(default_factory=list)
    unalerted: list[str] = field(default_factory=list)
    stale_applied: list[str] = field(default_factory=list)
    inconsistent_history: list[str] = field(default_factory=list)
    ids_not_carried: list[str] = field(default_factory=list)
    #: more orders of one key (§3.16) ran at once than its workflow's limit
    overlapping_turns: list[str] = field(default_factory=list)
    attempts: int = 0
    expiries: int = 0
    alerts: int = 0
    effects: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations()

    def violations(self) -> dict[str, list[str]]:
        return {name: getattr(self, name) for name in VIOLATIONS if getattr(self, name)}

    def problems(self) -> list[str]:
        return [
            f"{name}: {', '.join(items[:10])}"
            + (f" (+{len(items) - 10})" if len(items) > 10 else "")
            for name, items in self.violations().items()
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "orders": self.orders,
            "statuses": dict(self.statuses),
            "endedAsExpected": self.as_expected,
            "exhaustedRetries": len(self.exhausted),
            "endedInDoubt": len(self.doubted),
            **{_camel(name): len(getattr(self, name)) for name in VIOLATIONS},
            "attempts": self.attempts,
            "deadlineExpiries": self.expiries,
            "alerts": self.alerts,
            "effects": self.effects,
        }


def _told_in_doubt(order: Order, applied: list[str], alerts: list[dict[str, Any]]) -> bool:
    """The order is ``error`` because a step that its service never applied may have
    applied, as far as the order can know (3.11: in doubt), and an alert said so."""
    if order.status is not OrderStatus.ERROR:
        return False
    doubtful = {s.step for s in order.steps if s.may_have_applied and s.step not in applied}
    return bool(doubtful) and any(
        a.get("orderId") == order.order_id
        and a.get("step") in doubtful
        and "may have been applied" in str(a.get("reason"))
        for a in alerts
    )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def load_orders(ctx: AppContext, order_ids: list[str]) -> dict[str, Order | None]:
    return {order_id: ctx.store.load(order_id) for order_id in order_ids}


def drain_alerts(ctx: AppContext) -> list[dict[str, Any]]:
    """Everything on the operator-alerts queue (received and deleted: the tests')."""
    client = ctx.queues.client(ctx.names.operator_alerts)
    out: list[dict[str, Any]] = []
    while True:
        batch = list(
            client.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=60)
        )
        if not batch:
            return out
        for message in batch:
            out.append(json.loads(message.content))
            client.delete_message(message)


def drain_alerts_for(
    ctx: AppContext, order_ids: Iterable[str], timeout: float = 30.0
) -> list[dict[str, Any]]:
    """``drain_alerts`` until each of ``order_ids`` has an alert, or ``timeout`` s pass: an
    alert leaves after the save that ended its order (the transactional outbox), so an
    order seen ended may have its alert a moment later."""
    wanted, out = set(order_ids), list[dict[str, Any]]()
    end = time.monotonic() + timeout
    while True:
        out += drain_alerts(ctx)
        if wanted <= {alert.get("orderId") for alert in out} or time.monotonic() > end:
            return out
        time.sleep(0.2)


def read_alerts(ctx: AppContext) -> list[dict[str, Any]]:
    """Everything on the operator-alerts queue, left there: each message is received (so
    that more than a peek's 32 are read) and made visible again at once, so the console's
    alerts page still shows them after the demo."""
    client = ctx.queues.client(ctx.names.operator_alerts)
    out: list[dict[str, Any]] = []
    held = []
    try:
        while True:
            batch = list(
                client.receive_messages(
                    messages_per_page=32, max_messages=32, visibility_timeout=60
                )
            )
            if not batch:
                return out
            for message in batch:
                out.append(json.loads(message.content))
                held.append(message)
    finally:
        for message in held:
            client.update_message(message, visibility_timeout=0)


def _deadlines(step: StepRecord) -> dict[int, datetime]:
    return {a.number: a.deadline for a in step.attempts.items}


#: The state a step is in after these events, whatever it was in before.
_STATE_AFTER: dict[str, str] = {
    Happened.SKIPPED: "Skipped",
    Happened.HALTED: "Compensated",  # stopped before it applied: nothing to undo
    Happened.GIVE_UP_HELD: "Processing",  # its attempt decided; the supervisor makes it final
    Happened.RETRY_SCHEDULED: "Pending",
    Happened.RESUBMITTED: "Pending",
    Happened.ERROR: "Error",
    Happened.COMPENSATING: "Compensating",
    Happened.COMPENSATED: "Compensated",
    # its undo, never sent, withdrawn when a doubt came back: as it stood (``back``)
    Happened.UNDO_WITHDRAWN: "Processed",
}


def check_history(order: Order, step: StepRecord) -> tuple[list[str], list[str]]:
    """Replay a step's history: (replies applied that should not have been, inconsistencies).

    A report other than success decides only the attempt in flight (Processing, same
    attempt). A success is evidence whenever it arrives (docs/contracts.md §3.11): one marked
    ``late`` may be for an earlier attempt, after the deadline, or after the step had
    failed; an on-time one must be for the attempt in flight, before its deadline.
    """
    stale: list[str] = []
    wrong: list[str] = []
    deadlines = _deadlines(step)
    current: int | None = None  # the attempt in flight
    claimed = 0  # the highest attempt claimed so far
    state = "Pending"
    # an event settles it (docs/contracts.md §3.13): an Event step or a delay that waits,
    # or a task whose remote calls back: its success is for no attempt
    settled_by_event = False
    if step.history_dropped:
        # The middle of a long history was dropped: replay from its next claim on.
        state, claimed = "Unknown", max(h.get("attempt") or 0 for h in step.history)
    name = f"{order.order_id}:{step.step}"
    if _is_head(order, step.step):
        # A ForEach's head decides its list when it starts, with no attempt (§3.16)
        settled_by_event = True
    for event in step.history:
        kind = event["event"]
        attempt = event.get("attempt")
        if state == "Unknown" and kind != "claimed":
            continue
        if kind == Happened.CLAIMED:
            if state not in ("Pending", "Unknown"):
                wrong.append(f"{name}: claimed while {state}")
            current, state = attempt, "Processing"
            claimed = max(claimed, attempt or 0)
        elif kind == Happened.SUCCEEDED and attempt is None and settled_by_event:
            # Evidence whenever it arrives (§3.11), as a late success is: a callback that
            # lands after its attempt ran out and the step went back to Pending for the
            # supervisor's retry (the same key) settles the step; the retry then finds it
            # done.
            if state not in ("Pending", "Processing", "Error"):
                stale.append(f"{name}: an event's success applied while {state}")
            state, current, settled_by_event = "Processed", None, False
        elif kind == Happened.SUCCEEDED:
            if event.get("late"):
                if not isinstance(attempt, int) or not 1 <= attempt <= claimed:
                    stale.append(f"{name}: success for attempt {attempt} never claimed")
                elif state not in ("Pending", "Processing", "Error"):
                    stale.append(f"{name}: late success applied while {state}")
            elif state != "Processing" or attempt != current:
                stale.append(f"{name}: success for attempt {attempt} while {state} ({current})")
            elif current in deadlines and parse_iso(event["at"]) >= deadlines[current]:
                stale.append(f"{name}: on-time success for attempt {attempt} after its deadline")
            state, current = "Processed", None
        elif kind in ATTEMPT_ENDINGS - {Happened.SUCCEEDED}:
            if state != "Processing" or attempt != current:
                stale.append(f"{name}: {kind} for attempt {attempt} while {state} ({current})")
            state, current = "Ended", None
        elif kind in (Happened.WAITING, Happened.EVENT_TAKEN):
            settled_by_event = True  # an event or a delay began; an event was taken
            state = "Processing" if kind == Happened.WAITING else state
        elif kind in _STATE_AFTER:
            state = str(event.get("back") or _STATE_AFTER[kind])
        elif kind == Happened.CANCELLED and any(
            words in str(event.get("note", "")) for words in ("nothing to undo", "; stopped:")
        ):
            state = "Compensated"  # stopped before it applied
    if state != str(step.process_state):
        wrong.append(f"{name}: history ends {state}, record says {step.process_state}")
    return stale, wrong


def _is_head(order: Order, step: str) -> bool:
    """Whether ``step`` is a ForEach's head record (its list; no remote, no attempt)."""
    planned = next((p for p in order.plan.steps if p.name == step), None)
    return planned is not None and planned.kind == "items"


def _latest_failed(order: Order) -> StepRecord | None:
    failed = [s for s in order.steps if s.process_state is StepState.ERROR]
    return max(failed, key=lambda s: s.seq) if failed else None


def said_not_applied(step: StepRecord) -> bool:
    """The system told someone this step's effect does not exist: a refusal, a final
    failure known to have applied nothing, or a cancel of a step that never applied
    (read from the step's typed state: ``gave_up``, ``undone_by``). A step an operator
    stated did not happen is not counted: that was a person's word, not the system's."""
    stated = any((a.settled_by or "").startswith("operator ") for a in step.attempts.items)
    if stated:
        return False
    if step.process_state is StepState.ERROR:
        return step.gave_up is not None and not step.gave_up.ambiguous
    if step.process_state is StepState.COMPENSATED and step.kind is StepKind.ACTION:
        return step.undone_by is None
    return False


def _check_effects(
    order: Order, applied: list[str], wanted: tuple[str, ...] | None, verdict: Verdict
) -> None:
    order_id = order.order_id
    if order.status.finished:
        # nothing left half undone: no step still being compensated, no failed compensation
        for step in order.steps:
            if step.process_state is StepState.COMPENSATING or (
                step.kind is StepKind.COMPENSATION and step.process_state is not StepState.PROCESSED
            ):
                verdict.wrong_effects.append(
                    f"{order_id}:{step.step} is {step.process_state} in a {order.status} order"
                )
    if wanted is not None:
        if _free_in_groups(order, applied) != _free_in_groups(order, list(wanted)):
            verdict.wrong_effects.append(f"{order_id}: {applied}, expected {list(wanted)}")
        return
    if order.status is OrderStatus.COMPLETED:
        skipped = {s.step for s in order.steps if s.process_state is StepState.SKIPPED}
        plan = []
        for p in order.plan.steps:
            if p.name.endswith("[]"):  # a ForEach's items: each record of this order
                plan += sorted({s.step for s in order.steps if template_of(s.step) == p.name})
            elif not p.waits:
                plan.append(p.name)
        plan = [name for name in plan if name not in skipped]
        if _free_in_groups(order, applied) != _free_in_groups(order, plan):
            verdict.wrong_effects.append(f"{order_id}: {applied}, expected {plan}")
    elif order.status in (OrderStatus.COMPENSATED, OrderStatus.CANCELLED):
        for step in order.steps:
            undo = order.planned(step.step).compensation if step.kind is StepKind.ACTION else None
            compensation = compensation_of(step.step, undo) if undo else None
            if _is_head(order, step.step):
                continue  # a ForEach's head: its list, no effect to undo
            if step.process_state is StepState.PROCESSED and compensation:
                verdict.wrong_effects.append(f"{order_id}:{step.step} never compensated")
            if compensation and step.step in applied and compensation not in applied:
                verdict.wrong_effects.append(f"{order_id}:{step.step} applied, never undone")


def _free_in_groups(order: Order, steps: list[str]) -> list[str]:
    """``steps`` with each run of consecutive steps of one parallel group (or of their
    compensations; or items of one ForEach, or of their compensations) sorted: the order
    among them is not the plan's to fix."""
    group: dict[str, tuple[int, bool]] = {}
    for planned in order.plan.steps:
        group[planned.name] = (planned.group, False)
        if planned.compensation:
            group[planned.compensation] = (planned.group, True)
    out: list[str] = []
    run: list[str] = []
    for step in [*steps, ""]:
        if run and (not step or group.get(template_of(step)) != group.get(template_of(run[0]))):
            out += sorted(run)
            run = []
        if template_of(step) in group:
            run.append(step)
        elif step:
            out.append(step)
    return out


def check_ids(ledger: list[dict[str, Any]]) -> list[str]:
    """Compensations that undid an effect without naming the id it handed out."""
    handed = {
        (e["orderId"], e["step"]): e.get("ids")
        for e in ledger
        if e.get("kind") == "effect" and e.get("ids")
    }
    wrong = []
    for entry in ledger:
        if entry.get("kind") != "compensation" or not entry.get("undid"):
            continue
        ids = handed.get((entry["orderId"], entry["compensates"]))
        if ids and entry.get("ids") != ids:
            wrong.append(f"{entry['orderId']}:{entry['step']} named {entry.get('ids')}, not {ids}")
    return wrong


#: The instances' clocks agree (a chaos run passes how far one runs ahead).
NO_SKEW: Final = timedelta(0)
#: The statuses that give an order's slot back (``error`` too, unless ``hold_on_error``).
_RELEASING = frozenset({"completed", "compensated", "cancelled"})


def turn_spans(order: Order) -> list[tuple[datetime, datetime | None]]:
    """When the order held a slot of its key, from its history: from each ``turn-taken``
    to the status that gave the slot back (None: it still holds it). None for an order
    without a key."""
    rule = order.plan.concurrency
    if rule is None or not rule.order_key:
        return []
    ending = _RELEASING if rule.hold_on_error else _RELEASING | {"error"}
    spans: list[tuple[datetime, datetime | None]] = []
    taken: datetime | None = None
    for entry in order.history:
        if entry.get("event") == Happened.TURN_TAKEN and taken is None:
            taken = parse_iso(entry["at"])
        elif entry.get("event") == Happened.STATUS and entry.get("status") in ending and taken:
            spans.append((taken, parse_iso(entry["at"])))
            taken = None
    if taken is not None:
        # no status event said it gave the slot back (a status passed through silently,
        # or a history cut short): it held it until its last change, if it holds it no more
        spans.append((taken, order.updated_at if turns.gives_back(order) else None))
    return spans


def check_turns(orders: dict[str, Order | None], skew: timedelta = NO_SKEW) -> list[str]:
    """Each moment an order took its turn while its key's limit of other orders of the
    same workflow and key were running: ``<orderId> ran beside <others> (key k, limit n)``.
    ``skew``: how far the clocks of the instances that wrote the histories may run apart
    (an end written on a clock ahead is read as early as that, and a start written on one
    is not read as after another's: an overlap shorter than the skew is not told)."""
    by_key: dict[tuple[str, str], list[tuple[datetime, datetime | None, str]]] = {}
    limits: dict[tuple[str, str], int] = {}
    for order_id, order in orders.items():
        if order is None or order.plan.concurrency is None:
            continue
        key = (order.workflow, order.plan.concurrency.order_key)
        limits[key] = order.plan.concurrency.limit
        by_key.setdefault(key, []).extend((a, b, order_id) for a, b in turn_spans(order))
    wrong = []
    for key, spans in by_key.items():
        for start, _, order_id in spans:
            beside = sorted(
                other
                for a, b, other in spans
                if other != order_id and a + skew <= start and (b is None or start < b - skew)
            )
            if len(beside) >= limits[key]:
                wrong.append(
                    f"{order_id} ran beside {', '.join(beside)} (key {key[1]}, limit {limits[key]})"
                )
    return wrong


def verify(
    orders: dict[str, Order | None],
    ledger: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    expected: dict[str, str] | None = None,
    expected_effects: dict[str, tuple[str, ...]] | None = None,
    max_failures: int | None = None,
    skew: timedelta = NO_SKEW,
) -> Verdict:
    """``skew``: how far the instances' clocks may run apart (the chaos run's one ahead)."""
    verdict = Verdict(orders=len(orders), alerts=len(alerts), effects=len(ledger))
    by_order = effects_by_order(ledger)
    alerted = {(a.get("orderId"), a.get("step")) for a in alerts}
    verdict.double_effects = [f"{o}:{s}" for o, s in double_effects(ledger)]
    verdict.ids_not_carried = [w for w in check_ids(ledger) if w.split(":")[0] in orders]
    verdict.overlapping_turns = check_turns(orders, skew)
    for order_id, order in orders.items():
        if order is None:
            verdict.lost.append(order_id)
            continue
        verdict.statuses[str(order.status)] += 1
        if not order.status.terminal:
            verdict.stuck.append(f"{order_id}({order.status})")
            continue
        if expected is not None and order_id in expected:
            exhausted = max_failures is not None and any(
                s.process_state is StepState.ERROR
                and sum(
                    1
                    for a in s.attempts.items
                    if a.counted and a.ending in (Outcome.EXPIRED, Outcome.TRANSIENT)
                )
                >= max_failures
                for s in order.steps
            )
            if str(order.status) == expected[order_id]:
                verdict.as_expected += 1
            elif exhausted:
                verdict.exhausted.append(order_id)
            elif _told_in_doubt(order, by_order.get(order_id, []), alerts):
                verdict.doubted.append(order_id)
            else:
                verdict.unexpected.append(
                    f"{order_id}: {order.status}, expected {expected[order_id]}"
                )
        applied = by_order.get(order_id, [])
        for step in order.steps:
            verdict.attempts += step.attempt
            verdict.expiries += sum(1 for a in step.attempts.items if a.ending is Outcome.EXPIRED)
            stale, wrong = check_history(order, step)
            verdict.stale_applied += stale
            verdict.inconsistent_history += wrong
            if (
                order.status is OrderStatus.ERROR
                and step is _latest_failed(order)
                and (order_id, declared_name(step.step)) not in alerted
            ):
                # an order waiting for an operator: the step it waits on was alerted
                verdict.unalerted.append(f"{order_id}:{step.step}")
            if step.kind is StepKind.ACTION and said_not_applied(step) and step.step in applied:
                # told "not applied" (or refused, or cancelled with nothing to undo), yet done
                verdict.effects_after_definite_failure.append(f"{order_id}:{step.step}")
        _check_effects(order, applied, (expected_effects or {}).get(order_id), verdict)
    return verdict
