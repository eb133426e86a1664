"""Message formats of docs/contracts.md: order messages, agent requests and replies, notices."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from core.errors import InvalidMessage, InvalidOrder
from core.messages import (
    AgentReply,
    AgentRequest,
    alert_message,
    outage_alert_message,
    recovered_alert_message,
    rejection_message,
    status_message,
)
from core.order_message import MAX_MESSAGE_CHARS, MAX_NESTING, decode_order
from core.outcome import Outcome
from messaging.wire import decode_reply, decode_request
from tests.fixtures import flows
from tests.support import declarations

T0 = datetime(2026, 11, 22, 10, 15, 30, 123000, tzinfo=UTC)  # millisecond precision: iso() keeps ms
T0_TEXT = "2026-11-22T10:15:30.123Z"
ORDER_ID_RULE = "1-64 characters of A-Z a-z 0-9 - _"
REPLY_TO_RULE = (
    "replyTo must name a Storage queue (3-63 lowercase letters, digits and single hyphens, "
    "starting and ending with a letter or digit)"
)


#: What a rejection names: the workflows declared (here the tests' own, tests/fixtures/flows.py).
KNOWN = ", ".join(sorted(w.name for w in flows.WORKFLOWS))


@pytest.fixture(autouse=True)
def _own_declarations() -> Iterator[None]:
    with declarations():
        yield


def rejection(raw: bytes | str) -> InvalidOrder:
    with pytest.raises(InvalidOrder) as info:
        decode_order(raw)
    return info.value


def order_text(**fields: Any) -> str:
    return json.dumps({"orderId": "o-1", **fields})


# --- decode_order: valid orders ------------------------------------------------------------


def test_minimal_order_gets_the_default_workflow_and_no_reply_queue() -> None:
    message = decode_order('{"orderId":"o-1"}')

    assert message.order_id == "o-1"
    assert message.workflow == "order"
    assert message.reply_to is None
    assert message.body == {"orderId": "o-1"}


def test_full_order_keeps_every_business_field_untouched_in_body() -> None:
    body = {
        "orderId": "Order_42-b",
        "workflow": "fulfilment",
        "replyTo": "app-status-1",
        "customer": {"name": "Zoë Ünal", "tier": None},
        "lines": [{"sku": "A-1", "qty": 2, "price": 19.99}, {"sku": "B", "qty": 1, "gift": True}],
        "note": '  spaces, "quotes" and\nnewlines are data  ',
    }

    message = decode_order(json.dumps(body))

    assert message.order_id == "Order_42-b"
    assert message.workflow == "fulfilment"
    assert message.reply_to == "app-status-1"
    assert message.body == body
    assert json.loads(message.data_json) == body


def test_utf8_bytes_with_surrounding_whitespace_are_accepted() -> None:
    raw = '\n  {"orderId": "o-1", "city": "Kraków"}  \n'.encode()

    message = decode_order(raw)

    assert message.body == {"orderId": "o-1", "city": "Kraków"}


def test_reply_to_null_means_no_reply_queue() -> None:
    assert decode_order('{"orderId":"o-1","replyTo":null}').reply_to is None


@pytest.mark.parametrize(
    "order_id", ["a", "A" * 64, "az-AZ_09", "-", "_", "0123456789" * 6 + "abcd"]
)
def test_order_ids_within_the_rule_are_accepted(order_id: str) -> None:
    assert decode_order(json.dumps({"orderId": order_id})).order_id == order_id


@pytest.mark.parametrize("reply_to", ["abc", "a" * 63, "app-status", "q1-2-3"])
def test_reply_queue_names_within_the_storage_rule_are_accepted(reply_to: str) -> None:
    assert decode_order(order_text(replyTo=reply_to)).reply_to == reply_to


def test_content_hash_ignores_key_order_and_spacing() -> None:
    compact = '{"orderId":"o-1","a":1,"b":[1,2],"c":{"x":"é","y":null}}'
    spread = (
        '{ "c" : { "y" : null , "x" : "\\u00e9" } ,\n "b" : [ 1, 2 ], "a": 1, "orderId": "o-1" }'
    )

    assert decode_order(compact).content_hash == decode_order(spread).content_hash
    assert len(decode_order(compact).content_hash) == 64  # sha256, hex


@pytest.mark.parametrize(
    "other",
    [
        '{"orderId":"o-1","a":2,"b":[1,2]}',  # a value
        '{"orderId":"o-1","a":1,"b":[2,1]}',  # list order is content
        '{"orderId":"o-1","a":1,"b":[1,2],"c":0}',  # an extra field
        '{"orderId":"o-1","a":"1","b":[1,2]}',  # a type
        '{"orderId":"o-2","a":1,"b":[1,2]}',  # the id itself
    ],
)
def test_content_hash_differs_for_different_content(other: str) -> None:
    base = decode_order('{"orderId":"o-1","a":1,"b":[1,2]}')

    assert decode_order(other).content_hash != base.content_hash


def test_a_message_as_long_as_a_queue_message_can_be_is_accepted_and_a_longer_one_is_not() -> None:
    # Contract 3.1: whatever the queue can carry (64 KiB) is accepted, however large its
    # business data; only a text no queue message can hold is refused.
    pad = MAX_MESSAGE_CHARS - len('{"orderId":"o-1","d":""}')

    at_limit = decode_order(json.dumps({"orderId": "o-1", "d": "x" * pad}, separators=(",", ":")))
    over = rejection(json.dumps({"orderId": "o-1", "d": "x" * (pad + 1)}, separators=(",", ":")))

    assert len(at_limit.data_json) == MAX_MESSAGE_CHARS
    assert str(over) == (
        "the message is 65,537 characters; a Storage queue message holds at most 65,536: keep "
        "large documents elsewhere and send a reference"
    )


def test_a_60_kb_order_with_characters_outside_the_bmp_is_accepted() -> None:
    body = {"orderId": "o-1", "notes": ["line \U0001f600 n\u00b0" + str(n) for n in range(4_000)]}

    message = decode_order(json.dumps(body, separators=(",", ":"), ensure_ascii=False))

    assert message.body == body
    assert 60_000 < len(message.data_json) <= MAX_MESSAGE_CHARS


def test_numbers_that_grow_when_re_serialized_still_fit_at_the_queue_limit() -> None:
    # 1e15 is stored as 1000000000000000.0: the stored JSON is ~3.8x the message.
    count = (MAX_MESSAGE_CHARS - 40) // 5
    raw = '{"orderId":"o-1","a":[' + ",".join(["1e15"] * count) + "]}"

    message = decode_order(raw)

    assert len(raw) <= MAX_MESSAGE_CHARS
    assert len(message.data_json) > 3 * MAX_MESSAGE_CHARS


# --- decode_order: rejections ------------------------------------------------------------

_JSON_OBJECT = "send the order as a JSON object"
_BAD_ID = f"orderId must be {ORDER_ID_RULE} (it becomes a Table Storage key); got "
_LONE = (
    "the message has a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair) in {}; "
    "that is not a Unicode character: send the character itself, or both halves of its "
    "surrogate pair"
)

REJECTIONS: list[tuple[str, bytes | str, str]] = [
    (
        "not-utf8",
        b'{"orderId":"o-\xff"}',
        "the message is not UTF-8 text (invalid byte at position 14); send the order as UTF-8 JSON",
    ),
    ("empty", "", f"the message is empty; {_JSON_OBJECT}"),
    ("empty-bytes", b"", f"the message is empty; {_JSON_OBJECT}"),
    ("whitespace-only", " \n\t  ", f"the message is empty; {_JSON_OBJECT}"),
    (
        "not-json",
        "{orderId: o-1}",
        "the message is not valid JSON (Expecting property name enclosed in double quotes at "
        f"line 1, column 2); {_JSON_OBJECT}",
    ),
    (
        "truncated-json",
        '{"orderId":"o-1"',
        f"the message is not valid JSON (Expecting ',' delimiter at line 1, column 17); {_JSON_OBJECT}",
    ),
    (
        "base64-json",
        base64.b64encode(b'{"orderId":"o-1","qty":2}').decode(),
        "the message is base64-encoded JSON; the orders queue takes the JSON text as it is "
        "(message encoding 'none'): send the plain JSON",
    ),
    ("array", '[{"orderId":"o-1"}]', "the order must be a JSON object, got an array"),
    ("number", "42", "the order must be a JSON object, got a number"),
    ("string", '"o-1"', "the order must be a JSON object, got a string"),
    ("null", "null", "the order must be a JSON object, got null"),
    ("missing-order-id", '{"workflow":"order"}', f"orderId is required ({ORDER_ID_RULE})"),
    ("empty-object", "{}", f"orderId is required ({ORDER_ID_RULE})"),
    ("order-id-number", '{"orderId":17}', "orderId must be a string, got a number"),
    ("order-id-null", '{"orderId":null}', "orderId must be a string, got null"),
    ("order-id-bool", '{"orderId":true}', "orderId must be a string, got a boolean"),
    ("order-id-array", '{"orderId":["o-1"]}', "orderId must be a string, got an array"),
    ("order-id-empty", '{"orderId":""}', _BAD_ID + "'' (0 characters)"),
    ("order-id-65", json.dumps({"orderId": "a" * 65}), _BAD_ID + f"'{'a' * 65}' (65 characters)"),
    ("order-id-slash", '{"orderId":"a/b"}', _BAD_ID + "'a/b' (3 characters)"),
    ("order-id-backslash", '{"orderId":"a\\\\b"}', _BAD_ID + "'a\\\\b' (3 characters)"),
    ("order-id-hash", '{"orderId":"a#b"}', _BAD_ID + "'a#b' (3 characters)"),
    ("order-id-question", '{"orderId":"a?b"}', _BAD_ID + "'a?b' (3 characters)"),
    ("order-id-space", '{"orderId":"a b"}', _BAD_ID + "'a b' (3 characters)"),
    ("order-id-dot", '{"orderId":"a.b"}', _BAD_ID + "'a.b' (3 characters)"),
    ("order-id-colon", '{"orderId":"a:b"}', _BAD_ID + "'a:b' (3 characters)"),
    ("order-id-unicode-letter", '{"orderId":"café"}', _BAD_ID + "'café' (4 characters)"),
    ("order-id-cyrillic", '{"orderId":"\\u0430bc"}', _BAD_ID + "'\u0430bc' (3 characters)"),
    ("order-id-nul", '{"orderId":"a\\u0000b"}', _BAD_ID + "'a\\x00b' (3 characters)"),
    ("order-id-tab", '{"orderId":"a\\tb"}', _BAD_ID + "'a\\tb' (3 characters)"),
    ("order-id-leading-newline", '{"orderId":"\\nab"}', _BAD_ID + "'\\nab' (3 characters)"),
    (
        "unknown-workflow",
        order_text(workflow="express"),
        f"workflow: unknown workflow 'express'; known workflows: {KNOWN}",
    ),
    ("workflow-number", order_text(workflow=1), "workflow must be a string, got a number"),
    ("reply-to-uppercase", order_text(replyTo="App-Status"), f"{REPLY_TO_RULE}; got 'App-Status'"),
    ("reply-to-underscore", order_text(replyTo="app_status"), f"{REPLY_TO_RULE}; got 'app_status'"),
    ("reply-to-too-short", order_text(replyTo="ab"), f"{REPLY_TO_RULE}; got 'ab'"),
    ("reply-to-too-long", order_text(replyTo="a" * 64), f"{REPLY_TO_RULE}; got '{'a' * 64}'"),
    ("reply-to-leading-hyphen", order_text(replyTo="-app"), f"{REPLY_TO_RULE}; got '-app'"),
    ("reply-to-trailing-hyphen", order_text(replyTo="app-"), f"{REPLY_TO_RULE}; got 'app-'"),
    ("reply-to-double-hyphen", order_text(replyTo="app--q"), f"{REPLY_TO_RULE}; got 'app--q'"),
    ("reply-to-number", order_text(replyTo=5), "replyTo must be a string, got a number"),
    ("reply-to-bool", order_text(replyTo=True), "replyTo must be a string, got a boolean"),
    ("reply-to-array", order_text(replyTo=["q"]), "replyTo must be a string, got an array"),
    (
        "two-problems",
        '{"orderId":5,"workflow":"express"}',
        "orderId must be a string, got a number; "
        f"workflow: unknown workflow 'express'; known workflows: {KNOWN}",
    ),
    # What the JSON parser itself meets: never an exception other than InvalidOrder.
    ("lone-high-surrogate", '{"orderId":"a","x":"\\ud800"}', _LONE.format("the value at x")),
    ("lone-low-surrogate", '{"orderId":"a","x":"ok \\udc00"}', _LONE.format("the value at x")),
    (
        "lone-surrogate-key",
        '{"orderId":"a","\\ud800":1}',
        _LONE.format("a key of the object at the top"),
    ),
    ("lone-surrogate-order-id", '{"orderId":"\\ud800"}', _LONE.format("the value at orderId")),
    (
        "lone-surrogate-nested",
        '{"orderId":"a","l":[1,{"b c":["\\udfff"]}]}',
        _LONE.format('the value at l[1]["b c"][0]'),
    ),
    (
        "reversed-surrogate-pair",
        '{"orderId":"a","x":"\\ude00\\ud83d"}',
        _LONE.format("the value at x"),
    ),
    (
        "integer-4301-digits",
        '{"orderId":"a","n":' + "9" * 4_301 + "}",
        "the message contains an integer of 4,301 digits; the limit is 4,300 digits: send very "
        "large numbers as strings",
    ),
    (
        "negative-integer-5000-digits",
        '{"orderId":"a","n":-' + "1" * 5_000 + "}",
        "the message contains an integer of 5,000 digits; the limit is 4,300 digits: send very "
        "large numbers as strings",
    ),
    (
        "nested-65-arrays",
        '{"orderId":"a","n":' + "[" * 64 + "]" * 64 + "}",
        f"the message nests arrays and objects more than {MAX_NESTING} levels deep; flatten the "
        f"order's data to at most {MAX_NESTING} levels",
    ),
    (
        "nested-100000-arrays",
        '{"orderId":"a","n":' + "[" * 30_000 + "]" * 30_000 + "}",
        f"the message nests arrays and objects more than {MAX_NESTING} levels deep; flatten the "
        f"order's data to at most {MAX_NESTING} levels",
    ),
    (
        "nested-objects",
        '{"orderId":"a","n":' + '{"k":' * 2_000 + "1" + "}" * 2_000 + "}",
        f"the message nests arrays and objects more than {MAX_NESTING} levels deep; flatten the "
        f"order's data to at most {MAX_NESTING} levels",
    ),
    (
        "float-overflow",
        '{"orderId":"a","n":1e400}',
        "the message contains the number 1e400, which is too large for a 64-bit floating-point "
        "number (beyond about 1.8e308): send it as a string, or send a smaller number",
    ),
    (
        "negative-float-overflow",
        '{"orderId":"a","n":-1e400}',
        "the message contains the number -1e400, which is too large for a 64-bit floating-point "
        "number (beyond about 1.8e308): send it as a string, or send a smaller number",
    ),
    (
        "huge-exponent",
        '{"orderId":"a","n":1.5E+' + "9" * 50 + "}",
        "the message contains the number 1.5E+" + "9" * 32 + "..., which is too large for a "
        "64-bit floating-point number (beyond about 1.8e308): send it as a string, or send a "
        "smaller number",
    ),
    (
        "base64-of-deep-json",
        base64.b64encode(b"[" * 5_000 + b"]" * 5_000).decode(),
        "the message is base64-encoded JSON; the orders queue takes the JSON text as it is "
        "(message encoding 'none'): send the plain JSON",
    ),
    (
        "reply-to-operator-alerts",
        order_text(replyTo="operator-alerts"),
        "replyTo 'operator-alerts' is one of this app's own queues, which take only the app's "
        "own messages; name a queue of your application for status messages",
    ),
]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [(raw, reason) for _, raw, reason in REJECTIONS],
    ids=[i for i, *_ in REJECTIONS],
)
def test_every_rejection_is_a_specific_sentence(raw: bytes | str, reason: str) -> None:
    error = rejection(raw)

    assert str(error) == reason
    assert error.message == reason
    # No validator jargon reaches a person.
    for jargon in ("Input should", "pydantic", "type=", "For further information", "Value error"):
        assert jargon not in reason


def test_rejection_carries_the_order_id_when_it_is_a_valid_one() -> None:
    assert rejection(order_text(workflow="express")).order_id == "o-1"
    assert rejection('{"orderId":17}').order_id is None
    assert rejection("[]").order_id is None


def test_order_id_object_is_described_as_an_object() -> None:
    assert str(rejection('{"orderId":{"id":"o-1"}}')) == "orderId must be a string, got an object"


@pytest.mark.parametrize("order_id", ["o-1\n", "a" * 64 + "\n"])
def test_order_id_with_a_trailing_newline_is_rejected(order_id: str) -> None:
    # "$" in a regular expression matches before a final newline: the rule must not.
    error = rejection(json.dumps({"orderId": order_id}))

    assert str(error) == _BAD_ID + f"{order_id!r} ({len(order_id)} characters)"
    assert error.order_id is None


def test_reply_to_with_a_trailing_newline_is_rejected() -> None:
    error = rejection(order_text(replyTo="app-status\n"))

    assert str(error) == f"{REPLY_TO_RULE}; got 'app-status\\n'"
    assert error.order_id == "o-1"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_number_literals_are_rejected(literal: str) -> None:
    error = rejection('{"orderId":"o-1","price":' + literal + "}")

    assert str(error) == (
        f"the message contains {literal}, which is not a JSON number (RFC 8259): send numbers "
        "that JSON can carry, or null"
    )


def test_characters_outside_the_bmp_are_not_a_reason_to_refuse() -> None:
    body = {"orderId": "o-1", "d": "\U0001f600" * 20_000}  # 40,000 UTF-16 units

    assert decode_order(json.dumps(body, ensure_ascii=False)).body == body


# --- agent requests and replies (docs/contracts.md §3.3) ----------------------------------------------

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def make_request(**changes: Any) -> AgentRequest:
    fields: dict[str, Any] = {
        "order_id": "o-1",
        "step": "reserve-stock",
        "attempt": 2,
        "complete_by": T0,
        "path": "stock/reserve",
        "order": {"orderId": "o-1", "qty": 2, "note": "Zoë"},
        "trace": TRACE,
    }
    fields.update(changes)
    return AgentRequest(**fields)


def test_request_json_uses_the_contract_field_names_and_values() -> None:
    value = json.loads(make_request().encode())

    assert value == {
        "orderId": "o-1",
        "step": "reserve-stock",
        "attempt": 2,
        "idempotencyKey": "o-1:reserve-stock",
        "completeBy": T0_TEXT,
        "path": "stock/reserve",
        "order": {"orderId": "o-1", "qty": 2, "note": "Zoë"},
        "trace": TRACE,
    }


@pytest.mark.parametrize("as_bytes", [False, True])
def test_request_round_trips(as_bytes: bool) -> None:
    request = make_request()
    raw = request.encode().encode() if as_bytes else request.encode()

    assert decode_request(raw) == request


def test_request_without_path_uses_the_step_as_path() -> None:
    value = json.loads(make_request().encode())
    del value["path"], value["trace"]

    decoded = decode_request(json.dumps(value))

    assert decoded.path == "reserve-stock"
    assert decoded.trace == {}


def test_a_request_without_its_order_is_refused_not_sent_empty() -> None:
    # The remote would be called with {} under the order's real idempotency key.
    value = json.loads(make_request().encode())
    del value["order"]
    with pytest.raises(InvalidMessage, match="order must be a JSON object"):
        decode_request(json.dumps(value))
    value["orderInline"] = False  # by reference: the agent reads it from the state table
    assert decode_request(json.dumps(value)).order is None


@pytest.mark.parametrize("bad", ["00-\u00e9-x", "a\nb", "x" * 600])
def test_a_trace_value_that_cannot_be_a_header_is_dropped(bad: str) -> None:
    value = json.loads(make_request().encode())
    value["trace"] = {"traceparent": bad, "other": "x"}
    assert decode_request(json.dumps(value)).trace == {}


def test_complete_by_with_an_offset_is_read_as_utc() -> None:
    value = json.loads(make_request().encode())
    value["completeBy"] = "2026-11-22T12:15:30.123+02:00"

    assert decode_request(json.dumps(value)).complete_by == T0


def test_succeeded_reply_round_trips_with_result_and_no_error() -> None:
    reply = make_request().succeeded({"reservation": "r-9"})

    value = json.loads(reply.encode())

    assert value == {
        "orderId": "o-1",
        "step": "reserve-stock",
        "attempt": 2,
        "idempotencyKey": "o-1:reserve-stock",
        "completeBy": T0_TEXT,
        "outcome": "succeeded",
        "result": {"reservation": "r-9"},
        "trace": TRACE,
    }
    assert decode_reply(reply.encode()) == reply


def test_failed_reply_round_trips_with_error_and_no_result() -> None:
    reply = make_request().refused("stock/reserve: HTTP 409 out of stock")

    value = json.loads(reply.encode())

    assert value["outcome"] == "failed"
    assert value["error"] == "stock/reserve: HTTP 409 out of stock"
    assert "result" not in value
    assert decode_reply(reply.encode()) == reply


def test_reply_keeps_the_request_identity() -> None:
    request = make_request()
    reply = request.succeeded({})

    assert (reply.order_id, reply.step, reply.attempt, reply.complete_by) == (
        "o-1",
        "reserve-stock",
        2,
        T0,
    )
    assert reply.message_id == request.message_id == "o-1:reserve-stock:2"
    assert reply.idempotency_key == request.idempotency_key == "o-1:reserve-stock"


def _valid(kind: str) -> dict[str, Any]:
    request = make_request()
    reply = request.refused("declined")
    data: dict[str, Any] = json.loads((request if kind == "request" else reply).encode())
    return data


def _changed(kind: str, **changes: Any) -> str:
    value = _valid(kind)
    for key, new in changes.items():
        if new is _MISSING:
            del value[key]
        else:
            value[key] = new
    return json.dumps(value)


_MISSING = object()

COMMON_REJECTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("order-id-bad", {"orderId": "o/1"}, f"orderId must be {ORDER_ID_RULE}, got 'o/1'"),
    ("order-id-missing", {"orderId": _MISSING}, f"orderId must be {ORDER_ID_RULE}, got None"),
    ("order-id-number", {"orderId": 1}, f"orderId must be {ORDER_ID_RULE}, got 1"),
    (
        "step-uppercase",
        {"step": "Reserve"},
        "step must be a kebab-case name (an item: <name>[<i>]), got 'Reserve'",
    ),
    ("step-empty", {"step": ""}, "step must be a kebab-case name (an item: <name>[<i>]), got ''"),
    (
        "step-missing",
        {"step": _MISSING},
        "step must be a kebab-case name (an item: <name>[<i>]), got None",
    ),
    (
        "step-item-101",
        {"step": "ship[100]"},
        "step must be a kebab-case name (an item: <name>[<i>]), got 'ship[100]'",
    ),
    ("attempt-0", {"attempt": 0}, "attempt must be a whole number from 1 to 999999, got 0"),
    (
        "attempt-negative",
        {"attempt": -1},
        "attempt must be a whole number from 1 to 999999, got -1",
    ),
    (
        "attempt-string",
        {"attempt": "1"},
        "attempt must be a whole number from 1 to 999999, got '1'",
    ),
    (
        "attempt-true",
        {"attempt": True},
        "attempt must be a whole number from 1 to 999999, got True",
    ),
    ("attempt-float", {"attempt": 1.0}, "attempt must be a whole number from 1 to 999999, got 1.0"),
    (
        "key-order-only",
        {"idempotencyKey": "o-1"},
        "idempotencyKey must be 'o-1:reserve-stock' (or that and ':<round>', 2-99), got 'o-1'",
    ),
    (
        "key-other-step",
        {"idempotencyKey": "o-1:ship"},
        "idempotencyKey must be 'o-1:reserve-stock' (or that and ':<round>', 2-99), got 'o-1:ship'",
    ),
    (
        "key-round-one",
        {"idempotencyKey": "o-1:reserve-stock:1"},
        "idempotencyKey must be 'o-1:reserve-stock' (or that and ':<round>', 2-99), got 'o-1:reserve-stock:1'",
    ),
    (
        "key-missing",
        {"idempotencyKey": _MISSING},
        "idempotencyKey must be 'o-1:reserve-stock' (or that and ':<round>', 2-99), got None",
    ),
    (
        "complete-by-missing",
        {"completeBy": _MISSING},
        "completeBy must be an ISO 8601 UTC time from 2000 to 2099, got None",
    ),
    (
        "complete-by-naive",
        {"completeBy": "2026-11-22T10:15:30.123"},
        "completeBy must be an ISO 8601 UTC time from 2000 to 2099, got '2026-11-22T10:15:30.123'",
    ),
    (
        "complete-by-garbage",
        {"completeBy": "tomorrow"},
        "completeBy must be an ISO 8601 UTC time from 2000 to 2099, got 'tomorrow'",
    ),
    (
        "key-round-too-high",
        {"idempotencyKey": "o-1:reserve-stock:100"},
        "idempotencyKey must be 'o-1:reserve-stock' (or that and ':<round>', 2-99), got "
        "'o-1:reserve-stock:100'",
    ),
    (
        "attempt-huge",
        {"attempt": 10**7},
        "attempt must be a whole number from 1 to 999999, got 10000000",
    ),
    (
        "complete-by-far-future",
        {"completeBy": "9999-12-31T23:59:59Z"},
        "completeBy must be an ISO 8601 UTC time from 2000 to 2099, got '9999-12-31T23:59:59Z'",
    ),
    (
        "complete-by-long-ago",
        {"completeBy": "0001-01-01T00:00:00Z"},
        "completeBy must be an ISO 8601 UTC time from 2000 to 2099, got '0001-01-01T00:00:00Z'",
    ),
    (
        "token-bad",
        {"token": "a b"},
        "token must be 1-128 characters of A-Z a-z 0-9 - _",
    ),
    (
        "token-number",
        {"token": 7},
        "token must be 1-128 characters of A-Z a-z 0-9 - _",
    ),
    (
        "complete-by-number",
        {"completeBy": 1795342530},
        "completeBy must be an ISO 8601 UTC time from 2000 to 2099, got 1795342530",
    ),
]


@pytest.mark.parametrize("kind", ["request", "reply"])
@pytest.mark.parametrize(
    ("changes", "detail"),
    [(c, d) for _, c, d in COMMON_REJECTIONS],
    ids=[i for i, *_ in COMMON_REJECTIONS],
)
def test_request_and_reply_reject_bad_common_fields(
    kind: str, changes: dict[str, Any], detail: str
) -> None:
    decode = decode_request if kind == "request" else decode_reply

    with pytest.raises(InvalidMessage) as info:
        decode(_changed(kind, **changes))

    assert str(info.value) == f"agent {kind}: {detail}"


@pytest.mark.parametrize("kind", ["request", "reply"])
@pytest.mark.parametrize(
    ("raw", "detail"),
    [
        ("not json", "is not valid JSON"),
        (b"\xff\xfe", "is not UTF-8"),
        ("[]", "must be a JSON object, got an array"),
        ('"o-1"', "must be a JSON object, got a string"),
        ("null", "must be a JSON object, got null"),
    ],
)
def test_request_and_reply_reject_what_is_not_a_json_object(
    kind: str, raw: bytes | str, detail: str
) -> None:
    decode = decode_request if kind == "request" else decode_reply

    with pytest.raises(InvalidMessage) as info:
        decode(raw)

    assert str(info.value).startswith(f"agent {kind} {detail}")


def test_invalid_request_error_names_the_order_and_step() -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_request(_changed("request", attempt=0))

    assert (info.value.order_id, info.value.step) == ("o-1", "reserve-stock")
    assert (
        str(info.value) == "agent request: attempt must be a whole number from 1 to 999999, got 0"
    )


@pytest.mark.parametrize("path", ["Stock", "/stock", "stock/", "../x", 5])
def test_request_rejects_a_bad_remote_path(path: object) -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_request(_changed("request", path=path))

    assert str(info.value) == f"agent request: path must be a remote path, got {path!r}"


def test_request_rejects_an_order_that_is_not_an_object() -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_request(_changed("request", order=[1]))

    assert str(info.value) == ("agent request: order must be a JSON object (or orderInline: false)")


@pytest.mark.parametrize("outcome", ["ok", "SUCCEEDED", None, _MISSING])
def test_reply_rejects_an_unknown_outcome(outcome: object) -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_reply(_changed("reply", outcome=outcome))

    shown = None if outcome is _MISSING else outcome
    assert str(info.value) == (
        f"agent reply: outcome must be one of succeeded, failed, transient, deferred, got {shown!r}"
    )


@pytest.mark.parametrize("error", [_MISSING, "", None, 42])
def test_failed_reply_needs_an_error_string(error: object) -> None:
    with pytest.raises(InvalidMessage) as info:
        decode_reply(_changed("reply", error=error))

    assert str(info.value) == "agent reply: a failed reply needs an error string"


# --- notices (docs/contracts.md §3.1 and §3.5) -----------------------------------------------------


def test_status_message_has_exactly_the_contract_fields() -> None:
    assert json.loads(status_message("o-1", "received", T0)) == {
        "orderId": "o-1",
        "status": "received",
        "at": T0_TEXT,
    }


def test_notice_times_are_utc_with_z_whatever_the_offset_given() -> None:
    paris = T0.astimezone(timezone(timedelta(hours=1)))

    assert json.loads(status_message("o-1", "completed", paris))["at"] == T0_TEXT


def test_alert_message_has_exactly_the_contract_fields() -> None:
    assert json.loads(alert_message("o-1", "ship", "ship gave no reply", 5, T0)) == {
        "kind": "order",
        "orderId": "o-1",
        "step": "ship",
        "reason": "ship gave no reply",
        "failureCount": 5,
        "at": T0_TEXT,
    }


def test_an_outage_alert_has_exactly_the_contract_fields() -> None:
    since = T0 - timedelta(minutes=5)
    body = outage_alert_message("carrier", since, 17, "ship: HTTP 503 \u202ebusy", T0)

    assert json.loads(body) == {
        "kind": "outage",
        "agent": "carrier",
        "since": "2026-11-22T10:10:30.123Z",
        "waiting": 17,
        "reason": "ship: HTTP 503 \\u202ebusy",  # outside text, shown escaped
        "at": T0_TEXT,
    }


def test_a_recovered_alert_names_the_outage_it_ends() -> None:
    since = T0 - timedelta(minutes=5)
    body = json.loads(recovered_alert_message("carrier", since, T0, "answered again"))

    assert body == {
        "kind": "recovered",
        "agent": "carrier",
        "since": "2026-11-22T10:10:30.123Z",
        "at": T0_TEXT,
        "reason": "answered again",
    }


def test_rejection_message_has_the_contract_fields_and_the_original_text_unchanged() -> None:
    original = ' {"orderId": "café/1",\n  "qty": 2 }\t'

    value = json.loads(rejection_message("orderId must be ...", original, T0))

    assert value == {"reason": "orderId must be ...", "message": original, "at": T0_TEXT}


def test_notices_refuse_naive_times() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        status_message("o-1", "received", datetime(2026, 11, 22, 10, 0))


def test_agent_reply_defaults_fill_result_or_error() -> None:
    succeeded = AgentReply("o-1", "ship", 1, T0, Outcome.SUCCEEDED)
    failed = AgentReply("o-1", "ship", 1, T0, Outcome.REFUSED)

    assert json.loads(succeeded.encode())["result"] == {}
    assert json.loads(failed.encode())["error"] == "unspecified failure"


def test_a_utf8_byte_order_mark_is_not_content() -> None:
    message = decode_order(b"\xef\xbb\xbf" + order_text().encode())
    assert message.order_id == "o-1"


def test_a_key_repeated_in_one_object_is_rejected() -> None:
    reason = str(rejection('{"orderId":"o-1","amount":1,"amount":2}'))
    assert "repeats the key 'amount'" in reason
