"""The operator console (``GET /api/console``): server-rendered pages over the operator
use cases (``admin.service.OrderAdmin``), protected like the operator API.

Pages: the order list (filters in the URL, ``?waiting=<event>`` for the orders waiting
for an event, ``?<field>=<value>`` for a search by a field a workflow declares: contract
3.14), an order's detail with its timeline and the events it waits for, a
confirmation before every change (an event sent included), bulk actions with a dry run,
the inbox of events, the alerts and what retention would archive. The
page structure is described in ``docs/console-dom.md``; the protection in
``console/security.py``.

Every page reads and acts through the operator's services, the same the API uses
(``admin/service.py``, ``admin/agent_admin.py``, ``admin/watch.py``,
``admin/archiving.py``), which the app hands in (``bootstrap.uses``): never a store.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import azure.functions as func

from admin.callers import MAX_REASON_CHARS, caller_of
from admin.query import parse_filter, parse_page_size, searchable_text
from admin.service import BULK_ACTIONS, COUNT_CAP, MAX_BULK, order_view, paused_view
from bootstrap import uses
from config.principals import Access
from console import (
    agent_pages,
    bodies,
    dashboard_page,
    event_pages,
    fix_pages,
    layout,
    pages,
    security,
    views,
)
from console.pages import ASSETS, FILTER_KEYS, Page, Route, filters_of, form_of, guard, trouble
from core.errors import (
    InvalidContinuationToken,
    OrderNotFound,
    TransitionRefused,
)
from core.order_message import is_valid_order_id
from core.ports import ListFilter
from core.states import OrderStatus
from core.workflows import search_fields

#: What the list's filters name for themselves; any other name is a field to search by.
FILTER_PARAMS = frozenset(FILTER_KEYS)

bp = func.Blueprint()
#: No function key: a page must never carry it (in a link, a form, the history). Every
#: route needs a principal instead, and the role for what it does (``@access``; none for
#: the stylesheet and script, which hold nothing secret).
ANONYMOUS = func.AuthLevel.ANONYMOUS

#: What the pages use of the app: the operator's services, its settings and clock.
_settings = uses(lambda app: app.settings)
_orders = uses(lambda app: app.admin)
_events = uses(lambda app: app.events)
_agents = uses(lambda app: app.agents_admin)
_watch = uses(lambda app: app.watch)
_retainer = uses(lambda app: app.retainer)
_names = uses(lambda app: app.names)
_clock = uses(lambda app: app.clock)


def _page(req: func.HttpRequest) -> Page:
    return Page(req, _settings())


def access(need: Access) -> Callable[[Route], Route]:
    """The route does ``need`` (``console.pages.access``), by the app's settings."""
    return pages.access(need, _settings)


def caller(req: func.HttpRequest) -> str:
    """Who acts, for the history (``admin/callers.py``)."""
    return caller_of(_settings().sign_in.principal(req.headers, req.params), req.headers)


# --- list ---------------------------------------------------------------------------------


