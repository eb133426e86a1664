"""The order state machine, pure, on a fake clock."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal, TypedDict

import pytest

from core.attempts import Attempt
from core.errors import TransitionRefused, UnboundMessage
from core.messages import AgentReply
from core.model import IN_FLIGHT_GRACE, Order, ReplyEffect
from core.order_message import decode_order
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.timefmt import parse_iso
from core.workflows import WORKFLOWS, Plan

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, base_backoff_seconds=2)


def new_order(
    workflow: str = "order", reply_to: str | None = "app-status", **data: object
) -> Order:
    body = {"orderId": "o-1", "workflow": workflow, **data}
    if reply_to:
        body["replyTo"] = reply_to
    message = decode_order(json.dumps(body))
    return Order.accept(message, Plan.of(WORKFLOWS[workflow], 30), T0)


def reply(
    order: Order,
    outcome: Outcome = Outcome.SUCCEEDED,
    step: str | None = None,
    attempt: int | None = None,
    error: str = "declined",
    applied: Applied | None = None,
    not_before: datetime | None = None,
) -> AgentReply:
    """A reply for ``step``'s ``attempt``, by default the active step's current attempt."""
    if not step or attempt is None:
        active = order.active_step()
        assert active is not None, "no step is active: name the step and the attempt"
        step = step or active.step
        attempt = attempt if attempt is not None else active.attempt
    record = order.find(step)
    return AgentReply(
        order.order_id,
        step,
        attempt,
        T0,
        outcome,
        result={"ok": True} if outcome == Outcome.SUCCEEDED else None,
        error=None if outcome == Outcome.SUCCEEDED else error,
        applied=Applied(
            applied or ("no" if outcome in (Outcome.REFUSED, Outcome.DEFERRED) else "maybe")
        )
        if outcome != Outcome.SUCCEEDED
        else None,
        not_before=not_before if outcome == Outcome.DEFERRED else None,
        # the attempt's own token, as the agent carries it back from its request
        token=record.token_for(attempt) if record is not None else "",
    )


def status(order: Order) -> OrderStatus:
    """The order's status now (a call, so that a type checker reads it afresh after each
    transition)."""
    return order.status


def statuses(order: Order) -> list[str]:
    return [json.loads(n.body)["status"] for n in order.outbox if n.kind == "status"]


class Alert(TypedDict):
    """An operator alert's body, as ``core.messages.alert_message`` writes it."""

    orderId: str
    step: str
    reason: str
    failureCount: int
    at: str


def alerts(order: Order) -> list[Alert]:
    return [json.loads(n.body) for n in order.outbox if n.kind == "alert"]


def run_step(order: Order, now: datetime, outcome: Outcome = Outcome.SUCCEEDED) -> None:
    order.claim("i-1", now)
    order.apply_reply(reply(order, outcome), now + timedelta(seconds=1))


# --- single-step order -------------------------------------------------------------


def test_accepted_order_has_one_pending_step_due_now() -> None:
    order = new_order()
    assert order.status is OrderStatus.PENDING
    [step] = order.steps
    assert (step.step, step.process_state, step.locked_by) == ("process", StepState.PENDING, "")
    assert (step.complete_by, step.attempt, step.failure_count) == (T0, 0, 0)
    assert statuses(order) == ["received"]


def test_claim_locks_the_step_with_a_deadline_and_a_new_attempt() -> None:
    order = new_order()
    step = order.claim("scheduler-a", T0)
    assert step.process_state is StepState.PROCESSING
    assert step.locked_by == "scheduler-a"
    assert step.attempt == 1
    assert step.complete_by == T0 + timedelta(seconds=30)
    assert order.status is OrderStatus.PROCESSING
    with pytest.raises(TransitionRefused) as refused:
        order.claim("scheduler-b", T0)
    assert refused.value.reason == "already-claimed"


