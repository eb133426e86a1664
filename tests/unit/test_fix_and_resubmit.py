"""Fix and resubmit (docs/contracts.md §3.14): a JSON merge patch of an order's data with
its resubmit, for a failed step known not to have applied. In memory, on a fake clock."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.errors import OrderChanged, TransitionRefused
from core.messages import AgentRequest
from core.order_message import MAX_NESTING
from core.outcome import Outcome
from core.patches import (
    MAX_CHANGES,
    MAX_VALUE_CHARS,
    InvalidPatch,
    apply_patch,
    merge_patch,
    patch_between,
)
from core.states import OrderStatus, StepState
from tests.support import declarations
from tests.unit.test_services_in_memory import TIMEOUT, Services, build, reply_to, stored

#: RFC 7386, appendix A: target, patch, result.
RFC_7386 = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), RFC_7386)
def test_merge_patch_is_rfc_7386(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


def sent(s: Services, order_id: str) -> list[AgentRequest]:
    return [r for r in s.transport.requests if r.order_id == order_id]


def failed_order(s: Services, order_id: str, **data: Any) -> dict[str, Any]:
    """An ``order`` whose one step its service refused (422): error, not applied."""
    body = {"orderId": order_id, "address": {"street": "Main St 1", "zip": "1011"}, **data}
    s.scheduler.submit(json.dumps(body).encode())
    request = sent(s, order_id)[-1]
    s.scheduler.apply_reply(reply_to(request, Outcome.REFUSED, error="HTTP 400: bad zip"))
    assert stored(s, order_id).status is OrderStatus.ERROR
    return body


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 4}}),
        ({"a": [1, 2]}, {"a": [2], "e": {"f": "g"}}),
        ({"a": 1}, {"a": 1}),
        ({"a": {"b": 1}}, {"a": 5}),
        ({"a": 1, "b": 2}, {}),
    ],
)
def test_the_patch_between_two_versions_of_the_data_turns_one_into_the_other(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    patch = patch_between(old, new)
    assert merge_patch(old, patch) == new
    assert (patch == {}) == (old == new)


def test_the_patch_between_removes_a_member_the_edit_set_to_null() -> None:
    """A merge patch cannot say "set to null": the console's editor says so."""
    assert patch_between({"a": 1, "b": 2}, {"a": None, "b": 2}) == {"a": None}
    assert merge_patch({"a": 1, "b": 2}, {"a": None}) == {"b": 2}


def test_the_fixed_data_goes_out_under_a_new_key_and_the_history_keeps_the_change() -> None:
    s = build()
    body = failed_order(s, "f-1")
    fixed = s.admin.resubmit(
        "f-1", "ann", "customer gave the right zip", {"address": {"zip": "10115"}}
    )
    assert fixed["status"] == "processing"
    s.scheduler.dispatch("f-1")
    again = sent(s, "f-1")[-1]
    assert again.order == {**body, "address": {"street": "Main St 1", "zip": "10115"}}
    # it was never applied, and what it sends changed: a new effect for the remote
    assert again.idempotency_key == "f-1:process:2" and again.attempt == 2
    s.scheduler.apply_reply(reply_to(again))
    order = stored(s, "f-1")
    assert order.status is OrderStatus.COMPLETED
    assert order.body["address"]["zip"] == "10115"
    [patched] = [h for h in order.history if h["event"] == "patched"]
    assert patched["by"] == "ann" and patched["reason"] == "customer gave the right zip"
    assert patched["changed"] == [{"field": "address.zip", "old": "1011", "new": "10115"}]
    step = order.steps[0]
    assert [h["event"] for h in step.history].count("new-key") == 1


def test_steps_already_done_keep_their_results_and_the_failed_one_decides_its_input_again() -> None:
    s = build()
    with declarations():  # returns: the desk's RMA flows into restock's input
        s.scheduler.submit(
            json.dumps({"orderId": "r-1", "workflow": "returns", "items": ["boot"]}).encode()
        )
        s.scheduler.apply_reply(reply_to(sent(s, "r-1")[-1], result={"rma": "RMA-1"}))
        restock = sent(s, "r-1")[-1]
        assert restock.order == {"rma": "RMA-1", "items": ["boot"]}
        s.scheduler.apply_reply(reply_to(restock, Outcome.REFUSED, error="HTTP 422"))
        s.admin.resubmit("r-1", "ann", "two boots", {"items": ["boot", "boot"]})
        s.scheduler.dispatch("r-1")
        again = sent(s, "r-1")[-1]
        assert again.step == "restock"
        assert again.order == {"rma": "RMA-1", "items": ["boot", "boot"]}
        assert len([r for r in sent(s, "r-1") if r.step == "receive-return"]) == 1
        order = stored(s, "r-1")
        assert order.find("receive-return").result == {"rma": "RMA-1"}  # type: ignore[union-attr]


def test_a_step_that_may_have_applied_refuses_a_patch_and_nothing_changes() -> None:
    s = build()
    s.scheduler.submit(json.dumps({"orderId": "d-1", "zip": "1"}).encode())
    for _ in range(3):  # no reply, three times: it may have been applied
        s.clock.advance(TIMEOUT + 60)
        s.supervisor.run()
        s.scheduler.dispatch("d-1")
    before = stored(s, "d-1")
    assert before.status is OrderStatus.ERROR and before.steps[0].may_have_applied
    with pytest.raises(TransitionRefused) as refused:
        s.admin.resubmit("d-1", "ann", "fix", {"zip": "2"})
    assert refused.value.reason == "doubt"
    assert "d-1:process" in refused.value.message and "without a patch" in refused.value.message
    after = stored(s, "d-1")
    assert after.body == before.body and after.version == before.version


