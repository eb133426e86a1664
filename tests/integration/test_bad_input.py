"""The bad-input catalogue, through the real triggers of function_app.py on Azurite.

Every malformed order message is rejected with its own reason in
``orders-rejected`` (original text kept) and an ERROR log, and never disturbs
the good orders around it. Malformed transport messages (agent requests,
replies, dispatches) are quarantined in ``<queue>-poison`` with their reason.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from collections.abc import Iterator

import azure.functions as func
import pytest

os.environ.setdefault("AGENT_TRANSPORT", "storage")

from bootstrap import AppContext, reset_app_context
from core.states import OrderStatus
from simulator import SimulatorServer
from stores.kept import KeptMessages
from tests.support import app_function, drain, drain_json, drain_requests, make_context

GOOD = {"orderId": "placeholder", "sku": "A-1"}

#: (kind, raw message, a phrase its reason must contain)
ORDER_CATALOGUE: list[tuple[str, bytes, str]] = [
    ("not JSON", b"hello", "not valid JSON"),
    ("empty", b"", "empty"),
    ("whitespace only", b"   \n", "empty"),
    ("not UTF-8", b"\xff\xfe{}", "not UTF-8"),
    ("JSON array", b"[1,2]", "got an array"),
    ("JSON string", b'"o-1"', "got a string"),
    ("JSON number", b"42", "got a number"),
    ("JSON null", b"null", "got null"),
    ("missing orderId", b'{"sku":"A"}', "orderId is required"),
    ("orderId number", b'{"orderId":7}', "orderId must be a string, got a number"),
    ("orderId null", b'{"orderId":null}', "orderId must be a string, got null"),
    ("orderId boolean", b'{"orderId":true}', "orderId must be a string, got a boolean"),
    ("orderId object", b'{"orderId":{"id":1}}', "orderId must be a string, got an object"),
    ("orderId empty", b'{"orderId":""}', "orderId must be 1-64 characters"),
    ("orderId 65 characters", json.dumps({"orderId": "x" * 65}).encode(), "65 characters"),
    ("orderId with a space", b'{"orderId":"a b"}', "orderId must be 1-64"),
    ("orderId with /", b'{"orderId":"a/b"}', "orderId must be 1-64"),
    ("orderId with \\", b'{"orderId":"a\\\\b"}', "orderId must be 1-64"),
    ("orderId with #", b'{"orderId":"a#b"}', "orderId must be 1-64"),
    ("orderId with ?", b'{"orderId":"a?b"}', "orderId must be 1-64"),
    ("orderId with a control character", b'{"orderId":"a\\u0001b"}', "orderId must be 1-64"),
    ("orderId with a trailing newline", b'{"orderId":"ab\\n"}', "orderId must be 1-64"),
    ("orderId non-ASCII", '{"orderId":"caf\u00e9"}'.encode(), "orderId must be 1-64"),
    ("unknown workflow", b'{"orderId":"w1","workflow":"teleport"}', "unknown workflow"),
    ("workflow not a string", b'{"orderId":"w2","workflow":3}', "workflow must be a string"),
    ("replyTo uppercase", b'{"orderId":"r1","replyTo":"Status"}', "replyTo must name"),
    ("replyTo underscore", b'{"orderId":"r2","replyTo":"my_queue"}', "replyTo must name"),
    ("replyTo too short", b'{"orderId":"r3","replyTo":"ab"}', "replyTo must name"),
    ("replyTo double hyphen", b'{"orderId":"r4","replyTo":"a--b"}', "replyTo must name"),
    ("replyTo not a string", b'{"orderId":"r5","replyTo":5}', "replyTo must be a string"),
    ("base64 instead of JSON", base64.b64encode(b'{"orderId":"b64"}'), "base64"),
    ("NaN", b'{"orderId":"n1","price":NaN}', "NaN"),
    ("Infinity", b'{"orderId":"n2","price":Infinity}', "Infinity"),
    ("repeated key", b'{"orderId":"d1","qty":1,"qty":2}', "repeats the key 'qty'"),
    # Large orders are accepted (docs/contracts.md §3.1: anything the queue can carry); a text longer
    # than a queue message cannot arrive, so it has no entry here (tests/unit covers it).
    # What the JSON parser itself meets: a rejection with a reason, never a poison message.
    ("lone surrogate in a value", b'{"orderId":"s1","x":"\\ud800"}', "lone UTF-16 surrogate"),
    ("lone surrogate in a key", b'{"orderId":"s2","\\udc00":1}', "lone UTF-16 surrogate"),
    ("lone surrogate in orderId", b'{"orderId":"\\ud83d"}', "lone UTF-16 surrogate"),
    ("integer over 4,300 digits", b'{"orderId":"i1","n":' + b"9" * 4_301 + b"}", "4,301 digits"),
    ("nested 65 deep", b'{"orderId":"p1","n":' + b"[" * 64 + b"]" * 64 + b"}", "levels deep"),
    (
        "nested 30,000 deep",
        b'{"orderId":"p2","n":' + b"[" * 30_000 + b"]" * 30_000 + b"}",
        "levels deep",
    ),
    ("number 1e400", b'{"orderId":"f1","price":1e400}', "too large for a 64-bit"),
    ("number -1e400", b'{"orderId":"f2","price":-1e400}', "too large for a 64-bit"),
    ("huge exponent", b'{"orderId":"f3","price":1E+999999999999999999}', "too large for a 64-bit"),
    ("base64 of deeply nested JSON", base64.b64encode(b"[" * 20_000 + b"]" * 20_000), "base64"),
    # The app's own queues (this test app's names: see own_queue below).
    ("replyTo operator-alerts", b'{"orderId":"q1","replyTo":"<operator_alerts>"}', "own queues"),
    ("replyTo orders-poison", b'{"orderId":"q2","replyTo":"<orders>-poison"}', "own queues"),
    ("replyTo agent-replies", b'{"orderId":"q3","replyTo":"<agent_replies>"}', "own queues"),
    # Queues the app may have: the shared request queue of earlier versions, an agent
    # declared tomorrow.
    ("replyTo legacy requests", b'{"orderId":"q4","replyTo":"<agent_requests>"}', "own queues"),
    (
        "replyTo an undeclared agent's queue",
        b'{"orderId":"q5","replyTo":"<agent_requests>-shipping"}',
        "own queues",
    ),
    # Not listed in REPLY_QUEUES (the tests' is "st-*"), or listed but not there.
    (
        "replyTo not in REPLY_QUEUES",
        b'{"orderId":"q6","replyTo":"anything-new"}',
        "REPLY_QUEUES (st-*) does not list it",
    ),
    ("replyTo missing", b'{"orderId":"q7","replyTo":"st-nobody-made-it"}', "does not exist"),
]

#: Queues the catalogue names that nobody created: rejecting the order must not create them.
NOT_CREATED = ("anything-new", "st-nobody-made-it")


def own_queue(raw: bytes, ctx: AppContext) -> bytes:
    """``<field>`` in a catalogue message: that queue's name in this test app (``Names``)."""
    for field in ("operator_alerts", "orders", "agent_replies", "agent_requests"):
        raw = raw.replace(f"<{field}>".encode(), getattr(ctx.names, field).encode())
    return raw