def test_success_reply_completes_the_order() -> None:
    order = new_order()
    run_step(order, T0)
    [step] = order.steps
    assert step.process_state is StepState.PROCESSED
    assert step.locked_by == ""
    assert step.result == {"ok": True}
    assert order.status is OrderStatus.COMPLETED
    assert order.active_step() is None
    assert statuses(order) == ["received", "processing", "completed"]


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (
            lambda o, r: AgentReply(
                r.order_id, r.step, r.attempt + 1, T0, Outcome.SUCCEEDED, {}, token=r.token
            ),
            "attempt 2 was never claimed",
        ),
        (
            lambda o, r: AgentReply(
                r.order_id, "nope", r.attempt, T0, Outcome.SUCCEEDED, {}, token=r.token
            ),
            "the order has no step 'nope'",
        ),
        (
            lambda o, r: AgentReply(r.order_id, r.step, r.attempt, T0, Outcome.SUCCEEDED, {}),
            "it carries no token",
        ),
        (
            lambda o, r: AgentReply(
                r.order_id, r.step, r.attempt, T0, Outcome.SUCCEEDED, {}, token="f" * 32
            ),
            "its token is not that attempt's",
        ),
    ],
)
def test_a_reply_no_claim_speaks_for_is_unbound_and_changes_nothing(
    tamper: Callable[[Order, AgentReply], AgentReply], reason: str
) -> None:
    """docs/contracts.md §3.3: a report must carry its attempt's own token; a forged one
    (a success the remote never gave, or for an attempt never claimed) is never applied."""
    order = new_order()
    order.claim("i", T0)
    before = (order.steps[0].process_state, order.steps[0].attempt, order.status)
    with pytest.raises(UnboundMessage) as unbound:
        order.apply_reply(tamper(order, reply(order)), T0 + timedelta(seconds=1))
    assert reason in unbound.value.message
    assert (order.steps[0].process_state, order.steps[0].attempt, order.status) == before


def test_success_after_the_deadline_is_evidence_and_completes_the_step() -> None:
    order = new_order()
    order.claim("i", T0)
    assert order.apply_reply(reply(order), T0 + timedelta(seconds=30)) is ReplyEffect.NOTED
    assert order.steps[0].process_state is StepState.PROCESSED
    assert order.status is OrderStatus.COMPLETED
    assert order.steps[0].history[-1] == {
        "at": "2026-11-22T10:00:30.000Z",
        "event": "succeeded",
        "attempt": 1,
        "instance": "i",
        "late": True,
    }


def test_duplicate_reply_is_refused_after_the_first_applies() -> None:
    order = new_order()
    order.claim("i", T0)
    first = reply(order)
    assert order.apply_reply(first, T0 + timedelta(seconds=1)) is ReplyEffect.APPLIED
    with pytest.raises(TransitionRefused) as refused:
        order.apply_reply(first, T0 + timedelta(seconds=2))
    assert refused.value.reason == "already-settled"


def test_permanent_failure_makes_the_step_error_with_an_alert() -> None:
    order = new_order()
    run_step(order, T0, Outcome.REFUSED)
    [step] = order.steps
    assert step.process_state is StepState.ERROR
    assert step.failure_count == 1
    assert order.status is OrderStatus.ERROR
    [alert] = alerts(order)
    assert alert["orderId"] == "o-1" and alert["step"] == "process"
    assert "declined" in str(alert["reason"]) and alert["failureCount"] == 1
    assert statuses(order)[-1] == "error"


def test_expiry_retries_then_backs_off_then_gives_up_with_an_alert() -> None:
    order = new_order()
    step = order.claim("i", T0)
    with pytest.raises(TransitionRefused) as early:
        order.expire(T0 + timedelta(seconds=29), POLICY)
    assert early.value.reason == "not-expired"

    now = T0 + timedelta(seconds=31)
    order.expire(now, POLICY)  # failure 1: within the soft threshold, at once
    assert (step.process_state, step.failure_count, step.locked_by) == (StepState.PENDING, 1, "")
    assert step.complete_by == now
    order.claim("i", now)
    assert step.attempt == 2

    now += timedelta(seconds=31)
    order.expire(now, POLICY)  # failure 2: past the soft threshold, backoff about 2 s
    assert (step.process_state, step.failure_count, step.locked_by) == (StepState.PENDING, 2, "")
    delay = (step.complete_by - now).total_seconds()
    assert 1.6 <= delay <= 2.4
    with pytest.raises(TransitionRefused) as not_due:
        order.claim("i", now)
    assert not_due.value.reason == "not-due"

    now = step.complete_by
    order.claim("i", now)
    now += timedelta(seconds=31)
    order.expire(now, POLICY)  # failure 3 = max: Error
    assert step.process_state is StepState.ERROR
    assert order.status is OrderStatus.ERROR
    [alert] = alerts(order)
    assert alert["failureCount"] == 3 and "3 attempts" in str(alert["reason"])
    events = [h["event"] for h in step.history]
    assert events.count("expired") == 3 and events.count("claimed") == 3


