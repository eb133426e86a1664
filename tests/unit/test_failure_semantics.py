"""Contract 3.11 on the pure model, with a fake clock: what a try did decides what the
step does and what the operator is told."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from core.errors import TransitionRefused
from core.messages import AgentReply
from core.model import Order, ReplyEffect
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepState
from tests.unit.test_model import T0, alerts, new_order, reply, states, status, statuses

POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=600)


def attempt(
    order: Order,
    now: datetime,
    outcome: Outcome,
    *,
    error: str = "declined",
    applied: Applied | None = None,
    not_before: datetime | None = None,
) -> ReplyEffect:
    """Claim the active step at ``now`` and apply one reply (as ``reply`` makes it) a second
    later."""
    order.claim("i-1", now)
    sent = reply(order, outcome, error=error, applied=applied, not_before=not_before)
    return order.apply_reply(sent, now + timedelta(seconds=1), POLICY)


def fail_until_given_up(order: Order, applied: list[Applied], now: datetime = T0) -> datetime:
    """One transient report per attempt with the given 'applied' values, then (when the
    last failure came before the time budget was spent and the step is held) the
    supervisor's pass that makes it final; returns the time."""
    for value in applied:
        step = order.active_step()
        assert step is not None
        now = max(now, step.complete_by)
        attempt(order, now, Outcome.TRANSIENT, error="HTTP 503", applied=value)
        now += timedelta(seconds=2)
    step = order.active_step()
    if step is not None and step.held:
        now = max(now, step.complete_by + timedelta(seconds=1))
        order.expire(now, POLICY)
    return now


def reach(order: Order, step: str, now: datetime = T0) -> datetime:
    """Succeed every step before ``step``."""
    while (active := order.active_step()) is not None and active.step != step:
        attempt(order, max(now, active.complete_by), Outcome.SUCCEEDED)
        now += timedelta(seconds=2)
    return now


# --- definite vs ambiguous ---------------------------------------------------------------


def test_all_tries_not_applied_is_a_definite_failure_safe_to_resubmit() -> None:
    order = new_order()
    fail_until_given_up(order, [Applied.NO, Applied.NO, Applied.NO])
    [step] = order.steps
    assert step.process_state is StepState.ERROR and step.failure_count == 3
    assert order.status is OrderStatus.ERROR
    [alert] = alerts(order)
    assert "was not applied" in alert["reason"] and "safe to resubmit" in alert["reason"]
    assert "may" not in alert["reason"]


def test_one_attempt_that_may_have_applied_makes_it_ambiguous() -> None:
    order = new_order()
    fail_until_given_up(order, [Applied.NO, Applied.MAYBE, Applied.NO])
    [alert] = alerts(order)
    assert "may have been applied" in alert["reason"]
    assert order.steps[0].maybe_applied == [2]


def test_ship_refused_by_503_every_time_unwinds_to_compensated() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    fail_until_given_up(order, [Applied.NO, Applied.NO, Applied.NO], now)
    now += timedelta(seconds=30)
    for name in ("refund-payment", "release-stock"):
        step = order.active_step()
        assert step is not None and step.step == name
        attempt(order, max(now, step.complete_by), Outcome.SUCCEEDED)
    assert order.status is OrderStatus.COMPENSATED
    assert alerts(order) == []  # handled without people
    assert states(order) == [
        ("reserve-stock", "Compensated"),
        ("charge-payment", "Compensated"),
        ("ship", "Error"),
        ("refund-payment", "Processed"),
        ("release-stock", "Processed"),
    ]


def test_ambiguous_ship_waits_for_the_operator() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    fail_until_given_up(order, [Applied.MAYBE, Applied.NO, Applied.NO], now)
    assert order.status is OrderStatus.ERROR
    [alert] = alerts(order)
    assert alert["step"] == "ship" and "may have been applied" in alert["reason"]


# --- deferral --------------------------------------------------------------------------


