"""The chaos run's bounds on orders that ran out of attempts, on orders built with the
real state machine (no processes: these run in a second)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from core.model import Order
from core.policy import RetryPolicy
from core.states import OrderStatus
from core.timefmt import iso
from tests.chaos.runner import (
    CLOCK_OFFSET_SECONDS,
    DEATH_NOTICE_SLACK,
    MAX_FAILURES,
    RANDOM_FAULTS_PER_KEY,
    Deaths,
    ahead_prefix,
    exhausted_bound,
    explain_doubted,
    explain_exhausted,
)
from tests.unit.test_model import T0, new_order

POLICY = RetryPolicy(max_failure_count=MAX_FAILURES, soft_threshold=1, base_backoff_seconds=2)


def run_out(order_id: str) -> tuple[Order, list[tuple[datetime, datetime]]]:
    """An order whose every attempt expired, each claimed by a different process life
    (``devhost-0-<n>-100``): error after MAX_FAILURES. Returns it and each attempt's
    (claimed, expired) times."""
    order = new_order(orderId=order_id)
    now = T0
    windows = []
    for n in range(1, MAX_FAILURES + 1):
        step = order.claim(f"devhost-0-{n}-100", now)
        claimed = now
        now += timedelta(seconds=40)
        order.expire(now, POLICY)
        windows.append((claimed, now))
        now = max(now, step.complete_by) + timedelta(seconds=1)
    assert order.status is OrderStatus.ERROR
    return order, windows


def call(order_id: str, at: datetime, fault: str | None) -> dict[str, Any]:
    return {
        "at": iso(at),
        "step": "process",
        "idempotencyKey": f"{order_id}:process",
        "answer": 503,
        "applied": False,
        "fault": fault,
    }


def test_every_failed_attempt_is_put_down_to_a_fault_of_the_run_or_reported() -> None:
    order, windows = run_out("tired")
    second = timedelta(seconds=1)
    calls = [
        call("tired", windows[0][0] + second, "hang"),
        call("tired", windows[1][0] + second, "transient"),
        call("tired", windows[5][0] + second, "outage"),  # the outage explains nothing
        call("other", windows[6][0] + second, "hang"),  # another key's fault neither
    ]
    held = {("tired", "process", 3): 6.0, ("tired", "process", 99): 1.0}
    deaths = Deaths(
        [
            (windows[3][0] + second, "devhost-0-4"),  # attempt 4's claimer
            (windows[4][1] + DEATH_NOTICE_SLACK, "devhost-2-9"),  # noticed just after 5
            (windows[5][0] - second, "devhost-1-3"),  # before attempt 6 began
        ]
    )

    explained = explain_exhausted({"tired": order}, ["tired"], calls, deaths, held)

    assert explained == {
        "tired": {
            "step": "process",
            "failures": MAX_FAILURES,
            "randomFaultsOnKey": 2,
            "causes": {
                "random fault": 2,
                "reply held back": 1,
                "claimer died": 1,
                "a process died": 1,
            },
            "unexplained": [6, 7, 8],
        }
    }


def test_an_order_whose_failures_all_had_a_cause_is_explained() -> None:
    order, windows = run_out("tired")
    deaths = Deaths([(claimed + timedelta(seconds=2), "devhost-1-1") for claimed, _ in windows])

    [entry] = explain_exhausted({"tired": order}, ["tired"], [], deaths, {}).values()

    assert entry["unexplained"] == [] and entry["causes"] == {"a process died": MAX_FAILURES}


def test_an_order_reported_exhausted_without_such_a_step_is_unexplained() -> None:
    order = new_order(orderId="fine")

    explained = explain_exhausted({"fine": order, "gone": None}, ["fine", "gone"], [], Deaths(), {})

    assert explained == {
        "fine": {"unexplained": ["no step ran out of attempts"]},
        "gone": {"unexplained": ["no step ran out of attempts"]},
    }


def test_random_faults_alone_never_exhaust_a_step_and_the_bound_is_small() -> None:
    assert RANDOM_FAULTS_PER_KEY < MAX_FAILURES
    assert exhausted_bound(120) == 1 and exhausted_bound(400) == 4


def test_an_order_in_doubt_is_explained_only_by_a_death_while_its_attempt_ran() -> None:
    order, _ = run_out("unsure")  # every attempt expired: each may have applied
    doubtful = order.steps[0].maybe_applied
    assert doubtful, "expiries leave the attempts in doubt"
    during = [
        (order.steps[0].attempts.get(n).claimed_at + timedelta(seconds=1), "devhost-1-1")  # type: ignore[union-attr]
        for n in doubtful
    ]

    [explained] = explain_doubted({"unsure": order}, ["unsure"], Deaths(during)).values()
    before = Deaths([(T0 - timedelta(minutes=1), "devhost-1-0")])
    [unexplained] = explain_doubted({"unsure": order}, ["unsure"], before).values()
    [nothing] = explain_doubted({"fine": new_order(orderId="fine")}, ["fine"], Deaths()).values()

    held = {("unsure", "process", n): 6.0 for n in doubtful}
    [by_held] = explain_doubted({"unsure": order}, ["unsure"], before, held=held).values()
    faults = [
        call("unsure", order.steps[0].attempts.get(n).claimed_at + timedelta(seconds=1), "hang")  # type: ignore[union-attr]
        for n in doubtful
    ]
    [by_fault] = explain_doubted({"unsure": order}, ["unsure"], before, calls=faults).values()
    outage = [{**c, "fault": "outage"} for c in faults]  # an outage explains nothing
    [by_outage] = explain_doubted({"unsure": order}, ["unsure"], before, calls=outage).values()

    assert explained["unexplained"] == []
    assert unexplained["unexplained"] == [f"process:{n}" for n in doubtful]
    assert by_held["unexplained"] == [] and by_fault["unexplained"] == []
    assert by_outage["unexplained"] == unexplained["unexplained"]
    assert nothing["unexplained"] == ["no step in doubt"]


def expired_once(order_id: str, instance: str) -> Order:
    """An order whose first attempt, claimed by ``instance`` at T0 on its own clock,
    expired: in doubt."""
    order = new_order(orderId=order_id)
    step = order.claim(instance, T0)
    order.expire(step.complete_by + timedelta(seconds=1), POLICY)
    assert order.steps[0].maybe_applied == [1]
    return order


def test_a_claim_on_the_clock_that_runs_ahead_is_read_back_on_this_machines() -> None:
    """The last devhost's clock runs CLOCK_OFFSET_SECONDS ahead, so its claim records a
    time that late, after its own call reached the remote: a hang the simulator logged
    (this machine's clock) 10 ms after the claim, or an agent's death 0.5 s after it, is
    during the attempt, though before its ``claimed_at``. Only that instance's claims are
    read back, and only by the offset."""
    ahead = ahead_prefix(3)
    offset = timedelta(seconds=CLOCK_OFFSET_SECONDS)
    real_claim = T0 - offset  # when devhost-2 claimed, on this machine's clock
    hang = call("fast", real_claim + timedelta(milliseconds=10), "hang")
    death = Deaths([(real_claim + timedelta(seconds=0.5), "devhost-1-3")])
    fast = expired_once("fast", "devhost-2-1-100")
    other = expired_once("fast", "devhost-0-1-100")  # its T0 is this machine's T0

    def unexplained(order: Order, **found: Any) -> list[str]:
        [entry] = explain_doubted({"fast": order}, ["fast"], **found).values()
        return list(entry["unexplained"])

    nothing = Deaths()
    assert ahead == "devhost-2-"
    assert unexplained(fast, deaths=nothing, calls=[hang], ahead=ahead) == []
    assert unexplained(fast, deaths=death, ahead=ahead) == []
    # read on the claimer's clock, both come before the claim
    assert unexplained(fast, deaths=nothing, calls=[hang]) == ["process:1"]
    assert unexplained(fast, deaths=death) == ["process:1"]
    # another instance's claim is on this machine's clock: they came before it
    assert unexplained(other, deaths=nothing, calls=[hang], ahead=ahead) == ["process:1"]
    assert unexplained(other, deaths=death, ahead=ahead) == ["process:1"]
    # and before the offset, nothing is during the attempt
    early = call("fast", real_claim - timedelta(milliseconds=100), "hang")
    assert unexplained(fast, deaths=nothing, calls=[early], ahead=ahead) == ["process:1"]
    [entry] = explain_doubted({"fast": fast}, ["fast"], nothing, calls=[early]).values()
    assert entry["attempts"]["process:1"]["attempt"]["instance"] == "devhost-2-1-100"
    assert entry["attempts"]["process:1"]["randomFaultsOnKey"] == [early["at"]]
