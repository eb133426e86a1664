"""The app's own messages at their edges (docs/contracts.md §3.1, §3.3): every message the
app writes is one it can read, and no time a message carries can make arithmetic
overflow, whatever an agent (or anyone who can write to the queue) puts there.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidMessage, InvalidOrder, TransitionRefused, UnboundMessage
from core.messages import EARLIEST_TIME, LATEST_TIME, AgentRequest, bounded_result
from core.order_message import MAX_NESTING, decode_order
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus
from messaging.wire import decode_reply, decode_request
from tests.unit.test_model import T0, new_order, reply

POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=600)


def nested(levels: int) -> Any:
    """A JSON value whose arrays nest ``levels`` deep (the value itself is one level)."""
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


def order_of_depth(depth: int) -> str:
    """An order whose own nesting (the order object counts as one level) is ``depth``."""
    return json.dumps({"orderId": "o-deep", "data": nested(depth - 1)})


def test_an_order_nested_to_the_limit_travels_in_every_message_the_app_writes() -> None:
    message = decode_order(order_of_depth(MAX_NESTING))  # the deepest order accepted
    request = AgentRequest(
        "o-deep",
        "process",
        1,
        T0,
        "process",
        message.body,
        token="t" * 32,
    )
    read = decode_request(request.encode())
    assert read.order == message.body
    # ... and a result as deep as an order may be, in the reply
    result = {"data": nested(MAX_NESTING - 1)}
    assert bounded_result(result) == result
    answered = decode_reply(request.succeeded(result).encode())
    assert answered.result == result and answered.token == "t" * 32


def test_one_level_deeper_is_refused_at_the_door_not_later() -> None:
    with pytest.raises(InvalidOrder, match=f"more than {MAX_NESTING} levels"):
        decode_order(order_of_depth(MAX_NESTING + 1))
    too_deep = {"data": nested(MAX_NESTING)}
    assert bounded_result(too_deep)["unreadable"] is True  # the step succeeds, the reply fits


def test_a_reply_far_deeper_than_any_order_is_refused_as_a_message() -> None:
    body = reply(_claimed(), Outcome.SUCCEEDED).to_json()
    body["result"] = {"data": nested(MAX_NESTING + 10)}
    with pytest.raises(InvalidMessage, match="levels deep"):
        decode_reply(json.dumps(body))


def _claimed() -> Any:
    order = new_order()
    order.claim("i", T0)
    return order


# --- times ---------------------------------------------------------------------------------

ANY_TIME = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=12))]),
)
TIME_FIELDS = ("completeBy", "notBefore", "runningUntil", "answeredAt", "evidenceAt")


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(TIME_FIELDS), when=ANY_TIME, outcome=st.sampled_from(range(4)))
def test_no_time_a_report_carries_can_overflow_anything(
    field: str, when: datetime, outcome: int
) -> None:
    """Any time in a report: refused on decoding with a reason, or one every later step of
    the order can do arithmetic with (apply, expire, cancel, resubmit, claim)."""
    order = new_order("fulfilment")
    order.claim("i", T0)
    kinds = ["succeeded", "failed", "transient", "deferred"]
    body = reply(order).to_json() | {"outcome": kinds[outcome]}
    if kinds[outcome] != "succeeded":
        body.update(error="e", applied="maybe")
        body.pop("result", None)
    if kinds[outcome] == "deferred":
        body["notBefore"] = "2026-11-22T10:00:05Z"
    body[field] = when.isoformat()
    if field == "runningUntil":
        body["runner"] = "r"
    try:
        decoded = decode_reply(json.dumps(body))
    except InvalidMessage as refused:
        assert not EARLIEST_TIME <= when < LATEST_TIME or field in str(refused)
        return
    for name in ("complete_by", "not_before", "running_until", "answered_at", "evidence_at"):
        value = getattr(decoded, name)
        assert value is None or EARLIEST_TIME <= value < LATEST_TIME
    now = T0 + timedelta(seconds=1)
    for move in (
        lambda: order.apply_reply(decoded, now, POLICY),
        lambda: order.expire(LATEST_TIME, POLICY),
        lambda: order.cancel(now, "op"),
        lambda: order.cancel(now, "op", not_applied="reserve-stock"),
        lambda: order.resubmit(now, "op"),
        lambda: order.claim("i", LATEST_TIME),
    ):
        with contextlib.suppress(TransitionRefused, UnboundMessage):
            move()
    assert order.status in set(OrderStatus)


@pytest.mark.parametrize("value", ["9999-12-31T23:59:59Z", "1970-01-01T00:00:00Z", "x" * 100])
def test_a_deferral_or_a_hold_out_of_bounds_is_refused_with_the_bound(value: str) -> None:
    order = _claimed()
    deferred = reply(order).to_json() | {
        "outcome": "deferred",
        "error": "e",
        "applied": "no",
        "notBefore": value,
    }
    deferred.pop("result")
    with pytest.raises(InvalidMessage, match="from 2000 to 2099"):
        decode_reply(json.dumps(deferred))
    running = deferred | {"outcome": "transient", "runningUntil": value, "runner": "r"}
    running.pop("notBefore")
    with pytest.raises(InvalidMessage, match="from 2000 to 2099"):
        decode_reply(json.dumps(running))
