"""An agent's health probe, ``Agent(..., health="/health")`` (docs/contracts.md §3.11 (18), "a
probe settles a lone order"; ``agents.healthcheck``): its declaration, the GET itself, at
most one probe an interval per instance, and what its verdict decides in the runner, on
httpx.MockTransport and a fake clock; then orders on the pure model driven through the
runner: a lone order failing while the probe says healthy ends ``error`` within its
failure budget, and one failing while the probe says failing rides the outage out.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from agents.agent import AgentWorker
from agents.auth import ApiKeyHeader
from agents.healthcheck import HealthCheck, Verdict
from agents.remote import HttpTry
from agents.runner import AttemptRunner
from core.agent_spec import Agent, DeclarationError
from core.messages import AgentRequest
from core.model import Order
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepState
from messaging.wire import decode_reply
from tests.unit.test_endpoint_health import request_for
from tests.unit.test_model import T0, alerts, new_order
from tests.unit.test_remote_client import (
    BASE,
    FakeClock,
    MaxRng,
    RecordingTransport,
    Remote,
    close_clients,
    make_client,
    ok,
    remote,
    status,
)
from tests.unit.test_remote_client import T0 as R0


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    close_clients()


# --- the declaration ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/health", "health", "/api/v1/health-check", "/healthz"])
def test_a_health_path_like_a_step_path_is_declared_and_listed(path: str) -> None:
    agent = Agent("carrier", health=path)
    assert agent.health == path
    assert agent.describe()["health"] == path
    assert "health" not in Agent("carrier").describe()


@pytest.mark.parametrize(
    "path", ["", "/", "//health", "/health/", "/Health", "/he alth", "/../x", "/health?x=1", 5]
)
def test_a_bad_health_path_is_refused_naming_the_file_and_line(path: Any) -> None:
    with pytest.raises(DeclarationError, match="health must be a path like a step's") as error:
        Agent("carrier", health=path)
    assert "test_health_probe.py:" in str(error.value)


def test_a_python_agent_has_no_health_path() -> None:
    with pytest.raises(DeclarationError, match="a python agent has none") as error:
        Agent("desk", kind="python", handler=lambda order, **call: {}, health="/health")
    assert "test_health_probe.py:" in str(error.value)


def test_the_operator_lists_show_the_health_path() -> None:
    from admin.agent_admin import AgentAdmin
    from stores.memory import InMemoryStateStore

    agents = {"carrier": Agent("carrier", health="/health"), "orders": Agent("orders")}
    admin = AgentAdmin(InMemoryStateStore(), lambda: T0, agents)

    listed = {a["name"]: a for a in admin.list()}
    assert listed["carrier"]["health"] == "/health"
    assert "health" not in listed["orders"]
    assert admin.show("carrier")["health"] == "/health"


# --- the GET --------------------------------------------------------------------------------


def test_the_probe_is_a_get_on_the_base_url_with_the_agents_own_auth() -> None:
    seen: list[httpx.Request] = []

    def service(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    kind = HttpTry(
        BASE + "/",
        transport=httpx.MockTransport(service),
        auth=ApiKeyHeader("X-Api-Key", "k-1"),
    )
    try:
        assert asyncio.run(kind.probe("/health", 1.0)) == (True, "GET /health: HTTP 204")
    finally:
        kind.close()
    [request] = seen
    assert (request.method, str(request.url)) == ("GET", BASE + "/health")
    assert request.headers["X-Api-Key"] == "k-1"
    assert "Idempotency-Key" not in request.headers


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        (httpx.Response(503), "HTTP 503"),
        (httpx.Response(404), "HTTP 404"),
        (httpx.Response(302, headers={"Location": "/login"}), "HTTP 302"),
        (httpx.ConnectError, "ConnectError"),
    ],
)
def test_anything_but_a_2xx_is_failing(answer: Any, detail: str) -> None:
    def service(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, type):
            raise answer("simulated", request=request)
        return answer  # type: ignore[no-any-return]

    kind = HttpTry(BASE, transport=httpx.MockTransport(service))
    try:
        healthy, said = asyncio.run(kind.probe("/health", 1.0))
    finally:
        kind.close()
    assert not healthy and detail in said


def test_a_probe_that_never_answers_is_failing_within_its_bound() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    kind = HttpTry(BASE, transport=httpx.MockTransport(hang))
    try:
        healthy, said = asyncio.run(kind.probe("/health", 0.2))
    finally:
        kind.close()
    assert not healthy and "no answer within 0.2 s" in said


# --- at most once an interval ---------------------------------------------------------------


class CountingProber:
    def __init__(self, healthy: bool = True) -> None:
        self.healthy = healthy
        self.asked: list[tuple[str, float]] = []

    async def probe(self, path: str, timeout: float) -> tuple[bool, str]:
        self.asked.append((path, timeout))
        return self.healthy, f"GET {path}: HTTP {200 if self.healthy else 503}"


def test_one_probe_an_interval_and_its_verdict_holds_for_it() -> None:
    now = [1000.0]
    prober = CountingProber()
    check = HealthCheck(prober, "/health", interval=10, timeout=3, clock=lambda: now[0])

    first = asyncio.run(check.ask(now[0], bound=30))
    assert first == Verdict(True, 1000.0, "GET /health: HTTP 200")
    assert prober.asked == [("/health", 3)]  # bounded by its timeout
    now[0] = 1009.0
    assert asyncio.run(check.ask(now[0], bound=30)) is first  # still fresh: not asked
    assert check.fresh(now[0]) is first
    now[0] = 1010.5
    assert check.fresh(now[0]) is None
    prober.healthy = False
    again = asyncio.run(check.ask(now[0], bound=1.5))
    assert again is not None and not again.healthy
    assert prober.asked[-1] == ("/health", 1.5)  # bounded by what the attempt has left
    assert len(prober.asked) == 2


def test_no_probe_without_time_for_one_nor_while_one_was_just_asked() -> None:
    now = [1000.0]
    prober = CountingProber()
    check = HealthCheck(prober, "/health", interval=10, clock=lambda: now[0])
    assert asyncio.run(check.ask(now[0], bound=0.1)) is None
    assert prober.asked == []

    class Slow(CountingProber):
        async def probe(self, path: str, timeout: float) -> tuple[bool, str]:
            now[0] += 11  # answers only after an interval: its verdict is stale at once
            return await super().probe(path, timeout)

    slow = Slow()
    check = HealthCheck(slow, "/health", interval=10, clock=lambda: now[0])
    asyncio.run(check.ask(now[0], bound=30))
    assert asyncio.run(check.ask(now[0] - 5, bound=30)) is not None  # fresh for its own time
    assert asyncio.run(check.ask(now[0] + 20, bound=30)) is not None
    assert len(slow.asked) == 2  # asked again only once the interval since the last ask ran


# --- what the verdict decides -------------------------------------------------------------


def one_an_interval(probes: list[datetime]) -> bool:
    return all(b - a >= timedelta(seconds=10) for a, b in itertools.pairwise(probes))


def probed(
    r: Remote, health: Callable[[], int] = lambda: 200, **policy: Any
) -> tuple[AttemptRunner[HttpTry], list[datetime]]:
    """A client on ``r`` whose agent declares ``health="/health"``, answered by
    ``health()``; the times the probe was asked."""
    probes: list[datetime] = []

    def service(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            assert request.url.path == "/api/health"
            probes.append(r.clock())
            return httpx.Response(health())
        return r(request)

    client, clock = make_client(r, rng=MaxRng(), transport=httpx.MockTransport(service), **policy)
    client.check = HealthCheck(
        client.kind, "/health", interval=10, timeout=3, clock=lambda: clock().timestamp()
    )
    return client, probes


def test_a_lone_failing_order_is_its_own_failure_when_the_probe_says_healthy() -> None:
    clock = FakeClock()
    client, probes = probed(remote(clock, status(503)))

    outcome = asyncio.run(client.call(request_for("a", clock)))

    assert (outcome.kind, outcome.applied) == ("transient", "no")
    assert probes[0] == R0 and one_an_interval(probes)  # from its first failure on
    assert outcome.evidence_at == probes[-1]  # the verdict is the evidence, by its time
    assert "its health probe: GET /health: HTTP 200" in outcome.error


def test_a_lone_failing_order_rides_it_out_when_the_probe_says_failing() -> None:
    clock = FakeClock()
    client, probes = probed(remote(clock, status(503)), health=lambda: 503)

    outcome = asyncio.run(client.call(request_for("a", clock)))

    assert outcome.kind == "deferred" and outcome.evidence_at is None
    assert "its health probe: GET /health: HTTP 503" in outcome.error
    assert probes and one_an_interval(probes)


def test_the_probes_failing_verdict_outweighs_an_orders_old_flag() -> None:
    clock = FakeClock()
    client, _ = probed(remote(clock, ok(), **{"a:process": [status(503)]}), health=lambda: 503)
    assert asyncio.run(client.call(request_for("warm", clock))).kind == "succeeded"

    outcome = asyncio.run(client.call(request_for("a", clock, singled_out=True)))

    assert outcome.kind == "deferred"  # an outage, whatever a flag said before


def test_another_order_served_meanwhile_settles_it_and_the_probe_is_not_asked() -> None:
    clock = FakeClock()
    client, probes = probed(remote(clock, ok(), **{"a:process": [status(500)]}))
    others: list[str] = []

    async def meanwhile() -> None:
        if not others:
            others.append((await client.call(request_for("b", clock))).kind)

    # b is served during a's first backoff, before a's first failure is looked at again
    client.health("process")  # the endpoint exists before the first try
    clock.on_sleep.append(meanwhile)
    r_first = asyncio.run(client.call(request_for("a", clock)))

    assert others == ["succeeded"]
    assert r_first.kind == "transient"
    assert r_first.evidence_at is not None and r_first.evidence_at > T0  # b's answer
    assert len(probes) <= 1  # asked at a's first failure at most, never after b answered


def test_four_orders_failing_alone_each_count_once_the_probe_says_healthy() -> None:
    """Four orders whose remote answers 503 forever, nothing else left. While the probe
    says failing too, it is an outage: they open the breaker (three orders failing with
    no success between) and wait. Once it says healthy, the breaker closes: they are
    called, and counted, each its own failure."""
    clock = FakeClock()
    healthy = [False]
    client, probes = probed(
        remote(clock, status(503)),
        health=lambda: 200 if healthy[0] else 503,
        backoff_initial_seconds=1.0,
    )
    keys = ("a", "b", "c", "d")

    def round_(singled_out: bool = False) -> list[str]:
        return [
            asyncio.run(client.call(request_for(k, clock, 1, singled_out=singled_out))).kind
            for k in keys
        ]

    assert round_() == ["deferred"] * 4
    assert client.health("process").is_open
    healthy[0] = True
    clock.advance(10)  # the next probe is due
    rounds = [round_()]
    clock.advance(5)
    rounds.append(round_(singled_out=True))  # what the scheduler sends them now

    assert rounds == [["transient"] * 4] * 2, rounds
    assert not client.health("process").is_open
    assert probes and one_an_interval(probes)  # not one per order, nor per attempt


def test_without_the_probe_the_four_wait_as_in_an_outage() -> None:
    clock = FakeClock()
    client, _ = make_client(remote(clock, status(503)), rng=MaxRng(), backoff_initial_seconds=1.0)

    kinds = [asyncio.run(client.call(request_for(k, clock, 1))).kind for k in "abcd"]

    assert kinds == ["deferred"] * 4
    assert client.health("process").is_open


def test_an_open_breaker_stays_open_when_the_probe_says_failing() -> None:
    clock = FakeClock()
    client, probes = probed(
        remote(clock, status(503)), health=lambda: 503, backoff_initial_seconds=1.0
    )
    kinds = [asyncio.run(client.call(request_for(k, clock, 1))).kind for k in "abcd"]

    assert kinds == ["deferred"] * 4
    assert client.health("process").is_open
    assert probes and one_an_interval(probes)


# --- orders through the runner, on the pure model -----------------------------------------

POLICY = RetryPolicy()  # MAX_FAILURE_COUNT 5, a 30-minute deferral window


def drive(
    order: Order, client: AttemptRunner[HttpTry], clock: FakeClock, until: datetime
) -> list[str]:
    """The scheduler and the supervisor for one order, its requests answered by an agent
    on ``client`` (the replies through the wire), until it ends or ``until``."""
    transport = RecordingTransport()
    agent = AgentWorker(client, transport, clock, sleep=clock.sleep)
    outcomes: list[str] = []
    while not order.status.terminal and clock() < until:
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
        asyncio.run(agent.handle(request))
        answer = decode_reply(transport.replies[-1][0].encode())
        order.apply_reply(answer, clock(), POLICY)
        outcomes.append(str(answer.outcome))
    return outcomes


def test_a_lone_order_failing_while_its_probe_says_healthy_ends_error_within_its_budget() -> None:
    clock = FakeClock(T0)
    client, probes = probed(remote(clock, status(503)))
    order = new_order()

    outcomes = drive(order, client, clock, T0 + timedelta(hours=1))

    step = order.steps[0]
    assert order.status is OrderStatus.ERROR, outcomes
    assert outcomes == [Outcome.TRANSIENT] * POLICY.max_failure_count
    assert step.failure_count == POLICY.max_failure_count
    [alert] = alerts(order)
    assert "not applied" in alert["reason"] and "safe to resubmit" in alert["reason"]
    assert probes and one_an_interval(probes)


def test_a_lone_order_rides_out_an_outage_its_probe_says_is_one() -> None:
    clock = FakeClock(T0)
    back = T0 + timedelta(minutes=10)
    service = remote(clock, lambda request: ok() if clock() >= back else status(503))
    client, probes = probed(service, health=lambda: 200 if clock() >= back else 503)
    order = new_order()

    outcomes = drive(order, client, clock, back + timedelta(minutes=5))

    assert order.status is OrderStatus.COMPLETED, outcomes
    assert set(outcomes[:-1]) == {Outcome.DEFERRED}
    assert order.steps[0].failure_count == 0 and alerts(order) == []
    assert probes and one_an_interval(probes)  # it asked, and was told: an outage


def test_a_probe_that_breaks_is_a_failing_verdict_and_frees_the_next_one() -> None:
    class Broken:
        async def probe(self, path: str, timeout: float) -> tuple[bool, str]:
            raise RuntimeError("no socket for you")

    now = [1000.0]
    check = HealthCheck(Broken(), "/health", interval=10, clock=lambda: now[0])

    verdict = asyncio.run(check.ask(now[0], bound=5))

    assert verdict is not None and not verdict.healthy
    assert "RuntimeError: no socket for you" in verdict.detail
    now[0] += 10
    assert asyncio.run(check.ask(now[0], bound=5)) is not None  # asked again: not stuck


def test_a_healthy_verdict_is_fresh_evidence_for_an_order_blamed_on_its_flag() -> None:
    clock = FakeClock()
    client, probes = probed(remote(clock, ok(), **{"a:process": [status(503)]}))
    assert asyncio.run(client.call(request_for("warm", clock))).kind == "succeeded"
    clock.advance(600)  # nobody served for ten minutes

    outcome = asyncio.run(client.call(request_for("a", clock, singled_out=True)))

    assert outcome.kind == "transient"
    assert outcome.evidence_at is not None and outcome.evidence_at == probes[-1]


def test_a_healthy_verdict_from_before_an_orders_first_failure_blames_nobody() -> None:
    """An outage begins just after the probe said healthy (for another order): an order
    whose calls fail from then on is not blamed on that verdict (it speaks of before), and
    the next probe, once due, says it is an outage."""
    clock = FakeClock()
    down = [False]
    client, _ = probed(remote(clock, status(503)), health=lambda: 503 if down[0] else 200)
    # x fails on its own (the only one calling): the probe is asked, and says healthy
    assert asyncio.run(client.call(request_for("x", clock, 1))).kind == "transient"
    down[0] = True
    clock.advance(5)

    early = asyncio.run(client.call(request_for("y", clock, 1)))
    clock.advance(10)
    later = asyncio.run(client.call(request_for("y", clock, 1)))

    assert (early.kind, later.kind) == ("deferred", "deferred")
    assert "its health probe: GET /health: HTTP 503" in later.error
