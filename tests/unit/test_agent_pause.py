"""Agents paused and limited at runtime (docs/contracts.md §3.7), decided on the in-memory
store and a fake clock: the scheduler holds a paused agent's due steps (no claim, no
attempt, nothing counted, no alert, however long), an agent defers a request queued
before the pause without calling its remote (the deferral path, marked ``paused``), a
call already running finishes, and after the resume the held steps go on, but only once
every instance has read the resume. Limits: concurrency and call rate at runtime.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import pytest

from agents.agent import AgentWorker
from agents.outcomes import Try
from agents.pacing import RemotePolicy
from agents.runner import AttemptRunner
from bootstrap import AppContext, bootstrap
from core import control_cache
from core.control_cache import HOLD_MAX, HOLD_MIN, SETTLE
from core.history import Happened
from core.messages import AgentRequest
from core.model import Order
from core.names import Names
from core.outcome import Applied, Outcome
from core.states import OrderStatus, StepState
from core.workflows import AGENTS
from messaging.wire import decode_reply
from scheduler.service import SWEEP_GRACE, Handled
from stores.memory import InMemoryStateStore
from supervisor.service import SKEW_GRACE
from tests.support import settings_from
from tests.unit.test_remote_client import T0, FakeClock, MaxRng
from tests.unit.test_runner import ScriptedKind
from tests.unit.test_services_in_memory import RecordingKeeper, RecordingQueues, RecordingTransport

TIMEOUT = 30
OK = Try(Applied.YES, False, result={"ok": True})
DOWN = Try(Applied.NO, True, "process: HTTP 503 busy", status=503)


@dataclass
class App:
    ctx: AppContext
    store: InMemoryStateStore
    clock: FakeClock
    queues: RecordingQueues
    transport: RecordingTransport

    def submit(self, order_id: str, **extra: Any) -> Handled:
        body = {"orderId": order_id, **extra}
        return self.ctx.scheduler.submit(json.dumps(body).encode())

    def order(self, order_id: str) -> Order:
        order = self.store.load(order_id)
        assert order is not None
        return order

    def alerts(self) -> list[dict[str, Any]]:
        return self.queues.on(self.ctx.names.operator_alerts)

    def agent(
        self, script: list[Try], *, concurrency: int = 32
    ) -> tuple[AgentWorker, ScriptedKind]:
        """The ``orders`` agent over a scripted remote, reading this app's controls."""
        kind = ScriptedKind(script, self.clock)
        spec = AGENTS["orders"]
        runner = AttemptRunner(
            kind,
            RemotePolicy(),
            clock=self.clock,
            sleep=self.clock.asleep,
            rng=MaxRng(),
            concurrency=concurrency,
            runtime=lambda: self.ctx.agent_controls.runtime(spec),
        )
        return AgentWorker(runner, self.transport, self.clock, sleep=self.clock.sleep), kind

    def deliver(self, worker: AgentWorker, request: AgentRequest) -> None:
        """The agent handles a request; its reply is applied (as in process)."""
        before = len(self.transport.replies)
        asyncio.run(worker.handle(request))
        for reply in self.transport.replies[before:]:
            self.ctx.scheduler.apply_reply(reply)

    def pause(self, agent: str = "orders", reason: str = "remote maintenance") -> None:
        self.ctx.agents_admin.pause(agent, "alice", reason)

    def resume(self, agent: str = "orders") -> None:
        self.ctx.agents_admin.resume(agent, "bob", "maintenance over")

    def later(self, seconds: float) -> None:
        """Time passes: the instance's view of the controls goes stale, timers run."""
        self.clock.advance(seconds)
        self.ctx.supervisor.run()
        self.ctx.scheduler.sweep()


def build(*, window: int = 1800) -> App:
    store, clock = InMemoryStateStore(), FakeClock(T0)
    queues, transport = RecordingQueues(), RecordingTransport()
    settings = settings_from(
        {
            "AzureWebJobsStorage": "UseDevelopmentStorage=true",  # never reached
            "AGENT_TRANSPORT": "storage",
            "STEP_TIMEOUT_SECONDS": str(TIMEOUT),
            "MAX_FAILURE_COUNT": "3",
            "DEFERRAL_WINDOW_SECONDS": str(window),
        }
    )
    ctx = bootstrap(
        replace(settings, instance_id="i-1"),
        names=Names(),
        clock=clock,
        store=store,
        queues=queues,
        transport=transport,
        kept=RecordingKeeper(),
    )
    return App(ctx, store, clock, queues, transport)


