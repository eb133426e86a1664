"""The demo's orders: each names the fault it meets and the outcome it must reach."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HANG_FOREVER = {"fail": "hang", "times": 99, "seconds": 3600, "applyFirst": False}
#: What the demo does to an order as an operator would, through the HTTP API: approve or
#: refuse its ``approved`` event while it waits for it, or cancel it in its cooling-off.
OPERATOR_ACTIONS = ("approve", "refuse", "cancel")


@dataclass(frozen=True)
class Scenario:
    order_id: str
    title: str
    expected: str  # the order status it must end in
    workflow: str = "order"
    simulate: dict[str, Any] = field(default_factory=dict)
    # remote effects (and undos) applied, in the order applied (the steps of a parallel
    # group, and their undos, in any order among themselves)
    effects: tuple[str, ...] = ()
    amount: int = 42
    operator: str | None = None  # one of OPERATOR_ACTIONS
    lines: tuple[dict[str, Any], ...] = ()  # an order-lines order's lines, one item each
    customer: str = "demo"  # per-customer's key: one order of a customer at a time

    def message(self, reply_to: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "orderId": self.order_id,
            "workflow": self.workflow,
            "replyTo": reply_to,
            "customer": self.customer,
            "amount": self.amount,
        }
        if self.lines:
            body["lines"] = list(self.lines)
        if self.simulate:
            body["simulate"] = self.simulate
        return body


def scenarios(prefix: str, copies: int = 1) -> list[Scenario]:
    out: list[Scenario] = []
    for n in range(copies):
        p = f"{prefix}{n:02d}" if copies > 1 else prefix
        full = ("reserve-stock", "charge-payment", "ship")
        out += [
            Scenario(f"{p}-ok-1", "no fault", "completed", effects=("process",)),
            Scenario(f"{p}-ok-2", "no fault", "completed", effects=("process",)),
            Scenario(f"{p}-ok-3", "no fault", "completed", effects=("process",)),
            Scenario(
                f"{p}-transient",
                "two 503s, retried by the agent",
                "completed",
                simulate={"process": "transient:2"},
                effects=("process",),
            ),
            Scenario(
                f"{p}-throttled",
                "429 with Retry-After: 1",
                "completed",
                simulate={
                    "process": {"fail": "transient", "times": 1, "status": 429, "retryAfter": 1}
                },
                effects=("process",),
            ),
            Scenario(
                f"{p}-dropped",
                "connection dropped after applying",
                "completed",
                simulate={"process": {"fail": "drop", "times": 1, "applyFirst": True}},
                effects=("process",),
            ),
            Scenario(
                f"{p}-hang",
                "hangs past the deadline once (applied first)",
                "completed",
                simulate={"process": "hang:1"},
                effects=("process",),
            ),
            Scenario(f"{p}-declined", "permanent 422", "error", simulate={"process": "permanent"}),
            Scenario(
                f"{p}-dead",
                "never answers: given up after 3 attempts, alerted",
                "error",
                simulate={"process": HANG_FOREVER},
            ),
            Scenario(
                f"{p}-ful-ok", "fulfilment, no fault", "completed", "fulfilment", effects=full
            ),
            Scenario(
                f"{p}-ful-flaky",
                "fulfilment, flaky payment",
                "completed",
                "fulfilment",
                simulate={"charge-payment": "transient:2", "ship": "hang:1"},
                effects=full,
            ),
            Scenario(
                f"{p}-ful-card",
                "card declined: stock released",
                "compensated",
                "fulfilment",
                simulate={"charge-payment": "permanent"},
                effects=("reserve-stock", "release-stock"),
            ),
            Scenario(
                f"{p}-ful-ship",
                "shipping refused: refund, release",
                "compensated",
                "fulfilment",
                simulate={"ship": "permanent"},
                effects=("reserve-stock", "charge-payment", "refund-payment", "release-stock"),
            ),
            Scenario(
                f"{p}-ful-stuck",
                "payment never answers: refund, release",
                "compensated",
                "fulfilment",
                simulate={"charge-payment": HANG_FOREVER},
                effects=("reserve-stock", "refund-payment", "release-stock"),
            ),
            Scenario(
                f"{p}-ful-norefund",
                "ship refused and refund fails: operator",
                "error",
                "fulfilment",
                simulate={"ship": "permanent", "refund-payment": "permanent"},
                effects=("reserve-stock", "charge-payment"),
            ),
            *checkouts(p),
            *lined(p),
            *queued(p),
        ]
    return out


def checkouts(p: str) -> list[Scenario]:
    """``checkout`` (declarations/__init__.py): stock and payment at once, an approval for
    1000 or more, a 3 s cooling-off, a carrier that calls back; undos name their ids."""
    full = ("reserve-stock", "charge-payment", "ship")
    undone = ("reserve-stock", "charge-payment", "refund-payment", "release-stock")
    return [
        Scenario(
            f"{p}-chk-ok",
            "checkout: both at once, a callback",
            "completed",
            "checkout",
            effects=full,
        ),
        Scenario(
            f"{p}-chk-approved",
            "checkout 1500: approved via the API",
            "completed",
            "checkout",
            effects=full,
            amount=1500,
            operator="approve",
        ),
        Scenario(
            f"{p}-chk-refused",
            "checkout 2500: refused via the API",
            "compensated",
            "checkout",
            effects=undone,
            amount=2500,
            operator="refuse",
        ),
        Scenario(
            f"{p}-chk-cancel",
            "checkout: cancelled in its cooling-off",
            "cancelled",
            "checkout",
            effects=undone,
            operator="cancel",
        ),
        Scenario(
            f"{p}-chk-lost",
            "carrier's callback lost: asked again",
            "completed",
            "checkout",
            simulate={"ship": {"callback": "lost"}},
            effects=full,
        ),
        Scenario(
            f"{p}-chk-carrier",
            "carrier refuses by callback: undone",
            "compensated",
            "checkout",
            simulate={"ship": {"callback": "refuse:no driver today"}},
            effects=undone,
        ),
    ]


#: An order-lines order's lines: reserved two at a time, one ``reserve-line[<i>]`` each.
LINES: tuple[dict[str, Any], ...] = (
    {"sku": "boots", "qty": 1},
    {"sku": "socks", "qty": 3},
    {"sku": "tent", "qty": 1},
)


def lined(p: str) -> list[Scenario]:
    """``order-lines`` (declarations/__init__.py): the charge, then a ForEach that reserves
    each line on its own, two at a time, then the parcel with every line's reservation."""
    items = ("reserve-line[0]", "reserve-line[1]", "reserve-line[2]")
    return [
        Scenario(
            f"{p}-lines-ok",
            "3 lines, each reserved, 2 at a time",
            "completed",
            "order-lines",
            effects=("charge-payment", *items, "ship"),
            lines=LINES,
        ),
        Scenario(
            f"{p}-lines-out",
            "line 2 out of stock: lines 0, 1 released",
            "compensated",
            "order-lines",
            # line 2 starts only once line 0 or 1 has ended, and the other finishes its
            # attempt: both applied, both released, each with its own reservation
            simulate={"reserve-line[2]": "permanent"},
            effects=(
                "charge-payment",
                *items[:2],
                "release-line[1]",
                "release-line[0]",
                "refund-payment",
            ),
            lines=LINES,
        ),
    ]


