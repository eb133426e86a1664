"""The operator console (``GET /api/console``): server-rendered pages over the operator
use cases (``admin.service.OrderAdmin``), protected like the operator API.

Pages: the order list (filters in the URL), an order's detail with its timeline, a
confirmation before every change, bulk actions with a dry run, and the alerts. The
page structure is described in ``docs/console-dom.md``; the protection in
``console/security.py``.
"""

from __future__ import annotations

import json
import mimetypes
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import azure.functions as func

from admin.query import parse_filter, parse_page_size
from admin.service import BULK_ACTIONS, MAX_BULK, order_view
from admin.triggers import MAX_REASON_CHARS, caller
from console import inbox, security, views
from core.errors import (
    ConcurrencyConflict,
    CorruptOrder,
    OrderNotFound,
    StorageUnavailable,
    TransitionRefused,
)
from core.orders import is_valid_order_id
from core.states import OrderStatus
from core.workflows import WORKFLOWS
from runtime.context import app_context
from stores.listing import COUNT_CAP, InvalidContinuationToken, ListFilter

bp = func.Blueprint()

HERE = Path(__file__).parent
ASSETS = {p.name: p for p in (HERE / "assets").iterdir() if p.is_file()}
#: What the list keeps in its URL (and carries into every link and form).
FILTER_KEYS = ("status", "workflow", "from", "to", "pageSize", "refresh")
DEFAULT_STATUS = "error"


@cache
def _templates() -> Any:
    import jinja2  # only when a page is first drawn: the other functions never pay for it

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    return env


class Page:
    """One request's view of the console: its base path, the key to carry, its token."""

    def __init__(self, req: func.HttpRequest):
        self.req = req
        path = urlsplit(req.url).path
        self.root = path[: path.index("/console") + len("/console")] if "/console" in path else ""
        self.code = req.params.get("code") or ""
        held = security.cookie_token(req.headers.get("cookie"))
        self.csrf = held or security.new_token()
        self.new_cookie = held is None
        self.read_only = app_context().settings.console_read_only

    def url(self, path: str = "", params: Mapping[str, Any] | None = None) -> str:
        query = {k: str(v) for k, v in (params or {}).items() if v not in (None, "")}
        if self.code:
            query["code"] = self.code
        return f"{self.root}{path}" + (f"?{urlencode(query)}" if query else "")

    def render(self, template: str, status: int = 200, **context: Any) -> func.HttpResponse:
        body = (
            _templates()
            .get_template(template)
            .render(
                page=self,
                statuses=[s.value for s in OrderStatus],
                workflows=sorted(WORKFLOWS),
                message=context.pop("message", None) or self.req.params.get("message"),
                failed=context.pop("failed", False) or self.req.params.get("failed") == "1",
                **context,
            )
        )
        headers = dict(security.HEADERS)
        if self.new_cookie:
            secure = urlsplit(self.req.url).scheme == "https"
            headers["Set-Cookie"] = security.set_cookie(self.csrf, secure)
        return func.HttpResponse(
            body, status_code=status, mimetype="text/html", charset="utf-8", headers=headers
        )

    def redirect(self, path: str, params: Mapping[str, Any]) -> func.HttpResponse:
        headers = {**security.HEADERS, "Location": self.url(path, params)}
        return func.HttpResponse(status_code=303, headers=headers)


def _form(req: func.HttpRequest) -> dict[str, str]:
    body = req.get_body() or b""
    if len(body) > 64_000:
        return {}
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def _guard(page: Page, form: Mapping[str, str]) -> func.HttpResponse | None:
    """A refusal for a POST that is read-only or may be forged; None lets it through."""
    if page.read_only:
        return page.render(
            "message.html", 403, message="The console is read-only here.", failed=True
        )
    why = security.forged(
        page.req.headers.get("cookie"),
        form.get("csrf"),
        page.req.headers.get("origin"),
        page.req.headers.get("sec-fetch-site"),
        page.req.headers.get("host") or urlsplit(page.req.url).netloc,
    )
    if why is not None:
        return page.render("message.html", 403, message=f"Refused: {why}.", failed=True)
    return None


def _trouble(page: Page, call: Callable[[], func.HttpResponse]) -> func.HttpResponse:
    """The store's troubles as pages a person can act on."""
    try:
        return call()
    except (StorageUnavailable, ConcurrencyConflict) as exc:
        return page.render(
            "message.html", 503, message=f"Try again in a moment: {exc.message}", failed=True
        )
    except CorruptOrder as exc:
        return page.render("message.html", 500, message=exc.message, failed=True)


