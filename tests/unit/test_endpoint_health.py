"""The endpoint's health (``agents.health``): whose failure a failed attempt is, and the
circuit breaker that keeps an outage down to a trickle of probes (docs/contracts.md §3.11).

First the ``EndpointHealth`` object on its own (times are epoch seconds), then through
``AttemptRunner.call`` on httpx.MockTransport and a fake clock, counting what
reaches the remote.
"""

from __future__ import annotations

import asyncio
import heapq
import threading
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from agents.health import EndpointHealth, HealthPolicy, HostActivity, Mark
from agents.outcomes import CallOutcome
from agents.remote import HttpTry
from agents.runner import AttemptRunner
from core.messages import AgentRequest
from tests.unit.test_remote_client import (
    T0,
    FakeClock,
    MaxRng,
    Remote,
    close_clients,
    make_client,
    make_request,
    ok,
    remote,
    status,
)

S0 = T0.timestamp()


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    close_clients()


def tripped(health: EndpointHealth, at: float = S0, keys: str = "abc") -> EndpointHealth:
    for key in keys:
        health.record_failure(key, at, explained=False, probe=False)
    return health


# --- EndpointHealth on its own ------------------------------------------------------------


def test_a_closed_endpoint_admits_every_call_and_none_is_a_probe() -> None:
    health = EndpointHealth("e")

    for key in ("a", "b", "a"):
        admission = health.admit(key, S0, singled_out=key == "b")
        assert (admission.allowed, admission.probe) == (True, False)


def test_it_trips_after_three_different_orders_fail_with_no_success_between() -> None:
    health = EndpointHealth("e")

    for _ in range(10):  # one order failing over and over is that order's problem
        health.record_failure("a", S0, explained=False, probe=False)
    health.record_failure("b", S0, explained=False, probe=False)
    open_after_two = health.is_open

    health.record_failure("c", S0 + 1, explained=False, probe=False)

    assert (open_after_two, health.is_open) == (False, True)
    admission = health.admit("d", S0 + 1)
    assert (admission.allowed, admission.retry_at) == (False, S0 + 3)


def test_a_success_between_failures_starts_the_count_again() -> None:
    health = EndpointHealth("e")
    for key in "ab":
        health.record_failure(key, S0, explained=False, probe=False)

    health.record_answer("z", S0 + 1)
    for key in "cd":
        health.record_failure(key, S0 + 2, explained=False, probe=False)

    assert not health.is_open


def test_explained_failures_never_trip_it() -> None:
    health = EndpointHealth("e")

    for key in "abcdefgh":
        health.record_failure(key, S0, explained=True, probe=False)

    assert not health.is_open


def test_trip_keys_is_a_policy() -> None:
    health = EndpointHealth("e", HealthPolicy(trip_keys=2))

    tripped(health, keys="ab")

    assert health.is_open


def test_while_open_exactly_one_probe_goes_out_at_the_probe_time() -> None:
    health = tripped(EndpointHealth("e"))

    early = health.admit("d", S0 + 1.9)
    probe = health.admit("d", S0 + 2)
    other = health.admit("e", S0 + 2)
    later = health.admit("f", S0 + 9)

    assert (early.allowed, early.retry_at) == (False, S0 + 2)
    assert (probe.allowed, probe.probe) == (True, True)
    assert (other.allowed, other.probe) == (False, False)
    assert "in flight" in other.reason
    assert other.retry_at >= S0 + 2
    assert not later.allowed  # still in flight


