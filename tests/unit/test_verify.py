"""The checker behind the demo, the e2e tests and the chaos suite (``demo.verify``).

Orders are built with the real state machine on a fake clock (the helpers of
``test_model``), the ledger and the alerts as the simulator and the alert queue
give them. A clean run passes; then each violation is planted alone, and the
verdict must report exactly it, under its own name, naming the order and step.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from core.model import Order, StepRecord
from core.outcome import Applied, Outcome
from core.states import OrderStatus, StepState
from core.timefmt import iso, parse_iso
from demo.verify import VIOLATIONS, Verdict, check_history, said_not_applied, verify
from tests.support import callback_token
from tests.unit.test_model import POLICY, T0, drive, new_order, reply, run_step
from tests.unit.test_services_in_memory import reply_to, stored

COMPENSATIONS = {"release-stock": "reserve-stock", "refund-payment": "charge-payment"}
FULL = ["reserve-stock", "charge-payment", "ship"]
UNDONE_AT_SHIP = ["reserve-stock", "charge-payment", "refund-payment", "release-stock"]


# --- builders ------------------------------------------------------------------------------


def ledger_of(effects: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Ledger entries as the simulator writes them: orderId -> steps applied, in order."""
    entries: list[dict[str, Any]] = []
    for order_id, steps in effects.items():
        for step in steps:
            compensates = COMPENSATIONS.get(step)
            entries.append(
                {
                    "seq": len(entries) + 1,
                    "at": "2026-11-22T10:00:00.000Z",
                    "orderId": order_id,
                    "step": step,
                    "idempotencyKey": f"{order_id}:{step}",
                    "kind": "compensation" if compensates else "effect",
                    "compensates": compensates,
                    "undid": True if compensates else None,
                    "response": {},
                }
            )
    return entries


def alerts_of(*orders: Order) -> list[dict[str, Any]]:
    """What the operator-alerts queue holds: the alert notices the orders sent."""
    return [json.loads(n.body) for o in orders for n in o.outbox if n.kind == "alert"]


def completed(order_id: str) -> Order:
    order = new_order(orderId=order_id)
    run_step(order, T0)
    return order


def refused(order_id: str) -> Order:
    """A single-step order whose service refused it (a permanent 4xx): error, alerted."""
    order = new_order(orderId=order_id)
    run_step(order, T0, Outcome.REFUSED)
    return order


def fulfilled(order_id: str) -> Order:
    order = new_order("fulfilment", orderId=order_id)
    drive(order, {})
    return order


def unwound_at_ship(order_id: str) -> Order:
    """ship refused: charge-payment and reserve-stock compensated in reverse."""
    order = new_order("fulfilment", orderId=order_id)
    drive(order, {"ship": Outcome.REFUSED})
    return order


def late_success(order_id: str) -> Order:
    """Attempt 1 expired, attempt 2 claimed, then attempt 1's success arrived: completed."""
    order = new_order(orderId=order_id)
    order.claim("i", T0)
    first = reply(order)
    order.expire(T0 + timedelta(seconds=31), POLICY)
    order.claim("j", T0 + timedelta(seconds=31))
    order.apply_reply(first, T0 + timedelta(seconds=32), POLICY)
    return order


def out_of_retries(order_id: str) -> Order:
    """Every attempt expired: error after POLICY.max_failure_count (3) failures, alerted."""
    order = new_order(orderId=order_id)
    drive(order, {"process": "expire"})
    return order


def step_of(order: Order, name: str) -> StepRecord:
    step = order.find(name)
    assert step is not None
    return step


class Run:
    """A clean run of every kind of ending; each test plants one violation in it."""

    def __init__(self) -> None:
        self.orders: dict[str, Order | None] = {
            "ok": completed("ok"),
            "late": late_success("late"),
            "declined": refused("declined"),
            "ful": fulfilled("ful"),
            "undone": unwound_at_ship("undone"),
        }
        self.effects: dict[str, list[str]] = {
            "ok": ["process"],
            "late": ["process"],
            "ful": list(FULL),
            "undone": list(UNDONE_AT_SHIP),
        }
        self.expected = {
            "ok": "completed",
            "late": "completed",
            "declined": "error",
            "ful": "completed",
            "undone": "compensated",
        }
        self.alerts = alerts_of(*[o for o in self.orders.values() if o is not None])

    def order(self, order_id: str) -> Order:
        order = self.orders[order_id]
        assert order is not None
        return order

    def verdict(self, **options: Any) -> Verdict:
        return verify(
            self.orders,
            ledger_of(self.effects),
            self.alerts,
            expected=options.pop("expected", self.expected),
            **options,
        )


