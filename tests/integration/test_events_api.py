"""``POST /api/orders/{orderId}/events/{name}`` (docs/contracts.md §3.13, §3.15) through the
real trigger, on Azurite: every answer the contract names, the event written before the
answer, the next step claimed and requested in the same call, and who may deliver what:
a person's event an operator (here devhost's development principal), a remote's callback
only the capability URL of its run, and a function key alone nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import azure.functions as func
import pytest

from bootstrap import AppContext, reset_app_context
from config.principals import READER, SignIn
from messaging.wire import decode_reply, decode_request
from simulator import SimulatorServer
from tests.support import (
    DEV_OPERATOR,
    app_function,
    callback_token,
    declarations,
    drain,
    drain_requests,
    make_context,
    on_devhost,
)


@pytest.fixture
def ctx(storage_connection: str, tag: str, simulator: SimulatorServer) -> Iterator[AppContext]:
    context = on_devhost(make_context(storage_connection, tag, remote_url=simulator.url))
    reset_app_context(context)
    with declarations():
        yield context
    reset_app_context(None)


def post(
    order_id: str,
    name: str,
    body: Any,
    raw: bytes | None = None,
    *,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """POST the event as devhost's development principal (an operator), or, with ``token``,
    as a remote on its capability URL; ``headers`` replace the default ones."""
    request = func.HttpRequest(
        method="POST",
        url=f"http://localhost/api/orders/{order_id}/events/{name}",
        route_params={"orderId": order_id, "name": name},
        params={"token": token} if token else {},
        body=raw if raw is not None else json.dumps(body).encode(),
        headers=headers if headers is not None else {"content-type": "application/json"},
    )
    response: func.HttpResponse = app_function("deliver_event")(request)
    return response.status_code, json.loads(response.get_body())


def submit(ctx: AppContext, order_id: str, workflow: str, **data: Any) -> None:
    ctx.scheduler.submit(json.dumps({"orderId": order_id, "workflow": workflow, **data}).encode())


def test_every_answer_of_the_events_api(ctx: AppContext, tag: str) -> None:
    order_id = f"{tag}-ev"
    submit(ctx, order_id, "event-first")
    assert drain_requests(ctx) == []  # it waits for its event
    # the name and the body are checked first, whatever the order's state
    assert post(order_id, "nope", {"result": {}})[0] == 400
    status, body = post(order_id, "go-ahead", {"result": [1]})
    assert status == 400 and "JSON object" in body["error"]
    assert post(order_id, "go-ahead", None, raw=b"[" * 100_000)[0] == 400
    assert post(order_id, "go-ahead", None, raw=b"not json")[0] == 400
    assert post(order_id, "Bad Name", {"result": {}})[0] == 400
    assert post(f"{tag}-missing", "go-ahead", {"result": {}})[0] == 404
    # taken: written, and the next step claimed and requested before the answer
    status, body = post(order_id, "go-ahead", {"result": {"ok": True}, "reason": "checked"})
    assert status == 200 and body["effect"] == "taken" and body["status"] == "processing"
    [request] = [decode_request(t) for t in drain_requests(ctx)]
    assert (request.order_id, request.step, request.attempt) == (order_id, "after", 1)
    order = ctx.store.load(order_id)
    assert order is not None and order.find("go-ahead").result == {"ok": True}  # type: ignore[union-attr]
    taken = [h for h in order.find("go-ahead").history if h["event"] == "event-taken"]  # type: ignore[union-attr]
    assert taken[0]["by"] == DEV_OPERATOR.name and taken[0]["reason"] == "checked"
    # the same again: 200, nothing changes; another body: 409
    version = order.version
    status, body = post(order_id, "go-ahead", {"result": {"ok": True}, "reason": "checked"})
    assert status == 200 and body["effect"] == "same"
    assert ctx.store.load(order_id).version == version  # type: ignore[union-attr]
    status, body = post(order_id, "go-ahead", {"refused": "changed my mind"})
    assert status == 409 and "delivered before" in body["error"]


def test_an_event_that_beats_its_step_is_kept_202_and_taken_later(
    ctx: AppContext, tag: str
) -> None:
    order_id = f"{tag}-early"
    submit(ctx, order_id, "approval", amount=5000)
    status, body = post(order_id, "approved", {"result": {"by": "ann"}})
    assert status == 202 and body["effect"] == "kept"
    assert body["events"]["approved"]["payload"] == {"result": {"by": "ann"}}


def test_an_event_for_a_finished_order_is_409(ctx: AppContext, tag: str) -> None:
    """Cancelled while its first step is out: the step succeeds, is undone, and the order
    ends cancelled; an event then is refused."""
    order_id = f"{tag}-done"
    submit(ctx, order_id, "approval", amount=5000)
    ctx.admin.cancel(order_id, "ops")
    for _ in range(10):  # the host's part: requests, replies, dispatches
        for text in drain_requests(ctx):
            request = decode_request(text)
            asyncio.run(ctx.agent_for(request.agent).handle(request))
        for text in drain(ctx, ctx.names.agent_replies):
            ctx.scheduler.apply_reply(decode_reply(text))
        for text in drain(ctx, ctx.names.order_dispatch):
            ctx.scheduler.dispatch(json.loads(text)["orderId"])
    order = ctx.store.load(order_id)
    assert order is not None and str(order.status) == "cancelled"
    status, body = post(order_id, "approved", {"result": {}})
    assert status == 409 and "already cancelled" in body["error"]


def test_a_key_alone_or_a_reader_delivers_no_event(ctx: AppContext, tag: str) -> None:
    """docs/contracts.md §3.15: a person's event needs Orders.Operator; a key caller (no
    principal) and a reader are refused 403, and nothing is kept."""
    order_id = f"{tag}-who"
    submit(ctx, order_id, "approval", amount=5000)
    ctx.settings = replace(ctx.settings, sign_in=SignIn())  # as in Azure: no dev principal
    status, body = post(order_id, "approved", {"result": {}})
    assert status == 403 and "function key alone delivers nothing" in body["error"]
    reader = replace(DEV_OPERATOR, roles=frozenset({READER}))
    ctx.settings = replace(ctx.settings, sign_in=SignIn(dev_default=reader))
    assert post(order_id, "approved", {"result": {}})[0] == 403
    order = ctx.store.load(order_id)
    assert order is not None and "approved" not in order.events


def test_a_callback_is_delivered_only_on_the_capability_of_its_run(
    ctx: AppContext, tag: str
) -> None:
    """The bank's ``captured`` answers the capture's run: without a token (a person, or a
    key), with another event's or another order's token, or a made-up one: 403; with its
    own: taken."""
    order_id = f"{tag}-cb"
    submit(ctx, order_id, "quick")
    assert post(order_id, "ok", {"result": {}})[0] == 200  # a person's approval
    order = ctx.store.load(order_id)
    assert order is not None
    status, body = post(order_id, "captured", {"result": {"ref": "C-1"}})
    assert status == 403 and "events_url" in body["error"]
    wrong = [
        callback_token(order, "ok"),
        "r1." + "0" * 40,
        "r2." + callback_token(order, "captured").partition(".")[2],
        "junk",
    ]
    for token in wrong:
        assert post(order_id, "captured", {"result": {}}, token=token)[0] == 403, token
    assert post(f"{tag}-nobody", "captured", {"result": {}}, token=wrong[1])[0] == 403
    assert "captured" not in (ctx.store.load(order_id) or order).events
    status, body = post(
        order_id, "captured", {"result": {"ref": "C-1"}}, token=callback_token(order, "captured")
    )
    assert status == 202 and body["effect"] == "kept"  # it beats its step: kept for it