def test_a_deferral_is_no_failure_and_waits_for_the_time_asked() -> None:
    order = new_order()
    order.claim("i", T0)
    asked = T0 + timedelta(seconds=90)  # Retry-After well past the step's deadline
    order.apply_reply(
        reply(order, Outcome.DEFERRED, error="Retry-After 90 s", not_before=asked),
        T0 + timedelta(seconds=1),
        POLICY,
    )
    [step] = order.steps
    assert step.process_state is StepState.PENDING
    assert step.failure_count == 0 and step.deferrals == 1
    assert step.complete_by >= asked
    with pytest.raises(TransitionRefused) as early:
        order.claim("i", asked - timedelta(seconds=1))
    assert early.value.reason == "not-due"
    order.claim("i", step.complete_by)
    assert step.attempt == 2


def test_deferrals_grow_capped_and_end_at_the_window_as_a_definite_failure() -> None:
    order = new_order()
    now = T0
    delays = []
    while order.status is not OrderStatus.ERROR:
        step = order.active_step()
        assert step is not None
        now = max(now, step.complete_by)
        attempt(order, now, Outcome.DEFERRED, error="circuit open", not_before=now)
        if step.process_state is StepState.PENDING:
            delays.append((step.complete_by - (now + timedelta(seconds=1))).total_seconds())
        assert step.failure_count == 0
        assert len(delays) < 200
    assert delays[:4] == sorted(delays[:4]) and delays[0] < 1.5
    assert max(delays) <= POLICY.max_deferral_seconds
    total = (now - T0).total_seconds()
    assert 600 <= total <= 600 + POLICY.max_deferral_seconds + 2
    [alert] = alerts(order)
    assert "could not reach its service" in alert["reason"]
    assert "was not applied" in alert["reason"]


def test_a_counted_failure_ends_the_deferral_streak() -> None:
    order = new_order()
    attempt(order, T0, Outcome.DEFERRED, error="open", not_before=T0)
    step = order.steps[0]
    assert (step.deferrals, step.deferred_since is not None, step.failure_count) == (1, True, 0)
    attempt(order, step.complete_by, Outcome.TRANSIENT, error="503", applied=Applied.NO)
    assert (step.deferrals, step.deferred_since, step.failure_count) == (0, None, 1)


# --- late reports correct what an expiry assumed ----------------------------------------


def test_a_late_not_applied_report_clears_the_doubt_of_an_expiry() -> None:
    order = new_order()
    order.claim("i", T0)
    order.expire(T0 + timedelta(seconds=31), POLICY)
    step = order.steps[0]
    assert step.maybe_applied == [1] and step.failure_count == 1
    effect = order.apply_reply(
        reply(order, Outcome.TRANSIENT, attempt=1, error="503", applied=Applied.NO),
        T0 + timedelta(seconds=32),
        POLICY,
    )
    assert effect is ReplyEffect.NOTED
    assert step.maybe_applied == [] and step.failure_count == 1
    with pytest.raises(TransitionRefused):  # a second copy changes nothing
        order.apply_reply(
            reply(order, Outcome.TRANSIENT, attempt=1, error="503", applied=Applied.NO),
            T0 + timedelta(seconds=33),
            POLICY,
        )


@pytest.mark.parametrize(
    ("applied", "failures", "doubt"),
    [(Applied.NO, 0, []), (Applied.MAYBE, 1, [1])],
    ids=["not-called-gives-back-the-failure", "maybe-keeps-the-failure-and-the-doubt"],
)
def test_a_late_deferral_of_an_expired_attempt(
    applied: Applied, failures: int, doubt: list[int]
) -> None:
    """Its first report, a deferral, says what the expiry assumed. "Not called" gives back
    the failure the expiry counted. An agent that defers a redelivered request says
    "maybe" (an earlier delivery may have called the remote: agents/agent.py): no proof
    the attempt never reached for the remote, so its failure stays counted
    (docs/contracts.md §3.11: the budget counts attempts that reached for the remote and
    failed), and so does its doubt."""
    order = new_order()
    order.claim("i", T0)
    order.expire(T0 + timedelta(seconds=31), POLICY)
    order.claim("i", T0 + timedelta(seconds=31))
    step = order.steps[0]
    order.apply_reply(
        reply(order, Outcome.DEFERRED, attempt=1, error="open", not_before=T0, applied=applied),
        T0 + timedelta(seconds=32),
        POLICY,
    )
    assert step.failure_count == failures and step.maybe_applied == doubt
    assert step.process_state is StepState.PROCESSING and step.attempt == 2