@pytest.fixture
def app() -> App:
    return build()


# --- the scheduler holds a paused agent's steps ---------------------------------------------


def test_an_order_for_a_paused_agent_waits_pending_with_nothing_counted_however_long(
    app: App,
) -> None:
    app.pause()
    assert app.submit("o-1") is Handled.ACCEPTED

    order = app.order("o-1")
    [step] = order.steps
    assert order.status is OrderStatus.PENDING
    assert (step.process_state, step.attempt, step.failure_count) == (StepState.PENDING, 0, 0)
    assert step.paused_for == "orders" and step.locked_by == ""
    assert app.transport.requests == []  # nothing claimed, nothing sent
    assert [h["event"] for h in step.history][-1] == Happened.AGENT_PAUSED

    for _ in range(200):  # a day and more of sweeps and supervisions
        app.later(600)
    step = app.order("o-1").steps[0]
    assert (step.process_state, step.attempt, step.failure_count) == (StepState.PENDING, 0, 0)
    assert (step.deferrals, step.deferred_since) == (0, None)
    assert app.transport.requests == [] and app.alerts() == []
    assert app.order("o-1").status is OrderStatus.PENDING
    # one history entry for the pause, not one per look
    assert [h["event"] for h in step.history].count(Happened.AGENT_PAUSED) == 1


def test_a_held_step_is_looked_at_again_less_and_less_often() -> None:
    assert control_cache.hold_until(T0, None) == T0 + HOLD_MIN
    assert control_cache.hold_until(T0 + timedelta(minutes=3), T0) == T0 + timedelta(minutes=6)
    assert (
        control_cache.hold_until(T0 + timedelta(hours=5), T0) == T0 + timedelta(hours=5) + HOLD_MAX
    )


def test_a_sweep_looks_at_a_held_step_only_when_it_is_due(app: App) -> None:
    app.pause()
    app.submit("o-1")
    held = app.order("o-1")
    due = held.steps[0].complete_by
    assert due == T0 + HOLD_MIN
    app.later((due - T0).total_seconds())  # due, but within the sweep's grace
    assert app.order("o-1").version == held.version
    app.later(SWEEP_GRACE.total_seconds())
    again = app.order("o-1").steps[0]
    assert again.complete_by > due and again.paused_for == "orders"
    assert app.ctx.scheduler.sweep().held == 0  # not due again yet


def test_a_retry_of_a_paused_agent_is_held_not_claimed(app: App) -> None:
    app.submit("o-1")  # claimed while running
    [request] = app.transport.requests
    app.pause()
    app.clock.advance(TIMEOUT + SKEW_GRACE.total_seconds() + 1)  # no reply: it expires
    app.ctx.supervisor.run()
    expired = app.order("o-1").steps[0]
    assert expired.process_state is StepState.PENDING and expired.failure_count == 1
    app.clock.advance(control_cache.PERIOD.total_seconds())
    assert app.ctx.scheduler.dispatch("o-1") is Handled.HELD
    step = app.order("o-1").steps[0]
    assert step.attempt == request.attempt and step.paused_for == "orders"
    assert len(app.transport.requests) == 1


# --- a request queued before the pause ------------------------------------------------------