@pytest.fixture
def run() -> Run:
    return Run()


# --- the clean run -------------------------------------------------------------------------


def test_a_clean_run_passes_and_is_counted(run: Run) -> None:
    verdict = run.verdict()

    assert verdict.violations() == {}
    assert verdict.ok and verdict.problems() == []
    assert verdict.orders == 5 and verdict.as_expected == 5 and verdict.exhausted == []
    assert verdict.statuses == {"completed": 3, "error": 1, "compensated": 1}
    assert verdict.alerts == 1 == len(run.alerts)  # the refused order, nothing else
    assert verdict.effects == 1 + 1 + 3 + 4
    assert verdict.expiries == 1  # the late order's first attempt
    # ok 1, late 2, declined 1, ful 1+1+1, undone 1+1+1 + refund 1 + release 1
    assert verdict.attempts == 12


def test_the_clean_run_has_what_the_plants_below_rely_on(run: Run) -> None:
    """The orders are what their names say (so each plant changes one thing only)."""
    statuses = {k: str(run.order(k).status) for k in run.orders}
    assert statuses == run.expected
    late = step_of(run.order("late"), "process")
    assert [h["event"] for h in late.history][-2:] == ["claimed", "succeeded"]
    assert late.history[-1]["late"] is True and late.history[-1]["attempt"] == 1
    assert [a["orderId"] for a in run.alerts] == ["declined"]
    assert said_not_applied(step_of(run.order("declined"), "process"))
    assert said_not_applied(step_of(run.order("undone"), "ship"))
    assert not said_not_applied(step_of(run.order("ok"), "process"))


def test_as_json_reports_every_violation_by_its_camel_case_name(run: Run) -> None:
    run.orders["gone"] = None
    summary = run.verdict().as_json()

    assert summary["lost"] == 1 and summary["doubleEffects"] == 0
    assert summary["effectsAfterDefiniteFailure"] == 0
    assert summary["inconsistentHistory"] == 0 and summary["staleApplied"] == 0
    assert summary["endedAsExpected"] == 5 and summary["exhaustedRetries"] == 0
    assert {"lost", "stuck", "unexpected", "unalerted", "wrongEffects"} <= summary.keys()


def test_problems_name_the_first_ten_and_count_the_rest(run: Run) -> None:
    for n in range(12):
        run.orders[f"gone-{n:02d}"] = None

    [problem] = run.verdict().problems()

    assert problem.startswith("lost: gone-00, gone-01, ")
    assert "gone-09" in problem and "gone-10" not in problem
    assert problem.endswith(" (+2)")


# --- lost and stuck ------------------------------------------------------------------------


def test_an_order_not_in_the_table_is_lost(run: Run) -> None:
    run.orders["vanished"] = None

    verdict = run.verdict()

    assert verdict.violations() == {"lost": ["vanished"]}
    assert not verdict.ok


@pytest.mark.parametrize("claimed", [False, True])
def test_an_order_not_ended_is_stuck(run: Run, claimed: bool) -> None:
    order = new_order(orderId="waiting")
    if claimed:
        order.claim("i", T0)
    run.orders["waiting"] = order

    status = "processing" if claimed else "pending"
    assert run.verdict().violations() == {"stuck": [f"waiting({status})"]}


def test_an_order_in_error_is_ended_not_stuck(run: Run) -> None:
    run.orders["declined-2"] = refused("declined-2")
    run.alerts = alerts_of(*[o for o in run.orders.values() if o is not None])

    assert run.verdict(expected={}).violations() == {}


# --- effects -------------------------------------------------------------------------------


def test_an_undo_applied_twice_is_a_double_effect(run: Run) -> None:
    run.effects["undone"].append("release-stock")

    assert run.verdict().violations() == {"double_effects": ["undone:release-stock"]}


def test_a_step_applied_twice_is_a_double_effect_and_more_effects_than_the_plan(run: Run) -> None:
    run.effects["ok"] = ["process", "process"]

    assert run.verdict().violations() == {
        "double_effects": ["ok:process"],
        "wrong_effects": ["ok: ['process', 'process'], expected ['process']"],
    }


def test_a_completed_order_missing_an_effect_has_wrong_effects(run: Run) -> None:
    run.effects["ful"] = ["reserve-stock", "charge-payment"]

    assert run.verdict().violations() == {
        "wrong_effects": [
            "ful: ['reserve-stock', 'charge-payment'], "
            "expected ['reserve-stock', 'charge-payment', 'ship']"
        ]
    }