def test_a_late_report_turns_an_ambiguous_error_into_a_definite_one() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    fail_until_given_up(order, [Applied.NO, Applied.NO], now)
    ship = order.active_step()
    assert ship is not None
    now = max(now + timedelta(seconds=10), ship.complete_by)
    order.claim("i", now)
    order.expire(now + timedelta(seconds=31), POLICY)  # the third attempt's report was slow
    assert (order.status, ship.process_state) == (OrderStatus.ERROR, StepState.ERROR)
    assert "may have been applied" in alerts(order)[-1]["reason"]
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, step="ship", attempt=3, error="503", applied=Applied.NO),
        now + timedelta(seconds=32),
        POLICY,
    )
    # The attempt's own report says it was not applied: the operator is told; nothing is
    # undone on a report's word alone (docs/contracts.md §3.15): a cancel now needs no
    # statement, and undoes the completed steps.
    assert order.status is OrderStatus.ERROR and not ship.may_have_applied
    assert "not applied after all" in alerts(order)[-1]["reason"]
    order.cancel(now + timedelta(seconds=33), "ops")
    assert status(order) is OrderStatus.COMPENSATING
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"


# --- a success is evidence, whenever it arrives -------------------------------------------


def test_a_late_success_resolves_an_order_waiting_for_the_operator() -> None:
    order = new_order()
    now = T0
    for _ in range(3):
        step = order.claim("i", max(now, order.steps[0].complete_by))
        now = step.complete_by + timedelta(seconds=3)
        order.expire(now, POLICY)
    assert (order.status, step.process_state) == (OrderStatus.ERROR, StepState.ERROR)
    effect = order.apply_reply(reply(order, step="process", attempt=2), now, POLICY)
    assert effect is ReplyEffect.NOTED
    assert order.status is OrderStatus.COMPLETED
    assert statuses(order)[-2:] == ["processing", "completed"]
    assert any(e["event"] == "resolved" for e in order.history)


def test_a_late_success_of_a_step_being_undone_gets_it_undone_too() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    fail_until_given_up(
        order, [Applied.NO, Applied.NO, Applied.NO], now
    )  # definite: charge not compensated
    undoing = order.active_step()
    assert undoing is not None
    assert (order.status, undoing.step) == (OrderStatus.COMPENSATING, "release-stock")
    order.apply_reply(
        reply(order, step="charge-payment", attempt=2), now + timedelta(seconds=20), POLICY
    )
    charge = order.find("charge-payment")
    assert charge is not None
    assert (charge.process_state, order.status) == (StepState.PROCESSED, OrderStatus.COMPENSATING)
    release = order.active_step()
    assert release is not None
    attempt(order, max(now, release.complete_by) + timedelta(seconds=30), Outcome.SUCCEEDED)
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    attempt(order, refund.complete_by + timedelta(seconds=31), Outcome.SUCCEEDED)
    assert order.status is OrderStatus.COMPENSATED
    assert charge.process_state is StepState.COMPENSATED


# --- cancel -------------------------------------------------------------------------------


def test_cancel_too_late_for_ship_lets_the_order_complete() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    order.claim("i", now)
    order.cancel(now + timedelta(seconds=1), "app", "changed mind")
    order.apply_reply(reply(order), now + timedelta(seconds=2), POLICY)
    assert order.status is OrderStatus.COMPLETED
    assert states(order) == [
        ("reserve-stock", "Processed"),
        ("charge-payment", "Processed"),
        ("ship", "Processed"),
    ]
    assert any(e["event"] == "cancel-too-late" for e in order.history)
    assert not order.cancel_requested


