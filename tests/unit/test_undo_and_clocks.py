"""docs/contracts.md §3.11 where evidence meets an undo: a success that lands after its
step's undo began, clocks that disagree between instances, and reports that look like
duplicates but are not. On the pure model with fake clocks (the agent's reply shape where
the scenario needs it). Each scenario ended otherwise before: the late charge was dropped
as "already settled", the refund started while the charge could still run, the second
report of an attempt was lost to duplicate detection.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from core.errors import TransitionRefused
from core.messages import AgentReply
from core.model import IN_FLIGHT_GRACE, Order
from core.moves import OVERTAKEN
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepKind, StepState
from tests.unit.test_failure_semantics import reach
from tests.unit.test_model import T0, alerts, new_order, reply

POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=600)


def claim_due(order: Order, now: datetime, instance: str = "i-1") -> tuple[datetime, Order]:
    step = order.active_step()
    assert step is not None
    now = max(now, step.complete_by)
    order.claim(instance, now)
    return now, order


def succeed_active(order: Order, now: datetime) -> datetime:
    now, _ = claim_due(order, now)
    order.apply_reply(reply(order), now + timedelta(seconds=1), POLICY)
    return now + timedelta(seconds=2)


def cancelled_around_a_running_charge() -> tuple[Order, datetime, datetime]:
    """charge-payment is a Python handler that outlived its attempt; the order is cancelled;
    the handler's renewals never arrive (a storage blip), so its hold lapses and the refund
    and the release run; the order ends cancelled. Returns the order, the time, and when the
    refund was claimed."""
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    now, _ = claim_due(order, now)
    running = replace(
        reply(order, Outcome.TRANSIENT, applied=Applied.MAYBE, error="the handler still runs"),
        running_until=now + timedelta(seconds=30),
        runner="host-a:1",
    )
    order.apply_reply(running, now + timedelta(seconds=20), POLICY)
    order.cancel(now + timedelta(seconds=21), "app", "customer changed their mind")
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    refund_claimed = refund.not_before
    now = succeed_active(order, refund_claimed)  # refund-payment
    now = succeed_active(order, now)  # release-stock
    assert order.status is OrderStatus.CANCELLED
    return order, now, refund_claimed


def late_success(order: Order, runner: str, answered: datetime) -> AgentReply:
    return replace(
        reply(order, step="charge-payment", attempt=1),
        runner=runner,
        run_ended=True,
        answered_at=answered,
    )


# --- a success after its undo began is never swallowed ---------------------------------------


def test_a_charge_that_lands_after_its_refund_puts_the_order_in_error_with_what_happened() -> None:
    order, now, _refund_claimed = cancelled_around_a_running_charge()
    order.outbox.clear()
    answered = now + timedelta(seconds=5)
    order.apply_reply(late_success(order, "host-a:1", answered), now + timedelta(seconds=6), POLICY)

    assert order.status is OrderStatus.ERROR
    charge, refund = order.find("charge-payment"), order.find("refund-payment")
    assert charge is not None and refund is not None
    assert charge.process_state is StepState.COMPENSATING and charge.undone_by is None
    assert refund.process_state is StepState.ERROR
    assert refund.gave_up is not None and refund.gave_up.kind == OVERTAKEN
    [alert] = alerts(order)
    assert alert["step"] == "refund-payment"
    assert "charge-payment applied at" in alert["reason"]
    assert "after refund-payment began undoing it" in alert["reason"]
    assert "o-1:refund-payment:2" in alert["reason"]  # the key its run again will use


def test_the_operator_runs_the_undo_again_as_a_new_effect_and_the_order_ends_cancelled() -> None:
    order, now, _ = cancelled_around_a_running_charge()
    answered = now + timedelta(seconds=5)
    order.apply_reply(late_success(order, "host-a:1", answered), now + timedelta(seconds=6), POLICY)

    refund = order.resubmit(now + timedelta(seconds=60), "ops@example.com", "refund it again")
    assert refund.step == "refund-payment" and refund.process_state is StepState.PENDING
    assert refund.idempotency_key == "o-1:refund-payment:2"
    now = succeed_active(order, now + timedelta(seconds=60))
    assert order.status is OrderStatus.CANCELLED
    charge = order.find("charge-payment")
    assert charge is not None and charge.process_state is StepState.COMPENSATED
    assert charge.applied_after_undo is None  # acted on
    # the second run's request went out under the new key (recorded in the history)
    assert any(h.get("key") == "o-1:refund-payment:2" for h in refund.history)


def test_a_success_from_before_the_undo_began_is_covered_by_it() -> None:
    """The charge applied, then the refund began (beyond any clock skew): the refund met the
    charge, so its late report is recorded and nothing else happens."""
    order, now, refund_claimed = cancelled_around_a_running_charge()
    order.outbox.clear()
    answered = refund_claimed - POLICY.skew - timedelta(seconds=1)
    order.apply_reply(late_success(order, "host-a:1", answered), now, POLICY)
    assert order.status is OrderStatus.CANCELLED and alerts(order) == []
    charge = order.find("charge-payment")
    assert charge is not None and charge.attempts.applied


@pytest.mark.parametrize("refund_state", ["in-flight", "pending"])
def test_a_success_while_the_undo_runs_waits_for_its_attempt_then_tells(refund_state: str) -> None:
    """An HTTP charge's late 2xx (no handler) while the refund is claimed: the refund's
    attempt ends first, then the order is error; a refund not in flight stops at once."""
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    now, _ = claim_due(order, now)
    order.expire(now + timedelta(seconds=31), POLICY)  # no report: it may have applied
    for _ in range(2):
        now, _ = claim_due(order, now + timedelta(seconds=31))
        order.expire(now + timedelta(seconds=31), POLICY)
    now = now + timedelta(seconds=31)
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    now, _ = claim_due(order, now)
    if refund_state == "pending":
        order.apply_reply(
            reply(order, Outcome.TRANSIENT, applied=Applied.NO), now + timedelta(seconds=1), POLICY
        )
        assert refund.process_state is StepState.PENDING and refund.attempt == 1
    order.outbox.clear()
    late = replace(reply(order, step="charge-payment", attempt=1), answered_at=now + timedelta(2))
    order.apply_reply(late, now + timedelta(seconds=3), POLICY)
    if refund_state == "in-flight":
        assert order.status is OrderStatus.COMPENSATING and alerts(order) == []
        order.apply_reply(reply(order), now + timedelta(seconds=4), POLICY)  # refund's 2xx
    assert order.status is OrderStatus.ERROR
    assert refund.gave_up is not None and refund.gave_up.kind == OVERTAKEN
    assert "charge-payment applied at" in alerts(order)[-1]["reason"]


def test_a_duplicate_success_of_a_step_known_applied_is_not_news() -> None:
    """charge succeeded, ship failed, the charge was refunded: another copy of the charge's
    success (the same key, the same effect) changes nothing and alerts nobody."""
    order = new_order("fulfilment")
    now = reach(order, "ship")
    now, _ = claim_due(order, now)
    order.apply_reply(reply(order, Outcome.REFUSED, error="HTTP 422"), now, POLICY)
    now = succeed_active(order, now)  # refund
    now = succeed_active(order, now)  # release
    assert order.status is OrderStatus.COMPENSATED
    order.outbox.clear()
    again = replace(reply(order, step="charge-payment", attempt=1), answered_at=now)
    with pytest.raises(TransitionRefused) as refused:
        order.apply_reply(again, now, POLICY)
    assert refused.value.reason == "already-settled"
    assert order.status is OrderStatus.COMPENSATED and alerts(order) == []


# --- clocks that disagree ---------------------------------------------------------------------


class Clock:
    """One instance's clock: the true time plus its offset."""

    def __init__(self, offset_seconds: float) -> None:
        self.offset = timedelta(seconds=offset_seconds)

    def at(self, true: datetime) -> datetime:
        return true + self.offset


