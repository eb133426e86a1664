"""Every HTTP route of the operator API and the console decides by role
(config/principals.py), on real Azurite, through the functions ``function_app`` declares.

The routes are enumerated from ``function_app``: a route that is not in ``ACCESS`` (or
that carries no decision of its own, ``@requires`` / ``@access``) fails here, so no route
can be added without saying who may call it. Then, with sign-in on as in Azure (the
principal in X-MS-CLIENT-PRINCIPAL, as the platform writes it):

- a reader reads, and every route that changes an order or an agent refuses it (403)
  before anything happens: the orders and the agents are as they were;
- an operator is refused nothing;
- a key caller (no principal) reads and delivers events on the API, and changes nothing;
  the console sends it to sign in;
- a principal header nothing vouches for is ignored: without sign-in, no console page
  opens for it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import azure.functions as func
import pytest

from bootstrap import AppContext, reset_app_context
from config.principals import OPERATOR, READER, Access, SignIn
from console import security
from tests.integration.orders import accept
from tests.integration.test_listing import T0, fail
from tests.support import (
    CLIENT_ID,
    DEV_OPERATOR,
    app_function,
    client_principal,
    http_functions,
    make_context,
)

R, E, C, P = Access.READ, Access.EVENT, Access.CHANGE, Access.PUBLIC
#: What each HTTP function does, which decides who may call it.
ACCESS: dict[str, Access] = {
    # the operator API
    "get_order": R,
    "list_orders": R,
    "list_workflows": R,
    "list_agents": R,
    "agent_audit": R,
    "resubmit_order": C,
    "cancel_order": C,
    "deliver_event": E,
    "pause_agent": C,
    "resume_agent": C,
    "set_agent_limits": C,
    # the console
    "console_list": R,
    "console_inbox": R,
    "console_lookup": R,
    "console_order": R,
    "console_alerts": R,
    "console_dashboard": R,
    "console_retention": R,
    "console_agents": R,
    "console_confirm": C,  # a GET that changes nothing, but only on the way to a change
    "console_resubmit": C,
    "console_cancel": C,
    "console_fix_preview": C,
    "console_fix": C,
    "console_event": E,
    "console_bulk_preview": C,
    "console_bulk_run": C,
    "console_agent_confirm": C,
    "console_agent_change": C,
    "console_asset": P,
}
ORDER = "r-err"  # in error: every change route has something to change
AGENT = "orders"
TOKEN = security.new_token()
HOST = "app.example.net"
SIGNED_IN = SignIn(client_id=CLIENT_ID, platform=True)
READER_HEADERS = client_principal("rita@contoso.com", READER)
OPERATOR_HEADERS = client_principal("otto@contoso.com", OPERATOR)


def is_console(name: str) -> bool:
    return name.startswith("console_")


def test_every_http_route_says_who_may_call_it() -> None:
    routes = http_functions()
    assert set(routes) == set(ACCESS), (
        "a route without a decision here, or a decision for a route that is gone: "
        f"{sorted(set(routes) ^ set(ACCESS))}"
    )
    for name, (_, _, level) in routes.items():
        declared = getattr(app_function(name), "access", None)
        assert declared is ACCESS[name], f"{name} decides {declared}, expected {ACCESS[name]}"
        # The console never takes the function key (a page would carry it); the API does,
        # but for the event route, which a remote reaches with its capability URL alone
        # and a key alone cannot use (docs/contracts.md §3.15).
        open_route = is_console(name) or name == "deliver_event"
        assert level == ("anonymous" if open_route else "function"), (name, level)


@pytest.fixture
def ctx(storage_connection: str, tag: str) -> Iterator[AppContext]:
    context = make_context(storage_connection, tag)
    order = accept(ORDER, T0 + timedelta(seconds=1))
    context.store.create(order)
    fail(context, ORDER)
    reset_app_context(context)
    yield context
    reset_app_context(None)


def signed_in(ctx: AppContext, sign_in: SignIn = SIGNED_IN) -> None:
    """The app's settings with ``sign_in`` (as SIGN_IN_CLIENT_ID and the platform set it)."""
    ctx.settings = dataclasses.replace(ctx.settings, sign_in=sign_in)