@pytest.mark.parametrize("reclaimed", [False, True])
def test_a_success_for_an_expired_attempt_completes_the_step(reclaimed: bool) -> None:
    """Three successes must never become "it may or may not have been applied"."""
    order = new_order()
    order.claim("i", T0)
    late = reply(order)
    order.expire(T0 + timedelta(seconds=31), POLICY)
    if reclaimed:  # attempt 2 is in flight when attempt 1's success arrives
        order.claim("j", T0 + timedelta(seconds=31))
    assert order.apply_reply(late, T0 + timedelta(seconds=32)) is ReplyEffect.NOTED
    step = order.steps[0]
    assert step.process_state is StepState.PROCESSED and step.locked_by == ""
    assert order.status is OrderStatus.COMPLETED
    # attempt 2's own reply, if any, is then a duplicate
    if reclaimed:
        with pytest.raises(TransitionRefused):
            order.apply_reply(reply(order, step="process", attempt=2), T0 + timedelta(seconds=33))


def test_a_non_success_report_for_an_old_attempt_changes_nothing_it_should_not() -> None:
    order = new_order()
    order.claim("i", T0)
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, error="503", applied=Applied.NO), T0 + timedelta(seconds=5)
    )
    due = order.steps[0].complete_by  # paced: not before one step timeout after attempt 1
    assert due >= T0 + timedelta(seconds=30)
    order.claim("i", due)
    # attempt 1's report again (a duplicate delivery): it adds nothing
    with pytest.raises(TransitionRefused) as refused:
        order.apply_reply(
            reply(order, Outcome.TRANSIENT, attempt=1, error="503", applied=Applied.NO),
            due + timedelta(seconds=1),
        )
    assert refused.value.reason == "stale-attempt"
    with pytest.raises(UnboundMessage):  # an attempt never claimed: no token can be its own
        order.apply_reply(reply(order, attempt=7), T0 + timedelta(seconds=6))


def test_resubmit_puts_an_error_order_back_at_its_failed_step_keeping_history() -> None:
    order = new_order()
    run_step(order, T0, Outcome.REFUSED)
    with pytest.raises(TransitionRefused):
        new_order().resubmit(T0, "op")
    step = order.resubmit(T0 + timedelta(minutes=5), "alice")
    assert (order.status, step.process_state, step.failure_count, step.attempt) == (
        OrderStatus.PROCESSING,
        StepState.PENDING,
        0,
        1,
    )
    run_step(order, T0 + timedelta(minutes=5))
    assert order.status is OrderStatus.COMPLETED
    assert step.attempt == 2
    assert [h["event"] for h in step.history] == [
        "created",
        "claimed",
        "refused",
        "error",
        "resubmitted",
        "claimed",
        "succeeded",
    ]


# --- fulfilment: multi-step with compensation ----------------------------------------


def named(order: Order, step: str) -> StepRecord:
    """The order's latest record of ``step``, which the test expects to be there."""
    record = order.find(step)
    assert record is not None, f"{order.order_id} has no step {step!r}"
    return record


def states(order: Order) -> list[tuple[str, str]]:
    return [(s.step, str(s.process_state)) for s in order.steps]


def drive(
    order: Order, outcomes: dict[str, Outcome | Literal["expire"]], now: datetime = T0
) -> None:
    """Run the active steps until none is left; outcomes: step -> a reply's outcome, or
    "expire" (no reply: the step's deadlines pass until it errs); by default, succeeded."""
    for _ in range(50):
        step = order.active_step()
        if step is None:
            return
        now = max(now, step.complete_by)  # a compensation may be due later
        order.claim("i", now)
        how = outcomes.get(step.step, Outcome.SUCCEEDED)
        if how == "expire":
            while step.process_state is not StepState.ERROR and order.active_step() is step:
                now = step.complete_by + timedelta(seconds=1)
                order.expire(now, POLICY)
                if step.process_state is StepState.PENDING:
                    now = max(now, step.complete_by)
                    order.claim("i", now)
        else:
            order.apply_reply(reply(order, how), now + timedelta(seconds=1))
        now += timedelta(seconds=2)
    raise AssertionError("workflow did not settle")