def _filters(params: Mapping[str, str]) -> dict[str, str]:
    kept = {k: params.get(k, "") for k in FILTER_KEYS}
    kept["status"] = kept["status"] or DEFAULT_STATUS
    return kept


# --- list ---------------------------------------------------------------------------------


@bp.route(route="console", methods=["GET"])
def console_list(req: func.HttpRequest) -> func.HttpResponse:
    page = Page(req)
    filters = _filters(req.params)
    try:
        where = parse_filter(filters)
        page_size = parse_page_size(filters["pageSize"])
    except ValueError as exc:
        return page.render("message.html", 400, message=str(exc), failed=True)
    token = req.params.get("page") or None

    def show() -> func.HttpResponse:
        admin = app_context().admin
        try:
            listing = admin.list(where, page_size, token)
        except InvalidContinuationToken as exc:
            return page.render("message.html", 400, message=str(exc), failed=True)
        return page.render(
            "list.html",
            filters=filters,
            counts=admin.counts(where),
            cap=COUNT_CAP,
            orders=listing["orders"],
            unreadable=listing.get("unreadable", []),
            next_token=listing["continuationToken"],
            refreshing=filters["refresh"] != "off",
            max_bulk=MAX_BULK,
            actions=BULK_ACTIONS,
        )

    return _trouble(page, show)


@bp.route(route="console/lookup", methods=["GET"])
def console_lookup(req: func.HttpRequest) -> func.HttpResponse:
    page = Page(req)
    order_id = (req.params.get("orderId") or "").strip()
    if not is_valid_order_id(order_id):
        return page.redirect(
            "", {"message": "An order id is 1-64 characters of A-Z a-z 0-9 - _.", "failed": 1}
        )

    def find() -> func.HttpResponse:
        if app_context().store.load(order_id) is None:
            return page.redirect("", {"message": f"no order with id {order_id!r}", "failed": 1})
        return page.redirect(f"/orders/{order_id}", {})

    return _trouble(page, find)


# --- detail and actions -------------------------------------------------------------------


def _order_id(req: func.HttpRequest) -> str | None:
    order_id = req.route_params.get("orderId", "")
    return order_id if is_valid_order_id(order_id) else None


def _detail(page: Page, order_id: str, status: int = 200, **extra: Any) -> func.HttpResponse:
    order = app_context().admin.get(order_id)
    now = datetime.now(UTC)
    return page.render(
        "detail.html",
        status,
        order=order,
        view=order_view(order),
        timeline=views.timeline(order, now),
        why=views.why(order),
        can_resubmit=views.can_resubmit(order),
        can_cancel=views.can_cancel(order),
        **extra,
    )


@bp.route(route="console/orders/{orderId}", methods=["GET"])
def console_order(req: func.HttpRequest) -> func.HttpResponse:
    page = Page(req)
    order_id = _order_id(req)
    if order_id is None:
        return page.render("message.html", 400, message="Not an order id.", failed=True)

    def show() -> func.HttpResponse:
        try:
            return _detail(page, order_id)
        except OrderNotFound as exc:
            return page.render("message.html", 404, message=exc.message, failed=True)

    return _trouble(page, show)


@bp.route(route="console/orders/{orderId}/confirm", methods=["GET"])
def console_confirm(req: func.HttpRequest) -> func.HttpResponse:
    page = Page(req)
    order_id = _order_id(req)
    action = req.params.get("action", "")
    if order_id is None or action not in BULK_ACTIONS:
        return page.render("message.html", 400, message="Nothing to confirm.", failed=True)
    if page.read_only:
        return page.render("message.html", 403, message="The console is read-only here.")
    reason = (req.params.get("reason") or "").strip()[:MAX_REASON_CHARS]
    if not reason:
        return page.redirect(
            f"/orders/{order_id}", {"message": "Give a reason for the record.", "failed": 1}
        )

    def show() -> func.HttpResponse:
        try:
            order = app_context().admin.get(order_id)
        except OrderNotFound as exc:
            return page.render("message.html", 404, message=exc.message, failed=True)
        return page.render(
            "confirm.html", order=order, action=action, reason=reason, why=views.why(order)
        )

    return _trouble(page, show)


