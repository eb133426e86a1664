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


class HeldReplies(RecordingTransport):
    """A reply hand-over that blocks until ``gate`` opens (a storage write that hangs):
    ``holding`` counts the threads it holds."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.holding = 0
        self._lock = threading.Lock()

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        with self._lock:
            self.holding += 1
        self.gate.wait(60)  # a backstop: the test opens it
        with self._lock:
            self.holding -= 1
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
    """Agent ``slow`` hands its replies over, and they hang, with both of its threads held;
    agent ``quick``, on the same loop, is served by threads of its own meanwhile."""
    slow_transport, quick_transport = HeldReplies(), RecordingTransport()

    async def scenario() -> tuple[Outcome | None, tuple[int, int], int]:
        slow_threads, quick_threads = OwnThreads("slow", size=2), OwnThreads("quick")
        slow = quick_worker(slow_transport, slow_threads)
        quick = quick_worker(quick_transport, quick_threads)
        busy = [
            asyncio.create_task(slow.handle(make_request(30, order_id=f"s-{n}"))) for n in range(8)
        ]
        while slow_transport.holding < 2:  # both of slow's threads are held, six queued
            await asyncio.sleep(0.01)
        try:  # served at once; waiting for a thread of slow's would wait for the gate
            outcome = await asyncio.wait_for(quick.handle(make_request(30, order_id="q-1")), 30)
        except TimeoutError:
            outcome = None
        # what slow's threads were doing when quick's reply was handed over
        meanwhile = slow_transport.holding, len(slow_transport.replies)
        slow_transport.gate.set()
        done = await asyncio.wait_for(asyncio.gather(*busy), 60)
        for threads in (slow_threads, quick_threads):
            threads.close()
        return outcome, meanwhile, len(done)

    outcome, meanwhile, done = asyncio.run(scenario())
    assert outcome is Outcome.SUCCEEDED and len(quick_transport.replies) == 1, (
        "the quick agent was not served while the slow one's threads were held"
    )
    assert meanwhile == (2, 0), (
        "the quick agent was served only after the slow one's threads let go "
        f"(held, handed over then: {meanwhile})"
    )
    assert done == 8 and len(slow_transport.replies) == 8


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

    async def scenario() -> tuple[bool, object]:
        held = await slots.take(0)
        assert held is not None
        # an hour's wait: only the slot given back can end it within the test
        second = asyncio.create_task(slots.take(3600))
        await asyncio.sleep(0.05)
        waiting = not second.done()
        threading.Thread(target=held.release).start()  # a Python handler returning
        got = await asyncio.wait_for(second, 30)
        if got is not None:
            got.release()
        return waiting, got

    waiting, got = asyncio.run(scenario())
    assert waiting, "the second attempt got a slot while the only one was held"
    assert got is not None
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