def test_fulfilment_runs_its_steps_in_order() -> None:
    order = new_order("fulfilment")
    drive(order, {})
    assert states(order) == [
        ("reserve-stock", "Processed"),
        ("charge-payment", "Processed"),
        ("ship", "Processed"),
    ]
    assert order.status is OrderStatus.COMPLETED


@pytest.mark.parametrize(
    ("failing", "expected_states"),
    [
        ("reserve-stock", [("reserve-stock", "Error")]),
        (
            "charge-payment",
            [
                ("reserve-stock", "Compensated"),
                ("charge-payment", "Error"),
                ("release-stock", "Processed"),
            ],
        ),
        (
            "ship",
            [
                ("reserve-stock", "Compensated"),
                ("charge-payment", "Compensated"),
                ("ship", "Error"),
                ("refund-payment", "Processed"),
                ("release-stock", "Processed"),
            ],
        ),
    ],
)
def test_permanent_failure_compensates_completed_steps_in_reverse(
    failing: str, expected_states: list[tuple[str, str]]
) -> None:
    order = new_order("fulfilment")
    drive(order, {failing: Outcome.REFUSED})
    assert states(order) == expected_states
    assert order.status is OrderStatus.COMPENSATED
    assert alerts(order) == []  # undone without anyone's help: the app hears "compensated"
    assert statuses(order)[-2:] == (
        ["compensating", "compensated"]
        if len(expected_states) > 1
        else ["processing", "compensated"]
    )
    comps = [s for s in order.steps if s.kind is StepKind.COMPENSATION]
    assert all(c.compensates for c in comps)


def test_ambiguous_failure_compensates_the_failed_step_too() -> None:
    order = new_order("fulfilment")
    drive(order, {"charge-payment": "expire"})
    assert states(order) == [
        ("reserve-stock", "Compensated"),
        ("charge-payment", "Compensated"),
        ("refund-payment", "Processed"),
        ("release-stock", "Processed"),
    ]
    assert order.status is OrderStatus.COMPENSATED
    assert alerts(order) == []
    # the refund is not dispatched before charge-payment's last call can have ended
    charge, refund = order.find("charge-payment"), order.find("refund-payment")
    assert charge is not None and refund is not None
    first_claim = next(h for h in refund.history if h["event"] == "claimed")
    assert parse_iso(first_claim["at"]) >= charge.last_deadline() + IN_FLIGHT_GRACE


def test_ambiguous_failure_without_compensation_waits_for_the_operator() -> None:
    order = new_order("fulfilment")
    drive(order, {"ship": "expire"})
    assert (order.status, states(order)) == (
        OrderStatus.ERROR,
        [("reserve-stock", "Processed"), ("charge-payment", "Processed"), ("ship", "Error")],
    )
    [alert] = alerts(order)
    assert alert["step"] == "ship"
    assert "may have been applied" in str(alert["reason"])
    assert "has no compensation" in str(alert["reason"])
    order.resubmit(T0 + timedelta(hours=1), "op")
    drive(order, {}, T0 + timedelta(hours=1))
    assert order.status is OrderStatus.COMPLETED


@pytest.mark.parametrize("failing_compensation", ["refund-payment", "release-stock"])
def test_failed_compensation_stops_unwinding_and_can_be_resubmitted(
    failing_compensation: str,
) -> None:
    order = new_order("fulfilment")
    drive(order, {"ship": Outcome.REFUSED, failing_compensation: Outcome.REFUSED})
    assert (order.status, named(order, failing_compensation).process_state) == (
        OrderStatus.ERROR,
        StepState.ERROR,
    )
    [alert] = alerts(order)
    assert alert["step"] == failing_compensation
    assert "unwinding stopped" in str(alert["reason"])
    if failing_compensation == "refund-payment":  # release never started
        assert order.find("release-stock") is None
        assert named(order, "reserve-stock").process_state is StepState.PROCESSED
    retried = order.resubmit(T0 + timedelta(hours=1), "op")
    assert (order.status, retried.step) == (OrderStatus.COMPENSATING, failing_compensation)
    drive(order, {}, T0 + timedelta(hours=1))
    assert order.status is OrderStatus.COMPENSATED
    assert named(order, "reserve-stock").process_state is StepState.COMPENSATED
    assert named(order, "charge-payment").process_state is StepState.COMPENSATED