def test_an_order_that_finds_a_probe_in_flight_comes_back_when_it_can_have_answered() -> None:
    """Not every couple of seconds while a slow probe is out: each return is a dispatch,
    a claim, a request and a reply through the storage, for every order waiting."""
    health = tripped(EndpointHealth("e", HealthPolicy(probe_timeout_seconds=15)))
    assert health.admit("d", S0 + 2, bound=10).probe  # its try waits 10 s at most

    waiting = [health.admit(f"w{n}", S0 + 3) for n in range(20)]
    assert all(not w.allowed and "in flight" in w.reason for w in waiting)
    # after the probe's bound, spread over one probe interval (2 s here), not as a herd
    times = [w.retry_at for w in waiting]
    assert all(S0 + 12 <= t < S0 + 14 for t in times), times
    assert len({round(t, 3) for t in times}) > 10
    assert health.admit("w1", S0 + 4).retry_at == waiting[1].retry_at  # the same, per key
    # a probe without a bound given, or a longer one: at most the probe's timeout
    other = tripped(EndpointHealth("e", HealthPolicy(probe_timeout_seconds=15)))
    assert other.admit("d", S0 + 2, bound=60).probe
    assert S0 + 17 <= other.admit("e", S0 + 3).retry_at < S0 + 19
    # the probe failed early (a 503): the next probe time is as before, and the breaker
    # admits the next order to come at or after it
    health.record_failure("d", S0 + 2.1, explained=False, probe=True)
    assert health.admit("f", S0 + 2.2).retry_at == S0 + 2.1 + 4
    assert health.admit("f", S0 + 6.1).probe


def test_while_it_waits_to_probe_one_order_comes_back_at_the_probe_time() -> None:
    """The others once that probe can have answered: sent back at the probe time, all
    but one would only find it in flight."""
    health = tripped(EndpointHealth("e", HealthPolicy(probe_timeout_seconds=15)))
    first = health.admit("a", S0 + 0.5, bound=10)
    others = [health.admit(k, S0 + 0.5 + n / 10, bound=10) for n, k in enumerate("bcdefg")]

    assert (first.allowed, first.retry_at) == (False, S0 + 2)  # to probe
    assert all(not o.allowed and S0 + 12 <= o.retry_at < S0 + 14 for o in others), others
    assert health.admit("a", S0 + 2, bound=10).probe
    # the next wait to probe calls one order back again; the probe took its whole 10 s,
    # so the others come back 10 s after the next probe time
    health.record_failure("a", S0 + 12, explained=False, probe=True)
    assert health.admit("b", S0 + 12.1, bound=10).retry_at == S0 + 16
    assert S0 + 26 <= health.admit("c", S0 + 12.1, bound=10).retry_at < S0 + 30
    # a probe that fails at once (an outage answering 503): the others come back right
    # after the next probe time, spread over the interval (8 s now)
    assert health.admit("b", S0 + 16, bound=10).probe
    health.record_failure("b", S0 + 16.05, explained=False, probe=True)
    assert health.admit("d", S0 + 16.1, bound=10).retry_at == S0 + 16.05 + 8
    later = [health.admit(k, S0 + 16.1, bound=10).retry_at for k in "efghij"]
    assert all(S0 + 24.1 <= t < S0 + 32.1 for t in later), later


def test_a_probe_that_never_comes_back_frees_the_slot() -> None:
    health = tripped(EndpointHealth("e", HealthPolicy(probe_timeout_seconds=15)))
    assert health.admit("d", S0 + 2).probe

    assert not health.admit("e", S0 + 16.9).allowed
    assert health.admit("e", S0 + 17).probe


def test_a_failed_probe_lengthens_the_interval_to_its_cap() -> None:
    health = tripped(EndpointHealth("e"))
    probe_at, gaps = S0 + 2, [2.0]
    for _ in range(6):
        assert not health.admit("x", probe_at - 0.01).allowed
        assert health.admit("x", probe_at).probe
        health.record_failure("x", probe_at, explained=False, probe=True)
        refusal = health.admit("y", probe_at)
        gaps.append(refusal.retry_at - probe_at)
        probe_at = refusal.retry_at

    assert gaps == [2, 4, 8, 10, 10, 10, 10]


def test_a_successful_probe_closes_it_and_the_next_trip_starts_at_two_seconds() -> None:
    health = tripped(EndpointHealth("e"))
    for at in (S0 + 2, S0 + 6, S0 + 14):
        assert health.admit("x", at).probe
        health.record_failure("x", at, explained=False, probe=True)
    assert health.admit("x", S0 + 24).probe

    health.record_answer("x", S0 + 24)

    assert not health.is_open
    assert health.admit("y", S0 + 24).allowed
    tripped(health, S0 + 30, keys="pqr")
    assert health.admit("z", S0 + 30).retry_at == S0 + 32


