"""The attempt runner over a kind of try it knows nothing about: admission, pacing and
classification are the runner's, whatever the try is (``agents.runner``). The HTTP and
the Python kinds are tested through it in test_remote_client.py and test_agent_kinds.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from agents.limits import Slot
from agents.outcomes import Try
from agents.pacing import Backoff, Budget, RemotePolicy
from agents.runner import AttemptRunner
from core.messages import AgentRequest
from core.outcome import Applied
from tests.unit.test_remote_client import T0, FakeClock, MaxRng, make_request


@dataclass
class ScriptedKind:
    """A kind of try that plays a script, one ``Try`` per call, and records each call."""

    script: list[Try]
    clock: FakeClock
    takes: float = 0.0  # seconds each try takes on the clock
    calls: list[tuple[float, Slot | None]] = field(default_factory=list)
    closed: bool = False

    def endpoint(self, path: str) -> str:
        return f"scripted:{path}"

    async def run(self, request: AgentRequest, timeout: float, slot: Slot | None) -> Try:
        self.calls.append((timeout, slot))
        self.clock.advance(min(self.takes, timeout))  # a try never outlasts its timeout
        return self.script.pop(0)

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeRun:
    """A call that runs on past its try."""

    outcome: Try | None = None
    runner: str = "host-1:1"

    def until(self) -> datetime:
        return T0 + timedelta(minutes=1)

    def ended(self) -> Try | None:
        return self.outcome

    def watch(self, heartbeat: Callable[[datetime], None], ended: Callable[[Try], None]) -> None:
        raise AssertionError("the runner never watches a run: the agent does")


def runner(
    script: list[Try], *, takes: float = 0.0, concurrency: int | None = None, **policy: float
) -> tuple[AttemptRunner[ScriptedKind], ScriptedKind, FakeClock, MaxRng]:
    clock, rng = FakeClock(), MaxRng()
    kind = ScriptedKind(script, clock, takes)
    return (
        AttemptRunner(
            kind,
            RemotePolicy(**policy),  # type: ignore[arg-type]
            clock=clock,
            sleep=clock.asleep,
            rng=rng,
            concurrency=concurrency,
        ),
        kind,
        clock,
        rng,
    )


MAYBE = Try(Applied.MAYBE, True, "no answer")
NOT_APPLIED = Try(Applied.NO, True, "503")


def test_failed_tries_are_paced_then_a_success_ends_the_attempt() -> None:
    client, _, clock, _ = runner([MAYBE, NOT_APPLIED, Try(Applied.YES, False, result={"ok": 1})])

    outcome = asyncio.run(client.call(make_request(30)))

    assert (outcome.kind, outcome.result, outcome.tries) == ("succeeded", {"ok": 1}, 3)
    assert clock.sleeps == [0.2, 0.4]  # equal jitter at its ceiling: 0.2 s, doubling


def test_a_refusal_ends_the_attempt_and_keeps_the_doubt_of_earlier_tries() -> None:
    client, kind, _, _ = runner([MAYBE, Try(Applied.NO, False, "HTTP 404", status=404)])

    outcome = asyncio.run(client.call(make_request(30)))

    assert (outcome.kind, outcome.applied, outcome.settled, outcome.tries) == (
        "refused",
        "maybe",
        False,
        2,
    )
    assert len(kind.calls) == 2


def test_every_try_fits_in_the_time_left_and_none_starts_too_late() -> None:
    # 30 s left: stop 5 s before (the margin), tries of at most 10 s, none under 1 s.
    client, kind, clock, _ = runner([NOT_APPLIED] * 10, takes=10.0, max_try_seconds=10.0)

    outcome = asyncio.run(client.call(make_request(30)))

    timeouts = [t for t, _ in kind.calls]
    assert timeouts == [10.0, 10.0, pytest.approx(4.4)]  # the last: what was left of 25 s
    assert clock.now <= T0 + timedelta(seconds=25)
    assert outcome.kind == "deferred"  # a lone order: nothing shows the endpoint serving others
    assert outcome.tries == len(kind.calls)


def test_a_retry_after_past_the_deadline_defers_until_then() -> None:
    client, kind, clock, _ = runner([Try(Applied.NO, True, "429", retry_after=60.0)])

    outcome = asyncio.run(client.call(make_request(30)))

    assert outcome.kind == "deferred" and outcome.not_before == T0 + timedelta(seconds=60)
    assert len(kind.calls) == 1 and clock.sleeps == []


def test_each_try_is_handed_the_attempts_slot_and_the_slot_is_given_back() -> None:
    client, kind, _, _ = runner([NOT_APPLIED, Try(Applied.YES, False, result={})], concurrency=1)

    asyncio.run(client.call(make_request(30)))

    slots = {id(slot) for _, slot in kind.calls}
    assert None not in {slot for _, slot in kind.calls} and len(slots) == 1
    assert client.slots is not None and client.slots.in_use == 0


def test_without_a_limit_no_slot_is_handed_over() -> None:
    client, kind, _, _ = runner([Try(Applied.YES, False, result={})])
    asyncio.run(client.call(make_request(30)))
    assert kind.calls[0][1] is None


def test_a_call_left_running_goes_with_the_report() -> None:
    run = FakeRun()
    # every later try joins the same run (as a Python handler's retry does)
    client, _, _, _ = runner(
        [Try(Applied.MAYBE, True, "still running", running=run)] * 3, takes=30.0
    )

    outcome = asyncio.run(client.call(make_request(30)))

    assert outcome.running is run and outcome.applied == "maybe"


def test_a_call_left_running_that_has_just_succeeded_is_the_report() -> None:
    run = FakeRun(Try(Applied.YES, False, result={"late": True}))
    client, _, _, _ = runner(
        [Try(Applied.MAYBE, True, "still running", running=run)] * 3, takes=30.0
    )

    outcome = asyncio.run(client.call(make_request(30)))

    assert (outcome.kind, outcome.result, outcome.running) == ("succeeded", {"late": True}, None)


def test_a_call_that_ended_within_a_later_try_leaves_nothing_running() -> None:
    client, _, _, _ = runner(
        [Try(Applied.MAYBE, True, "still running", running=FakeRun())] + [NOT_APPLIED] * 3,
        takes=10.0,
    )

    outcome = asyncio.run(client.call(make_request(30)))

    assert outcome.running is None


def test_an_order_that_cannot_be_sent_is_refused_before_any_try() -> None:
    client, kind, _, _ = runner([])
    outcome = asyncio.run(client.call(make_request(30, order={"x": float("nan")})))
    assert outcome.kind == "refused" and "cannot be sent as JSON" in outcome.error
    assert kind.calls == []


def test_closing_the_runner_closes_its_kind() -> None:
    client, kind, _, _ = runner([])
    client.close()
    assert kind.closed


@pytest.mark.parametrize(("left", "stop_after"), [(30, 25.0), (4, 3.2), (1, 0.5)])
def test_the_budget_stops_a_margin_before_the_deadline(left: float, stop_after: float) -> None:
    budget = Budget.of(make_request(left), RemotePolicy(), T0)
    assert budget.stop_at == T0 + timedelta(seconds=stop_after)


def test_retry_after_never_shortens_the_backoff() -> None:
    backoff = Backoff(RemotePolicy(backoff_initial_seconds=1.0), MaxRng())
    assert backoff.after(Try(Applied.NO, True, retry_after=0.0), 3) == 4.0
    assert backoff.after(Try(Applied.NO, True, retry_after=9.0), 3) == 9.0