def test_a_completed_order_with_its_effects_out_of_order_has_wrong_effects(run: Run) -> None:
    run.effects["ful"] = ["charge-payment", "reserve-stock", "ship"]

    assert list(run.verdict().violations()) == ["wrong_effects"]
    assert run.verdict().wrong_effects[0].startswith("ful: ['charge-payment', 'reserve-stock'")


def test_a_completed_order_with_no_effect_at_all_has_wrong_effects(run: Run) -> None:
    del run.effects["ok"]

    assert run.verdict().violations() == {"wrong_effects": ["ok: [], expected ['process']"]}


@pytest.mark.parametrize(
    ("missing", "undone"),
    [("refund-payment", "charge-payment"), ("release-stock", "reserve-stock")],
)
def test_a_compensated_order_with_a_compensation_missing_has_wrong_effects(
    run: Run, missing: str, undone: str
) -> None:
    run.effects["undone"].remove(missing)

    assert run.verdict().violations() == {
        "wrong_effects": [f"undone:{undone} applied, never undone"]
    }


def test_a_compensated_order_whose_step_was_never_compensated_has_wrong_effects(
    run: Run,
) -> None:
    # The record says charge-payment still stands in an order reported compensated.
    charge = step_of(run.order("undone"), "charge-payment")
    charge.process_state = StepState.PROCESSED
    charge.history = [
        h for h in charge.history if h["event"] not in ("compensating", "compensated")
    ]

    assert run.verdict().violations() == {
        "wrong_effects": ["undone:charge-payment never compensated"]
    }


def test_a_finished_order_with_a_step_still_compensating_has_wrong_effects(run: Run) -> None:
    reserve = step_of(run.order("undone"), "reserve-stock")
    reserve.process_state = StepState.COMPENSATING
    reserve.history = [h for h in reserve.history if h["event"] != "compensated"]

    assert run.verdict().violations() == {
        "wrong_effects": ["undone:reserve-stock is Compensating in a compensated order"]
    }


def test_the_effects_a_scenario_names_must_be_exactly_those_applied(run: Run) -> None:
    named = {"ok": ("process",), "undone": tuple(UNDONE_AT_SHIP)}
    assert run.verdict(expected_effects=named).violations() == {}

    named["undone"] = ("reserve-stock", "charge-payment", "release-stock", "refund-payment")
    assert run.verdict(expected_effects=named).violations() == {
        "wrong_effects": [
            f"undone: {UNDONE_AT_SHIP}, expected "
            "['reserve-stock', 'charge-payment', 'release-stock', 'refund-payment']"
        ]
    }


# --- effects for a step the system said was not applied ---------------------------------------


def test_an_effect_of_a_refused_step_in_an_error_order_is_caught(run: Run) -> None:
    run.effects["declined"] = ["process"]

    assert run.verdict().violations() == {"effects_after_definite_failure": ["declined:process"]}


def test_an_effect_of_the_refused_step_of_a_compensated_order_is_caught(run: Run) -> None:
    run.effects["undone"].insert(2, "ship")

    assert run.verdict().violations() == {"effects_after_definite_failure": ["undone:ship"]}


def test_an_effect_of_a_step_cancelled_before_it_ran_is_caught(run: Run) -> None:
    order = new_order("fulfilment", orderId="cancelled")
    order.cancel(T0, "app")
    assert order.status is OrderStatus.CANCELLED
    run.orders["cancelled"] = order
    assert run.verdict().violations() == {}

    run.effects["cancelled"] = ["reserve-stock"]

    assert run.verdict().violations() == {
        "wrong_effects": ["cancelled:reserve-stock applied, never undone"],
        "effects_after_definite_failure": ["cancelled:reserve-stock"],
    }


def test_an_effect_of_a_step_that_may_have_applied_is_no_violation(run: Run) -> None:
    """Out of retries with "it may have been applied": an effect is allowed to exist."""
    run.orders["unsure"] = out_of_retries("unsure")
    run.alerts = alerts_of(*[o for o in run.orders.values() if o is not None])
    run.effects["unsure"] = ["process"]
    assert not said_not_applied(step_of(run.order("unsure"), "process"))

    assert run.verdict(expected={**run.expected, "unsure": "error"}).violations() == {}


# --- alerts --------------------------------------------------------------------------------


def test_an_error_order_without_an_alert_is_unalerted(run: Run) -> None:
    run.alerts = []

    assert run.verdict().violations() == {"unalerted": ["declined:process"]}


