"""What the product's own workflows send (docs/contracts.md §3.13, §3.16): the ids their
compensations name, a shipment the carrier confirms later, and an order's lines, each
reserved on its own.

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


def order_lines(ctx: Context) -> Any:
    """``order-lines``: the order's lines, one ``reserve-line`` each (§3.16)."""
    return ctx.order.get("lines")


def reserve_line(ctx: Context) -> dict[str, Any]:
    """One line: the order's JSON, which line (``ctx.index``) and what it is."""
    return {**ctx.order, "line": ctx.index, "item": ctx.item}


def release_line(ctx: Context) -> dict[str, Any]:
    """Undo one line: name the reservation that line's own reserve-line handed out."""
    own = _id(ctx, f"reserve-line[{ctx.index}]", "reservation")
    return {**ctx.order, "line": ctx.index, "reservation": own}


def ship_lines(ctx: Context) -> dict[str, Any]:
    """The parcel: every line's reservation, in line order (``ctx.results`` of the
    ForEach is the list of its items' results)."""
    lines = ctx.results["reserve-line"]
    return {**ctx.order, "reservations": [line["reservation"] for line in lines]}


def customer(ctx: Context) -> Any:
    """``per-customer``'s concurrency key: the order's ``customer`` (§3.16). Absent: no
    limit for that order; anything but a string of 1-256 characters: the order is rejected
    and an operator told."""
    return ctx.order.get("customer")