def test_a_request_queued_before_the_pause_is_deferred_back_without_a_call(app: App) -> None:
    app = build(window=3)  # a deferral window far shorter than the pause
    worker, remote = app.agent([OK])
    app.submit("o-1")
    [request] = app.transport.requests  # claimed and queued: then the pause lands
    app.pause()
    app.clock.advance(1)

    app.deliver(worker, request)

    assert remote.calls == []  # the remote was not called
    [reply] = app.transport.replies
    assert reply.outcome == "deferred" and reply.paused and reply.applied == "no"
    assert "agent orders is paused (by alice" in (reply.error or "")
    assert json.loads(reply.encode())["paused"] is True
    assert decode_reply(reply.encode()) == reply  # through the reply queue as well
    step = app.order("o-1").steps[0]
    attempt = step.attempts.get(1)
    assert attempt is not None and attempt.ending is Outcome.DEFERRED and not attempt.counted
    assert (step.process_state, step.failure_count, step.deferrals) == (StepState.PENDING, 0, 0)
    assert step.paused_for == "orders" and step.complete_by >= app.clock.now + HOLD_MIN

    for _ in range(30):  # far past the 3 s deferral window: still waiting, no alert
        app.later(120)
    step = app.order("o-1").steps[0]
    assert (step.process_state, step.failure_count, step.attempt) == (StepState.PENDING, 0, 1)
    assert app.alerts() == [] and len(app.transport.requests) == 1 and remote.calls == []

    app.resume()
    app.later(SETTLE.total_seconds() + control_cache.PERIOD.total_seconds())
    [_, again] = app.transport.requests
    assert again.attempt == 2
    app.deliver(worker, again)
    assert app.order("o-1").status is OrderStatus.COMPLETED and len(remote.calls) == 1


def test_a_call_already_running_when_the_pause_lands_finishes(app: App) -> None:
    worker, remote = app.agent([OK, OK])
    app.submit("o-1")
    app.submit("o-2")
    first, second = app.transport.requests

    async def pause_meanwhile(request: AgentRequest, timeout: float, slot: Any) -> Try:
        app.pause()  # lands while the call runs
        return await ScriptedKind.run(remote, request, timeout, slot)

    remote.run = pause_meanwhile  # type: ignore[method-assign]
    app.deliver(worker, first)
    assert app.order("o-1").status is OrderStatus.COMPLETED
    remote.run = lambda r, t, s: ScriptedKind.run(remote, r, t, s)  # type: ignore[method-assign,assignment]
    app.clock.advance(control_cache.PERIOD.total_seconds())  # every instance knows now
    app.deliver(worker, second)
    assert len(remote.calls) == 1
    assert app.transport.replies[-1].paused


# --- after the resume -----------------------------------------------------------------------


def test_after_the_resume_held_steps_go_once_every_instance_has_read_it(app: App) -> None:
    app.pause()
    for n in range(3):
        app.submit(f"o-{n}")
    app.later(3600)
    app.resume()
    assert app.ctx.scheduler.dispatch("o-0") is Handled.NOT_DUE  # the resume is too fresh
    report = app.ctx.scheduler.sweep()
    assert report.released == 0 and app.transport.requests == []

    app.clock.advance(SETTLE.total_seconds())
    report = app.ctx.scheduler.sweep()
    assert report.released == 3
    assert sorted(r.order_id for r in app.transport.requests) == ["o-0", "o-1", "o-2"]
    for n in range(3):
        step = app.order(f"o-{n}").steps[0]
        assert step.process_state is StepState.PROCESSING and step.attempt == 1
        assert step.paused_for == "" and step.failure_count == 0
        assert Happened.PAUSE_OVER in [h["event"] for h in step.history]
    assert app.ctx.scheduler.sweep().released == 0  # each goes once


def test_without_a_resume_a_held_step_is_never_claimed_early(app: App) -> None:
    app.pause()
    app.submit("o-1")
    app.clock.advance(SETTLE.total_seconds() + 1)
    assert app.ctx.scheduler.dispatch("o-1") is Handled.NOT_DUE
    assert app.transport.requests == []


def test_a_pause_spends_none_of_a_deferral_streaks_window(app: App) -> None:
    app = build(window=600)
    worker, _ = app.agent([DOWN] * 200)
    app.submit("o-1")
    app.deliver(worker, app.transport.requests[-1])  # a lone order, remote down: deferred
    step = app.order("o-1").steps[0]
    since = step.deferred_since
    assert step.deferrals == 1 and since is not None
    app.clock.advance(300)  # five minutes of the ten-minute window spent
    app.pause()
    app.later(control_cache.PERIOD.total_seconds())
    held = app.order("o-1").steps[0]
    assert held.paused_for == "orders" and held.paused_since is not None
    app.later(3 * 3600)  # a three-hour pause
    app.resume()
    app.later(SETTLE.total_seconds() + 1)
    step = app.order("o-1").steps[0]
    assert step.process_state is StepState.PROCESSING
    waited = app.clock.now - held.paused_since
    assert step.deferred_since == since + waited  # the pause is not in the streak
    app.deliver(worker, app.transport.requests[-1])
    step = app.order("o-1").steps[0]
    assert step.process_state is StepState.PENDING and step.deferrals == 2
    assert app.order("o-1").status is not OrderStatus.ERROR and app.alerts() == []