def test_an_alert_for_another_step_or_order_does_not_count(run: Run) -> None:
    run.alerts = [
        {**run.alerts[0], "step": "ship"},
        {**run.alerts[0], "orderId": "ok"},
    ]

    assert run.verdict().violations() == {"unalerted": ["declined:process"]}


def test_a_failed_compensation_must_be_the_step_alerted(run: Run) -> None:
    order = new_order("fulfilment", orderId="stopped")
    drive(order, {"ship": Outcome.REFUSED, "refund-payment": Outcome.REFUSED})
    assert order.status is OrderStatus.ERROR
    run.orders["stopped"] = order
    run.effects["stopped"] = ["reserve-stock", "charge-payment"]
    expected = {**run.expected, "stopped": "error"}
    run.alerts += alerts_of(order)
    assert run.verdict(expected=expected).violations() == {}

    run.alerts[-1] = {**run.alerts[-1], "step": "ship"}

    assert run.verdict(expected=expected).violations() == {"unalerted": ["stopped:refund-payment"]}


# --- final status against the scenario -----------------------------------------------------


def test_an_order_that_ended_other_than_expected_is_unexpected(run: Run) -> None:
    run.expected["declined"] = "completed"

    verdict = run.verdict()

    assert verdict.violations() == {"unexpected": ["declined: error, expected completed"]}
    assert verdict.as_expected == 4


def test_a_compensated_order_expected_to_complete_is_unexpected(run: Run) -> None:
    run.expected["undone"] = "completed"

    assert run.verdict().violations() == {"unexpected": ["undone: compensated, expected completed"]}


def test_an_order_without_an_expectation_is_not_judged_by_status(run: Run) -> None:
    del run.expected["declined"]

    verdict = run.verdict()

    assert verdict.violations() == {} and verdict.as_expected == 4


def test_out_of_retries_is_reported_apart_only_when_max_failures_explains_it(run: Run) -> None:
    run.orders["tired"] = out_of_retries("tired")
    run.alerts = alerts_of(*[o for o in run.orders.values() if o is not None])
    run.effects["tired"] = []
    run.expected["tired"] = "completed"

    # POLICY gives up after 3 failures: with max_failures=3 it ran out of retries ...
    explained = run.verdict(max_failures=3)
    assert explained.violations() == {} and explained.exhausted == ["tired"]
    assert explained.as_expected == 5
    # ... without it, or with a larger limit than it met, it did not run out: it ended in
    # doubt (every attempt expired: each may have applied), told so by its alert, and its
    # service applied nothing: reported apart as such (a chaos run explains each) ...
    for verdict in (run.verdict(), run.verdict(max_failures=4)):
        assert verdict.violations() == {} and verdict.exhausted == []
        assert verdict.doubted == ["tired"]
    # ... and, had nobody been told of the doubt, it simply ended wrong
    run.alerts = [a for a in run.alerts if a["orderId"] != "tired"]
    assert run.verdict().violations()["unexpected"] == ["tired: error, expected completed"]


# --- histories -----------------------------------------------------------------------------


def test_a_success_for_an_attempt_no_longer_in_flight_is_stale(run: Run) -> None:
    # The late order's success for attempt 1 came while attempt 2 was in flight; as a late
    # success that is evidence. Recorded as an on-time one, it was applied to a stale attempt.
    step = step_of(run.order("late"), "process")
    del step.history[-1]["late"]

    assert run.verdict().violations() == {
        "stale_applied": ["late:process: success for attempt 1 while Processing (2)"]
    }


def test_an_on_time_success_after_its_deadline_is_stale(run: Run) -> None:
    step = step_of(run.order("ok"), "process")
    step.history[-1]["at"] = step.history[-2]["completeBy"]

    assert run.verdict().violations() == {
        "stale_applied": ["ok:process: on-time success for attempt 1 after its deadline"]
    }


def test_a_late_success_for_an_attempt_never_claimed_is_stale(run: Run) -> None:
    step = step_of(run.order("late"), "process")
    step.history[-1]["attempt"] = 3

    assert run.verdict().violations() == {
        "stale_applied": ["late:process: success for attempt 3 never claimed"]
    }


def test_a_late_success_applied_to_a_step_already_processed_is_stale(run: Run) -> None:
    step = step_of(run.order("ok"), "process")
    step.history.append({**step.history[-1], "late": True})  # a duplicate, applied again

    assert run.verdict().violations() == {
        "stale_applied": ["ok:process: late success applied while Processed"]
    }