def test_cancel_with_ship_unanswered_asks_the_operator_who_can_cancel_again() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    ship = order.claim("i", now)
    order.cancel(now + timedelta(seconds=1), "app")
    order.expire(ship.complete_by + timedelta(seconds=3), POLICY)
    assert (order.status, ship.process_state) == (OrderStatus.ERROR, StepState.ERROR)
    [alert] = alerts(order)
    assert "may have been applied" in alert["reason"] and "cancel again" in alert["reason"]
    with pytest.raises(TransitionRefused) as refused:  # not around the doubt, unasked
        order.cancel(now + timedelta(minutes=5), "operator", "carrier says nothing shipped")
    assert refused.value.reason == "doubt"
    order.cancel(
        now + timedelta(minutes=5), "operator", "carrier says nothing shipped", not_applied="ship"
    )
    undoing = order.active_step()
    assert undoing is not None
    assert (order.status, undoing.step) == (OrderStatus.COMPENSATING, "refund-payment")
    later = now + timedelta(minutes=6)
    for _ in range(2):
        step = order.active_step()
        assert step is not None
        attempt(order, max(later, step.complete_by), Outcome.SUCCEEDED)
    assert order.status is OrderStatus.CANCELLED
    assert [s for s, _ in states(order)][-2:] == ["refund-payment", "release-stock"]


def test_cancel_with_ship_unanswered_then_resubmit_finds_it_applied() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    ship = order.claim("i", now)
    order.cancel(now + timedelta(seconds=1), "app")
    order.expire(ship.complete_by + timedelta(seconds=3), POLICY)
    order.resubmit(now + timedelta(minutes=5), "operator")
    attempt(order, now + timedelta(minutes=5), Outcome.SUCCEEDED)  # the key's stored answer
    assert order.status is OrderStatus.COMPLETED


def test_cancel_during_a_compensable_step_that_fails_transiently_undoes_the_rest() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    order.claim("i", now)
    order.cancel(now + timedelta(seconds=1), "app")
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, error="503", applied=Applied.NO),
        now + timedelta(seconds=2),
        POLICY,
    )
    charge = order.find("charge-payment")
    assert charge is not None and charge.process_state is StepState.COMPENSATED
    release = order.active_step()
    assert release is not None and release.step == "release-stock"
    attempt(order, now + timedelta(seconds=3), Outcome.SUCCEEDED)
    assert order.status is OrderStatus.CANCELLED


def test_compensations_under_a_cancel_get_retries_and_supervision() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    attempt(order, now, Outcome.SUCCEEDED)
    ship = order.active_step()
    assert ship is not None and ship.step == "ship"
    order.cancel(now + timedelta(seconds=5), "app")
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    claimed = order.claim("i", now + timedelta(seconds=5))
    order.expire(claimed.complete_by + timedelta(seconds=3), POLICY)  # one missed deadline
    assert (order.status, refund.process_state, refund.failure_count) == (
        OrderStatus.COMPENSATING,
        StepState.PENDING,
        1,
    )
    attempt(order, refund.complete_by, Outcome.SUCCEEDED)
    release = order.active_step()
    assert release is not None
    attempt(order, release.complete_by, Outcome.SUCCEEDED)
    assert order.status is OrderStatus.CANCELLED


def test_cancel_of_a_step_that_may_have_applied_compensates_it() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    charge = order.claim("i", now)
    order.expire(charge.complete_by + timedelta(seconds=3), POLICY)  # Pending, maybe applied
    order.cancel(charge.complete_by + timedelta(seconds=4), "app")
    assert charge.process_state is StepState.COMPENSATING
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"


def test_cancel_of_a_step_deferred_so_far_needs_no_undo() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    attempt(order, now, Outcome.DEFERRED, error="open", not_before=now)
    order.cancel(now + timedelta(seconds=2), "app")
    charge = order.find("charge-payment")
    assert charge is not None and charge.process_state is StepState.COMPENSATED
    release = order.active_step()
    assert release is not None and release.step == "release-stock"