# --- cancellation ---------------------------------------------------------------------


def test_cancel_before_anything_ran_ends_cancelled_at_once() -> None:
    order = new_order("fulfilment")
    order.cancel(T0, "app")
    assert order.status is OrderStatus.CANCELLED
    assert states(order) == [("reserve-stock", "Compensated")]
    assert order.active_step() is None


def test_cancel_while_a_step_is_in_flight_undoes_it_after_its_reply() -> None:
    order = new_order("fulfilment")
    drive_one = order.claim("i", T0)
    order.apply_reply(reply(order), T0 + timedelta(seconds=1))
    order.claim("i", T0 + timedelta(seconds=2))  # charge-payment in flight
    order.cancel(T0 + timedelta(seconds=3), "app", "customer changed mind")
    assert (order.status, order.cancel_requested) == (OrderStatus.PROCESSING, True)
    order.apply_reply(reply(order), T0 + timedelta(seconds=4))
    drive(order, {}, T0 + timedelta(seconds=5))
    assert order.status is OrderStatus.CANCELLED
    assert drive_one.process_state is StepState.COMPENSATED
    assert [s.step for s in order.steps] == [
        "reserve-stock",
        "charge-payment",
        "refund-payment",
        "release-stock",
    ]
    with pytest.raises(TransitionRefused):
        order.cancel(T0 + timedelta(seconds=9), "app")


def test_finished_orders_refuse_every_transition() -> None:
    order = new_order()
    run_step(order, T0)
    for attempt in (
        lambda: order.claim("i", T0),
        lambda: order.expire(T0 + timedelta(hours=1), POLICY),
        lambda: order.resubmit(T0, "op"),
        lambda: order.cancel(T0, "op"),
    ):
        with pytest.raises(TransitionRefused):
            attempt()


# --- invariants under random histories ---------------------------------------------------


@pytest.mark.parametrize("seed", [20261122, 1, 2])
def test_random_histories_keep_the_invariants(seed: int) -> None:
    """A seeded random walk over every transition and every kind of reply (on time, late,
    for old attempts, duplicated); the invariants hold after each move."""
    rng = random.Random(seed)
    outcomes = list(Outcome)
    for _ in range(400):
        order = new_order(rng.choice(["order", "fulfilment"]))
        now = T0
        for _ in range(60):
            now += timedelta(seconds=rng.choice([1, 5, 40]))
            move = rng.choice(["claim", "claim", "reply", "late", "expire", "resubmit", "cancel"])
            active = order.active_step()
            try:
                if move == "claim":
                    order.claim("i", now)
                elif move in ("reply", "late"):
                    target = active or rng.choice(order.steps)
                    if not target.attempt:
                        continue
                    number = target.attempt
                    if move == "late":
                        number = rng.randint(1, target.attempt)
                    outcome = rng.choice(outcomes)
                    reply = random_reply(order, target.step, number, outcome, rng, now)
                    order.apply_reply(reply, now, POLICY)
                elif move == "expire":
                    order.expire(now, POLICY)
                elif move == "resubmit":
                    order.resubmit(now, "op")
                elif move == "cancel" and rng.random() < 0.15:
                    order.cancel(now, "op")
            except TransitionRefused:
                pass
            check_invariants(order)


