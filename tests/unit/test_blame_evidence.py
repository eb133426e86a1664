"""Who is to blame (docs/contracts.md §3.11 (18), "blame ages from its evidence"): an order
singled out once is not blamed for a later outage because of its own failures.

On the pure model with a fake agent that plays the agent's rules (``agents.health``): in
an outage nobody is served, so a failure is the order's own only on the request's flag
(``singledOut``), and such a blame brings no new evidence.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import httpx
import pytest

from agents.agent import AgentWorker
from agents.health import Blame, EndpointHealth, HostActivity
from core.errors import InvalidMessage
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepState
from core.timefmt import iso
from messaging.wire import decode_reply
from tests.unit.test_endpoint_health import request_for
from tests.unit.test_model import T0, alerts, new_order, reply
from tests.unit.test_remote_client import (
    FakeClock,
    MaxRng,
    RecordingTransport,
    make_client,
    ok,
    remote,
    status,
)

S0 = T0.timestamp()
POLICY = RetryPolicy()  # MAX_FAILURE_COUNT 5, a 30-minute deferral window
#: The step's timeout in ``new_order`` (30 s): the flag's horizon is three of them.
HORIZON = timedelta(seconds=90)
#: How long an attempt's tries go on before the agent reports (30 s steps: 25 s).
TRIES = timedelta(seconds=25)

#: (the order, when its attempt was claimed, the request's singledOut) -> (reply, at)
Agent = Callable[[Order, datetime, bool], tuple[AgentReply, datetime]]


def run(order: Order, agent: Agent, until: datetime, now: datetime = T0) -> list[str]:
    """Drive the order as the scheduler and the supervisor do, each attempt answered by
    ``agent``, until it ends or ``until``; each attempt's outcome and when it was
    claimed (seconds from T0)."""
    outcomes: list[str] = []
    while not order.status.terminal and now < until:
        step = order.active_step()
        assert step is not None
        if step.process_state is StepState.PROCESSING:  # held at its last failure
            now = max(now, step.complete_by + timedelta(seconds=1))
            order.expire(now, POLICY)
            continue
        now = max(now, step.not_before)
        order.claim("i-1", now)
        flag = step.singled_out_now(now)  # what the scheduler puts in the request
        outcomes.append(f"@{int((now - T0).total_seconds())}")
        answer, now = agent(order, now, flag)
        order.apply_reply(answer, now, POLICY)
        outcomes[-1] = f"{answer.outcome}{outcomes[-1]}"
    return outcomes


def outage(end: datetime) -> Agent:
    """Every call fails for every order until ``end``; nobody else is served. The agent's
    instance saw no other order fail since the endpoint last answered, so the request's
    flag alone blames the order (and brings no new evidence); without it, a deferral."""

    def agent(order: Order, claimed: datetime, flag: bool) -> tuple[AgentReply, datetime]:
        if claimed >= end:
            return reply(order), claimed + timedelta(seconds=1)
        at = claimed + TRIES
        if flag:
            return reply(order, Outcome.TRANSIENT, error="HTTP 503", applied=Applied.NO), at
        deferred = reply(
            order, Outcome.DEFERRED, error="HTTP 503; failing for others too", not_before=at
        )
        return deferred, at

    return agent


def singled_out_at_first(order: Order) -> datetime:
    """Attempt 1 fails while another order is served: the order's own failure (counted,
    singled out). Returns when its report came."""
    order.claim("i-1", T0)
    at = T0 + TRIES
    order.apply_reply(
        reply(order, Outcome.TRANSIENT, error="HTTP 500", applied=Applied.NO), at, POLICY
    )
    step = order.steps[0]
    assert step.singled_out and step.failure_count == 1
    return at


def test_an_order_singled_out_once_rides_out_a_later_outage_its_own_failures_renew_nothing() -> (
    None
):
    """Singled out at T; then a 4-minute outage (every call fails for every order), which
    lasts well past the flag's horizon. Blamed on the flag alone, its failures bring no
    new evidence, so the flag ages from T: after T + horizon every attempt is a deferral,
    and the order completes once the remote is back, with no alert. (Before, each blamed
    failure set ``singled_out_at`` to its own time: the flag never aged while the outage
    lasted, and the order ended ``error`` after 5 attempts, with an alert.)"""
    order = new_order()
    seen = singled_out_at_first(order)
    back = seen + timedelta(minutes=4)

    outcomes = run(order, outage(back), back + timedelta(minutes=5), seen)

    step = order.steps[0]
    assert order.status is OrderStatus.COMPLETED, (outcomes, step.history)
    assert alerts(order) == []
    assert step.failure_count < POLICY.max_failure_count, outcomes
    counted = [h for h in step.history if h["event"] == "transient"]
    assert all(h["at"] <= iso(seen + HORIZON) for h in counted), outcomes
    after = [o for o in outcomes if int(o.split("@")[1]) > (seen + HORIZON - T0).seconds]
    assert after and all(not o.startswith("transient") for o in after), outcomes
    assert step.singled_out_at == seen  # never renewed by its own failures


def test_the_same_order_without_the_old_flag_rides_the_outage_out_with_no_failure() -> None:
    order = new_order()
    order.claim("i-1", T0)
    order.apply_reply(reply(order), T0 + timedelta(seconds=1), POLICY)
    assert order.status is OrderStatus.COMPLETED
    fresh = new_order()
    back = T0 + timedelta(minutes=4)

    outcomes = run(fresh, outage(back), back + timedelta(minutes=5))

    assert fresh.status is OrderStatus.COMPLETED and alerts(fresh) == []
    assert fresh.steps[0].failure_count == 0, outcomes


def test_an_outage_that_starts_after_the_horizon_counts_no_failure() -> None:
    """The flag has aged when the outage starts: every attempt in it is a deferral."""
    order = new_order()
    seen = singled_out_at_first(order)
    start = seen + HORIZON + timedelta(minutes=2)
    back = start + timedelta(minutes=4)

    outcomes = run(order, outage(back), back + timedelta(minutes=5), start)

    assert order.status is OrderStatus.COMPLETED and alerts(order) == []
    assert order.steps[0].failure_count == 1, outcomes  # the first one only
    assert not any(o.startswith("transient") for o in outcomes), outcomes


def test_the_flag_ages_from_when_the_agent_saw_its_evidence_not_from_the_report() -> None:
    order = new_order()
    order.claim("i-1", T0)
    seen = T0 + timedelta(seconds=3)  # another order served while this one failed
    failed = replace(
        reply(order, Outcome.TRANSIENT, error="HTTP 500", applied=Applied.NO), evidence_at=seen
    )
    order.apply_reply(failed, T0 + TRIES, POLICY)
    step = order.steps[0]
    assert step.singled_out_at == seen
    assert step.singled_out_now(seen + HORIZON)
    assert not step.singled_out_now(seen + HORIZON + timedelta(seconds=1))


@pytest.mark.parametrize(
    ("before", "seen", "expected"),
    [
        (None, None, "now"),  # the first blame with no date: as an agent that says nothing
        (None, "later", "now"),  # an agent's clock ahead: never past now
        (None, "earlier", "earlier"),
        ("earlier", None, "earlier"),  # the flag alone: it keeps its age
        ("earlier", "earliest", "earlier"),  # older evidence than known: nothing changes
        ("earliest", "earlier", "earlier"),  # newer evidence: the flag ages from it
    ],
)
def test_single_out_takes_the_evidence_as_the_contract_bounds_it(
    before: str | None, seen: str | None, expected: str
) -> None:
    times = {
        "earliest": T0 - timedelta(minutes=2),
        "earlier": T0 - timedelta(minutes=1),
        "now": T0,
        "later": T0 + timedelta(minutes=5),
    }
    step = new_order().steps[0]
    if before is not None:
        step.singled_out, step.singled_out_at = True, times[before]

    step.single_out(times[seen] if seen else None, T0)

    assert step.singled_out and step.singled_out_at == times[expected]


def test_evidence_at_travels_on_a_transient_reply_and_nowhere_else() -> None:
    order = new_order()
    order.claim("i-1", T0)
    seen = T0 + timedelta(seconds=3, milliseconds=250)
    failed = replace(
        reply(order, Outcome.TRANSIENT, error="HTTP 500", applied=Applied.NO), evidence_at=seen
    )
    wire = json.loads(failed.encode())
    assert wire["evidenceAt"] == iso(seen)
    assert decode_reply(failed.encode()).evidence_at == seen
    plain = reply(order, Outcome.TRANSIENT, error="HTTP 500", applied=Applied.NO)
    assert "evidenceAt" not in json.loads(plain.encode())  # no new evidence: absent
    assert decode_reply(plain.encode()).evidence_at is None
    # another outcome never carries it
    deferred = replace(
        reply(order, Outcome.DEFERRED, error="down", not_before=T0), evidence_at=seen
    )
    assert "evidenceAt" not in json.loads(deferred.encode())


@pytest.mark.parametrize(
    ("outcome", "value"),
    [
        ("transient", "yesterday"),
        ("transient", 1234),
        ("transient", None),
        ("transient", "1969-12-31T23:59:59Z"),  # before the contract's times
        ("transient", "9999-01-01T00:00:00Z"),
        ("transient", "2026-11-22T10:00:00"),  # no offset
        ("deferred", "2026-11-22T10:00:00Z"),  # only a transient reply is blamed
        ("failed", "2026-11-22T10:00:00Z"),
    ],
)
def test_a_reply_with_an_unreadable_or_misplaced_evidence_at_is_refused(
    outcome: str, value: object
) -> None:
    order = new_order()
    order.claim("i-1", T0)
    wire = json.loads(
        reply(order, Outcome.of_wire(outcome), error="x", not_before=T0 + TRIES).encode()
    )
    wire["evidenceAt"] = value

    with pytest.raises(InvalidMessage, match="evidenceAt"):
        decode_reply(json.dumps(wire))


# --- the agent's side: what it saw, and when ------------------------------------------------


def test_a_blame_says_when_another_order_was_served_and_nothing_for_the_flag_alone() -> None:
    health = EndpointHealth("e")
    mark = health.mark()
    health.record_failure("a", S0, explained=False, probe=False)
    health.record_answer("b", S0 + 2)  # another order served after a first failed
    health.record_answer("a", S0 + 3)  # then a's own 409: up, busy with its key
    assert health.attribute("a", mark=mark, singled_out=False) == Blame(True, S0 + 2, True)
    # the endpoint answered only a itself (its 409s): blamed, but no new evidence
    own = EndpointHealth("e")
    mark = own.mark()
    own.record_answer("a", S0 + 1)
    assert own.attribute("a", mark=mark, singled_out=False) == Blame(True, None, True)
    # the flag alone, the endpoint's last word a success long ago: no new evidence
    flag = EndpointHealth("e")
    flag.record_answer("b", S0)
    mark = flag.mark()
    flag.record_failure("a", S0 + 600, explained=True, probe=False)
    assert flag.attribute("a", mark=mark, singled_out=True) == Blame(True, None)


def test_the_host_answering_others_is_evidence_by_its_time() -> None:
    host = HostActivity()
    ship, reserve = EndpointHealth("ship", host=host), EndpointHealth("reserve", host=host)
    mark = ship.mark()
    ship.record_failure("o-1:ship", S0, explained=False, probe=False)
    reserve.record_answer("o-2:reserve-stock", S0 + 4)
    assert ship.attribute("o-1:ship", mark=mark, singled_out=False) == Blame(True, S0 + 4, True)


def test_a_singled_out_order_rides_out_a_later_outage_through_the_agent_and_the_wire() -> None:
    """The same as the first test, with the real runner on a fake remote and the replies
    through the wire: a (o-1) fails while b is served (a's flag dates from b's answer);
    then every call fails for 4 minutes and a is alone. Blamed on its flag for a while
    (no new evidence), then deferred once the flag has aged; completed when the remote is
    back, no alert."""
    clock = FakeClock(T0)
    back = T0 + TRIES + timedelta(minutes=4)

    def service(request: httpx.Request) -> httpx.Response:
        if request.headers["Idempotency-Key"] == "b:process" or clock() >= back:
            return ok()
        return status(503)

    client, _ = make_client(remote(clock, service), rng=MaxRng())
    transport = RecordingTransport()
    agent = AgentWorker(client, transport, clock, sleep=clock.sleep)
    served: list[datetime] = []

    async def b_meanwhile() -> None:  # during a's first backoff, b is served
        if not served:
            outcome = await client.call(request_for("b", clock))
            assert outcome.kind == "succeeded"
            served.append(clock())

    clock.on_sleep.append(b_meanwhile)
    order = new_order()
    outcomes: list[str] = []
    while not order.status.terminal and clock() < back + timedelta(minutes=5):
        step = order.steps[0]
        if step.process_state is StepState.PROCESSING:  # held at its last failure
            clock.now = max(clock.now, step.complete_by + timedelta(seconds=1))
            order.expire(clock(), POLICY)
            continue
        clock.now = max(clock.now, step.not_before)
        claimed = order.claim("i-1", clock())
        request = AgentRequest(
            order.order_id,
            claimed.step,
            claimed.attempt,
            claimed.complete_by,
            claimed.path,
            order.body,
            singled_out=claimed.singled_out_now(clock()),
            token=claimed.token_for(claimed.attempt),
        )
        at = int((clock() - T0).total_seconds())
        asyncio.run(agent.handle(request))
        sent, _ = transport.replies[-1]
        answer = decode_reply(sent.encode())
        order.apply_reply(answer, clock(), POLICY)
        outcomes.append(f"{answer.outcome}@{at}")
        if len(outcomes) == 1:
            assert answer.evidence_at == served[0]  # b's answer, not a's report
            assert order.steps[0].singled_out_at == served[0]

    step = order.steps[0]
    assert order.status is OrderStatus.COMPLETED, (outcomes, step.history)
    assert alerts(order) == []
    assert step.failure_count < POLICY.max_failure_count, outcomes
    assert step.singled_out_at == served[0]
    aged = served[0] + HORIZON
    late = [o for o in outcomes[:-1] if T0 + timedelta(seconds=int(o.split("@")[1])) > aged]
    assert late and all(o.startswith("deferred") for o in late), outcomes
