"""The agents are async (agents/triggers.py): a slow remote holds a coroutine, not a thread,
and an agent's blocking work runs on threads of its own (agents/threads.py), so a slow
agent cannot take the threads another agent or function needs.

Everything here runs on one event loop, as the Python runtime runs every async function
of an instance; the waits that are real are bounded well under a few seconds."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import httpx
import pytest

from agents.agent import AgentWorker
from agents.limits import CallSlots
from agents.pacing import RemotePolicy
from agents.remote import HttpTry
from agents.runner import AttemptRunner
from agents.threads import OwnThreads
from core.errors import StorageUnavailable
from core.messages import AgentReply
from core.outcome import Outcome
from tests.unit.test_remote_client import T0, RecordingTransport, make_request

CALLS = 40  # more than Python's default pool (min(32, CPUs + 4)) and the host's 16 + 8


def slow_runner(release: asyncio.Event, entered: list[str]) -> AttemptRunner[HttpTry]:
    """An HTTP agent whose remote answers only once ``release`` is set."""

    async def remote(request: httpx.Request) -> httpx.Response:
        entered.append(request.headers["Idempotency-Key"])
        await release.wait()
        return httpx.Response(200, json={"ok": True})

    return AttemptRunner(
        HttpTry("http://slow.test", transport=httpx.MockTransport(remote)),
        RemotePolicy(min_try_seconds=0.0),
        concurrency=CALLS,
    )


def test_calls_waiting_on_a_slow_remote_hold_no_thread() -> None:
    async def scenario() -> tuple[int, int, list[str]]:
        release, entered = asyncio.Event(), list[str]()
        runner = slow_runner(release, entered)
        before = threading.active_count()
        calls = [
            asyncio.create_task(runner.call(make_request(30, order_id=f"o-{n}")))
            for n in range(CALLS)
        ]
        while len(entered) < CALLS:  # every call is at the remote, waiting for its answer
            await asyncio.sleep(0.01)
        waiting = threading.active_count() - before
        release.set()
        outcomes = await asyncio.wait_for(asyncio.gather(*calls), 10)
        runner.close()
        return waiting, len(outcomes), [o.kind for o in outcomes]

    waiting, count, kinds = asyncio.run(scenario())
    assert count == CALLS and set(kinds) == {"succeeded"}
    assert waiting <= 2, f"{CALLS} calls in flight took {waiting} threads"


class SlowReplies(RecordingTransport):
    """A reply hand-over that blocks (a storage write that takes its time)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        time.sleep(self.seconds)
        return super().send_reply(reply, reply_to)


def quick_worker(transport: RecordingTransport, threads: OwnThreads) -> AgentWorker:
    runner = AttemptRunner(
        HttpTry(
            "http://quick.test",
            transport=httpx.MockTransport(lambda r: httpx.Response(200, json={})),
        ),
        RemotePolicy(min_try_seconds=0.0),
        clock=lambda: T0,
    )
    return AgentWorker(runner, transport, lambda: T0, threads=threads)


def test_one_agents_blocking_work_never_waits_for_another_agents_threads() -> None:
    """Agent ``slow`` hands its replies over slowly, with all of its threads busy; agent
    ``quick``, on the same loop, is served at once by threads of its own."""

    async def scenario() -> tuple[float, int]:
        slow_threads, quick_threads = OwnThreads("slow", size=2), OwnThreads("quick")
        slow = quick_worker(SlowReplies(0.5), slow_threads)
        quick_transport = RecordingTransport()
        quick = quick_worker(quick_transport, quick_threads)
        busy = [
            asyncio.create_task(slow.handle(make_request(30, order_id=f"s-{n}"))) for n in range(8)
        ]
        await asyncio.sleep(0.05)  # both of slow's threads are taken, six replies queued
        started = time.monotonic()
        outcome = await quick.handle(make_request(30, order_id="q-1"))
        took = time.monotonic() - started
        assert outcome is Outcome.SUCCEEDED
        done = await asyncio.wait_for(asyncio.gather(*busy), 10)
        for threads in (slow_threads, quick_threads):
            threads.close()
        return took, len(done)

    took, done = asyncio.run(scenario())
    assert done == 8
    assert took < 0.4, f"the quick agent waited {took:.2f} s for the slow one's threads"


def test_a_handler_of_a_python_agent_runs_on_a_thread_of_its_own() -> None:
    from agents.python import PythonTry

    seen: list[str] = []

    def handler(order: dict[str, Any], **_: Any) -> dict[str, Any]:
        seen.append(threading.current_thread().name)
        return {}

    runner = AttemptRunner(PythonTry(handler, name="stock"), RemotePolicy(min_try_seconds=0.0))

    async def scenario() -> str:
        outcome = await runner.call(make_request(30))
        assert outcome.kind == "succeeded"
        return threading.current_thread().name

    loop_thread = asyncio.run(scenario())
    assert seen and seen[0].startswith("handler-stock-") and seen[0] != loop_thread


# --- the agent's threads ---------------------------------------------------------------------


def test_work_runs_with_the_callers_context_and_within_its_bound() -> None:
    field: contextvars.ContextVar[str] = contextvars.ContextVar("field", default="")
    threads = OwnThreads("orders")

    async def scenario() -> tuple[str, str]:
        field.set("o-1")
        name = await threads.run(field.get, bound=5, what="read")
        thread = await threads.run(lambda: threading.current_thread().name, bound=5, what="whoami")
        with pytest.raises(StorageUnavailable, match=r"the reply's hand-over of agent orders"):
            await threads.run(lambda: time.sleep(1), bound=0.1, what="the reply's hand-over")
        return name, thread

    try:
        name, thread = asyncio.run(scenario())
    finally:
        threads.close()
    assert name == "o-1"  # the order's log fields travel with the work
    assert thread.startswith("agent-orders")


# --- slots on an event loop ------------------------------------------------------------------


def test_a_slot_given_back_on_another_thread_wakes_the_attempt_waiting_on_the_loop() -> None:
    slots = CallSlots(1)

    async def scenario() -> float:
        held = await slots.take(0)
        assert held is not None
        threading.Timer(0.1, held.release).start()  # a Python handler returning
        started = time.monotonic()
        second = await slots.take(5)
        assert second is not None
        second.release()
        return time.monotonic() - started

    waited = asyncio.run(scenario())
    assert 0.05 < waited < 1.0
    assert slots.in_use == 0


def test_no_slot_in_time_is_none_and_a_larger_limit_wakes_the_waiters() -> None:
    slots = CallSlots(1)

    async def scenario() -> tuple[object, object]:
        held = await slots.take(0)
        assert held is not None
        missed = await slots.take(0.05)
        waiting = asyncio.create_task(slots.take(5))
        await asyncio.sleep(0.05)
        slots.resize(2)  # an operator raised the limit: the waiting attempt goes
        got = await asyncio.wait_for(waiting, 1)
        assert got is not None
        got.release()
        held.release()
        return missed, got

    missed, got = asyncio.run(scenario())
    assert missed is None and got is not None
    assert slots.in_use == 0