def test_a_permanent_refusal_from_a_probe_closes_it_too() -> None:
    # A 4xx about the request is an answer: the endpoint is up.
    health = tripped(EndpointHealth("e"))
    assert health.admit("x", S0 + 2).probe

    health.record_answer("x", S0 + 2)

    assert not health.is_open


def test_fresh_orders_probe_before_singled_out_ones() -> None:
    health = tripped(EndpointHealth("e"))

    singled = health.admit("bad", S0 + 2, singled_out=True)
    fresh = health.admit("new", S0 + 2)

    assert (singled.allowed, singled.retry_at) == (False, S0 + 4)
    assert fresh.probe


def test_a_singled_out_order_probes_when_no_fresh_one_came() -> None:
    health = tripped(EndpointHealth("e"))

    assert not health.admit("bad", S0 + 3.9, singled_out=True).allowed
    assert health.admit("bad", S0 + 4, singled_out=True).probe


def test_failures_of_calls_admitted_before_it_opened_change_nothing() -> None:
    health = tripped(EndpointHealth("e"))
    for key in "defg":  # tries that were on the wire when it opened
        health.record_failure(key, S0 + 1.5, explained=False, probe=False)

    assert health.admit("x", S0 + 2).probe  # the probe time did not move

    health.record_failure("late", S0 + 2.5, explained=False, probe=False)

    assert not health.admit("y", S0 + 2.5).allowed  # the probe is still the one in flight
    health.record_answer("x", S0 + 3)
    assert not health.is_open


@pytest.mark.parametrize(
    ("setup", "key", "mark", "singled_out", "blamed"),
    [
        # somebody else got an answer after this order first failed
        ("success-after-mark", "a", 0, False, True),
        ("success-after-mark", "a", 0, True, True),
        # nobody answered since: not provably this order's fault
        ("nothing", "a", 0, False, False),
        ("success-before-mark", "a", 1, False, False),
        # singled out, and the endpoint's last word was a success
        ("success-before-mark", "a", 1, True, True),
        ("success-then-own-failure", "a", 1, True, True),
        # singled out, but another order fails too: maybe an outage starting
        ("success-then-other-failure", "a", 1, True, False),
        # singled out, but this process never saw the endpoint work
        ("nothing", "a", 0, True, False),
        # open: the endpoint's failure, whatever else
        ("open", "a", 0, True, False),
    ],
)
def test_blame(setup: str, key: str, mark: int, singled_out: bool, blamed: bool) -> None:
    health = EndpointHealth("e")
    if setup == "success-after-mark":
        health.record_failure(key, S0, explained=singled_out, probe=False)
        health.record_answer("other", S0 + 1)
    elif setup.startswith("success"):
        health.record_answer("other", S0)
        if setup == "success-then-own-failure":
            health.record_failure(key, S0 + 1, explained=True, probe=False)
        if setup == "success-then-other-failure":
            health.record_failure("other-2", S0 + 1, explained=False, probe=False)
    elif setup == "open":
        health.record_answer("other", S0)
        tripped(health, S0 + 1, keys="xyz")
        mark = 0

    assert health.blames(key, mark=Mark(mark, mark), singled_out=singled_out) is blamed


def test_the_host_answering_on_other_endpoints_blames_a_lone_failing_order() -> None:
    """One order's ship fails while the same host answers reserve-stock for others: the
    host is up, and nobody else fails on ship, so the failure is the order's."""
    host = HostActivity()
    ship, reserve = EndpointHealth("ship", host=host), EndpointHealth("reserve", host=host)
    mark = ship.mark()
    ship.record_failure("o-1:ship", S0, explained=False, probe=False)
    assert not ship.blames("o-1:ship", mark=mark, singled_out=False)
    reserve.record_answer("o-2:reserve-stock", S0 + 1)
    assert ship.blames("o-1:ship", mark=mark, singled_out=False)
    # ... but not when other orders fail on ship too: that looks like ship being down
    ship.record_failure("o-3:ship", S0 + 2, explained=False, probe=False)
    assert not ship.blames("o-1:ship", mark=mark, singled_out=False)