def test_a_failure_report_applied_to_a_step_not_in_flight_is_stale(run: Run) -> None:
    step = step_of(run.order("declined"), "process")
    # the refusal landed while the step was Pending (its claim is gone from the history)
    step.history = [h for h in step.history if h["event"] != "claimed"]

    assert run.verdict().violations() == {
        "stale_applied": ["declined:process: refused for attempt 1 while Pending (None)"]
    }


def test_a_history_cut_short_is_inconsistent(run: Run) -> None:
    step = step_of(run.order("ok"), "process")
    del step.history[-1]  # the success is gone; the record still says Processed

    assert run.verdict().violations() == {
        "inconsistent_history": ["ok:process: history ends Processing, record says Processed"]
    }


def test_a_claim_of_a_step_already_in_flight_is_inconsistent(run: Run) -> None:
    step = step_of(run.order("ok"), "process")
    claim = next(h for h in step.history if h["event"] == "claimed")
    step.history.insert(step.history.index(claim), dict(claim))

    assert run.verdict().violations() == {
        "inconsistent_history": ["ok:process: claimed while Processing"]
    }


def test_a_record_that_disagrees_with_its_history_is_inconsistent(run: Run) -> None:
    step_of(run.order("ful"), "ship").process_state = StepState.ERROR

    verdict = run.verdict(expected={**run.expected, "ful": "completed"})

    assert verdict.inconsistent_history == ["ful:ship: history ends Processed, record says Error"]


def long_history(order_id: str) -> Order:
    """A step deferred 40 times, then expired twice (each expiry corrected by a late "not
    applied" report), then successful: 131 events, so its middle is dropped, and what is
    kept after its first event begins in the middle of an attempt (a ``deferred``)."""
    order = new_order(orderId=order_id)
    now = T0
    for _ in range(40):
        step = order.claim("i", now)
        order.apply_reply(reply(order, Outcome.DEFERRED, applied=Applied.NO), now, POLICY)
        now = step.complete_by
    for _ in range(2):
        order.claim("i", now)
        report = reply(order, Outcome.TRANSIENT, applied=Applied.NO)
        now += timedelta(seconds=31)
        order.expire(now, POLICY)
        order.apply_reply(report, now, POLICY)
        now = order.steps[0].complete_by
    order.claim("i", now)
    order.apply_reply(reply(order), now + timedelta(seconds=1), POLICY)
    assert order.status is OrderStatus.COMPLETED
    return order


def test_a_long_history_with_its_middle_dropped_replays_from_its_next_claim(run: Run) -> None:
    run.orders["long"] = long_history("long")
    run.effects["long"] = ["process"]
    expected = {**run.expected, "long": "completed"}
    step = step_of(run.order("long"), "process")
    assert step.history_dropped > 0
    assert [h["event"] for h in step.history[:2]] == ["created", "deferred"]

    assert run.verdict(expected=expected).violations() == {}

    del step.history[-1]  # ... and a cut after that is still caught
    assert run.verdict(expected=expected).violations() == {
        "inconsistent_history": ["long:process: history ends Processing, record says Processed"]
    }


def test_check_history_replays_every_kind_of_ending_cleanly(run: Run) -> None:
    stopped = new_order("fulfilment", orderId="stopped")
    drive(stopped, {"ship": Outcome.REFUSED, "refund-payment": Outcome.REFUSED})
    stopped.resubmit(T0 + timedelta(hours=1), "op")
    drive(stopped, {}, T0 + timedelta(hours=1))
    cancelled = new_order("fulfilment", orderId="cancelled")
    cancelled.claim("i", T0)
    cancelled.apply_reply(reply(cancelled), T0 + timedelta(seconds=1))
    cancelled.claim("i", T0 + timedelta(seconds=2))
    cancelled.cancel(T0 + timedelta(seconds=3), "app")
    cancelled.apply_reply(reply(cancelled), T0 + timedelta(seconds=4))
    drive(cancelled, {}, T0 + timedelta(seconds=5))
    orders = [*run.orders.values(), out_of_retries("tired"), stopped, cancelled]

    for order in orders:
        assert order is not None
        for step in order.steps:
            assert check_history(order, step) == ([], []), (order.order_id, step.step)


def test_every_violation_name_is_a_field_of_the_verdict() -> None:
    verdict = Verdict()
    for name in VIOLATIONS:
        assert getattr(verdict, name) == []


# --- what a workflow can say (docs/contracts.md §3.13): checkout, through the services --------


