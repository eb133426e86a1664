"""System-wide invariants, checked from outside after a chaos run.

Only what must hold whatever failed: nothing lost, nothing stuck, every
effect once, nothing applied for a definite failure, every Error alerted,
no stale reply applied, every step's history consistent with its state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.model import Order, StepRecord
from core.states import OrderStatus, StepKind, StepState
from core.timefmt import parse_iso
from simulator import double_effects, effects_by_order


@dataclass
class ChaosReport:
    orders: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    expected: int = 0
    exhausted: list[str] = field(default_factory=list)  # Error after MAX deadline failures
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    double_effects: list[str] = field(default_factory=list)
    missing_effects: list[str] = field(default_factory=list)
    effects_after_definite_failure: list[str] = field(default_factory=list)
    unalerted: list[str] = field(default_factory=list)
    stale_applied: list[str] = field(default_factory=list)
    inconsistent_history: list[str] = field(default_factory=list)
    attempts: int = 0
    expiries: int = 0
    alerts: int = 0
    effects: int = 0
    kills: int = 0
    duplicated_replies: int = 0

    VIOLATIONS = (
        "lost",
        "stuck",
        "unexpected",
        "double_effects",
        "missing_effects",
        "effects_after_definite_failure",
        "unalerted",
        "stale_applied",
        "inconsistent_history",
    )

    def violations(self) -> dict[str, list[str]]:
        return {name: getattr(self, name) for name in self.VIOLATIONS if getattr(self, name)}

    def summary(self) -> dict[str, Any]:
        return {
            "orders": self.orders,
            "statuses": dict(self.statuses),
            "endedAsExpected": self.expected,
            "exhaustedRetries": len(self.exhausted),
            **{name: len(getattr(self, name)) for name in self.VIOLATIONS},
            "attempts": self.attempts,
            "deadlineExpiries": self.expiries,
            "alerts": self.alerts,
            "effects": self.effects,
            "kills": self.kills,
            "duplicatedReplies": self.duplicated_replies,
        }


def _attempt_deadlines(step: StepRecord) -> dict[int, datetime]:
    return {
        h["attempt"]: parse_iso(h["completeBy"]) for h in step.history if h["event"] == "claimed"
    }


def check_history(order: Order, step: StepRecord) -> tuple[list[str], list[str]]:
    """Replay a step's history: (stale replies applied, inconsistencies)."""
    stale: list[str] = []
    wrong: list[str] = []
    deadlines = _attempt_deadlines(step)
    current: int | None = None  # the attempt in flight
    state = "Pending"
    name = f"{order.order_id}:{step.step}"
    for event in step.history:
        kind = event["event"]
        if kind == "claimed":
            if state != "Pending":
                wrong.append(f"{name}: claimed while {state}")
            current, state = event["attempt"], "Processing"
        elif kind in ("succeeded", "failed"):
            attempt = event.get("attempt")
            if state != "Processing" or attempt != current:
                stale.append(
                    f"{name}: {kind} for attempt {attempt} while {state} (attempt {current})"
                )
            elif parse_iso(event["at"]) >= deadlines[attempt]:
                stale.append(f"{name}: {kind} for attempt {attempt} after its deadline")
            state = "Processed" if kind == "succeeded" else "Failed"
            current = None
        elif kind == "expired":
            if state != "Processing" or event.get("attempt") != current:
                wrong.append(f"{name}: expired attempt {event.get('attempt')} while {state}")
            state, current = "Expired", None
        elif kind == "retry-scheduled" or kind == "resubmitted":
            state = "Pending"
        elif kind == "error":
            state = "Error"
        elif kind == "compensating":
            state = "Compensating"
        elif kind in ("compensated",) or (
            kind == "cancelled" and "never ran" in str(event.get("note", ""))
        ):
            state = "Compensated"
    final = str(step.process_state)
    replayed = {
        "Processed": "Processed",
        "Error": "Error",
        "Compensating": "Compensating",
        "Compensated": "Compensated",
        "Pending": "Pending",
        "Processing": "Processing",
    }.get(state, state)
    if replayed != final:
        wrong.append(f"{name}: history ends {state}, record says {final}")
    return stale, wrong


def check(
    orders: dict[str, Order | None],
    expected: dict[str, str],
    ledger: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    max_failures: int,
) -> ChaosReport:
    report = ChaosReport(orders=len(orders), alerts=len(alerts), effects=len(ledger))
    applied = effects_by_order(ledger)
    alerted = {(a.get("orderId"), a.get("step")) for a in alerts}
    report.double_effects = [f"{o}:{s}" for o, s in double_effects(ledger)]
    for order_id, order in orders.items():
        if order is None:
            report.lost.append(order_id)
            continue
        report.statuses[str(order.status)] += 1
        if not order.status.terminal:
            report.stuck.append(f"{order_id}({order.status})")
            continue
        exhausted = any(
            s.process_state is StepState.ERROR
            and sum(1 for h in s.history if h["event"] == "expired") >= max_failures
            for s in order.steps
        )
        if str(order.status) == expected[order_id]:
            report.expected += 1
        elif exhausted:
            report.exhausted.append(order_id)
        else:
            report.unexpected.append(f"{order_id}: {order.status}, expected {expected[order_id]}")
        steps_applied = applied.get(order_id, [])
        for step in order.steps:
            report.attempts += step.attempt
            report.expiries += sum(1 for h in step.history if h["event"] == "expired")
            stale, wrong = check_history(order, step)
            report.stale_applied += stale
            report.inconsistent_history += wrong
            if step.process_state is StepState.ERROR and (order_id, step.step) not in alerted:
                report.unalerted.append(f"{order_id}:{step.step}")
            definite = any(h["event"] == "failed" for h in step.history) and not any(
                h["event"] == "succeeded" for h in step.history
            )
            if (
                step.kind is StepKind.ACTION
                and step.process_state is StepState.ERROR
                and definite
                and step.step in steps_applied
            ):
                report.effects_after_definite_failure.append(f"{order_id}:{step.step}")
        if order.status is OrderStatus.COMPLETED:
            wanted = [p.name for p in order.plan.steps]
            if steps_applied != wanted:
                report.missing_effects.append(f"{order_id}: {steps_applied} != {wanted}")
        if order.status is OrderStatus.COMPENSATED:
            for step in order.steps:
                if (
                    step.kind is StepKind.ACTION
                    and step.process_state is StepState.PROCESSED
                    and order.planned(step.step).compensation
                ):
                    report.missing_effects.append(f"{order_id}:{step.step} never compensated")
    return report