def test_no_undo_starts_on_a_fast_clock_while_the_attempt_may_still_call() -> None:
    """Instance A (true clock) claims charge-payment; instance B's clock is 30 s fast, within
    the allowed skew (35 s here). B's supervisor expires the attempt early by the true clock
    and gives up as ambiguous; its scheduler may not start the refund before the attempt's
    deadline plus the skew by its own clock: after the true deadline, when A's agent has
    stopped calling (it does not call past the deadline by its own clock)."""
    policy = replace(POLICY, max_failure_count=1, clock_skew_seconds=35)
    a, b = Clock(0), Clock(30)
    order = new_order("fulfilment")
    true = reach(order, "charge-payment")
    charge = order.claim("A", a.at(true), skew=policy.skew)
    deadline = charge.complete_by  # by A's clock, which is true
    true = deadline - timedelta(seconds=29)  # B's clock reads deadline + 1
    order.expire(b.at(true), policy, timedelta(seconds=0.5))
    assert order.status is OrderStatus.COMPENSATING
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    # B's scheduler looks every second by its own clock: the first moment it may claim
    first = next(
        t
        for t in (true + timedelta(seconds=s) for s in range(0, 120))
        if refund.not_before <= b.at(t)
    )
    assert first > deadline  # true time: A's agent has stopped calling
    assert refund.not_before == deadline + policy.skew + IN_FLIGHT_GRACE
    # A's success inside its own deadline is evidence the refund then undoes
    order.outbox.clear()
    late = replace(
        reply(order, step="charge-payment", attempt=1),
        answered_at=a.at(deadline - timedelta(seconds=1)),
    )
    order.apply_reply(late, b.at(deadline - timedelta(seconds=1)), policy)
    assert order.status is OrderStatus.COMPENSATING and alerts(order) == []
    assert charge.attempts.applied and refund.attempt == 0


