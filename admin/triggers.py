"""The operator API (docs/contracts.md §3.7): HTTP routes, function-key protected in Azure.

Every answer is JSON; every failure has an ``error`` sentence: 400 bad input, 404
unknown order or agent, 409 refused by the order's (or agent's) state, 503 the store did
not answer or the outcome of a change is unknown (retry), 500 only for an order whose
records cannot be read (a person must repair them).

Orders: ``orders/{orderId}``, ``orders``, ``orders/{orderId}/resubmit``,
``orders/{orderId}/cancel``. Agents at runtime (``admin/agent_admin.py``): ``agents`` (list),
``agents/{agent}/pause``, ``agents/{agent}/resume``, ``agents/{agent}/limits``,
``agents/audit``.

Who may (``config/principals.py``; docs/operating.md, "Who can do what"): every route
says what it does with ``@requires(Access...)``: reads need ``Orders.Reader``, changes
``Orders.Operator``, from the principal App Service authentication vouches for. A caller
with the function key and no principal (a machine: a webhook, a script) may read and
deliver events, and change orders and agents only where no sign-in is configured. A
refusal is a 403 (or a 401) with a JSON ``error`` and the ``role`` it needs.

Who did it (kept in the order's history): ``admin/callers.py``. The parts it uses come
from the composition root, once, through ``bootstrap.uses``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

import azure.functions as func

from admin.agent_admin import CHANGE_FIELDS, apply_change, parse_change
from admin.callers import MAX_REASON_CHARS, caller_of
from admin.query import parse_filter, parse_page_size
from bootstrap import index_time, uses
from config.principals import Access, Principal, refusal
from console.security import with_hsts
from core.errors import (
    AgentNotFound,
    ConcurrencyConflict,
    CorruptOrder,
    Forbidden,
    InvalidContinuationToken,
    InvalidEvent,
    OrderChanged,
    OrderError,
    OrderNotFound,
    StorageUnavailable,
    TransitionRefused,
)
from core.item_names import RECORD_NAME
from core.order_message import is_valid_order_id, strict_json
from core.patches import InvalidPatch
from core.workflows import AGENTS, MAX_STEP_NAME, WORKFLOWS

bp = func.Blueprint()

#: What these routes use of the app (built on first use: ``bootstrap.uses``).
_settings = uses(lambda app: app.settings)
_orders = uses(lambda app: app.admin)
_events = uses(lambda app: app.events)
_agents = uses(lambda app: app.agents_admin)
_retainer = uses(lambda app: app.retainer)
#: An event's body: an order's limit (a Storage queue message's 64 KiB), with room for
#: its envelope.
MAX_EVENT_BODY_BYTES = 4 * 65_536
#: A resubmit's or cancel's body: a reason and a patch, which makes at most an order.
MAX_CHANGE_BODY_BYTES = MAX_EVENT_BODY_BYTES
RETRY_AFTER_SECONDS = 5
#: Steps one cancel may state did not happen (a workflow has fewer).
MAX_STATED = 100
_STEP = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
#: a step's record: a step's name, or an item's of a ForEach, ``<name>[<i>]`` (§3.16)
_RECORD = RECORD_NAME


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(body, ensure_ascii=False),
        status_code=status,
        mimetype="application/json",
        headers=headers,
    )


def _error(status: int, message: str, **extra: Any) -> func.HttpResponse:
    return _json(status, {"error": message, **extra})


def principal_of(req: func.HttpRequest) -> Principal | None:
    """The request's principal, as config/principals.py believes one here; None: none (on
    the API, a key caller)."""
    return _settings().sign_in.principal(req.headers, req.params)


def caller(req: func.HttpRequest) -> str:
    """Who acts, for the history (``admin/callers.py``)."""
    return caller_of(principal_of(req), req.headers)


Route = Callable[[func.HttpRequest], func.HttpResponse]


def requires(
    access: Access, *, unless: Callable[[func.HttpRequest], bool] | None = None
) -> Callable[[Route], Route]:
    """The route does ``access``: a caller who may not gets a 401 or 403 with a JSON
    ``error`` (and ``role``: what it needs) before the route runs. ``unless``: a request it
    is true of is checked by the route itself (a capability). The route carries its
    ``access`` (tests/integration/test_roles.py reads it from every HTTP function)."""

    def decorate(route: Route) -> Route:
        @functools.wraps(route)
        def checked(req: func.HttpRequest) -> func.HttpResponse:
            if unless is not None and unless(req):
                return route(req)
            refused = refusal(principal_of(req), access, _settings().sign_in, console=False)
            if refused is None:
                return route(req)
            extra = {"role": refused.role} if refused.role else {}
            return _error(refused.status, refused.reason, **extra)

        checked.access = access  # type: ignore[attr-defined]
        return checked

    return decorate


def _answer(
    order_id: str | None, call: Callable[[], Any], *, with_status: bool = False
) -> func.HttpResponse:
    """Run an admin call; its domain errors become the status codes of docs/contracts.md §3.7.
    ``with_status``: the call gives the status with its answer."""
    ids = {"orderId": order_id} if order_id else {}
    try:
        if with_status:
            status, body = call()
            return _json(status, body)
        return _json(200, call())
    except (InvalidEvent, InvalidPatch) as exc:
        return _error(400, exc.message, **ids)
    except Forbidden as exc:
        return _error(403, exc.message, **ids)
    except (OrderNotFound, AgentNotFound) as exc:
        return _error(404, exc.message, **ids)
    except OrderChanged as exc:
        return _error(412, exc.message, **ids)
    except TransitionRefused as exc:
        return _error(409, exc.message, reason=exc.reason, **ids)
    except InvalidContinuationToken as exc:
        return _error(400, str(exc))
    except (StorageUnavailable, ConcurrencyConflict) as exc:
        # Includes "the outcome of the write is unknown": never reported as refused.
        return _unavailable(exc, **ids)
    except CorruptOrder as exc:
        return _error(500, exc.message, **ids)


def _unavailable(exc: OrderError, **ids: str) -> func.HttpResponse:
    """503, ``retryable``, with ``Retry-After``: storage did not answer, or lost a race."""
    return _json(
        503,
        {"error": exc.message, "retryable": True, **ids},
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def _order_id(req: func.HttpRequest) -> str | None:
    order_id = req.route_params.get("orderId", "")
    return order_id if is_valid_order_id(order_id) else None


@bp.route(route="orders/{orderId}", methods=["GET"])
@with_hsts
@requires(Access.READ)
def get_order(req: func.HttpRequest) -> func.HttpResponse:
    order_id = _order_id(req)
    if order_id is None:
        return _error(400, "orderId must be 1-64 characters of A-Z a-z 0-9 - _")
    response = _answer(order_id, lambda: _show(order_id))
    if response.status_code == 200:  # what a resubmit or cancel may send as If-Match
        response.headers["ETag"] = f'"{json.loads(response.get_body())["version"]}"'
    return response


def _show(order_id: str) -> dict[str, Any]:
    try:
        return _orders().show(order_id)
    except OrderNotFound as exc:
        from admin.archiving import archived_or  # the Blob SDK: only when it may be needed

        raise archived_or(exc, _retainer(), order_id) from None


@bp.timer_trigger(
    arg_name="timer",
    schedule=index_time().retention_schedule,
    run_on_startup=False,
    use_monitor=True,
)
def purge_finished_orders(timer: func.TimerRequest) -> None:
    """Retention (docs/contracts.md §3.12): archive finished orders past their retention
    (``RETENTION``), then delete them; at most ``RETENTION_BATCH`` a run."""
    _retainer().purge()


@bp.route(route="orders", methods=["GET"])
@with_hsts
@requires(Access.READ)
def list_orders(req: func.HttpRequest) -> func.HttpResponse:
    """``?status=`` (required unless it searches), ``workflow``, ``from``, ``to``,
    ``pageSize``, ``continuationToken``: newest first (``admin.query``). ``?<field>=<value>``:
    the orders whose data has that value in a field a workflow searches by, of any status
    unless ``status`` names one (docs/contracts.md §3.14); a name that is neither a filter
    nor such a field is a 400 that lists the fields orders can be searched by."""
    try:
        where = parse_filter(req.params)
        page_size = parse_page_size(req.params.get("pageSize"))
    except ValueError as exc:
        return _error(400, str(exc))
    token = req.params.get("continuationToken") or None
    return _answer(None, lambda: _orders().page(where, page_size, token))


def _change(req: func.HttpRequest, action: str) -> func.HttpResponse:
    order_id = _order_id(req)
    if order_id is None:
        return _error(400, "orderId must be 1-64 characters of A-Z a-z 0-9 - _")
    by = caller(req)
    reason = ""
    not_applied: list[str] | None = None
    patch: Any = None
    raw_body = req.get_body()
    if len(raw_body) > MAX_CHANGE_BODY_BYTES:
        return _error(
            400,
            f"the body is {len(raw_body):,} bytes; at most {MAX_CHANGE_BODY_BYTES:,} (a patch "
            "makes an order, which is at most 64 KB)",
        )
    match = (req.headers.get("if-match") or "").strip()
    if_version: int | None = None
    if match and match != "*":
        digits = match.removeprefix("W/").strip('"')
        if not digits.isdigit() or len(digits) > 12:
            return _error(400, 'If-Match takes the order\'s "version" (GET shows it), like "7"')
        if_version = int(digits)
    if raw_body:
        try:
            # strict_json, not req.get_json(): json.loads recurses once per level, and a
            # body of "[" * 100000 would be a RecursionError (a 500) rather than a ValueError.
            body = strict_json(raw_body.decode("utf-8"))
            reason = str(body.get("reason", ""))[:MAX_REASON_CHARS]
            raw = body.get("notApplied") if action == "cancel" else None
            if action == "resubmit" and "patch" in body:
                patch = body["patch"]
                if patch is None:
                    return _error(400, 'a patch is a JSON object, like {"address": {...}}')
        except (ValueError, AttributeError, UnicodeDecodeError):
            return _error(400, 'the body, if any, must be JSON like {"reason": "..."}')
        if raw is not None:
            names = [raw] if isinstance(raw, str) else raw
            if (
                not isinstance(names, list)
                or not names
                or len(names) > MAX_STATED
                or not all(isinstance(n, str) and _RECORD.fullmatch(n) for n in names)
            ):
                return _error(
                    400,
                    "notApplied names the step you state did not happen, or a list of them "
                    f'(step names like "ship", or an item like "ship-lines[3]"), got '
                    f"{json.dumps(raw)[:80]}",
                )
            not_applied = names
    if action == "resubmit":
        return _answer(
            order_id,
            lambda: _orders().resubmit(order_id, by, reason, patch, if_version),
        )
    return _answer(
        order_id,
        lambda: _orders().cancel(order_id, by, reason, not_applied, if_version),
    )


@bp.route(route="orders/{orderId}/resubmit", methods=["POST"])
@with_hsts
@requires(Access.CHANGE)
def resubmit_order(req: func.HttpRequest) -> func.HttpResponse:
    return _change(req, "resubmit")


@bp.route(route="orders/{orderId}/cancel", methods=["POST"])
@with_hsts
@requires(Access.CHANGE)
def cancel_order(req: func.HttpRequest) -> func.HttpResponse:
    return _change(req, "cancel")


def _capability(req: func.HttpRequest) -> bool:
    """The request carries a capability (``?token=``): a remote's callback, which needs no
    principal and no key (the token is checked against the order, the event and its run)."""
    return bool(req.params.get("token"))


@bp.route(
    route="orders/{orderId}/events/{name}", methods=["POST"], auth_level=func.AuthLevel.ANONYMOUS
)
@with_hsts
@requires(Access.EVENT, unless=_capability)
def deliver_event(req: func.HttpRequest) -> func.HttpResponse:
    """docs/contracts.md §3.13, §3.15: ``{"result": {...}}`` or ``{"refused": "<reason>"}``
    (and an optional ``reason``, kept in the history). Who may: a person's ``Event``, an
    operator (``Orders.Operator``); a remote's callback or ``Event(..., by="machine")``, the
    URL ``events_url`` gave it (``?token=``, the capability of its run); a function key
    alone delivers nothing (403). 202 kept for a step that has not started, 200 taken (or
    the same event again, or evidence noted), 409 another body for an event delivered
    before, an earlier run's answer (``stale``), one too late (``too-late``) or an order
    already finished, 404 an unknown order, 400 a name the order's workflow does not
    declare or a body that is neither. Written (If-Match) before the answer."""
    order_id = _order_id(req)
    if order_id is None:
        return _error(400, "orderId must be 1-64 characters of A-Z a-z 0-9 - _")
    name = req.route_params.get("name", "")
    if not _STEP.fullmatch(name) or len(name) > MAX_STEP_NAME:
        return _error(
            400, f"an event name is kebab-case (a-z, 0-9, -), at most {MAX_STEP_NAME} characters"
        )
    raw = req.get_body()
    if len(raw) > MAX_EVENT_BODY_BYTES:
        return _error(
            400,
            f"the event is {len(raw):,} bytes; at most {MAX_EVENT_BODY_BYTES:,} (an order's "
            "size): keep large documents elsewhere and send a reference",
        )
    try:
        body = strict_json(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return _error(400, f'the body must be JSON like {{"result": {{...}}}} ({exc})')
    token = req.params.get("token") or None
    by = caller(req)

    def deliver() -> tuple[int, dict[str, Any]]:
        effect, view = _events().deliver_event(order_id, name, body, by, token=token)
        return 202 if effect == "kept" else 200, {"event": name, "effect": effect, **view}

    return _answer(order_id, deliver, with_status=True)


@bp.route(route="workflows", methods=["GET"])
@with_hsts
@requires(Access.READ)
def list_workflows(req: func.HttpRequest) -> func.HttpResponse:
    """The workflows and agents as deployed (docs/contracts.md §3.8)."""
    return _json(200, workflows_view())


def workflows_view() -> dict[str, Any]:
    return {
        "workflows": [WORKFLOWS[name].describe() for name in sorted(WORKFLOWS)],
        "agents": [AGENTS[name].describe() for name in sorted(AGENTS)],
    }


# --- agents at runtime (docs/contracts.md §3.7) -------------------------------------------


@bp.route(route="agents", methods=["GET"])
@with_hsts
@requires(Access.READ)
def list_agents(req: func.HttpRequest) -> func.HttpResponse:
    """Every declared agent: ``name``, ``paused`` (and ``pause``: since, by, reason),
    ``limits`` in force, ``declared`` limits, ``overrides``."""
    return _answer(None, lambda: {"agents": _agents().list()})


def _agent_change(req: func.HttpRequest, action: str) -> func.HttpResponse:
    agent = req.route_params.get("agent", "")
    try:
        admin = _agents()  # its first use may meet a storage outage
        admin.spec(agent)
    except AgentNotFound as exc:
        return _error(404, exc.message)
    except StorageUnavailable as exc:
        return _unavailable(exc)
    fields: Any = {}
    if req.get_body():
        try:
            fields = strict_json(req.get_body().decode("utf-8"))
        except ValueError:
            fields = None
    if not isinstance(fields, dict):
        shape = ", ".join(f'"{f}": ...' for f in sorted(CHANGE_FIELDS[action]))
        return _error(400, f"the body, if any, must be a JSON object like {{{shape}}}")
    try:
        change = parse_change(action, fields)
    except ValueError as exc:
        return _error(400, str(exc))
    by = caller(req)
    return _answer(None, lambda: apply_change(admin, agent, change, by))


@bp.route(route="agents/{agent}/pause", methods=["POST"])
@with_hsts
@requires(Access.CHANGE)
def pause_agent(req: func.HttpRequest) -> func.HttpResponse:
    """``{"reason": ...}`` (required): calls to the agent's remote stop on every instance
    within seconds; its steps wait, Pending, uncounted, without an alert."""
    return _agent_change(req, "pause")


@bp.route(route="agents/{agent}/resume", methods=["POST"])
@with_hsts
@requires(Access.CHANGE)
def resume_agent(req: func.HttpRequest) -> func.HttpResponse:
    """``{"reason": ...}`` (optional): calls start again; the waiting steps go on."""
    return _agent_change(req, "resume")


@bp.route(route="agents/{agent}/limits", methods=["POST"])
@with_hsts
@requires(Access.CHANGE)
def set_agent_limits(req: func.HttpRequest) -> func.HttpResponse:
    """``{"concurrency": N | "declared", "rate": R | "declared", "reason": ...}``."""
    return _agent_change(req, "limits")


@bp.route(route="agents/audit", methods=["GET"])
@with_hsts
@requires(Access.READ)
def agent_audit(req: func.HttpRequest) -> func.HttpResponse:
    """Every pause, resume and limit change, newest first: ``?agent=``, ``pageSize``
    (1-100, default 50), ``continuationToken``."""
    try:
        page_size = parse_page_size(req.params.get("pageSize"))
    except ValueError as exc:
        return _error(400, str(exc))
    agent = req.params.get("agent") or None
    token = req.params.get("continuationToken") or None
    return _answer(None, lambda: _agents().audit(page_size, token, agent))