def test_the_host_answering_before_the_first_failure_is_no_evidence() -> None:
    host = HostActivity()
    ship, reserve = EndpointHealth("ship", host=host), EndpointHealth("reserve", host=host)
    reserve.record_answer("o-1:reserve-stock", S0)
    mark = ship.mark()
    ship.record_failure("o-1:ship", S0 + 1, explained=False, probe=False)
    assert not ship.blames("o-1:ship", mark=mark, singled_out=False)
    # once singled out (an earlier attempt was blamed), the host's last word counts
    assert ship.blames("o-1:ship", mark=mark, singled_out=True)


# --- attribution through the client -----------------------------------------------------------


def request_for(order_id: str, clock: FakeClock, seconds: float = 30, **kw: Any) -> AgentRequest:
    """``make_request`` for ``order_id``, due ``seconds`` from now; ``kw``: other fields."""
    return make_request(order_id=order_id, complete_by=clock.now + timedelta(seconds=seconds), **kw)


def test_an_order_failing_while_another_succeeds_is_its_own_failure() -> None:
    clock = FakeClock()
    r = remote(clock, ok({"b": 1}), **{"a:process": [status(500)]})
    client, _ = make_client(r, rng=MaxRng())
    other: list[CallOutcome] = []

    async def meanwhile() -> None:  # during a's first backoff, b is served by the same client
        if not other:
            other.append(await client.call(request_for("b", clock)))

    clock.on_sleep.append(meanwhile)

    outcome = asyncio.run(client.call(request_for("a", clock)))

    assert [o.kind for o in other] == ["succeeded"]
    keys = [s.idempotency_key for s in r.seen]
    assert keys[:3] == ["a:process", "b:process", "a:process"]
    assert outcome.kind == "transient"  # counted against the order
    assert outcome.applied == "maybe"
    assert outcome.tries == keys.count("a:process") > 2
    assert not client.health("process").is_open


def test_a_success_recorded_by_another_thread_blames_the_failing_order() -> None:
    clock = FakeClock()
    client: AttemptRunner[HttpTry] | None = None
    tries = 0

    def a_fails(request: httpx.Request) -> httpx.Response:
        nonlocal tries
        tries += 1
        if tries == 2:  # while a's second try is on the wire, b gets an answer
            assert client is not None
            client.health("process").record_answer("b:process", clock().timestamp())
        return status(503)

    client, _ = make_client(remote(clock, a_fails), rng=MaxRng())

    outcome = asyncio.run(client.call(request_for("a", clock)))

    assert (outcome.kind, outcome.applied) == ("transient", "no")


def test_a_lone_failing_order_is_deferred_not_counted() -> None:
    clock = FakeClock()
    r = remote(clock, status(500))
    client, _ = make_client(r, rng=MaxRng())

    outcome = asyncio.run(client.call(request_for("a", clock)))

    assert outcome.kind == "deferred"
    assert outcome.applied == "maybe"
    assert outcome.not_before == clock.now  # closed: it may run again at once
    assert outcome.tries == len(r.seen) > 3
    assert "failing for other orders too, or has served none" in outcome.error
    assert not client.health("process").is_open


def test_a_singled_out_order_failing_after_the_endpoint_last_worked_is_counted() -> None:
    clock = FakeClock()
    r = remote(clock, ok(), **{"a:process": [status(503), status(502)]})
    client, _ = make_client(r, rng=MaxRng())
    assert asyncio.run(client.call(request_for("b", clock))).kind == "succeeded"

    outcome = asyncio.run(client.call(request_for("a", clock, singled_out=True)))

    assert (outcome.kind, outcome.applied) == ("transient", "maybe")
    assert len(r.calls("a:process")) == outcome.tries > 2


