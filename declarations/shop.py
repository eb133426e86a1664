"""What the product's own workflows send (docs/contracts.md §3.13): the ids their
compensations name, and a shipment the carrier confirms later.

Each body is the order's JSON (what every step sent before ``input`` existed, so a
remote, and the simulator's ``simulate`` directives, see what they saw), plus what the
step needs from the steps before: a compensation names the id its step handed out
(``ctx.results[<the step it undoes>]``), so the remote knows what to undo. A step that
never answered handed out nothing the app knows: its compensation names none (``None``),
and a remote that did apply it refuses to guess (the order waits for an operator).
"""

from __future__ import annotations

from typing import Any

from core.workflows import Context, events_url

#: Orders of at least this amount wait for a person's approval (``checkout``).
APPROVAL_AMOUNT = 1000


def _id(ctx: Context, step: str, field: str) -> Any:
    """The id ``step`` handed out in ``field`` of its result (None: it never answered)."""
    return ctx.results.get(step, {}).get(field)


def release_stock(ctx: Context) -> dict[str, Any]:
    return {**ctx.order, "reservation": _id(ctx, "reserve-stock", "reservation")}


def refund_payment(ctx: Context) -> dict[str, Any]:
    return {**ctx.order, "charge": _id(ctx, "charge-payment", "charge")}


def needs_approval(ctx: Context) -> bool:
    return float(ctx.order.get("amount", 0)) >= APPROVAL_AMOUNT


def ship_and_call_back(ctx: Context) -> dict[str, Any]:
    """The carrier takes the parcel now (its 2xx is acceptance) and calls back, on the
    order's ``parcel-left`` event, once the parcel has left the depot."""
    return {
        **ctx.order,
        "reservation": ctx.results["reserve-stock"]["reservation"],
        "callback": {"url": events_url(ctx.order_id, "parcel-left")},
    }