@pytest.mark.parametrize(
    ("patch", "says"),
    [
        (["zip"], "must be a JSON object"),
        ("zip", "must be a JSON object"),
        ({"orderId": "other"}, "cannot change orderId"),
        ({"workflow": "fulfilment"}, "cannot change workflow"),
        ({"replyTo": "my-queue"}, "cannot change replyTo"),
        ({"deep": json.loads("[" * MAX_NESTING + "]" * MAX_NESTING)}, "levels"),
        ({"big": "x" * 70_000}, "characters"),
        ({"amount": float("inf")}, "would not be accepted"),
    ],
)
def test_a_bad_patch_is_refused_saying_why_and_nothing_changes(patch: Any, says: str) -> None:
    s = build()
    failed_order(s, "b-1")
    before = stored(s, "b-1")
    with pytest.raises(InvalidPatch) as refused:
        s.admin.resubmit("b-1", "ann", "fix", patch)
    assert says in refused.value.message, refused.value.message
    after = stored(s, "b-1")
    assert after.body == before.body and after.version == before.version
    assert after.status is OrderStatus.ERROR


def test_the_same_orderid_and_workflow_in_the_patch_are_not_a_change() -> None:
    body = {"orderId": "o", "workflow": "order", "zip": "1"}
    patched, changed = apply_patch(body, {"orderId": "o", "workflow": "order", "zip": "2"})
    assert patched == {**body, "zip": "2"} and [c.field for c in changed] == ["zip"]


def test_only_an_order_in_error_takes_a_fix() -> None:
    s = build()
    s.scheduler.submit(json.dumps({"orderId": "c-1"}).encode())
    s.scheduler.apply_reply(reply_to(sent(s, "c-1")[-1]))
    with pytest.raises(TransitionRefused) as refused:
        s.admin.resubmit("c-1", "ann", "fix", {"zip": "2"})
    assert refused.value.reason == "not-in-error"


def test_two_operators_fixing_at_once_one_wins_the_other_is_told() -> None:
    s = build()
    failed_order(s, "t-1")
    read = stored(s, "t-1").version  # both read the order at this version
    s.admin.resubmit("t-1", "ann", "zip", {"address": {"zip": "10115"}}, if_version=read)
    with pytest.raises(OrderChanged, match="changed since you read it"):
        s.admin.resubmit("t-1", "bob", "zip", {"address": {"zip": "99999"}}, if_version=read)
    # without If-Match, the second is told the order is no longer in error
    with pytest.raises(TransitionRefused, match="only an order in error"):
        s.admin.resubmit("t-1", "bob", "zip", {"address": {"zip": "99999"}})
    assert stored(s, "t-1").body["address"]["zip"] == "10115"


def test_the_history_cuts_long_values_and_counts_what_it_does_not_list() -> None:
    s = build()
    failed_order(s, "h-1", note="short")
    patch: dict[str, Any] = {f"f{n}": n for n in range(MAX_CHANGES + 5)}
    patch["note"] = "y" * 1000
    s.admin.resubmit("h-1", "ann", "many", patch)
    [patched] = [h for h in stored(s, "h-1").history if h["event"] == "patched"]
    assert len(patched["changed"]) == MAX_CHANGES and patched["changedMore"] == 6
    [note] = [c for c in patched["changed"] if c["field"] == "note"]
    assert note["old"] == "short" and len(note["new"]) == MAX_VALUE_CHARS + 1


def test_a_patch_that_changes_nothing_resubmits_under_the_same_key() -> None:
    s = build()
    failed_order(s, "n-1")
    s.admin.resubmit("n-1", "ann", "as it was", {"address": {"zip": "1011"}})
    s.scheduler.dispatch("n-1")
    again = sent(s, "n-1")[-1]
    assert again.idempotency_key == "n-1:process"
    [patched] = [h for h in stored(s, "n-1").history if h["event"] == "patched"]
    assert patched["changed"] == []
    assert stored(s, "n-1").steps[0].process_state is StepState.PROCESSING


def test_an_order_being_undone_takes_no_patch_only_a_plain_resubmit() -> None:
    """A fix can patch the data of an order whose failed step is a compensation, so the
    refund would carry an amount the charge never had: refused there (reason
    ``unwinding``), saying a plain resubmit retries it as it was; nothing changes."""
    s = build()
    s.scheduler.submit(json.dumps({"orderId": "u-1", "workflow": "fulfilment"}).encode())
    s.scheduler.apply_reply(reply_to(sent(s, "u-1")[-1], result={"reservation": "r-1"}))
    s.scheduler.apply_reply(reply_to(sent(s, "u-1")[-1], result={"charge": "c-1"}))
    ship = sent(s, "u-1")[-1]
    s.scheduler.apply_reply(reply_to(ship, Outcome.REFUSED, error="HTTP 422 no address"))
    refund = sent(s, "u-1")[-1]
    assert refund.step == "refund-payment"
    s.scheduler.apply_reply(reply_to(refund, Outcome.REFUSED, error="HTTP 400"))
    before = stored(s, "u-1")
    assert before.status is OrderStatus.ERROR
    with pytest.raises(TransitionRefused) as refused:
        s.admin.resubmit("u-1", "ann", "the amount was wrong", {"amount": 1})
    assert refused.value.reason == "unwinding"
    assert "without a patch" in refused.value.message
    assert stored(s, "u-1").body == before.body
    s.admin.resubmit("u-1", "ann", "the payment service is back")  # as it was: accepted
    assert stored(s, "u-1").status is OrderStatus.COMPENSATING