def request(name: str, headers: dict[str, str], ctx: AppContext) -> func.HttpRequest:
    """A well-formed request to ``name``, as its client would send it (a console form with
    its CSRF token, same-origin), so that only the role can refuse it."""
    route, methods, _ = http_functions()[name]
    params = {"orderId": ORDER, "agent": AGENT, "name": "approved"}
    if name == "console_asset":
        params["name"] = "console.css"
    path = route
    for key, value in params.items():
        path = path.replace(f"{{{key}}}", value)
    method = methods[0]
    query: dict[str, str] = {}
    body = b""
    sent = {"host": HOST, **headers}
    if name == "list_orders" or name == "console_list":
        query = {"status": "error"}
    elif name == "console_lookup":
        query = {"orderId": ORDER}
    elif name == "console_confirm":
        query = {"action": "resubmit", "reason": "probe"}
    elif name == "console_agent_confirm":
        query = {"action": "pause", "reason": "probe"}
    if method == "POST" and is_console(name):
        order = ctx.store.load(ORDER)
        assert order is not None
        form = {
            "csrf": TOKEN,
            "reason": "probe",
            "status": "error",
            "action": "pause" if "agent" in name else "resubmit",
            "ids": ORDER,
            "data": json.dumps({**order.body, "fixed": True}),
            "version": str(order.version),
            "result": "{}",
        }
        body = urlencode(form).encode()
        sent |= {
            "cookie": f"{security.COOKIE}={TOKEN}",
            "content-type": "application/x-www-form-urlencoded",
            "origin": f"https://{HOST}",
            "sec-fetch-site": "same-origin",
        }
    elif method == "POST":
        body = json.dumps(
            {"result": {}}
            if name == "deliver_event"
            else {"concurrency": 5, "reason": "probe"}
            if name == "set_agent_limits"
            else {"reason": "probe"}
        ).encode()
        sent["content-type"] = "application/json"
    return func.HttpRequest(
        method,
        f"https://{HOST}/api/{path}",
        params=query,
        headers=sent,
        route_params={k: v for k, v in params.items() if f"{{{k}}}" in route},
        body=body,
    )


def call(name: str, headers: dict[str, str], ctx: AppContext) -> func.HttpResponse:
    response = app_function(name)(request(name, headers, ctx))
    assert isinstance(response, func.HttpResponse)
    return response


def state(ctx: AppContext) -> tuple[Any, ...]:
    """What any change of the order or of an agent changes."""
    order = ctx.store.load(ORDER)
    assert order is not None
    agents = ctx.agents_admin.list()
    return (
        order.status,
        order.version,
        len(order.history),
        tuple((s.step, s.attempt, len(s.history)) for s in order.steps),
        json.dumps(agents, sort_keys=True, default=str),
        len(ctx.agents_admin.audit()["entries"]),
    )


def refused_with(response: func.HttpResponse, name: str, status: int) -> str:
    body = response.get_body().decode()
    assert response.status_code == status, (name, response.status_code, body[:300])
    if is_console(name):
        assert response.mimetype == "text/html" and 'id="message"' in body, (name, body[:300])
    else:
        assert json.loads(body)["error"], (name, body)
    return body


def test_a_reader_reads_and_is_refused_every_change(ctx: AppContext) -> None:
    signed_in(ctx)
    before = state(ctx)
    for name, access in ACCESS.items():
        response = call(name, READER_HEADERS, ctx)
        if access in (Access.CHANGE, Access.EVENT):
            body = refused_with(response, name, 403)
            assert OPERATOR in body, (name, body[:300])
            if not is_console(name):
                assert json.loads(body)["role"] == OPERATOR
        else:
            assert response.status_code not in (401, 403), (name, response.status_code)
        assert state(ctx) == before, f"{name} changed something for a reader"
    page = call("console_order", READER_HEADERS, ctx).get_body().decode()
    assert 'id="read-only"' in page and "rita@contoso.com" in page
    for action in ("resubmit-form", "cancel-form", "fix-form"):
        assert f'id="{action}"' not in page, f"a reader is offered #{action}"


