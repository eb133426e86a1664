"""What must hold at the end of a run, checked from the outside (table, queues, ledger).

Used by the demo's summary and by the e2e and chaos suites: nothing lost,
nothing stuck, every effect applied once, every failed-for-good step alerted.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from core.model import Order
from core.states import StepKind, StepState
from runtime.context import AppContext
from simulator import double_effects, effects_by_order


@dataclass
class Verdict:
    orders: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    double_effects: list[str] = field(default_factory=list)
    wrong_effects: list[str] = field(default_factory=list)
    unalerted: list[str] = field(default_factory=list)
    retries: int = 0
    attempts: int = 0
    alerts: int = 0
    effects: int = 0

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.stuck
            or self.unexpected
            or self.double_effects
            or self.wrong_effects
            or self.unalerted
        )

    def problems(self) -> list[str]:
        out = []
        for name in ("lost", "stuck", "unexpected", "double_effects", "wrong_effects", "unalerted"):
            items = getattr(self, name)
            if items:
                out.append(
                    f"{name}: {', '.join(items[:10])}"
                    + (f" (+{len(items) - 10})" if len(items) > 10 else "")
                )
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "orders": self.orders,
            "statuses": dict(self.statuses),
            "lost": len(self.lost),
            "stuck": len(self.stuck),
            "unexpected": len(self.unexpected),
            "doubleEffects": len(self.double_effects),
            "wrongEffects": len(self.wrong_effects),
            "unalertedErrors": len(self.unalerted),
            "retries": self.retries,
            "attempts": self.attempts,
            "alerts": self.alerts,
            "effects": self.effects,
        }


def load_orders(ctx: AppContext, order_ids: list[str]) -> dict[str, Order | None]:
    return {order_id: ctx.store.load(order_id) for order_id in order_ids}


def verify(
    orders: dict[str, Order | None],
    ledger: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    expected: dict[str, str] | None = None,
    expected_effects: dict[str, tuple[str, ...]] | None = None,
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
        if expected and expected.get(order_id) not in (None, str(order.status)):
            verdict.unexpected.append(f"{order_id}: {order.status}, expected {expected[order_id]}")
        for step in order.steps:
            verdict.attempts += step.attempt
            verdict.retries += sum(1 for h in step.history if h["event"] == "expired")
            if step.process_state is StepState.ERROR and (order_id, step.step) not in alerted:
                verdict.unalerted.append(f"{order_id}:{step.step}")
        applied = by_order.get(order_id, [])
        if expected_effects is not None and order_id in expected_effects:
            if tuple(applied) != expected_effects[order_id]:
                verdict.wrong_effects.append(
                    f"{order_id}: {applied}, expected {list(expected_effects[order_id])}"
                )
        elif str(order.status) == "completed":
            wanted = [p.name for p in order.plan.steps]
            if applied != wanted:
                verdict.wrong_effects.append(f"{order_id}: {applied}, expected {wanted}")
        elif str(order.status) == "compensated":
            undone = {s.step for s in order.steps if s.kind is StepKind.COMPENSATION}
            standing = [s for s in applied if s not in undone]
            compensable = {p.name for p in order.plan.steps if p.compensation}
            left = [
                s
                for s in standing
                if s in compensable and order.planned(s).compensation not in applied
            ]
            if left:
                verdict.wrong_effects.append(f"{order_id}: {left} applied and never undone")
    return verdict


def drain_alerts(ctx: AppContext) -> list[dict[str, Any]]:
    client = ctx.queues.client(ctx.names.operator_alerts)
    out: list[dict[str, Any]] = []
    for message in client.receive_messages(messages_per_page=32, visibility_timeout=60):
        out.append(json.loads(message.content))
        client.delete_message(message)
    return out