def test_a_second_cancel_of_an_order_whose_compensation_failed_retries_it() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    order.claim("i", now)
    order.cancel(now + timedelta(seconds=1), "app")
    order.apply_reply(reply(order, Outcome.REFUSED), now + timedelta(seconds=2), POLICY)
    refund = order.active_step()
    assert refund is not None
    attempt(order, refund.complete_by, Outcome.REFUSED)  # refund refused: unwinding stops
    assert (order.status, refund.process_state) == (OrderStatus.ERROR, StepState.ERROR)
    order.cancel(now + timedelta(minutes=1), "operator")
    assert (order.status, refund.process_state) == (OrderStatus.COMPENSATING, StepState.PENDING)
    for _ in range(2):
        step = order.active_step()
        assert step is not None
        attempt(order, max(now + timedelta(minutes=1), step.complete_by), Outcome.SUCCEEDED)
    assert order.status is OrderStatus.CANCELLED


def test_reply_json_round_trip_of_every_outcome() -> None:
    from core.outcome import REPORTED
    from messaging.wire import decode_reply

    order = new_order()
    order.claim("i", T0)
    for outcome in REPORTED:
        original = reply(order, outcome, not_before=T0 + timedelta(seconds=5))
        decoded = decode_reply(original.encode())
        assert decoded.outcome == outcome
        assert decoded.applied == original.applied
        if outcome is Outcome.DEFERRED:
            assert decoded.not_before == T0 + timedelta(seconds=5)
        body = json.loads(original.encode())
        assert ("applied" in body) is (outcome is not Outcome.SUCCEEDED)


def test_an_old_agents_failed_reply_without_applied_still_means_refused() -> None:
    from messaging.wire import decode_reply

    legacy = {
        "orderId": "o-1",
        "step": "process",
        "attempt": 1,
        "idempotencyKey": "o-1:process",
        "completeBy": "2026-11-22T10:00:30.000Z",
        "outcome": "failed",
        "error": "declined",
    }
    assert decode_reply(json.dumps(legacy)).applied == "no"
    legacy["outcome"] = "transient"
    assert decode_reply(json.dumps(legacy)).applied == "maybe"


def test_reply_from_an_unknown_outcome_is_refused_by_the_decoder() -> None:
    from core.errors import InvalidMessage
    from messaging.wire import decode_reply

    body = AgentReply(
        "o-1", "process", 1, T0, Outcome.DEFERRED, error="x", applied=Applied.NO
    ).to_json()
    del body["notBefore"]
    with pytest.raises(InvalidMessage, match="notBefore"):
        decode_reply(json.dumps(body))
    body["outcome"] = "maybe-later"
    with pytest.raises(InvalidMessage, match="outcome must be one of"):
        decode_reply(json.dumps(body))


DEEP: object = []
for _ in range(80):
    DEEP = [DEEP]


@pytest.mark.parametrize(
    "result",
    [
        {"x": float("nan")},
        {"x": "\ud800"},  # a lone surrogate, as JSON "\ud800" from the remote decodes to
        {"x": DEEP},
    ],
)
def test_a_success_whose_result_replies_cannot_carry_is_still_a_success(
    result: dict[str, object],
) -> None:
    from core.messages import AgentRequest
    from messaging.wire import decode_reply

    request = AgentRequest("o-1", "process", 1, T0 + timedelta(seconds=30), "process", {})
    reply = request.succeeded(result)
    decoded = decode_reply(reply.encode())  # the scheduler can read it: no quarantine
    assert decoded.outcome == "succeeded"
    assert decoded.result is not None and decoded.result["unreadable"] is True


def test_a_large_result_is_cut_with_a_marker_and_the_reply_fits_a_queue_message() -> None:
    from core.messages import AgentRequest
    from messaging.wire import decode_reply

    request = AgentRequest("o-1", "process", 1, T0 + timedelta(seconds=30), "process", {})
    reply = request.succeeded({"blob": "é" * 200_000})
    encoded = reply.encode()
    assert len(encoded.encode("utf-8")) < 64 * 1024
    decoded = decode_reply(encoded)
    assert decoded.result is not None and decoded.result["truncated"] is True


def test_a_workflow_step_timeout_the_host_cannot_honour_is_refused_at_start_up() -> None:
    from core.workflows import StepSpec, Workflow

    with pytest.raises(ValueError, match="what the host can honour"):
        Workflow("slow", (StepSpec("wait", timeout_seconds=600),))
    Workflow("ok", (StepSpec("wait", timeout_seconds=270),))