def test_an_operator_is_refused_nothing(ctx: AppContext) -> None:
    signed_in(ctx)
    for name in ACCESS:
        response = call(name, OPERATOR_HEADERS, ctx)
        assert response.status_code not in (401, 403), (
            name,
            response.status_code,
            response.get_body()[:300],
        )
    order = ctx.store.load(ORDER)
    assert order is not None
    by = {h.get("by") for s in order.steps for h in s.history if h.get("event") == "resubmitted"}
    assert by == {"otto@contoso.com"}, by  # the person, never function-key


def test_a_key_caller_reads_but_delivers_no_event_and_changes_nothing(ctx: AppContext) -> None:
    signed_in(ctx)
    before = state(ctx)
    forged = {"x-dev-principal": f"mallory; roles={OPERATOR}", "x-functions-key": "k"}
    for name, access in ACCESS.items():
        response = call(name, forged, ctx)
        if is_console(name) and access is not Access.PUBLIC:
            _, methods, _ = http_functions()[name]
            if methods[0] == "GET":  # a browser: to the sign-in page, and back here
                assert response.status_code == 302, (name, response.status_code)
                location = response.headers["Location"]
                assert location.startswith("/.auth/login/aad?post_login_redirect_uri=%2Fapi%2F")
            else:
                refused_with(response, name, 401)
        elif access in (Access.CHANGE, Access.EVENT):
            assert json.loads(refused_with(response, name, 403))["role"] == OPERATOR
        else:
            assert response.status_code not in (401, 403), (name, response.status_code)
        assert state(ctx) == before, f"{name} changed something for a key caller"


def test_without_sign_in_a_principal_header_opens_no_console_page(ctx: AppContext) -> None:
    signed_in(ctx, SignIn())  # no SIGN_IN_CLIENT_ID: nothing strips the header
    before = state(ctx)
    for name, access in ACCESS.items():
        if not is_console(name) or access is Access.PUBLIC:
            continue
        body = refused_with(call(name, OPERATOR_HEADERS, ctx), name, 403)
        assert "AZURE_AUTH_CLIENT_ID" in body, (name, body[:300])
    assert state(ctx) == before
    # the API takes the header for a claim at most: the key caller it is, recorded so
    response = call("resubmit_order", OPERATOR_HEADERS, ctx)
    assert response.status_code == 200, response.get_body()
    order = ctx.store.load(ORDER)
    assert order is not None
    by = {h.get("by") for s in order.steps for h in s.history if h.get("event") == "resubmitted"}
    assert by == {"function-key (claims: otto@contoso.com)"}, by


def test_on_devhost_the_development_principal_decides(ctx: AppContext) -> None:
    signed_in(ctx, SignIn(dev_default=DEV_OPERATOR))
    before = state(ctx)
    reader = {"x-dev-principal": f"rita; roles={READER}"}
    assert call("console_order", reader, ctx).status_code == 200
    for name in ("console_resubmit", "resubmit_order", "pause_agent", "console_agent_change"):
        refused_with(call(name, reader, ctx), name, 403)
    assert state(ctx) == before
    assert call("console_resubmit", {}, ctx).status_code == 303  # the developer, an operator


@pytest.mark.parametrize(
    "sent",
    [
        {"x-dev-principal": "x; roles=Orders.Admin"},  # a role this app does not have
        {"x-dev-principal": "; roles=Orders.Operator"},  # no name
        {"x-dev-principal": "x; role=Orders.Operator", "x-functions-key": "k"},  # with a key
    ],
    ids=["unknown-role", "no-name", "with-key"],
)
def test_on_devhost_a_malformed_principal_header_is_nobody(
    ctx: AppContext, sent: dict[str, str]
) -> None:
    """Neither the development principal nor a key caller: refused on every route that
    needs anyone, and nothing changes."""
    signed_in(ctx, SignIn(dev_default=DEV_OPERATOR))
    before = state(ctx)
    for name, access in ACCESS.items():
        response = call(name, sent, ctx)
        if access is Access.PUBLIC:
            assert response.status_code == 200, name
            continue
        body = refused_with(response, name, 403)
        assert "X-Dev-Principal" in body, (name, body[:300])
    assert state(ctx) == before