def test_a_singled_out_order_failing_with_others_is_not_counted() -> None:
    clock = FakeClock()
    r = remote(clock, ok(), **{"a:process": [status(503)], "c:process": [status(503)]})
    client, _ = make_client(r, rng=MaxRng(), backoff_initial_seconds=10)
    assert asyncio.run(client.call(request_for("b", clock))).kind == "succeeded"
    assert (
        asyncio.run(client.call(request_for("c", clock))).kind == "deferred"
    )  # fresh: c's first try

    outcome = asyncio.run(client.call(request_for("a", clock, singled_out=True)))

    assert outcome.kind == "deferred"


def test_a_singled_out_order_on_an_endpoint_never_seen_working_is_not_counted() -> None:
    clock = FakeClock()
    client, _ = make_client(remote(clock, status(503)), rng=MaxRng())

    assert asyncio.run(client.call(request_for("a", clock, singled_out=True))).kind == "deferred"


# --- the breaker through the client ----------------------------------------------------------


def one_try_each(r: Remote) -> AttemptRunner[HttpTry]:
    """A client whose attempts (1 s left: stop at 0.5 s) make one try each."""
    client, _ = make_client(r, rng=MaxRng(), backoff_initial_seconds=1.0)
    return client


def trip(client: AttemptRunner[HttpTry], clock: FakeClock) -> list[CallOutcome]:
    return [asyncio.run(client.call(request_for(k, clock, 1))) for k in ("a", "b", "c")]


def test_three_failing_orders_open_it_and_then_nothing_reaches_the_remote() -> None:
    clock = FakeClock()
    r = remote(clock, status(503))
    client = one_try_each(r)

    outcomes = trip(client, clock)

    assert [o.kind for o in outcomes] == ["deferred"] * 3
    assert [o.not_before for o in outcomes] == [T0, T0, T0 + timedelta(seconds=2)]
    assert client.health("process").is_open
    assert len(r.seen) == 3

    r.script = [ok()]
    for i, at in enumerate((0, 0.5, 1.99)):
        clock.at(at)
        outcome = asyncio.run(client.call(request_for(f"x{i}", clock)))
        assert outcome.kind == "deferred"
        assert (outcome.tries, outcome.applied) == (0, "no")
        # c, whose failure tripped it, comes back at the probe time (2 s) to probe; the
        # others once that probe can have answered (its try's bound: 10 s), spread over
        # one probe interval (2 s), rather than all at the probe time to find it out
        assert outcome.not_before is not None
        waits = (outcome.not_before - T0).total_seconds()
        assert 2 + 10 <= waits < 2 + 10 + 2, waits
        assert "circuit open (waiting for the next probe)" in outcome.error
    assert len(r.seen) == 3  # nothing reached the remote while open


def test_failed_probes_come_ever_less_often_and_a_successful_one_closes_it() -> None:
    clock = FakeClock()
    r = remote(clock, status(503))
    client = one_try_each(r)
    trip(client, clock)
    probes = []
    not_before = T0 + timedelta(seconds=2)
    for i in range(6):
        clock.now = not_before
        outcome = asyncio.run(client.call(request_for(f"p{i}", clock, 1)))
        assert outcome.kind == "deferred"
        assert outcome.tries == 1
        probes.append((r.seen[-1].at - T0).total_seconds())
        assert outcome.not_before is not None
        not_before = outcome.not_before

    assert probes == [2, 6, 14, 24, 34, 44]  # waits of 4, 8, 10, 10, 10 after the first 2
    assert len(r.seen) == 3 + 6

    r.script = [ok({"back": True})]
    clock.now = not_before
    assert asyncio.run(client.call(request_for("p9", clock))).result == {"back": True}
    assert not client.health("process").is_open
    assert asyncio.run(client.call(request_for("next", clock))).kind == "succeeded"
    assert len(r.seen) == 3 + 6 + 2