def checkout_ledger(order_id: str, steps: list[str], **ids: str) -> list[dict[str, Any]]:
    """The ledger of a checkout: ``steps`` applied in that order; effects hand out the ids
    given (``reserve-stock="reservation-1"``), compensations name them."""
    entries = ledger_of({order_id: steps})
    for entry in entries:
        field = {"reserve-stock": "reservation", "charge-payment": "charge"}.get(
            entry["compensates"] or entry["step"]
        )
        if field and field in ids:
            entry["ids"] = {field: ids[field]}
    return entries


@pytest.fixture
def shop() -> Any:
    from tests.unit import test_product_workflows as product
    from tests.unit.test_services_in_memory import build

    return product, build(host="127.0.0.1:7071")


def test_a_checkout_with_its_waits_and_callback_replays_cleanly(shop: Any) -> None:
    """Parallel steps applied in either order, a skipped approval, a delay, an approval
    taken, a callback's result: no violation."""
    product, s = shop
    for order_id, amount in (("c-small", 40), ("c-big", 1500)):
        product.run_checkout(s, order_id, amount=amount)
        if amount > 1000:
            s.admin.deliver_event(order_id, "approved", {"result": {"by": "ann"}}, "ann")
        s.clock.advance(3)
        s.scheduler.dispatch(order_id)
        product.succeed(s, product.sent(s, order_id)[-1])
        s.admin.deliver_event(
            order_id,
            "parcel-left",
            {"result": {}},
            "carrier",
            token=callback_token(stored(s, order_id), "parcel-left"),
        )
    orders = {o: s.store.load(o) for o in ("c-small", "c-big")}
    ledger = checkout_ledger("c-small", ["charge-payment", "reserve-stock", "ship"])
    ledger += checkout_ledger("c-big", ["reserve-stock", "charge-payment", "ship"])
    for entry in ledger:
        entry["seq"] = ledger.index(entry) + 1
    verdict = verify(orders, ledger, [], expected=dict.fromkeys(orders, "completed"))
    assert verdict.ok, verdict.problems()
    wanted: dict[str, tuple[str, ...]] = {
        o: ("reserve-stock", "charge-payment", "ship") for o in orders
    }
    verdict = verify(orders, ledger, [], expected_effects=wanted)
    assert verdict.ok, verdict.problems()
    # the order the plan does fix is still checked: ship before the group
    late = checkout_ledger("c-small", ["ship", "charge-payment", "reserve-stock"])
    assert verify({"c-small": orders["c-small"]}, late, []).wrong_effects


def test_a_refused_approval_undoes_the_group_and_its_ids_must_be_named(shop: Any) -> None:
    product, s = shop
    product.run_checkout(s, "c-no", amount=2500)
    s.admin.deliver_event("c-no", "approved", {"refused": "too big"}, "ann")
    for _ in range(2):
        s.scheduler.dispatch("c-no")
        product.succeed(s, product.sent(s, "c-no")[-1])
    orders = {"c-no": s.store.load("c-no")}
    steps = ["charge-payment", "reserve-stock", "refund-payment", "release-stock"]
    ids = {"reservation": "reservation-1", "charge": "charge-1"}
    ledger = checkout_ledger("c-no", steps, **ids)
    verdict = verify(orders, ledger, [], expected={"c-no": "compensated"})
    assert verdict.ok, verdict.problems()
    ledger[3]["ids"] = {"reservation": "reservation-2"}  # released another reservation
    assert verify(orders, ledger, []).violations() == {
        "ids_not_carried": [
            "c-no:release-stock named {'reservation': 'reservation-2'}, not "
            "{'reservation': 'reservation-1'}"
        ]
    }