@bp.route(route="console", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.READ)
def console_list(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    if "searchField" in req.params:  # the search box: to the URL that names the search
        return _search_redirect(page)
    filters = filters_of(req.params)
    try:
        where = parse_filter(filters, known=FILTER_PARAMS)
        page_size = parse_page_size(filters["pageSize"])
    except ValueError as exc:
        return page.render("message.html", 400, message=str(exc), failed=True)
    token = req.params.get("page") or None

    def show() -> func.HttpResponse:
        admin = _orders()
        try:
            listing = admin.page(where, page_size, token)
        except InvalidContinuationToken as exc:
            return page.render("message.html", 400, message=str(exc), failed=True)
        return page.render(
            "list.html",
            filters=filters,
            # a search is not counted by status: that would read every order it matches
            counts=admin.counts(where) if where.search is None else None,
            cap=COUNT_CAP,
            orders=listing["orders"],
            unreadable=listing.get("unreadable", []),
            next_token=listing["continuationToken"],
            refreshing=filters["refresh"] != "off",
            max_bulk=MAX_BULK,
            actions=BULK_ACTIONS,
            events=event_pages.declared_events(),
            machine_events=event_pages.machine_events(),
            search=where.search,
            search_fields=search_fields(),
        )

    return trouble(page, show)


def _search_redirect(page: Page) -> func.HttpResponse:
    """``?searchField=F&searchValue=V`` (the search box's form) to ``?F=V``, the URL a
    search is shared by, with the list's other filters kept (but the status: a search
    looks at every status until one is chosen); an empty value clears the search."""
    params = page.req.params
    field_name = params.get("searchField") or ""
    value = params.get("searchValue") or ""
    kept = {k: params.get(k, "") for k in FILTER_KEYS if k not in ("status", "waiting")}
    if field_name not in search_fields():
        return page.render(
            "message.html", 400, message=f"{field_name[:64]!r}: {searchable_text()}", failed=True
        )
    if not value:
        return page.redirect("", kept)
    return page.redirect("", {**kept, field_name: value})


@bp.route(route="console/inbox", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.READ)
def console_inbox(req: func.HttpRequest) -> func.HttpResponse:
    """The events the deployed workflows declare, how many orders wait for each, and the
    link to each one's list (``/api/console?waiting=<event>``)."""
    page = _page(req)
    return trouble(page, lambda: event_pages.inbox(page, _orders()))


@bp.route(route="console/lookup", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.READ)
def console_lookup(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    order_id = (req.params.get("orderId") or "").strip()
    if not is_valid_order_id(order_id):
        return page.redirect(
            "", {"message": "An order id is 1-64 characters of A-Z a-z 0-9 - _.", "failed": 1}
        )

    def find() -> func.HttpResponse:
        if not _orders().exists(order_id):
            return page.redirect("", {"message": f"no order with id {order_id!r}", "failed": 1})
        return page.redirect(f"/orders/{order_id}", {})

    return trouble(page, find)


# --- detail and actions -------------------------------------------------------------------


def _order_id(req: func.HttpRequest) -> str | None:
    order_id = req.route_params.get("orderId", "")
    return order_id if is_valid_order_id(order_id) else None


def _detail(page: Page, order_id: str, status: int = 200, **extra: Any) -> func.HttpResponse:
    admin = _orders()
    order = admin.get(order_id)
    now = _clock()()  # the app's clock: the one its deadlines were set by
    pauses = admin.pauses()
    paused = paused_view(order, pauses)
    view = {**order_view(order, pauses), **admin.turn_of(order)}  # its key's slot (§3.16)
    for record, step in zip(order.steps, view["steps"], strict=True):
        # what the page says of each record: its body and result, its state in true words
        step["io"] = bodies.step_io(order, record, step)
        step["shown"] = views.state_label(order, record)
        for attempt in step["attempts"]:
            attempt["shownOutcome"] = views.attempt_outcome(record, attempt)
    fields: dict[str, Any] = {
        "editable": fix_pages.editable(order),
        **extra,  # a refused fix shows the operator's own edit again, not the stored data
    }
    return page.render(
        "detail.html",
        status,
        order=order,
        view=view,
        paused=paused,
        timeline=views.timeline(order, now),
        step_rows=layout.step_rows(order, view["steps"]),
        # the events it waits for now, each with who sends it; the page offers Approve /
        # Refuse for a person's decisions only: a remote answers on its own URL
        # (docs/contracts.md §3.15)
        awaited=[] if order.status.finished else event_pages.awaited(order, view["waitingFor"]),
        why=views.why(order, paused),
        can_resubmit=views.can_resubmit(order),
        can_fix=fix_pages.can_fix(order),
        can_cancel=views.can_cancel(order),
        **fields,
    )


@bp.route(route="console/orders/{orderId}", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.READ)
def console_order(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    order_id = _order_id(req)
    if order_id is None:
        return page.render("message.html", 400, message="Not an order id.", failed=True)

    def show() -> func.HttpResponse:
        try:
            return _detail(page, order_id)
        except OrderNotFound as exc:
            return page.render("message.html", 404, message=exc.message, failed=True)

    return trouble(page, show)


@bp.route(route="console/orders/{orderId}/confirm", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_confirm(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    order_id = _order_id(req)
    action = req.params.get("action", "")
    if order_id is None or action not in (*BULK_ACTIONS, *event_pages.DECISIONS):
        return page.render("message.html", 400, message="Nothing to confirm.", failed=True)
    if page.read_only:
        return page.render("message.html", 403, message="The console is read-only here.")
    if action in event_pages.DECISIONS:
        return trouble(page, lambda: event_pages.confirm(page, _orders(), order_id))
    reason = (req.params.get("reason") or "").strip()[:MAX_REASON_CHARS]
    if not reason:
        return page.redirect(
            f"/orders/{order_id}", {"message": "Give a reason for the record.", "failed": 1}
        )

    def show() -> func.HttpResponse:
        try:
            order = _orders().get(order_id)
        except OrderNotFound as exc:
            return page.render("message.html", 404, message=exc.message, failed=True)
        preview = order.cancel_preview(datetime.now(UTC)) if action == "cancel" else None
        return page.render(
            "confirm.html",
            order=order,
            action=action,
            reason=reason,
            why=views.why(order),
            preview=preview,
            doubts=views.doubts_of(order, preview) if preview else [],
        )

    return trouble(page, show)


def _act(req: func.HttpRequest, action: str) -> func.HttpResponse:
    page = _page(req)
    order_id = _order_id(req)
    if order_id is None:
        return page.render("message.html", 400, message="Not an order id.", failed=True)
    form = form_of(req)
    refused = guard(page, form)
    if refused is not None:
        return refused
    reason = form.get("reason", "").strip()[:MAX_REASON_CHARS]
    if not reason:
        return page.redirect(
            f"/orders/{order_id}", {"message": "Give a reason for the record.", "failed": 1}
        )
    by = caller(req)
    # The statement that doubtful steps did not happen: a ticked box for each, naming it.
    not_applied = [v for k, v in form.items() if k.startswith("not_applied") and v] or None

    def change() -> func.HttpResponse:
        admin = _orders()  # in here: its first use may meet a storage outage
        try:
            if action == "resubmit":
                admin.resubmit(order_id, by, reason)
                done = f"Resubmitted by {by}: the failed step is back to work."
            else:
                admin.cancel(order_id, by, reason, not_applied)
                done = f"Cancel requested by {by}: completed steps will be undone."
        except OrderNotFound as exc:
            return page.render("message.html", 404, message=exc.message, failed=True)
        except TransitionRefused as exc:
            return _detail(page, order_id, 409, message=f"Refused: {exc.message}", failed=True)
        return page.redirect(f"/orders/{order_id}", {"message": done})

    return trouble(page, change)


@bp.route(route="console/orders/{orderId}/resubmit", methods=["POST"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_resubmit(req: func.HttpRequest) -> func.HttpResponse:
    return _act(req, "resubmit")


@bp.route(route="console/orders/{orderId}/cancel", methods=["POST"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_cancel(req: func.HttpRequest) -> func.HttpResponse:
    return _act(req, "cancel")


def _fix(req: func.HttpRequest, step: str) -> func.HttpResponse:
    page = _page(req)
    order_id = _order_id(req)
    if order_id is None:
        return page.render("message.html", 400, message="Not an order id.", failed=True)

    def refused(status: int, message: str, edited: str | None = None) -> func.HttpResponse:
        kept = {} if edited is None else {"editable": edited}
        try:
            return _detail(page, order_id, status, message=message, failed=True, **kept)
        except OrderNotFound:
            return page.render("message.html", status, message=message, failed=True)

    def act() -> func.HttpResponse:
        admin = _orders()
        if step == "preview":
            return fix_pages.preview(page, admin, order_id, refused)
        return fix_pages.fix(page, admin, order_id, caller(req), refused)

    return trouble(page, act)


@bp.route(route="console/orders/{orderId}/fix/preview", methods=["POST"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_fix_preview(req: func.HttpRequest) -> func.HttpResponse:
    """What a fix of the order's data would change (docs/contracts.md §3.14): nothing
    changes."""
    return _fix(req, "preview")


@bp.route(route="console/orders/{orderId}/fix", methods=["POST"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_fix(req: func.HttpRequest) -> func.HttpResponse:
    """Fix the order's data and resubmit it, as previewed."""
    return _fix(req, "fix")


@bp.route(route="console/orders/{orderId}/events/{name}", methods=["POST"], auth_level=ANONYMOUS)
@access(Access.EVENT)
def console_event(req: func.HttpRequest) -> func.HttpResponse:
    """Send the event ``name`` to the order (``action`` approve, with ``result`` and an
    optional note in ``reason``; or refuse, with its ``reason``), as confirmed. Through
    ``events``: the step that comes next is claimed and requested at once, as the API's."""
    page = _page(req)
    order_id = _order_id(req)
    if order_id is None:
        return page.render("message.html", 400, message="Not an order id.", failed=True)
    name = req.route_params.get("name", "")

    def refused(status: int, message: str, edited: str | None = None) -> func.HttpResponse:
        kept = {} if edited is None else {"editable": edited}
        try:
            return _detail(page, order_id, status, message=message, failed=True, **kept)
        except OrderNotFound:  # gone since (retention): the refusal still says why
            return page.render("message.html", status, message=message, failed=True)

    def send() -> func.HttpResponse:
        events = _events()
        return event_pages.deliver(page, events, order_id, name, caller(req), refused)

    return trouble(page, send)


# --- bulk ----------------------------------------------------------------------------------


def _bulk_form(page: Page) -> tuple[dict[str, str], ListFilter, str, str] | func.HttpResponse:
    form = form_of(page.req)
    refused = guard(page, form)
    if refused is not None:
        return refused
    filters = filters_of(form)
    action = form.get("action", "")
    reason = form.get("reason", "").strip()[:MAX_REASON_CHARS]
    try:
        where = parse_filter(filters, known=FILTER_PARAMS)
    except ValueError as exc:
        return page.render("message.html", 400, message=str(exc), failed=True)
    if action not in BULK_ACTIONS:
        return page.render("message.html", 400, message="Choose an action.", failed=True)
    if not reason:
        return page.redirect("", {**filters, "message": "Give a reason.", "failed": 1})
    filters["_ids"] = form.get("ids", "")
    return filters, where, action, reason


@bp.route(route="console/bulk/preview", methods=["POST"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_bulk_preview(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    parsed = _bulk_form(page)
    if isinstance(parsed, func.HttpResponse):
        return parsed
    filters, where, action, reason = parsed
    filters.pop("_ids")

    def preview() -> func.HttpResponse:
        ids = _orders().bulk_targets(where)
        return page.render(
            "bulk_preview.html",
            filters=filters,
            action=action,
            reason=reason,
            ids=ids,
            max_bulk=MAX_BULK,
            search=where.search,
        )

    return trouble(page, preview)


@bp.route(route="console/bulk/run", methods=["POST"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_bulk_run(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    parsed = _bulk_form(page)
    if isinstance(parsed, func.HttpResponse):
        return parsed
    filters, _, action, reason = parsed
    ids = [i for i in filters.pop("_ids").split(",") if is_valid_order_id(i)][:MAX_BULK]

    def run() -> func.HttpResponse:
        result = _orders().bulk(action, ids, caller(req), reason)
        return page.render("bulk_result.html", filters=filters, result=result)

    return trouble(page, run)


# --- agents at runtime ----------------------------------------------------------------------


@bp.route(route="console/agents", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.READ)
def console_agents(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    return trouble(page, lambda: agent_pages.listing(page, _agents()))


@bp.route(route="console/agents/{agent}/confirm", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_agent_confirm(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    agent = req.route_params.get("agent", "")
    return trouble(page, lambda: agent_pages.confirm(page, _agents(), agent, caller(req)))


@bp.route(route="console/agents/{agent}/change", methods=["POST"], auth_level=ANONYMOUS)
@access(Access.CHANGE)
def console_agent_change(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)
    agent = req.route_params.get("agent", "")
    return trouble(page, lambda: agent_pages.change(page, _agents(), agent, caller(req)))


# --- alerts and assets ---------------------------------------------------------------------


@bp.route(route="console/alerts", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.READ)
def console_alerts(req: func.HttpRequest) -> func.HttpResponse:
    page = _page(req)

    def show() -> func.HttpResponse:
        watch = _watch()
        attention = _orders().page(ListFilter(OrderStatus.ERROR), 100)
        stuck, checked = dashboard_page.stuck_of(watch.stuck_rows())
        return page.render(
            "alerts.html",
            dash={"stuck": stuck, "stuck_checked": checked},
            alerts=watch.alerts(),
            rejected=watch.rejected(),
            kept=watch.kept(limit=50),
            attention=attention["orders"],
        )

    return trouble(page, show)


@bp.route(route="console/dashboard", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.READ)
def console_dashboard(req: func.HttpRequest) -> func.HttpResponse:
    """The figures the dashboard timer keeps, and the stuck steps (console/dashboard_page.py)."""
    page = _page(req)

    def show() -> func.HttpResponse:
        now = _clock()()  # the clock the dashboard timer kept its rows by
        dash = dashboard_page.load(_watch(), now)
        return page.render("dashboard.html", dash=dash, fmt=dashboard_page.ms)

    return trouble(page, show)


#: Orders a console dry run looks at, at most (the page stays quick; it says when more wait).
RETENTION_PREVIEW = 200


@bp.route(route="console/retention", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.READ)
def console_retention(req: func.HttpRequest) -> func.HttpResponse:
    """What the retention timer would archive now (a dry run; docs/contracts.md §3.12)."""
    page = _page(req)

    def show() -> func.HttpResponse:
        report = _retainer().purge(dry_run=True, limit=RETENTION_PREVIEW)
        settings = _settings()
        return page.render(
            "retention.html",
            report=report,
            container=_names().orders_archive,
            batch=settings.retention_batch,
            kept_days=settings.kept_days,
        )

    return trouble(page, show)


@bp.route(route="console/assets/{name}", methods=["GET"], auth_level=ANONYMOUS)
@access(Access.PUBLIC)
def console_asset(req: func.HttpRequest) -> func.HttpResponse:
    path = ASSETS.get(req.route_params.get("name", ""))
    if path is None:
        return func.HttpResponse(
            "not found",
            status_code=404,
            mimetype="text/plain",
            headers={**security.HEADERS, **security.transport_headers(req)},
        )
    mimetype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    headers = {
        **security.HEADERS,
        **security.transport_headers(req),
        # the browser's own cache only: a shared cache would keep whatever an old link
        # put in the URL (a function key in ?code=, once)
        "Cache-Control": "private, max-age=300",
    }
    return func.HttpResponse(path.read_bytes(), mimetype=mimetype, headers=headers)