def test_an_order_waiting_for_a_pause_can_be_cancelled(app: App) -> None:
    app.pause()
    app.submit("o-1")
    app.ctx.admin.cancel("o-1", "carol", "not needed")
    assert app.order("o-1").status is OrderStatus.CANCELLED
    assert app.transport.requests == []


def test_the_order_view_says_which_paused_agent_it_waits_for(app: App) -> None:
    app.submit("o-run")
    app.pause()
    app.submit("o-held")
    view = app.ctx.admin.show("o-held")
    assert view["paused"] == {
        "agent": "orders",
        "step": "process",
        "held": True,
        "since": "2030-01-01T12:00:00.000Z",
        "by": "alice",
        "reason": "remote maintenance",
    }
    [step] = view["steps"]
    assert step["pausedFor"] == "orders" and step["pausedSince"] == "2030-01-01T12:00:00.000Z"
    running = app.ctx.admin.show("o-run")  # its call runs on: the next attempt waits
    assert running["paused"]["held"] is False and running["steps"][0]["pausedFor"] is None
    listed = app.ctx.admin.page(OrderStatus.PENDING)["orders"]
    assert [(o["orderId"], o["pausedAgent"]) for o in listed] == [("o-held", "orders")]
    app.resume()
    assert app.ctx.admin.show("o-held")["paused"] is None


# --- limits at runtime ---------------------------------------------------------------------


def test_a_concurrency_set_at_runtime_limits_the_next_attempts(app: App) -> None:
    worker, remote = app.agent([OK] * 4, concurrency=32)
    runner = worker._remote
    app.ctx.agents_admin.limits("orders", "alice", "protect it", concurrency=1)
    app.submit("o-1")
    [request] = app.transport.requests
    held = None

    async def hold_a_slot(r: AgentRequest, timeout: float, slot: Any) -> Try:
        nonlocal held
        if held is None:  # another attempt starts while this one runs (0.1 s to wait)
            soon = app.clock.now + timedelta(seconds=1.6)
            held = await runner.call(replace(r, order_id="o-x", complete_by=soon))
        return await ScriptedKind.run(remote, r, timeout, slot)

    remote.run = hold_a_slot  # type: ignore[method-assign,assignment]
    outcome = asyncio.run(runner.call(request))
    assert outcome.kind == "succeeded"
    assert held is not None and held.kind == "deferred" and "all 1 call slots" in held.error
    assert runner.slots is not None and runner.slots.limit == 1 and runner.slots.in_use == 0

    app.ctx.agents_admin.limits("orders", "alice", "back", concurrency="declared")
    app.clock.advance(control_cache.PERIOD.total_seconds())
    remote.run = lambda r, t, s: ScriptedKind.run(remote, r, t, s)  # type: ignore[method-assign,assignment]
    assert asyncio.run(runner.call(request)).kind == "succeeded"
    assert runner.slots.limit == AGENTS["orders"].concurrency


def test_a_call_rate_set_at_runtime_spaces_the_calls(app: App) -> None:
    worker, remote = app.agent([OK] * 5)
    runner = worker._remote
    app.ctx.agents_admin.limits("orders", "alice", "their quota", rate=0.5)
    app.submit("o-1")
    [request] = app.transport.requests
    starts = []
    for _ in range(3):
        starts.append(app.clock.now)
        assert asyncio.run(runner.call(request)).kind == "succeeded"
    assert app.clock.sleeps == [2.0, 2.0]  # one call every 2 s
    assert runner.rate.rate == 0.5

    # too little time left for the next token: not called, deferred (not counted)
    short = replace(request, complete_by=app.clock.now + timedelta(seconds=2.5))
    outcome = asyncio.run(runner.call(short))
    assert outcome.kind == "deferred" and "call rate" in outcome.error
    assert len(remote.calls) == 3

    app.ctx.agents_admin.limits("orders", "alice", "no quota", rate="declared")
    app.clock.advance(control_cache.PERIOD.total_seconds())
    assert asyncio.run(runner.call(request)).kind == "succeeded" and runner.rate.rate is None