def test_a_refused_callback_and_a_halted_group_replay_cleanly(shop: Any) -> None:
    product, s = shop
    product.run_checkout(s, "c-carrier")
    s.clock.advance(3)
    s.scheduler.dispatch("c-carrier")
    product.succeed(s, product.sent(s, "c-carrier")[-1])
    s.admin.deliver_event(
        "c-carrier",
        "parcel-left",
        {"refused": "no driver"},
        "carrier",
        token=callback_token(stored(s, "c-carrier"), "parcel-left"),
    )
    for _ in range(2):
        s.scheduler.dispatch("c-carrier")
        product.succeed(s, product.sent(s, "c-carrier")[-1])
    # a group whose step is refused while the other waits for its retry: that one halts
    product.submit(s, "c-halt", "checkout")
    reserve, charge = product.sent(s, "c-halt")
    s.scheduler.apply_reply(reply_to(charge, Outcome.TRANSIENT, error="503", applied="no"))
    s.scheduler.apply_reply(reply_to(reserve, Outcome.REFUSED, error="HTTP 422"))
    orders = {o: s.store.load(o) for o in ("c-carrier", "c-halt")}
    assert {o: str(v.status) for o, v in orders.items()} == {
        "c-carrier": "compensated",
        "c-halt": "compensated",  # nothing applied; as fulfilment's first step refused
    }
    halted = orders["c-halt"].find("charge-payment")
    assert halted is not None and halted.history[-1]["event"] == "halted"
    undone = ["reserve-stock", "charge-payment", "refund-payment", "release-stock"]
    ledger = checkout_ledger("c-carrier", undone)
    alerts = s.queues.on(s.names.operator_alerts)
    verdict = verify(orders, ledger, alerts, expected=dict.fromkeys(orders, "compensated"))
    assert verdict.ok, verdict.problems()


# --- a ForEach's items (docs/contracts.md §3.16) --------------------------------------------


def lined(order_id: str, refuse_last: bool = False) -> Order:
    """An order of tests/fixtures/items.py's ``lines``: charged, three lines reserved two
    at a time (the second ends first), then confirmed; or the third line refused, the
    first two released (latest first) and the charge refunded."""
    from tests.support import declarations
    from tests.unit.test_one_decision import claim, new, report, succeed, unwind_to_the_end

    lines = [{"sku": s, "qty": 1} for s in "ABC"]
    with declarations("tests.fixtures.items"):
        order = new("lines", order_id, lines=lines)
        now = succeed(order, "charge", T0)
        for name in ("reserve[1]", "reserve[0]"):  # each with its own reservation
            now = claim(order, name, now)
            order.apply_reply(report(order, name, result={"reservation": name}), now, POLICY)
        if refuse_last:
            order.claim("i-1", now, step="reserve[2]")
            refused = report(order, "reserve[2]", Outcome.REFUSED, error="out of stock")
            order.apply_reply(refused, now + timedelta(seconds=1), POLICY)
            unwind_to_the_end(order, now + timedelta(seconds=2))
        else:
            now = succeed(order, "reserve[2]", now)
            succeed(order, "confirm", now)
    return order


def item_ledger(order_id: str, steps: list[str]) -> list[dict[str, Any]]:
    """The simulator's ledger of an order of ``lines``: ``unreserve[<i>]`` undoes
    ``reserve[<i>]``, ``refund`` the ``charge``."""
    entries = ledger_of({order_id: steps})
    for entry in entries:
        undone = {"refund": "charge"}.get(entry["step"])
        if entry["step"].startswith("unreserve["):
            undone = entry["step"].removeprefix("un")
        entry["kind"] = "compensation" if undone else "effect"
        entry["compensates"], entry["undid"] = undone, True if undone else None
    return entries


def test_items_apply_in_any_order_among_themselves_and_their_head_applies_nothing() -> None:
    order = lined("l-1")
    applied = ["charge", "reserve[1]", "reserve[0]", "reserve[2]", "confirm"]
    wanted = ("charge", "reserve[0]", "reserve[1]", "reserve[2]", "confirm")
    for expected in (None, wanted):  # the plan's own, or the one given
        verdict = verify(
            {"l-1": order},
            item_ledger("l-1", applied),
            [],
            expected={"l-1": "completed"},
            expected_effects=None if expected is None else {"l-1": expected},
        )
        assert verdict.ok, verdict.violations()
    # an item missing is still told
    verdict = verify({"l-1": order}, item_ledger("l-1", applied[:2] + applied[3:]), [])
    assert verdict.wrong_effects, verdict.violations()


def test_an_item_refused_is_undone_item_by_item_and_an_item_left_standing_is_told() -> None:
    order = lined("l-2", refuse_last=True)
    assert order.status is OrderStatus.COMPENSATED
    applied = ["charge", "reserve[1]", "reserve[0]", "unreserve[1]", "unreserve[0]", "refund"]
    verdict = verify({"l-2": order}, item_ledger("l-2", applied), [], {"l-2": "compensated"})
    assert verdict.ok, verdict.violations()
    # reserve[0] applied and never undone
    left = [s for s in applied if s != "unreserve[0]"]
    verdict = verify({"l-2": order}, item_ledger("l-2", left), [], {"l-2": "compensated"})
    assert verdict.wrong_effects == ["l-2:reserve[0] applied, never undone"]