def test_one_probe_at_a_time() -> None:
    clock = FakeClock()
    entered, release = threading.Event(), threading.Event()

    def slow_probe(request: httpx.Request) -> httpx.Response:
        entered.set()
        release.wait(timeout=2)
        return ok()

    r = remote(clock, status(503))
    client = one_try_each(r)
    trip(client, clock)
    clock.at(2)
    r.script = [slow_probe]
    probe: list[CallOutcome] = []
    thread = threading.Thread(
        target=lambda: probe.append(asyncio.run(client.call(request_for("p", clock))))
    )
    thread.start()
    try:
        assert entered.wait(timeout=2)
        others = [asyncio.run(client.call(request_for(f"q{i}", clock))) for i in range(3)]
    finally:
        release.set()
        thread.join(timeout=5)

    assert [o.kind for o in others] == ["deferred"] * 3
    assert all("in flight" in o.error for o in others)
    assert all(o.not_before is not None and o.not_before >= clock.now for o in others)
    assert [s.idempotency_key for s in r.seen[3:]] == ["p:process"]
    assert [o.kind for o in probe] == ["succeeded"]
    assert not client.health("process").is_open


def test_while_open_a_fresh_order_probes_before_a_singled_out_one() -> None:
    clock = FakeClock()
    r = remote(clock, status(503))
    client = one_try_each(r)
    trip(client, clock)
    r.script = [ok()]
    clock.at(2)

    singled = asyncio.run(client.call(request_for("bad", clock, singled_out=True)))
    fresh = asyncio.run(client.call(request_for("new", clock)))

    assert singled.kind == "deferred"
    assert singled.not_before == T0 + timedelta(seconds=4)
    assert fresh.kind == "succeeded"
    assert [s.idempotency_key for s in r.seen[3:]] == ["new:process"]


def test_always_failing_singled_out_orders_among_healthy_traffic_never_open_it() -> None:
    clock = FakeClock()
    bad = {f"bad{i}:process": [status(500)] for i in range(4)}
    r = remote(clock, ok(), **bad)
    client, _ = make_client(r, rng=MaxRng())
    assert asyncio.run(client.call(request_for("warm", clock))).kind == "succeeded"
    kinds: dict[str, list[str]] = defaultdict(list)
    for round_ in range(5):
        for i in range(4):
            kinds["bad"].append(
                asyncio.run(client.call(request_for(f"bad{i}", clock, singled_out=True))).kind
            )
        kinds["good"].append(asyncio.run(client.call(request_for(f"good{round_}", clock))).kind)

    assert not client.health("process").is_open
    assert set(kinds["bad"]) == {"transient"}  # each one's own failure: counted
    assert set(kinds["good"]) == {"succeeded"}
    assert len(r.calls("good0:process")) == 1


def test_an_unsendable_order_says_nothing_about_the_endpoint() -> None:
    clock = FakeClock()
    r = remote(clock, status(503))
    client = one_try_each(r)
    trip(client, clock)
    clock.at(2)

    outcome = asyncio.run(client.call(request_for("nan", clock, order={"price": float("nan")})))

    assert outcome.kind == "refused"
    assert client.health("process").is_open  # not closed by an order it never saw
    probe = asyncio.run(client.call(request_for("p", clock, 1)))
    assert probe.tries == 1  # the probe slot is still free
    assert len(r.seen) == 4


def test_breakers_are_per_path() -> None:
    clock = FakeClock()
    r = remote(clock, status(503))
    client = one_try_each(r)
    trip(client, clock)
    r.script = [ok({"shipped": True})]

    outcome = asyncio.run(
        client.call(
            make_request(path="ship", step="ship", complete_by=clock.now + timedelta(seconds=5))
        )
    )

    assert outcome.result == {"shipped": True}
    assert r.seen[-1].url == "http://remote.test/api/ship"
    assert client.health("process").is_open
    assert not client.health("ship").is_open


def test_permanent_refusals_never_open_it() -> None:
    clock = FakeClock()
    r = remote(clock, status(404, error="no such order"))
    client = one_try_each(r)

    for i in range(6):
        assert asyncio.run(client.call(request_for(f"o{i}", clock))).kind == "refused"

    assert len(r.seen) == 6
    assert not client.health("process").is_open


# --- an outage on the fake clock ------------------------------------------------------------