def test_the_skew_allowed_is_kept_with_the_attempt_that_was_claimed() -> None:
    """Whoever decides later reads the allowance from the attempt, not from its own settings."""
    order = new_order()
    step = order.claim("A", T0, skew=timedelta(seconds=42))
    current = step.current
    assert current is not None and current.skew == timedelta(seconds=42)
    assert step.last_deadline() == step.complete_by + timedelta(seconds=42)


# --- reports that look alike ------------------------------------------------------------------


def test_a_redelivered_copys_maybe_after_the_first_copys_no_is_kept() -> None:
    """Two reports of one attempt with the same outcome and different evidence: both count
    (on Service Bus each is its own message: messaging/servicebus.reply_message)."""
    order = new_order()
    now, _ = claim_due(order, T0)
    step = order.steps[0]
    order.apply_reply(reply(order, Outcome.TRANSIENT, applied=Applied.NO), now, POLICY)
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, step="process", attempt=1, applied=Applied.MAYBE),
        now + timedelta(seconds=1),
        POLICY,
    )
    attempt = step.attempts.get(1)
    assert attempt is not None and attempt.applied is Applied.MAYBE


def test_an_undone_step_of_the_right_kind_only() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    reserve = order.find("reserve-stock")
    assert reserve is not None and order.undo_of(reserve) is None
    now, _ = claim_due(order, now)
    order.apply_reply(reply(order, Outcome.REFUSED, error="HTTP 422"), now, POLICY)
    undo = order.undo_of(reserve)
    assert undo is not None and undo.kind is StepKind.COMPENSATION


# --- medium and low: flags that age, refusals that prove nothing, doubt already settled ------


def test_a_singled_out_flag_ages_so_an_old_failure_is_not_blamed_in_a_later_outage() -> None:
    order = new_order()
    now, _ = claim_due(order, T0)
    order.apply_reply(reply(order, Outcome.TRANSIENT, applied=Applied.NO), now, POLICY)
    step = order.steps[0]
    assert step.singled_out and step.singled_out_now(now + timedelta(seconds=60))
    assert not step.singled_out_now(now + timedelta(minutes=4))  # evidence ages


def test_a_refusal_proves_the_host_answers_not_that_the_endpoint_serves() -> None:
    from agents.health import EndpointHealth

    health = EndpointHealth("ship")
    for key in ("a", "b", "c"):
        health.record_failure(key, 1.0, explained=False, probe=False)
    assert health.is_open
    mark = health.mark()
    health.record_refusal("malformed", 2.0)  # a 400 for a bad order, from a gateway
    assert health.is_open  # no breaker closes on it
    assert not health.blames("d", mark=mark, singled_out=False)  # nobody blamed for it


def test_a_retry_after_shorter_than_the_backoff_is_still_honoured_when_neither_fits() -> None:
    from tests.unit.test_remote_client import T0 as R0
    from tests.unit.test_remote_client import FakeClock as RemoteClock
    from tests.unit.test_remote_client import MaxRng, make_client, make_request, remote, status

    r = remote(RemoteClock(), status(503, **{"Retry-After": "3"}))
    # the backoff at its ceiling: 5 s, longer than what the service asked for
    client, _ = make_client(r, rng=MaxRng(), backoff_initial_seconds=5, backoff_max_seconds=5)
    outcome = asyncio.run(client.call(make_request(seconds_left=6)))
    assert outcome.kind == "deferred" and len(r.seen) == 1
    assert outcome.not_before is not None and outcome.not_before >= R0 + timedelta(seconds=5)


