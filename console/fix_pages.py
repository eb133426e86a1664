"""The console's fix and resubmit (docs/contracts.md §3.14): an ``error`` order whose failed
step is known not to have applied offers its data, prefilled, to edit; "Preview the fix"
shows each field that would change, old and new, and changes nothing; "Fix and resubmit"
sends that change as a merge patch through the operator API's own use case
(``OrderAdmin.resubmit``), with the reason, and with the version the operator read, so
that a fix made meanwhile by someone else is refused (the 412 of the API), never
overwritten. Both are CSRF-checked POSTs: an order's data does not fit in a URL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import azure.functions as func

from admin.callers import MAX_REASON_CHARS
from admin.service import OrderAdmin
from console.pages import Page, form_of, guard
from core.errors import OrderChanged, OrderNotFound, TransitionRefused
from core.model import Order
from core.order_message import strict_json
from core.patches import InvalidPatch, apply_patch, history_of, patch_between
from core.states import OrderStatus

#: A form that carries an order's data: 64 KiB of JSON, urlencoded (up to 3 bytes a byte).
MAX_FIX_FORM_BYTES = 4 * 65_536 * 3

#: The detail page's answer for a refusal: ``(status, message, the operator's edited data)``.
Detail = Callable[[int, str, str | None], func.HttpResponse]


def can_fix(order: Order) -> bool:
    """An ``error`` order whose failed step may not have applied: its data may change."""
    if order.status is not OrderStatus.ERROR:
        return False
    return not order.failed_step().may_have_applied


def editable(order: Order) -> str:
    """The order's data as the editor shows it."""
    return json.dumps(order.body, indent=2, ensure_ascii=False)


def _read(page: Page) -> tuple[dict[str, str], str] | func.HttpResponse:
    form = form_of(page.req, MAX_FIX_FORM_BYTES)
    refused = guard(page, form)
    if refused is not None:
        return refused
    return form, form.get("reason", "").strip()[:MAX_REASON_CHARS]


def _version(form: dict[str, str]) -> int | None:
    text = form.get("version", "")
    return int(text) if text.isdigit() and len(text) <= 12 else None


def preview(page: Page, admin: OrderAdmin, order_id: str, detail: Detail) -> func.HttpResponse:
    read = _read(page)
    if isinstance(read, func.HttpResponse):
        return read
    form, reason = read
    data = form.get("data", "")
    if not reason:
        return detail(400, "Give a reason for the record.", data)
    try:
        order = admin.get(order_id)
    except OrderNotFound as exc:
        return page.render("message.html", 404, message=exc.message, failed=True)
    try:
        edited = strict_json(data)
    except ValueError as exc:
        return detail(400, f"The data is not JSON ({exc}): nothing was changed.", data)
    patch = patch_between(order.body, edited)
    try:
        _, found = apply_patch(order.body, patch)
    except InvalidPatch as exc:
        return detail(400, f"Refused: {exc.message}. Nothing was changed.", data)
    shown = history_of(found)
    return page.render(
        "fix_confirm.html",
        order=order,
        reason=reason,
        changes=shown["changed"],
        more=shown.get("changedMore", 0),
        patch=json.dumps(patch, separators=(",", ":"), ensure_ascii=False),
        version=_version(form) if form.get("version") else order.version,
    )


def fix(page: Page, admin: OrderAdmin, order_id: str, by: str, detail: Detail) -> func.HttpResponse:
    read = _read(page)
    if isinstance(read, func.HttpResponse):
        return read
    form, reason = read
    if not reason:
        return detail(400, "Give a reason for the record.", None)
    try:
        patch: Any = strict_json(form.get("patch", ""))
    except ValueError as exc:
        return detail(400, f"The change is not JSON ({exc}): nothing was changed.", None)
    try:
        admin.resubmit(order_id, by, reason, patch, _version(form))
    except OrderNotFound as exc:
        return page.render("message.html", 404, message=exc.message, failed=True)
    except InvalidPatch as exc:
        return detail(400, f"Refused: {exc.message}. Nothing was changed.", None)
    except OrderChanged as exc:
        return detail(412, f"Refused: {exc.message}. Nothing was changed.", None)
    except TransitionRefused as exc:
        return detail(409, f"Refused: {exc.message}", None)
    done = f"Fixed and resubmitted by {by}: the failed step is back to work with the new data."
    return page.redirect(f"/orders/{order_id}", {"message": done})