def _act(req: func.HttpRequest, action: str) -> func.HttpResponse:
    page = Page(req)
    order_id = _order_id(req)
    if order_id is None:
        return page.render("message.html", 400, message="Not an order id.", failed=True)
    form = _form(req)
    refused = _guard(page, form)
    if refused is not None:
        return refused
    reason = form.get("reason", "").strip()[:MAX_REASON_CHARS]
    if not reason:
        return page.redirect(
            f"/orders/{order_id}", {"message": "Give a reason for the record.", "failed": 1}
        )
    by = caller(req)
    admin = app_context().admin

    def change() -> func.HttpResponse:
        try:
            if action == "resubmit":
                admin.resubmit(order_id, by, reason)
                done = f"Resubmitted by {by}: the failed step is back to work."
            else:
                admin.cancel(order_id, by, reason)
                done = f"Cancel requested by {by}: completed steps will be undone."
        except OrderNotFound as exc:
            return page.render("message.html", 404, message=exc.message, failed=True)
        except TransitionRefused as exc:
            return _detail(page, order_id, 409, message=f"Refused: {exc.message}", failed=True)
        return page.redirect(f"/orders/{order_id}", {"message": done})

    return _trouble(page, change)


@bp.route(route="console/orders/{orderId}/resubmit", methods=["POST"])
def console_resubmit(req: func.HttpRequest) -> func.HttpResponse:
    return _act(req, "resubmit")


@bp.route(route="console/orders/{orderId}/cancel", methods=["POST"])
def console_cancel(req: func.HttpRequest) -> func.HttpResponse:
    return _act(req, "cancel")


# --- bulk ----------------------------------------------------------------------------------


def _bulk_form(page: Page) -> tuple[dict[str, str], ListFilter, str, str] | func.HttpResponse:
    form = _form(page.req)
    refused = _guard(page, form)
    if refused is not None:
        return refused
    filters = _filters(form)
    action = form.get("action", "")
    reason = form.get("reason", "").strip()[:MAX_REASON_CHARS]
    try:
        where = parse_filter(filters)
    except ValueError as exc:
        return page.render("message.html", 400, message=str(exc), failed=True)
    if action not in BULK_ACTIONS:
        return page.render("message.html", 400, message="Choose an action.", failed=True)
    if not reason:
        return page.redirect("", {**filters, "message": "Give a reason.", "failed": 1})
    filters["_ids"] = form.get("ids", "")
    return filters, where, action, reason


@bp.route(route="console/bulk/preview", methods=["POST"])
def console_bulk_preview(req: func.HttpRequest) -> func.HttpResponse:
    page = Page(req)
    parsed = _bulk_form(page)
    if isinstance(parsed, func.HttpResponse):
        return parsed
    filters, where, action, reason = parsed
    filters.pop("_ids")

    def preview() -> func.HttpResponse:
        ids = app_context().admin.bulk_targets(where)
        return page.render(
            "bulk_preview.html",
            filters=filters,
            action=action,
            reason=reason,
            ids=ids,
            max_bulk=MAX_BULK,
        )

    return _trouble(page, preview)


@bp.route(route="console/bulk/run", methods=["POST"])
def console_bulk_run(req: func.HttpRequest) -> func.HttpResponse:
    page = Page(req)
    parsed = _bulk_form(page)
    if isinstance(parsed, func.HttpResponse):
        return parsed
    filters, _, action, reason = parsed
    ids = [i for i in filters.pop("_ids").split(",") if is_valid_order_id(i)][:MAX_BULK]

    def run() -> func.HttpResponse:
        result = app_context().admin.bulk(action, ids, caller(req), reason)
        return page.render("bulk_result.html", filters=filters, result=result)

    return _trouble(page, run)


# --- alerts and assets ---------------------------------------------------------------------


@bp.route(route="console/alerts", methods=["GET"])
def console_alerts(req: func.HttpRequest) -> func.HttpResponse:
    page = Page(req)

    def show() -> func.HttpResponse:
        ctx = app_context()
        attention = ctx.admin.list(ListFilter(OrderStatus.ERROR), 100)
        return page.render(
            "alerts.html",
            alerts=inbox.alerts(ctx),
            rejected=inbox.rejected(ctx),
            kept=ctx.kept.list(limit=50),
            attention=attention["orders"],
        )

    return _trouble(page, show)


@bp.route(route="console/assets/{name}", methods=["GET"])
def console_asset(req: func.HttpRequest) -> func.HttpResponse:
    path = ASSETS.get(req.route_params.get("name", ""))
    if path is None:
        return func.HttpResponse("not found", status_code=404, mimetype="text/plain")
    mimetype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    headers = {**security.HEADERS, "Cache-Control": "public, max-age=300"}
    return func.HttpResponse(path.read_bytes(), mimetype=mimetype, headers=headers)