def test_a_two_minute_outage_is_a_trickle_and_counts_against_no_order() -> None:
    """30 orders, the remote answers 503 to everything for 120 s, then 200.

    A sequential agent on a fake clock, every backoff at its ceiling (MaxRng), so the
    calls can be counted in advance. A step has 30 s and the agent stops 5 s before
    CompleteBy; an attempt's tries start at +0, 0.2, 0.6, 1.4, 3.0, 6.2, 11.2, 16.2 and
    21.2 s, and the next wait (5 s) does not fit: 9 tries. Orders 1 and 2 each fail
    alone for a whole attempt (2 x 9 calls, deferred: nobody else was served, so not
    counted); order 3's first try is the third distinct failing order and opens the
    breaker. From then on one probe per interval: trip + 2, + 6, + 14, then every 10 s.
    So at most 19 + 3 + ceil((120 - 14) / 10) = 33 calls in the 120 s whenever the trip
    comes, where every order retrying on its own would make hundreds.
    """
    clock = FakeClock()
    outage_end = T0 + timedelta(seconds=120)
    step_seconds = 30

    def service(request: httpx.Request) -> httpx.Response:
        return status(503) if clock() < outage_end else ok({"done": True})

    r = remote(clock, service)
    client, _ = make_client(r, rng=MaxRng())
    queue = [(T0, i, f"o{i:02d}") for i in range(30)]
    heapq.heapify(queue)
    history: dict[str, list[CallOutcome]] = defaultdict(list)
    while queue:
        due, seq, order_id = heapq.heappop(queue)
        clock.now = max(clock.now, due)
        request = make_request(
            order_id=order_id,
            attempt=len(history[order_id]) + 1,
            complete_by=clock.now + timedelta(seconds=step_seconds),
        )
        calls_before = len(r.seen)
        outcome = asyncio.run(client.call(request))
        history[order_id].append(outcome)
        assert all(s.at >= due for s in r.seen[calls_before:])  # never before notBefore
        if outcome.kind == "deferred":
            assert outcome.not_before is not None
            # what the scheduler does: not before notBefore, and at least a second later
            again = max(outcome.not_before, clock.now + timedelta(seconds=1))
            heapq.heappush(queue, (again, seq, order_id))
        else:
            assert outcome.kind == "succeeded", (order_id, outcome)

    during = [(s.at - T0).total_seconds() for s in r.seen if s.at < outage_end]
    assert len(during) <= 33
    # before the trip: two lone attempts of 9 tries, and the try that trips it
    assert [s.idempotency_key for s in r.seen[:19]] == ["o00:process"] * 9 + ["o01:process"] * 9 + [
        "o02:process"
    ]
    tripped_at = during[18]
    assert tripped_at == pytest.approx(42.4)
    probes, expected, at, wait = during[19:], [], tripped_at, 2.0
    while at + wait < 120:
        at += wait
        expected.append(at)
        wait = min(wait * 2, 10)
    assert probes == pytest.approx(expected)
    assert len(probes) == 9
    assert len(during) == 28

    for order_id, outcomes in history.items():
        kinds = [o.kind for o in outcomes]
        assert kinds[-1] == "succeeded", order_id
        assert set(kinds[:-1]) <= {"deferred"}, (order_id, kinds)  # never counted
        assert all(o.applied == "no" for o in outcomes[:-1])
    assert len(history) == 30
    after = [s.at for s in r.seen if s.at >= outage_end]
    assert min(after) - outage_end <= timedelta(seconds=10)  # back within one interval
    assert len(after) == 30  # then one call each


def test_a_probe_failing_after_another_order_closed_the_breaker_does_not_reopen_it() -> None:
    health = tripped(EndpointHealth("e"))
    probe = health.admit("p", S0 + 10)
    assert probe.probe
    health.record_answer("other", S0 + 11)  # a call admitted before it opened succeeds
    assert not health.is_open
    health.record_failure("p", S0 + 12, explained=False, probe=True)
    assert not health.is_open  # one order's failure: not three without a success between