def check_invariants(order: Order) -> None:
    active = [s for s in order.steps if s.is_active]
    assert len(active) <= 1
    if order.status.terminal:
        assert not active, (order.status, [(s.step, s.process_state) for s in order.steps])
    else:
        assert active, (order.status, [(s.step, s.process_state) for s in order.steps])
    for s in order.steps:
        assert (s.locked_by != "") == (s.process_state is StepState.PROCESSING)
        assert s.attempt >= (1 if s.process_state is StepState.PROCESSING else 0)
    if order.status is OrderStatus.COMPLETED:
        assert [s.step for s in order.steps] == [p.name for p in order.plan.steps]
        assert all(s.process_state is StepState.PROCESSED for s in order.steps)
    # compensations run in reverse order of the steps they undo (a step that turned out
    # applied while the order was already being undone is the one exception)
    late = {
        s.step
        for s in order.steps
        if any(
            h.get("note") == "applied after all"
            or "may have been applied after all" in str(h.get("reason", ""))
            for h in s.history
        )
    }
    undone: list[str] = []
    for s in order.steps:
        if s.kind is StepKind.COMPENSATION:
            assert s.compensates is not None, f"{s.step} compensates no step"
            if s.compensates not in late:
                undone.append(s.compensates)
    seqs = [named(order, name).seq for name in undone]
    assert seqs == sorted(seqs, reverse=True)
    # one compensation record per undone step, never two
    assert len(undone) == len(set(undone))
    # a finished order left nothing half undone
    if order.status.finished:
        assert not any(s.process_state is StepState.COMPENSATING for s in order.steps), [
            (s.step, str(s.process_state)) for s in order.steps
        ]
        assert all(
            s.process_state is StepState.PROCESSED
            for s in order.steps
            if s.kind is StepKind.COMPENSATION
        ), [(s.step, str(s.process_state)) for s in order.steps]
    # an order in error told an operator about the very step it waits on, when (or after)
    # that step failed for good: not merely "some alert once" (the outbox is never drained
    # here, so it holds every notice of the walk)
    # (or, with nothing failed, about the effect that stands after the order was undone)
    if order.status is OrderStatus.ERROR:
        told = [json.loads(n.body) for n in order.outbox if n.kind == "alert"]
        if any(s.process_state is StepState.ERROR for s in order.steps):
            failed = order.failed_step()
            assert failed.gave_up is not None
            assert any(
                a["step"] in {s.step for s in order.steps if s.process_state is StepState.ERROR}
                and parse_iso(a["at"]) >= failed.gave_up.at
                for a in told
            ), (failed.step, told[-3:])
        else:
            assert any("its effect stands" in a["reason"] for a in told), told[-3:]
    for s in order.steps:
        assert s.failure_count >= 0
        assert all(1 <= n <= s.attempt for n in s.maybe_applied)
    if order.status is OrderStatus.COMPENSATED:
        assert not any(
            s.process_state is StepState.PROCESSED
            and s.kind is StepKind.ACTION
            and order.planned(s.step).compensation
            for s in order.steps
        )


def random_reply(
    order: Order,
    step: str,
    number: int,
    outcome: Outcome,
    rng: random.Random,
    now: datetime,
) -> AgentReply:
    """A reply a random walk sends: ``outcome``, with a random doubt (not applied or may
    have applied) when it is not a success, and a random wait when it is a deferral."""
    record = order.find(step)
    return AgentReply(
        order.order_id,
        step,
        number,
        T0,
        outcome,
        result={} if outcome == Outcome.SUCCEEDED else None,
        error=None if outcome == Outcome.SUCCEEDED else "no",
        applied=None if outcome == Outcome.SUCCEEDED else rng.choice([Applied.NO, Applied.MAYBE]),
        not_before=now + timedelta(seconds=rng.choice([0, 3, 90]))
        if outcome == Outcome.DEFERRED
        else None,
        token=record.token_for(number) if record is not None else "",
    )


def test_one_copy_of_a_request_takes_its_attempt_and_the_others_do_not() -> None:
    """Storage queues detect no duplicates: the first copy an agent reads takes the
    attempt; the same copy again still holds it (a redelivery after a crash); any other
    copy does not, nor does one for an attempt no longer kept."""
    order = new_order()
    step = order.claim("i-1", T0)
    assert order.take(step.step, 1, "m-1") == "took" and step.changed
    assert order.take(step.step, 1, "m-1") == "held"
    assert order.take(step.step, 1, "m-2") == "other"
    assert order.take(step.step, 2, "m-3") == "other"  # never claimed
    assert order.take("nope", 1, "m-1") == "other"
    [attempt] = step.attempts.items
    assert attempt.taken_by == "m-1"
    assert Attempt.from_json(attempt.to_json()).taken_by == "m-1"  # it is stored