def test_a_late_maybe_for_a_key_known_applied_and_undone_raises_no_alert() -> None:
    """charge attempt 1 said "not applied", attempt 2 succeeded, ship failed, the charge was
    refunded; a redelivered copy of attempt 1 then says "may have applied": one key, one
    effect, known applied and undone. No "undo it by hand" (that would refund twice)."""
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    now, _ = claim_due(order, now)
    order.apply_reply(reply(order, Outcome.TRANSIENT, applied=Applied.NO), now, POLICY)
    now = succeed_active(order, now + timedelta(seconds=60))  # attempt 2: charged
    now, _ = claim_due(order, now)
    order.apply_reply(reply(order, Outcome.REFUSED, error="HTTP 422"), now, POLICY)  # ship
    now = succeed_active(order, now)  # refund
    now = succeed_active(order, now)  # release
    assert order.status is OrderStatus.COMPENSATED
    order.outbox.clear()
    copy = reply(order, Outcome.TRANSIENT, step="charge-payment", attempt=1, applied=Applied.MAYBE)
    order.apply_reply(copy, now, POLICY)
    assert alerts(order) == [] and order.status is OrderStatus.COMPENSATED


def test_an_operator_states_a_refused_undo_is_not_needed_and_the_unwinding_goes_on() -> None:
    """The refund of an ambiguous charge is refused for good ("no charge to refund"): the
    operator states the charge did not happen; the refund is not needed, the stock is
    released, the order ends cancelled, and the history says who and why."""
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    for _ in range(3):
        now, _ = claim_due(order, now)
        order.expire(now + timedelta(seconds=31), POLICY)
        now += timedelta(seconds=31)
    assert str(order.status) == "compensating"  # the ambiguous charge is refunded first
    now, _ = claim_due(order, now)
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    order.apply_reply(
        reply(order, Outcome.REFUSED, error="HTTP 422 no charge to refund"), now, POLICY
    )
    assert str(order.status) == "error"
    order.cancel(now, "ops@example.com", "the bank shows no charge", not_applied="charge-payment")
    assert refund.process_state is StepState.SKIPPED
    charge = order.find("charge-payment")
    assert charge is not None and charge.process_state is StepState.COMPENSATED
    assert any(h["event"] == "not-needed" and h["by"] == "ops@example.com" for h in refund.history)
    now = succeed_active(order, now)  # release-stock
    assert order.status is OrderStatus.CANCELLED


def test_an_undo_waits_while_its_steps_handler_still_runs_even_after_a_success() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    now, _ = claim_due(order, now)
    running = replace(
        reply(order, Outcome.TRANSIENT, applied=Applied.MAYBE, error="still runs"),
        running_until=now + timedelta(seconds=120),
        runner="r-1",
    )
    order.apply_reply(running, now + timedelta(seconds=20), POLICY)
    now = succeed_active(order, now + timedelta(seconds=60))  # attempt 2 succeeds meanwhile
    now, _ = claim_due(order, now)
    order.apply_reply(reply(order, Outcome.REFUSED, error="HTTP 422"), now, POLICY)  # ship
    refund = order.active_step()
    assert refund is not None and refund.step == "refund-payment"
    charge = order.find("charge-payment")
    assert charge is not None
    assert refund.not_before >= charge.attempts.running_until(now) + POLICY.skew  # type: ignore[operator]


def test_the_stuck_check_alerts_each_stuck_episode_once() -> None:
    order = new_order("fulfilment")
    now, _ = claim_due(order, T0)
    order.mark_stuck("reserve-stock", "stuck at reserve", now)
    with pytest.raises(TransitionRefused):
        order.mark_stuck("reserve-stock", "stuck at reserve", now)
    order.apply_reply(reply(order), now, POLICY)
    claim_due(order, now)
    order.mark_stuck("charge-payment", "stuck at charge", now)  # a later episode: told
    assert [a["step"] for a in alerts(order)] == ["reserve-stock", "charge-payment"]