@pytest.fixture
def ctx(storage_connection: str, tag: str, simulator: SimulatorServer) -> Iterator[AppContext]:
    context = make_context(storage_connection, tag, remote_url=simulator.url)
    reset_app_context(context)
    yield context
    reset_app_context(None)


def call(name: str, body: bytes) -> None:
    app_function(name)(func.QueueMessage(id="m", body=body))


def run_good_order(ctx: AppContext, order_id: str) -> None:
    call("submit_order", json.dumps({**GOOD, "orderId": order_id}).encode())
    [request] = drain_requests(ctx)
    call("run_agent_orders", request.encode())
    [reply] = drain(ctx, ctx.names.agent_replies)
    call("handle_agent_reply", reply.encode())
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED


def test_the_catalogue_has_at_least_25_kinds() -> None:
    assert len(ORDER_CATALOGUE) >= 25
    assert len({kind for kind, _, _ in ORDER_CATALOGUE}) == len(ORDER_CATALOGUE)


def test_every_bad_order_is_rejected_with_its_reason_and_good_orders_flow(
    ctx: AppContext, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_good_order(ctx, f"{tag}-before")
    reasons: dict[str, str] = {}
    with caplog.at_level(logging.ERROR):
        for kind, template, phrase in ORDER_CATALOGUE:
            raw = own_queue(template, ctx)
            call("submit_order", raw)
            [record] = drain_json(ctx, ctx.names.orders_rejected)
            assert phrase in record["reason"], (kind, record["reason"])
            assert record["at"].endswith("Z")
            expected = raw.decode("utf-8", errors="replace")
            if "keptAs" in record:  # too large to quote in its record: kept whole instead
                kept = KeptMessages(ctx.store.table).get(record["keptAs"])
                assert kept is not None and kept.text == expected, kind
            else:
                assert record["message"] == expected, kind
            reasons[kind] = record["reason"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) >= len(ORDER_CATALOGUE)
    for queue in NOT_CREATED:
        assert not ctx.queues.exists(queue), queue
    assert not drain_requests(ctx)  # nothing bad got dispatched
    run_good_order(ctx, f"{tag}-after")
    # Same id, different content: rejected, and the first order is untouched.
    call("submit_order", json.dumps({**GOOD, "orderId": f"{tag}-after", "sku": "B"}).encode())
    [record] = drain_json(ctx, ctx.names.orders_rejected)
    assert "already exists" in record["reason"]
    order = ctx.store.load(f"{tag}-after")
    assert order is not None and order.body["sku"] == "A-1"


@pytest.mark.parametrize(
    ("function", "raw", "phrase"),
    [
        ("run_agent_orders", b"garbage", "not valid JSON"),
        ("run_agent_orders", b"[]", "must be a JSON object"),
        ("run_agent_orders", b'{"orderId":"o","step":"process","attempt":1}', "idempotencyKey"),
        (
            "run_agent_orders",
            json.dumps(
                {
                    "orderId": "o",
                    "step": "process",
                    "attempt": 0,
                    "idempotencyKey": "o:process",
                    "completeBy": "2030-01-01T00:00:00Z",
                }
            ).encode(),
            "attempt",
        ),
        (
            "run_agent_orders",
            json.dumps(
                {
                    "orderId": "o",
                    "step": "Bad Step",
                    "attempt": 1,
                    "idempotencyKey": "o:Bad Step",
                    "completeBy": "2030-01-01T00:00:00Z",
                }
            ).encode(),
            "step",
        ),
        (
            "run_agent_orders",
            json.dumps(
                {
                    "orderId": "o",
                    "step": "process",
                    "attempt": 1,
                    "idempotencyKey": "o:process",
                    "completeBy": "tomorrow",
                }
            ).encode(),
            "completeBy",
        ),
        ("handle_agent_reply", b"{}", "orderId"),
        (
            "handle_agent_reply",
            json.dumps(
                {
                    "orderId": "o",
                    "step": "process",
                    "attempt": 1,
                    "idempotencyKey": "o:process",
                    "completeBy": "2030-01-01T00:00:00Z",
                    "outcome": "maybe",
                }
            ).encode(),
            "outcome",
        ),
        (
            "handle_agent_reply",
            json.dumps(
                {
                    "orderId": "o",
                    "step": "process",
                    "attempt": 1,
                    "idempotencyKey": "o:process",
                    "completeBy": "2030-01-01T00:00:00Z",
                    "outcome": "failed",
                }
            ).encode(),
            "error",
        ),
        ("dispatch_order", b"nope", "a dispatch message is not valid JSON"),
        ("dispatch_order", b'{"orderId":"has space"}', "orderId"),
    ],
)
def test_bad_transport_messages_are_quarantined_with_a_reason(
    ctx: AppContext, function: str, raw: bytes, phrase: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = {
        "run_agent_orders": ctx.names.agent_queue("orders"),
        "handle_agent_reply": ctx.names.agent_replies,
        "dispatch_order": ctx.names.order_dispatch,
    }[function]
    with caplog.at_level(logging.ERROR):
        call(function, raw)  # returns normally: one delivery, no retries
    [record] = drain_json(ctx, f"{queue}-poison")
    assert phrase in record["reason"]
    assert record["message"] == raw.decode("utf-8", errors="replace")
    assert record["queue"] == queue
    assert any(
        "quarantined" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
    )


def test_a_deeply_nested_dispatch_message_is_quarantined_once_with_its_reason(
    ctx: AppContext, caplog: pytest.LogCaptureFixture
) -> None:
    """60,000 ``[`` made ``json.loads`` raise RecursionError on each of five deliveries
    before the host gave up on it; read with the bounded decoder of internal messages it
    is refused on the first, with a reason, and kept whole (too large for its record)."""
    raw = b"[" * 60_000
    with caplog.at_level(logging.ERROR):
        call("dispatch_order", raw)  # returns normally: no retry, no poison by the host
    [record] = drain_json(ctx, f"{ctx.names.order_dispatch}-poison")
    assert "nests arrays and objects more than 68 levels deep" in record["reason"]
    kept = KeptMessages(ctx.store.table).get(record["keptAs"])
    assert kept is not None and kept.text == raw.decode()