# --- found in review: each would fail without its fix --------------------------------------


def test_a_refusal_of_the_key_settles_the_doubt_of_an_earlier_attempt() -> None:
    """The service would answer an applied key with its stored result: its own refusal of
    the key (400, 422) in a later attempt says nothing was applied (the chaos suite's
    permanent-ship orders, whose earlier attempts expired when their agents were killed)."""
    order = new_order("fulfilment")
    now = reach(order, "ship")
    ship = order.claim("i", now)
    order.expire(ship.complete_by + timedelta(seconds=3), POLICY)  # may have applied
    order.claim("i", ship.complete_by + timedelta(seconds=3))
    settling = replace(reply(order, Outcome.REFUSED, error="HTTP 422"), settled=True)
    order.apply_reply(settling, now + timedelta(seconds=40), POLICY)
    assert order.status is OrderStatus.COMPENSATING  # unwinding: not "ask the operator"
    assert alerts(order) == []
    first = ship.attempts.get(1)
    assert first is not None and first.settled_by


def test_a_refusal_after_a_try_that_may_have_applied_in_the_same_attempt_is_ambiguous() -> None:
    order = new_order()
    order.claim("i", T0)
    order.apply_reply(
        reply(order, Outcome.REFUSED, error="409 after a 500", applied=Applied.MAYBE),
        T0 + timedelta(seconds=1),
        POLICY,
    )
    assert order.steps[0].maybe_applied == [1]
    assert "may have been applied" in alerts(order)[-1]["reason"]


def test_a_late_deferral_of_the_expiry_that_failed_the_step_changes_nothing() -> None:
    """A report that adds no evidence of an effect (a deferral: "not called") changes nothing
    on a step that has ended (docs/contracts.md §3.15): the count, the state and the order
    stay; the operator, told, decides."""
    order = new_order()
    fail_until_given_up(order, [Applied.NO, Applied.NO])
    step = order.steps[0]
    now = step.complete_by
    order.claim("i", now)
    order.expire(now + timedelta(seconds=33), POLICY)  # the deferral report was slow
    assert (order.status, step.failure_count) == (OrderStatus.ERROR, 3)
    order.apply_reply(
        reply(
            order,
            Outcome.DEFERRED,
            step="process",
            attempt=3,
            error="circuit open",
            not_before=now,
        ),
        now + timedelta(seconds=34),
        POLICY,
    )
    assert (order.status, step.process_state, step.failure_count) == (
        OrderStatus.ERROR,
        StepState.ERROR,
        3,
    )
    assert not any("back to work" in a["reason"] for a in alerts(order))


def test_a_late_report_does_not_skip_a_compensation_that_failed_after_it() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    fail_until_given_up(order, [Applied.NO, Applied.NO], now)
    ship = order.active_step()
    assert ship is not None
    later = ship.complete_by
    order.claim("i", later)
    order.expire(later + timedelta(seconds=33), POLICY)  # ambiguous: order error
    order.cancel(later + timedelta(seconds=40), "operator", not_applied="ship")  # undo the rest
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    # refund refused: error again
    attempt(order, later + timedelta(seconds=41), Outcome.REFUSED)
    assert order.status is OrderStatus.ERROR
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, step="ship", attempt=3, error="503", applied=Applied.NO),
        later + timedelta(seconds=50),
        POLICY,
    )
    assert order.status is OrderStatus.ERROR  # still waiting on the refund
    assert refund.process_state is StepState.ERROR


def test_resubmitting_a_step_after_a_cancel_gives_it_the_usual_retries() -> None:
    order = new_order("fulfilment")
    now = reach(order, "ship")
    ship = order.claim("i", now)
    order.cancel(now + timedelta(seconds=1), "app")
    order.expire(ship.complete_by + timedelta(seconds=3), POLICY)
    assert (order.status, ship.process_state) == (OrderStatus.ERROR, StepState.ERROR)
    order.resubmit(now + timedelta(minutes=5), "operator")
    assert not order.cancel_requested
    attempt(order, now + timedelta(minutes=5), Outcome.DEFERRED, error="open", not_before=now)
    assert (order.status, ship.failure_count) == (OrderStatus.PROCESSING, 0)
    attempt(order, ship.complete_by, Outcome.SUCCEEDED)
    assert order.status is OrderStatus.COMPLETED