def test_an_items_alert_names_its_for_each() -> None:
    """An item held for an operator: the alert names the ForEach (one alert-rule value)."""
    from tests.support import declarations
    from tests.unit.test_one_decision import new, report, succeed

    with declarations("tests.fixtures.items"):
        order = new("lines-held", "l-3", lines=[{"sku": "A", "qty": 1}])
        now = succeed(order, "charge", T0)
        order.claim("i-1", now, step="reserve[0]")
        refused = report(order, "reserve[0]", Outcome.REFUSED, error="out of stock")
        order.apply_reply(refused, now + timedelta(seconds=1), POLICY)
    assert order.status is OrderStatus.ERROR
    alerts = alerts_of(order)
    assert [a["step"] for a in alerts] == ["reserve"]
    ledger = item_ledger("l-3", ["charge"])
    assert verify({"l-3": order}, ledger, alerts, {"l-3": "error"}).ok
    assert verify({"l-3": order}, ledger, [], {"l-3": "error"}).unalerted == ["l-3:reserve[0]"]


# --- per-key concurrency (docs/contracts.md §3.16): never more of one key than its limit --


def keyed_run() -> dict[str, Order | None]:
    """Three ``serial`` orders (tests/fixtures/turns.py, limit 1) through the services:
    two of account ``x`` one after the other, one of ``y`` beside them."""
    from tests.support import declarations
    from tests.unit.test_services_in_memory import build
    from tests.unit.test_turns import finish, pump, send

    s = build()
    with declarations("tests.fixtures.turns"):
        for order_id, account in (("x-1", "x"), ("x-2", "x"), ("y-1", "y")):
            send(s, order_id, account=account)
        s.clock.advance(2)
        finish(s, "x-1")
        finish(s, "y-1")
        pump(s)
        s.clock.advance(2)
        finish(s, "x-2")
        return {o: stored(s, o) for o in ("x-1", "x-2", "y-1")}


def test_orders_of_one_key_one_after_the_other_pass_and_running_beside_is_told() -> None:
    orders = keyed_run()
    assert {str(o.status) for o in orders.values() if o} == {"completed"}
    ledger = ledger_of({o: ["process"] for o in orders})
    assert verify(orders, ledger, []).ok, verify(orders, ledger, []).violations()
    # x-2's history says it took its turn before x-1 gave the slot back: a broken slot
    x2 = orders["x-2"]
    assert x2 is not None
    [taken] = [h for h in x2.history if h["event"] == "turn-taken"]
    taken["at"] = "2000-01-01T00:00:00.000Z"
    verdict = verify(orders, ledger, [])
    assert verdict.violations() == {"overlapping_turns": ["x-1 ran beside x-2 (key x, limit 1)"]}


def test_an_end_written_on_a_clock_ahead_is_read_as_early_as_the_skew_allows() -> None:
    """The chaos run's one instance runs its clock ahead: x-1's end, written there, may
    read after x-2 took its turn; within the skew, that is no overlap; beyond it, it is."""
    orders = keyed_run()
    ledger = ledger_of({o: ["process"] for o in orders})
    x1, x2 = orders["x-1"], orders["x-2"]
    assert x1 is not None and x2 is not None
    [taken] = [h for h in x2.history if h["event"] == "turn-taken"]
    [ended] = [h for h in x1.history if h.get("status") == "completed"]
    at = parse_iso(taken["at"])
    ended["at"] = iso(at + timedelta(seconds=1))  # x-1's end, 1 s ahead
    assert verify(orders, ledger, [], skew=timedelta(seconds=1.5)).ok
    said = verify(orders, ledger, [], skew=timedelta(seconds=0.5)).violations()
    assert said == {"overlapping_turns": ["x-2 ran beside x-1 (key x, limit 1)"]}


def test_a_start_written_on_a_clock_ahead_is_not_read_as_after_the_other_s() -> None:
    """Seen in a chaos run: x-2's turn written on the instance 1.5 s ahead reads after
    x-1's, though x-2 ran first; within the skew, no overlap is told."""
    orders = keyed_run()
    ledger = ledger_of({o: ["process"] for o in orders})
    x1, x2 = orders["x-1"], orders["x-2"]
    assert x1 is not None and x2 is not None
    [first] = [h for h in x1.history if h["event"] == "turn-taken"]
    [second] = [h for h in x2.history if h["event"] == "turn-taken"]
    second["at"] = iso(parse_iso(first["at"]) + timedelta(seconds=1))  # read just after
    assert verify(orders, ledger, [], skew=timedelta(seconds=1.5)).ok
    assert not verify(orders, ledger, []).ok
