"""The operator API (contract 3.7): HTTP routes, function-key protected in Azure."""

from __future__ import annotations

import json
from typing import Any

import azure.functions as func

from core.errors import OrderNotFound, TransitionRefused
from core.orders import is_valid_order_id
from core.states import OrderStatus
from runtime.context import app_context

bp = func.Blueprint()


def _json(status: int, body: Any) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(body, ensure_ascii=False), status_code=status, mimetype="application/json"
    )


def _error(status: int, message: str, **extra: Any) -> func.HttpResponse:
    return _json(status, {"error": message, **extra})


def _caller(req: func.HttpRequest) -> str:
    return (
        req.headers.get("x-ms-client-principal-name")
        or req.headers.get("x-operator")
        or "operator-api"
    )


def _order_id(req: func.HttpRequest) -> str | None:
    order_id = req.route_params.get("orderId", "")
    return order_id if is_valid_order_id(order_id) else None


@bp.route(route="orders/{orderId}", methods=["GET"])
def get_order(req: func.HttpRequest) -> func.HttpResponse:
    order_id = _order_id(req)
    if order_id is None:
        return _error(400, "orderId must be 1-64 characters of A-Z a-z 0-9 - _")
    try:
        return _json(200, app_context().admin.show(order_id))
    except OrderNotFound as exc:
        return _error(404, exc.message, orderId=order_id)


@bp.route(route="orders", methods=["GET"])
def list_orders(req: func.HttpRequest) -> func.HttpResponse:
    raw = req.params.get("status", "")
    try:
        status = OrderStatus(raw)
    except ValueError:
        valid = ", ".join(s.value for s in OrderStatus)
        return _error(400, f"give ?status= one of: {valid} (got {raw!r})")
    try:
        page_size = int(req.params.get("pageSize", "50"))
    except ValueError:
        return _error(400, "pageSize must be a whole number (1-100)")
    token = req.params.get("continuationToken") or None
    try:
        return _json(200, app_context().admin.list(status, page_size, token))
    except (ValueError, json.JSONDecodeError):
        return _error(400, "continuationToken is not one this API returned")


def _change(req: func.HttpRequest, action: str) -> func.HttpResponse:
    order_id = _order_id(req)
    if order_id is None:
        return _error(400, "orderId must be 1-64 characters of A-Z a-z 0-9 - _")
    admin = app_context().admin
    try:
        if action == "resubmit":
            view = admin.resubmit(order_id, _caller(req))
        else:
            reason = ""
            if req.get_body():
                try:
                    reason = str(req.get_json().get("reason", ""))
                except (ValueError, AttributeError):
                    return _error(400, 'the body, if any, must be JSON like {"reason": "..."}')
            view = admin.cancel(order_id, _caller(req), reason)
    except OrderNotFound as exc:
        return _error(404, exc.message, orderId=order_id)
    except TransitionRefused as exc:
        return _error(409, exc.message, orderId=order_id, reason=exc.reason)
    return _json(200, view)


@bp.route(route="orders/{orderId}/resubmit", methods=["POST"])
def resubmit_order(req: func.HttpRequest) -> func.HttpResponse:
    return _change(req, "resubmit")


@bp.route(route="orders/{orderId}/cancel", methods=["POST"])
def cancel_order(req: func.HttpRequest) -> func.HttpResponse:
    return _change(req, "cancel")