def test_a_success_for_a_step_cancelled_as_not_applied_gets_it_undone() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    attempt(order, now, Outcome.TRANSIENT, error="503", applied=Applied.NO)
    charge = order.find("charge-payment")
    assert charge is not None
    order.claim("i", charge.complete_by)
    order.cancel(charge.complete_by + timedelta(seconds=1), "app")
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, error="503", applied=Applied.NO),
        charge.complete_by + timedelta(seconds=2),
        POLICY,
    )
    assert (charge.process_state, order.status) == (
        StepState.COMPENSATED,  # "not applied: nothing to undo"
        OrderStatus.COMPENSATING,  # releasing the stock
    )
    # a redelivered copy of attempt 1 succeeded after all
    order.apply_reply(
        reply(order, step="charge-payment", attempt=1), now + timedelta(seconds=90), POLICY
    )
    assert (charge.process_state, order.status) == (
        StepState.PROCESSED,  # so it will be refunded
        OrderStatus.COMPENSATING,
    )
    for _ in range(3):
        step = order.active_step()
        if step is None:
            break
        attempt(order, max(now + timedelta(seconds=100), step.complete_by), Outcome.SUCCEEDED)
    assert order.status is OrderStatus.CANCELLED
    assert charge.process_state is StepState.COMPENSATED
    assert order.find("refund-payment") is not None


def test_a_late_deferral_keeps_the_time_the_remote_asked_for() -> None:
    order = new_order()
    order.claim("i", T0)
    order.expire(T0 + timedelta(seconds=33), POLICY)  # back to Pending, due at once
    asked = T0 + timedelta(seconds=150)
    order.apply_reply(
        reply(order, Outcome.DEFERRED, attempt=1, error="Retry-After 120", not_before=asked),
        T0 + timedelta(seconds=34),
        POLICY,
    )
    step = order.steps[0]
    assert step.complete_by >= asked and step.failure_count == 0


def test_a_late_report_of_an_earlier_expiry_corrects_the_verdict_of_a_later_attempt() -> None:
    """Attempt 1 expires (its report is slow); attempts 2 and 3 get 503 and the step gives
    up as "may have been applied" because of attempt 1; then attempt 1's report says it
    was not applied either: the operator is told it is safe to resubmit after all."""
    order = new_order()
    step = order.steps[0]
    order.claim("i", T0)
    now = step.complete_by + timedelta(seconds=1)
    order.expire(now, POLICY)
    assert step.maybe_applied == [1]
    now = fail_until_given_up(order, [Applied.NO, Applied.NO], now)
    assert order.status is OrderStatus.ERROR
    assert "may have been applied" in alerts(order)[-1]["reason"]
    order.apply_reply(
        reply(
            order,
            Outcome.TRANSIENT,
            step="process",
            attempt=1,
            error="HTTP 503",
            applied=Applied.NO,
        ),
        now,
        POLICY,
    )
    assert step.maybe_applied == [] and order.status is OrderStatus.ERROR
    assert step.failure_count == 3  # a counted failure all the same: nothing to give back
    last = alerts(order)[-1]["reason"]
    assert "not applied after all" in last and "safe to resubmit" in last
    # An operator's resubmit after the "may" alert keeps the late report from speaking up.
    other = new_order()
    other.claim("i", T0)
    later = other.steps[0].complete_by + timedelta(seconds=1)
    other.expire(later, POLICY)
    later = fail_until_given_up(other, [Applied.NO, Applied.NO], later)
    other.resubmit(later, "ops")
    told = len(alerts(other))
    other.apply_reply(
        reply(
            other,
            Outcome.TRANSIENT,
            step="process",
            attempt=1,
            error="HTTP 503",
            applied=Applied.NO,
        ),
        later + timedelta(seconds=1),
        POLICY,
    )
    assert len(alerts(other)) == told and other.status is OrderStatus.PROCESSING
