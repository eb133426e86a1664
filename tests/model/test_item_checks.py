"""The model's ``ForEach`` (``Items``): the declarations it generates, and the checks it adds
(``tests.model.checks``: I5's one key per item, I9 the cap, I10 no item after a halt, I11
the results in item order), each on a snapshot made for it, so that a check that stops
biting fails here and not only in a long search.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from core.workflows import WORKFLOWS, ForEach
from tests.model import checks
from tests.model.flows import Flow, Items, Task, installed
from tests.model.machine import ORDER, EngineModel
from tests.model.signatures import Finding
from tests.model.vocabulary import OrderSnap, StepSnap

T = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
EACH = Items("f1", count=4, cap=2, comp=True, skip=(2,))
FLOW = Flow(EACH, Task("t2"))


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def step(name: str, state: str = "processing", **kw: Any) -> StepSnap:
    fields: dict[str, Any] = {
        "action": True,
        "compensates": None,
        "state": state,
        "key_round": 1,
        "attempt": 1,
        "deadline": T,
        "known_applied": state == "processed",
        "accepted": False,
        "in_doubt": False,
        "in_flight": state == "processing",
    }
    fields.update(kw)
    return StepSnap(name=name, **fields)


def snap(*steps: StepSnap, status: str = "processing", cancel: bool = False) -> OrderSnap:
    return OrderSnap(ORDER, status, cancel, (step("f1", "processed"), *steps))


def signatures_of(findings: list[Finding]) -> list[str]:
    return [f.signature for f in findings]


# --- what the model declares -------------------------------------------------------------


def test_an_items_element_is_a_for_each_over_the_orders_field_and_each_item_a_task() -> None:
    assert FLOW.order_data()["f1"] == [
        {"n": 0, "skip": False},
        {"n": 1, "skip": False},
        {"n": 2, "skip": True},
        {"n": 3, "skip": False},
    ]
    assert [t.name for t in FLOW.tasks()] == ["t2", "f1[0]", "f1[1]", "f1[2]", "f1[3]"]
    assert FLOW.compensated("undo-f1[3]") == Task("f1[3]", comp=True)
    with installed(FLOW):
        declared = WORKFLOWS["model"].steps[0]
        assert isinstance(declared, ForEach)
        assert (declared.max_concurrency, declared.step.on_failure) == (2, "unwind")
        assert declared.step.when is not None and declared.step.compensation is not None


def test_a_printed_items_element_builds_itself_again() -> None:
    each = Items("f3", count=2, cap=1, reads="t1", skip=(0,), fails="hold")
    assert eval(repr(each)) == each  # what a printed script runs


def test_the_model_drives_a_for_each_to_completion_with_every_check_quiet() -> None:
    state = EngineModel()
    try:
        state.start(flow=FLOW)
        state.check()
        for _ in range(6):
            for pick in range(3):
                state.reply(pick=pick, report="success")
                state.check()
            state.dispatch()
            state.check()
        assert state.snap is not None and state.snap.status == "completed"
        results = state.world.results(ORDER) or {}
        assert results["f1"] == [
            {"ref": "m-1:f1:0"},
            {"ref": "m-1:f1:1"},
            None,
            {"ref": "m-1:f1:3"},
        ]
        state.teardown()
    finally:
        state.close()


# --- I5: one key per item ------------------------------------------------------------------


def test_an_item_is_requested_under_its_own_key_and_a_later_run_under_its_round() -> None:
    assert checks._item_key(ORDER, "f1[3]", "m-1:f1:3", 1) == []
    assert checks._item_key(ORDER, "undo-f1[3]", "m-1:undo-f1:3", 1) == []
    assert checks._item_key(ORDER, "f1[3]", "m-1:f1:3:2", 2) == []
    assert checks._item_key(ORDER, "t2", "m-1:t2", 1) == []
    shared = checks._item_key(ORDER, "f1[3]", "m-1:f1", 1)
    assert signatures_of(shared) == ["I5-item-key"]
    assert signatures_of(checks._item_key(ORDER, "f1[3]", "m-1:f1:2", 1)) == ["I5-item-key"]


# --- I9: the cap ---------------------------------------------------------------------------


def test_no_more_items_in_flight_than_the_cap() -> None:
    two = snap(step("f1[0]"), step("f1[1]"))
    assert checks.in_flight(FLOW, two) == []
    # a Pending item whose attempt ended (a retry waiting) is not in flight
    waiting = snap(step("f1[0]"), step("f1[1]"), step("f1[3]", "pending", in_flight=False))
    assert checks.in_flight(FLOW, waiting) == []
    three = snap(step("f1[0]"), step("f1[1]"), step("f1[3]", "pending", in_flight=True))
    assert signatures_of(checks.in_flight(FLOW, three)) == ["I9-items-over-cap"]


# --- I10: no item after a halt --------------------------------------------------------------


def test_no_item_is_started_once_a_sibling_failed_for_good_or_a_cancel() -> None:
    before = snap(step("f1[0]"), step("f1[1]", "processed"))
    failed = snap(step("f1[0]", "error", in_flight=False), step("f1[1]", "processed"))
    started = snap(
        step("f1[0]", "error", in_flight=False), step("f1[1]", "processed"), step("f1[3]")
    )
    assert checks.started_after_halt(FLOW, before, failed, []) == []
    assert signatures_of(checks.started_after_halt(FLOW, before, started, ["f1[3]"])) == [
        "I10-item-after-halt@failed"
    ]
    cancelled = snap(step("f1[0]"), step("f1[1]", "processed"), step("f1[3]"), cancel=True)
    assert signatures_of(checks.started_after_halt(FLOW, before, cancelled, [])) == [
        "I10-item-after-halt@cancel"
    ]
    # a sibling gone past (on_failure="continue") halts nothing
    went_on = snap(
        step("f1[0]", "error", in_flight=False, continued=True),
        step("f1[1]", "processed"),
        step("f1[3]"),
    )
    assert checks.started_after_halt(FLOW, before, went_on, []) == []


def test_no_item_is_requested_again_while_its_group_stays_halted() -> None:
    halted = snap(step("f1[0]", "error", in_flight=False), step("f1[1]", "pending"))
    retried = snap(step("f1[0]", "error", in_flight=False), step("f1[1]"))
    assert signatures_of(checks.started_after_halt(FLOW, halted, retried, ["f1[1]"])) == [
        "I10-item-after-halt@retried"
    ]
    # resubmitted: the group goes on, and its items are requested again
    resubmitted = snap(step("f1[0]"), step("f1[1]"))
    assert checks.started_after_halt(FLOW, halted, resubmitted, ["f1[0]", "f1[1]"]) == []
    # the request that halts nothing, and the one of the item that failed, in one transition
    running = snap(step("f1[0]"), step("f1[1]", "pending"))
    assert checks.started_after_halt(FLOW, running, halted, ["f1[0]"]) == []


# --- I11: the results, in item order ---------------------------------------------------------


def test_a_completed_order_lists_each_items_result_in_item_order() -> None:
    done = snap(
        step("f1[0]", "processed"),
        step("f1[1]", "processed", key_round=2),
        step("f1[2]", "skipped", in_flight=False),
        step("f1[3]", "processed"),
        status="completed",
    )
    right = [{"ref": "m-1:f1:0"}, {"ref": "m-1:f1:1:2"}, None, {"ref": "m-1:f1:3"}]
    assert checks.listed(FLOW, done, {"f1": right}) == []
    for wrong in (
        [right[1], right[0], *right[2:]],  # out of order
        right[:3],  # one short
        [*right[:2], {"ref": "m-1:f1:2"}, right[3]],  # a skipped item with a result
        None,  # not there
    ):
        found = checks.listed(FLOW, done, {"f1": wrong})
        assert signatures_of(found) == ["I11-results-unlisted"], wrong


def test_an_item_gone_past_is_listed_as_none_and_an_empty_for_each_as_an_empty_list() -> None:
    went_on = snap(
        step("f1[0]", "processed"),
        step("f1[1]", "error", in_flight=False, continued=True),
        step("f1[2]", "skipped", in_flight=False),
        step("f1[3]", "processed"),
        status="completed",
    )
    listed = [{"ref": "m-1:f1:0"}, None, None, {"ref": "m-1:f1:3"}]
    assert checks.listed(FLOW, went_on, {"f1": listed}) == []
    empty = Flow(Items("f1", count=0))
    assert checks.listed(empty, snap(status="completed"), {"f1": []}) == []
    none = checks.listed(empty, snap(status="completed"), {})
    assert signatures_of(none) == ["I11-results-unlisted"]
