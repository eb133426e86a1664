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
history does not replay to its state.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bootstrap import AppContext
from core.attempts import Ending
from core.events import ATTEMPT_ENDINGS, Event
from core.model import Order, StepRecord
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
)


@dataclass
class Verdict:
    orders: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    as_expected: int = 0
    exhausted: list[str] = field(default_factory=list)  # Error after MAX deadline failures
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    double_effects: list[str] = field(default_factory=list)
    wrong_effects: list[str] = field(default_factory=list)
    effects_after_definite_failure: list[str] = field(default_factory=list)
    unalerted: list[str] = field(default_factory=list)
    stale_applied: list[str] = field(default_factory=list)
    inconsistent_history: list[str] = field(default_factory=list)
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
            **{_camel(name): len(getattr(self, name)) for name in VIOLATIONS},
            "attempts": self.attempts,
            "deadlineExpiries": self.expiries,
            "alerts": self.alerts,
            "effects": self.effects,
        }


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def load_orders(ctx: AppContext, order_ids: list[str]) -> dict[str, Order | None]:
    return {order_id: ctx.store.load(order_id) for order_id in order_ids}


def drain_alerts(ctx: AppContext) -> list[dict[str, Any]]:
    """Everything on the operator-alerts queue (received and deleted)."""
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


def _deadlines(step: StepRecord) -> dict[int, datetime]:
    return {a.number: a.deadline for a in step.attempts.items}


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
    if step.history_dropped:
        # The middle of a long history was dropped: replay from its next claim on.
        state, claimed = "Unknown", max(h.get("attempt") or 0 for h in step.history)
    name = f"{order.order_id}:{step.step}"
    for event in step.history:
        kind = event["event"]
        attempt = event.get("attempt")
        if state == "Unknown" and kind != "claimed":
            continue
        if kind == Event.CLAIMED:
            if state not in ("Pending", "Unknown"):
                wrong.append(f"{name}: claimed while {state}")
            current, state = attempt, "Processing"
            claimed = max(claimed, attempt or 0)
        elif kind == Event.SUCCEEDED:
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
        elif kind in ATTEMPT_ENDINGS - {Event.SUCCEEDED}:
            if state != "Processing" or attempt != current:
                stale.append(f"{name}: {kind} for attempt {attempt} while {state} ({current})")
            state, current = "Ended", None
        elif kind == Event.GIVE_UP_HELD:
            state = "Processing"  # its attempt decided; the supervisor makes it final
        elif kind in (Event.RETRY_SCHEDULED, Event.RESUBMITTED):
            state = "Pending"
        elif kind == Event.ERROR:
            state = "Error"
        elif kind == Event.COMPENSATING:
            state = "Compensating"
        elif kind == Event.COMPENSATED or (
            kind == Event.CANCELLED and "nothing to undo" in str(event.get("note", ""))
        ):
            state = "Compensated"
    if state != str(step.process_state):
        wrong.append(f"{name}: history ends {state}, record says {step.process_state}")
    return stale, wrong


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
        if tuple(applied) != wanted:
            verdict.wrong_effects.append(f"{order_id}: {applied}, expected {list(wanted)}")
        return
    if order.status is OrderStatus.COMPLETED:
        plan = [p.name for p in order.plan.steps]
        if applied != plan:
            verdict.wrong_effects.append(f"{order_id}: {applied}, expected {plan}")
    elif order.status in (OrderStatus.COMPENSATED, OrderStatus.CANCELLED):
        for step in order.steps:
            compensation = (
                order.planned(step.step).compensation if step.kind is StepKind.ACTION else None
            )
            if step.process_state is StepState.PROCESSED and compensation:
                verdict.wrong_effects.append(f"{order_id}:{step.step} never compensated")
            if compensation and step.step in applied and compensation not in applied:
                verdict.wrong_effects.append(f"{order_id}:{step.step} applied, never undone")


def verify(
    orders: dict[str, Order | None],
    ledger: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    expected: dict[str, str] | None = None,
    expected_effects: dict[str, tuple[str, ...]] | None = None,
    max_failures: int | None = None,
) -> Verdict:
    verdict = Verdict(orders=len(orders), alerts=len(alerts), effects=len(ledger))
    by_order = effects_by_order(ledger)
    alerted = {(a.get("orderId"), a.get("step")) for a in alerts}
    verdict.double_effects = [f"{o}:{s}" for o, s in double_effects(ledger)]
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
                    if a.counted and a.ending in (Ending.EXPIRED, Ending.TRANSIENT)
                )
                >= max_failures
                for s in order.steps
            )
            if str(order.status) == expected[order_id]:
                verdict.as_expected += 1
            elif exhausted:
                verdict.exhausted.append(order_id)
            else:
                verdict.unexpected.append(
                    f"{order_id}: {order.status}, expected {expected[order_id]}"
                )
        applied = by_order.get(order_id, [])
        for step in order.steps:
            verdict.attempts += step.attempt
            verdict.expiries += sum(1 for a in step.attempts.items if a.ending is Ending.EXPIRED)
            stale, wrong = check_history(order, step)
            verdict.stale_applied += stale
            verdict.inconsistent_history += wrong
            if (
                order.status is OrderStatus.ERROR
                and step is _latest_failed(order)
                and (order_id, step.step) not in alerted
            ):
                # an order waiting for an operator: the step it waits on was alerted
                verdict.unalerted.append(f"{order_id}:{step.step}")
            if step.kind is StepKind.ACTION and said_not_applied(step) and step.step in applied:
                # told "not applied" (or refused, or cancelled with nothing to undo), yet done
                verdict.effects_after_definite_failure.append(f"{order_id}:{step.step}")
        _check_effects(order, applied, (expected_effects or {}).get(order_id), verdict)
    return verdict
