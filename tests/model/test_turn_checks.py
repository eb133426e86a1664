"""The model's checks of per-key concurrency (``tests.model.turn_checks``, T1-T5) on
hand-built slots and orders, what the model found with them (and what was fixed), and that a failure found at teardown after an example ran out of
input is no longer lost."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from unittest import mock

import pytest
from hypothesis.errors import StopTest

from core.turns import Holder, Slot, Waiter
from tests.model import signatures
from tests.model.flows import Flow, Group, Task, Turns, Wait
from tests.model.machine import EngineModel
from tests.model.signatures import Finding, Recorder, Violation
from tests.model.turn_checks import Keyed, after_transition, settled
from tests.model.vocabulary import OrderSnap, StepSnap
from tests.model.world import T0


def keyed(limit: int = 1, hold: bool = False, orders: int = 3) -> Keyed:
    ids = [f"m-{n}" for n in range(1, orders + 1)]
    return Keyed(limit, hold, dict.fromkeys(ids, "k1"), ids)


def step(name: str, state: str, *, action: bool = True, in_flight: bool = False) -> StepSnap:
    return StepSnap(
        name=name,
        action=action,
        compensates=None if action else name.removeprefix("undo-"),
        state=state,
        key_round=1,
        attempt=1,
        deadline=T0,
        known_applied=False,
        accepted=False,
        in_doubt=False,
        in_flight=in_flight,
    )


def order(order_id: str, status: str = "processing", *steps: StepSnap) -> OrderSnap:
    return OrderSnap(order_id, status, False, tuple(steps))


def running(order_id: str) -> OrderSnap:
    return order(order_id, "processing", step("t1", "processing", in_flight=True))


def waiting(order_id: str) -> OrderSnap:
    return order(order_id, "pending")


def slot(holders: list[str], line: list[str] = ()) -> dict[str, Slot]:  # type: ignore[assignment]
    return {
        "k1": Slot(
            "model",
            "k1",
            tuple(Holder(h, T0) for h in holders),
            tuple(Waiter(w, T0 + timedelta(seconds=n)) for n, w in enumerate(line)),
        )
    }


def found(findings: list[Finding]) -> list[str]:
    return [f.signature for f in findings]


# --- each invariant bites --------------------------------------------------------------------


def test_t1_more_holders_or_runners_than_the_limit() -> None:
    snaps = {"m-1": running("m-1"), "m-2": running("m-2"), "m-3": waiting("m-3")}
    got = found(after_transition(keyed(), snaps, slot(["m-1", "m-2"], ["m-3"])))
    assert got == ["T1-over-limit@slot", "T1-over-limit@running"]
    assert found(after_transition(keyed(limit=2), snaps, slot(["m-1", "m-2"], ["m-3"]))) == []


def test_t1_an_order_running_without_its_slot_and_one_only_undoing_told_apart() -> None:
    undoing = order(
        "m-2",
        "compensating",
        step("t1", "compensating"),
        step("undo-t1", "processing", action=False),
    )
    snaps = {"m-1": running("m-1"), "m-2": undoing, "m-3": running("m-3")}
    got = found(after_transition(keyed(orders=3), snaps, slot(["m-1"])))
    assert got == [
        "T1-running-without-slot@undo",
        "T1-running-without-slot",
        "T1-over-limit@running",
    ]


def test_t2_a_turn_taken_past_an_order_accepted_before_it() -> None:
    state = keyed()
    snaps = {"m-1": running("m-1"), "m-2": waiting("m-2"), "m-3": waiting("m-3")}
    assert found(after_transition(state, snaps, slot(["m-1"], ["m-2", "m-3"]))) == []
    ended = {"m-1": order("m-1", "completed", step("t1", "processed")), "m-3": running("m-3")}
    got = after_transition(state, snaps | ended, slot(["m-3"], ["m-2"]))
    assert found(got) == ["T2-turn-out-of-order"]
    # an order accepted before it that ended (cancelled while it waited) waits no more
    state = keyed()
    after_transition(state, snaps, slot(["m-1"], ["m-2", "m-3"]))
    cancelled = {"m-2": order("m-2", "cancelled")}
    assert found(after_transition(state, snaps | ended | cancelled, slot(["m-3"], ["m-2"]))) == []


def test_t4_an_order_in_line_with_a_step_record() -> None:
    snaps = {"m-1": running("m-1"), "m-2": order("m-2", "pending", step("t1", "pending"))}
    got = found(after_transition(keyed(orders=2), snaps, slot(["m-1"], ["m-2"])))
    assert got == ["T4-waiting-with-steps"]


def test_t3_a_slot_held_by_an_order_that_ended_or_gave_it_back() -> None:
    for status, hold, leaked in [
        ("completed", False, True),
        ("cancelled", True, True),
        ("error", False, True),
        ("error", True, False),
        ("processing", False, False),
    ]:
        snaps = {"m-1": order("m-1", status), "m-2": order("m-2", "completed")}
        got = found(settled(keyed(hold=hold, orders=2), snaps, slot(["m-1"])))
        assert got == (["T3-slot-leaked"] if leaked else []), status


def test_t5_an_order_still_waiting_once_settled() -> None:
    snaps = {"m-1": order("m-1", "completed"), "m-2": waiting("m-2")}
    assert found(settled(keyed(orders=2), snaps, slot([]))) == ["T5-waiting-stuck"]
    # a line row left by an order that ended is not one that waits
    snaps["m-2"] = order("m-2", "cancelled")
    assert found(settled(keyed(orders=2), snaps, slot([], ["m-2"]))) == []


# --- what the model found (known, not fixed yet) ------------------------------------------


@pytest.fixture
def strict() -> Iterator[Recorder]:
    """A recorder that suppresses nothing, the known findings included."""
    recorder = Recorder(suppressed=set())
    with mock.patch.object(signatures, "RECORDER", recorder):
        yield recorder


def signature_of(run: EngineModel, *steps: str) -> str | None:
    try:
        for each in steps:
            getattr(run, each)()
        run.check()
        run.teardown()
    except Violation as exc:
        return exc.signature
    finally:
        run.close()
    return None


def test_a_finding_known_and_suppressed_fails_no_example() -> None:
    assert (
        Recorder(suppressed={"T5-waiting-stuck@held-for-good"}).seen(
            "T5-waiting-stuck@held-for-good"
        )
        is False
    )
    assert Recorder().seen("T5-waiting-stuck") is True


def test_an_order_held_in_error_for_good_does_not_block_its_key_for_ever(
    strict: Recorder,
) -> None:
    run = EngineModel()
    turns = Turns(limit=1, hold=True, orders=2, keys=1, first=0)
    flow = Flow(Group(Task("t1", comp=True), Task("t2")), Wait("e3", timeout=60), turns=turns)
    run.start(flow=flow)  # m-1 holds; t2 stands after the unwind, and e3 is never decided
    assert signature_of(run) is None


def test_a_lost_release_of_an_order_nobody_can_act_on_is_repaired_by_the_next_sweep(
    strict: Recorder,
) -> None:
    """Seed 4242 (was ``T5-waiting-stuck@held-for-good``, known): m-2 ends in error held
    for good (t7 applied and has no undo; nothing left to cancel or resubmit) and its
    release is lost. The check read the slot before any supervisor run, blaming what the
    sweep is there to repair; after one, m-2 has given its slot back and m-1 runs."""
    run = EngineModel()
    turns = Turns(limit=1, hold=False, orders=2, keys=1, first=1)
    group = Group(Task("t1", comp=True), Task("t2", comp=True), Task("t3", comp=True))
    last = Group(Task("t5", comp=True), Task("t6", comp=True), Task("t7", fails="hold"))
    flow = Flow(group, Task("t4", comp=True), last, Wait("e8", timeout=60), turns=turns)
    run.start(flow=flow)
    assert signature_of(run, "lose_release") is None


def test_an_order_cancelled_after_it_gave_its_slot_back_undoes_within_the_limit(
    strict: Recorder,
) -> None:
    run = EngineModel()
    turns = Turns(limit=1, hold=False, orders=2, keys=1, first=1)
    run.start(flow=Flow(Task("t1", comp=True), Task("t2", comp=True), turns=turns))
    run.other_cancel(then="later", which=0)  # m-2 holds the slot, m-1 waits
    run.other_reply(pick=0, report="success", which=0)  # m-2's t1 applied: undone
    run.tick()
    run.tick()  # its undo timed out twice: m-2 in error, its slot to m-1
    run.other_cancel(then="dispatched", which=0)  # m-2's undo again, beside m-1
    assert signature_of(run) is None


def test_an_order_that_leaves_error_on_evidence_runs_only_with_a_slot(strict: Recorder) -> None:
    run = EngineModel()
    turns = Turns(limit=1, hold=False, orders=2, keys=1, first=0)
    run.start(flow=Flow(Task("t1", comp=True, fails="hold"), Task("t2", comp=True), turns=turns))
    run.tick()  # m-1's t1 expired once
    run.execute(pick=0)  # its remote applies the retry, and says nothing yet
    run.tick()  # expired again: t1 failed for good, held; m-1 in error, its slot to m-2
    run.reply(pick=0, report="success")  # the success comes: m-1 goes on, beside m-2
    assert signature_of(run) is None


# --- a failure at teardown after the input ran out ---------------------------------------


def test_a_failure_at_teardown_after_the_input_ran_out_fails_the_run(strict: Recorder) -> None:
    """Hypothesis drops what its ``finally`` raises after ``StopTest``; the machine records
    it and the run fails on it (``no_failure_lost``)."""
    run = EngineModel()
    run.start(flow=Flow(Task("t1")))
    broken = signatures.violation("LIVENESS")("LIVENESS: made up")
    with mock.patch.object(run, "_liveness", side_effect=broken), pytest.raises(Violation):
        try:
            raise StopTest(0)  # the example ran out of input mid-run
        finally:
            run.teardown()

    assert strict.lost == [("LIVENESS", f"LIVENESS: made up ({Flow(Task('t1'))!r})")]
    with pytest.raises(AssertionError, match=r"1 failure.*LIVENESS: made up"):
        signatures.no_failure_lost()
    signatures.no_failure_lost(since=1)  # nothing after it


def test_a_failure_at_a_normal_teardown_is_not_recorded_as_lost(strict: Recorder) -> None:
    run = EngineModel()
    run.start(flow=Flow(Task("t1")))
    broken = signatures.violation("LIVENESS")("LIVENESS: made up")
    with mock.patch.object(run, "_liveness", side_effect=broken), pytest.raises(Violation):
        run.teardown()
    assert strict.lost == []