#: How long each per-customer order's call takes (the simulator's ``latencyMs``): long
#: enough to see the customer's next orders wait for their turn in the live table.
TURN_MS = 1500


def queued(p: str) -> list[Scenario]:
    """``per-customer`` (declarations/__init__.py, §3.16): three orders of one customer
    sent at once run one after the other, the others waiting for their turn; one of
    another customer runs at once beside them."""
    slow = {"process": {"latencyMs": TURN_MS}}
    ann, bob = f"{p}-ann", f"{p}-bob"
    return [
        *(
            Scenario(
                f"{p}-ann-{n}",
                f"customer ann's order {n} of 3: one at a time",
                "completed",
                "per-customer",
                simulate=slow,
                effects=("process",),
                customer=ann,
            )
            for n in (1, 2, 3)
        ),
        Scenario(
            f"{p}-bob-1",
            "customer bob: beside ann's, at once",
            "completed",
            "per-customer",
            simulate=slow,
            effects=("process",),
            customer=bob,
        ),
    ]


#: Messages that must be rejected (kept in orders-rejected with a reason).
BAD_MESSAGES: tuple[str, ...] = (
    "this is not JSON",
    '{"orderId": "has spaces"}',
    '{"orderId": "x-1", "workflow": "teleport"}',
)


#: The outage act: the remote services answer 503 to everything, then refuse
#: connections, then come back. Orders submitted into it must all complete, without an
#: alert, and the remote must see only a trickle of probes while it is down.
OUTAGE_PHASES: tuple[dict[str, Any], ...] = (
    {"mode": "error", "status": 503, "seconds": 12},
    {"mode": "unreachable", "seconds": 10},
)


def outage_orders(prefix: str, count: int = 12) -> list[Scenario]:
    full = ("reserve-stock", "charge-payment", "ship")
    out = []
    for n in range(count):
        if n % 3 == 2:
            out.append(
                Scenario(
                    f"{prefix}-out-{n:02d}",
                    "fulfilment, in the outage",
                    "completed",
                    "fulfilment",
                    effects=full,
                )
            )
        else:
            out.append(
                Scenario(
                    f"{prefix}-out-{n:02d}", "in the outage", "completed", effects=("process",)
                )
            )
    return out
