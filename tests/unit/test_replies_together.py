"""Replies for one order applied together (``scheduler/together.py``, ``Scheduler.
_apply_replies``): the lines of a ``ForEach`` that end together no longer each save the
order (and lose the race to each other), but go in one save per batch, each decided in
turn as if applied alone one after the other. Threads meet here only through events and
conditions: nothing sleeps, nothing is timed."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from agents.binding import RequestBinding
from core.item_names import MAX_ITEM_CONCURRENCY
from core.messages import AgentReply
from core.model import Order
from core.states import OrderStatus, StepState
from scheduler.service import REPLIES_TOGETHER, Handled
from scheduler.together import Together
from tests.fixtures.wide_items import WIDTH
from tests.support import FakeClock
from tests.unit.test_crowded_replies import Wide, reply_to, submit, wide  # noqa: F401

WAIT = 30.0  # seconds a thread may take to come: a bound, never a pace


def processed(order: Order | None, *replies: AgentReply) -> bool:
    """Whether each reply's step is Processed in ``order``."""
    steps = [order.find(r.step) if order is not None else None for r in replies]
    return all(s is not None and s.process_state is StepState.PROCESSED for s in steps)


# --- Together ---------------------------------------------------------------------------


def test_a_caller_alone_is_its_own_batch() -> None:
    together: Together[int, str] = Together(8)
    batches: list[list[int]] = []

    def batch(items: list[int]) -> list[str]:
        batches.append(items)
        return [f"r{i}" for i in items]

    assert together.run("o", 1, batch) == "r1"
    assert together.run("o", 2, batch) == "r2"
    assert batches == [[1], [2]]


def held_first(together: Together[int, str], waiting: int) -> tuple[Any, list[list[int]]]:
    """A batch function whose first batch is held until ``waiting`` callers wait."""
    batches: list[list[int]] = []
    started = threading.Event()

    def batch(items: list[int]) -> list[str]:
        batches.append(sorted(items))
        if len(batches) == 1:
            started.set()
            assert together.await_waiting("o", waiting, WAIT)
        if -1 in items:
            raise RuntimeError("this batch failed")
        return [f"r{i}" for i in items]

    return (batch, started), batches


def run_all(
    together: Together[int, str],
    batch: Callable[[list[int]], Any],
    started: threading.Event,
    later: list[int],
) -> dict[int, Any]:
    results: dict[int, Any] = {}

    def call(i: int) -> None:
        try:
            results[i] = together.run("o", i, batch)
        except Exception as exc:
            results[i] = exc

    first = threading.Thread(target=call, args=(0,))
    first.start()
    assert started.wait(WAIT)  # the first leads, and holds its batch open
    others = [threading.Thread(target=call, args=(i,)) for i in later]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(WAIT)
    return results


def test_callers_that_come_while_a_batch_runs_go_together_in_the_next() -> None:
    together: Together[int, str] = Together(8)
    (batch, started), batches = held_first(together, 5)

    results = run_all(together, batch, started, [1, 2, 3, 4, 5])

    assert batches == [[0], [1, 2, 3, 4, 5]]
    assert results == {i: f"r{i}" for i in range(6)}  # each its own result


def test_a_batch_takes_at_most_its_bound_and_the_next_leads_the_rest() -> None:
    together: Together[int, str] = Together(2)
    (batch, started), batches = held_first(together, 5)

    results = run_all(together, batch, started, [1, 2, 3, 4, 5])

    assert [len(b) for b in batches] == [1, 2, 2, 1]
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4, 5]
    assert results == {i: f"r{i}" for i in range(6)}


def test_a_batch_that_fails_fails_its_own_callers_only() -> None:
    together: Together[int, str] = Together(8)
    (batch, started), batches = held_first(together, 2)

    results = run_all(together, batch, started, [-1, 7])

    assert batches == [[0], [-1, 7]]
    assert results[0] == "r0"
    assert isinstance(results[-1], RuntimeError) and results[-1] is results[7]
    assert together.run("o", 3, batch) == "r3"  # nobody is left leading


def test_a_caller_within_its_own_batch_runs_alone_rather_than_wait_for_itself() -> None:
    """A batch that (through what it calls) asks for the same key again on the same
    thread would wait for its own leader: it runs alone instead."""
    together: Together[int, str] = Together(8)
    batches: list[list[int]] = []

    def batch(items: list[int]) -> list[str]:
        batches.append(items)
        if items == [1]:
            assert together.run("o", 2, batch) == "r2"
        return [f"r{i}" for i in items]

    assert together.run("o", 1, batch) == "r1"
    assert batches == [[1], [2]]
    assert together.run("o", 3, batch) == "r3"  # and nothing is left leading


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Together(0)


# --- the scheduler's replies ------------------------------------------------------------


def forged(reply: AgentReply) -> AgentReply:
    return replace(reply, token="not-its-token")


def test_replies_that_come_together_are_one_save(wide: Wide) -> None:  # noqa: F811
    requests = submit(wide, "o-together", 2 * WIDTH)
    saves = wide.store.saves

    results = wide.app.scheduler._apply_replies([reply_to(r) for r in requests[:REPLIES_TOGETHER]])

    assert results == [Handled.APPLIED] * REPLIES_TOGETHER
    # one save applied the eight, one more claimed the eight lines started in their place
    assert wide.store.saves - saves == 2
    order = wide.store.load("o-together")
    assert order is not None
    ended = [order.find(r.step) for r in requests[:REPLIES_TOGETHER]]
    assert all(s is not None and s.process_state is StepState.PROCESSED for s in ended)
    assert len(wide.transport.requests) == WIDTH + REPLIES_TOGETHER


def test_a_copy_in_a_batch_is_stale_and_the_others_are_applied(wide: Wide) -> None:  # noqa: F811
    requests = submit(wide, "o-copy", 2 * WIDTH)
    first, second = reply_to(requests[0]), reply_to(requests[1])

    results = wide.app.scheduler._apply_replies([first, second, first])

    assert results == [Handled.APPLIED, Handled.APPLIED, Handled.STALE]


def test_a_forged_reply_in_a_batch_is_quarantined_and_the_others_applied(
    wide: Wide,  # noqa: F811
) -> None:
    requests = submit(wide, "o-forged", 2 * WIDTH)
    one, other = reply_to(requests[0]), reply_to(requests[1])

    results = wide.app.scheduler._apply_replies([one, forged(other), other])

    assert results == [Handled.APPLIED, Handled.UNBOUND, Handled.APPLIED]
    assert processed(wide.store.load("o-forged"), one, other)


def test_replies_for_an_order_that_does_not_exist_are_each_quarantined(
    wide: Wide,  # noqa: F811
) -> None:
    requests = submit(wide, "o-gone", 2)
    lost = [replace(reply_to(r), order_id="o-none") for r in requests]

    assert wide.app.scheduler._apply_replies(lost) == [Handled.UNBOUND, Handled.UNBOUND]


def test_the_widest_batch_on_the_widest_for_each_fits_one_transaction(
    wide: Wide,  # noqa: F811
) -> None:
    requests = submit(wide, "o-widest", 60, workflow="widest")
    assert len(requests) == MAX_ITEM_CONCURRENCY

    results = wide.app.scheduler._apply_replies([reply_to(r) for r in requests[:REPLIES_TOGETHER]])

    # the in-memory store refuses a transaction of more than 100 operations, as Azure does
    assert results == [Handled.APPLIED] * REPLIES_TOGETHER
    assert len(wide.transport.requests) == MAX_ITEM_CONCURRENCY + REPLIES_TOGETHER


def test_replies_given_at_once_on_threads_are_applied_in_fewer_saves(
    wide: Wide,  # noqa: F811
) -> None:
    requests = submit(wide, "o-threads", 2 * WIDTH)
    scheduler = wide.app.scheduler
    together = scheduler._together
    store_save = wide.store.save
    held = threading.Event()

    def save(order: Any) -> Any:  # the first reply's save waits until the others are in line
        if not held.is_set():
            held.set()
            assert together.await_waiting("o-threads", WIDTH - 1, WAIT)
        return store_save(order)

    wide.store.save = save  # type: ignore[method-assign]
    saves = wide.store.saves
    results: dict[int, Any] = {}

    def reply(n: int) -> None:
        results[n] = scheduler.apply_reply(reply_to(requests[n]))

    threads = [threading.Thread(target=reply, args=(n,)) for n in range(WIDTH)]
    threads[0].start()
    assert held.wait(WAIT)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(WAIT)

    assert results == {n: Handled.APPLIED for n in range(WIDTH)}
    order = wide.store.load("o-threads")
    assert order is not None and order.status is OrderStatus.PROCESSING
    assert processed(order, *(reply_to(r) for r in requests))
    # the first alone, then the other nine in batches of at most eight: three saves of
    # replies, each followed by the claim of the lines they started (where one by one,
    # ten replies made ten saves and ten claims, and lost races to each other)
    assert wide.store.saves - saves == 2 * 3


# --- which requests a redelivered order sends again, and which a copy must take ------------


def test_only_lines_claimed_when_the_order_was_accepted_are_sent_again_or_taken(
    wide: Wide,  # noqa: F811
) -> None:
    """A redelivered order may send again what its acceptance claimed (that delivery may
    have died before its send); a line claimed later, as another ended, was sent by the
    invocation that claimed it: it is never sent twice, so no copy of it must take its
    attempt (a save per line on Storage queues, for nothing)."""
    requests = submit(wide, "o-later", 2 * WIDTH)
    clock = wide.app.clock
    assert isinstance(clock, FakeClock)
    clock.advance(1)
    wide.app.scheduler.apply_reply(reply_to(requests[0]))
    later = wide.transport.requests[-1]
    assert later.step == f"each[{WIDTH}]"

    order = wide.store.load("o-later")
    assert order is not None
    assert order.resendable(requests[1].step, 1)
    assert not order.resendable(later.step, 1)
    binding = RequestBinding(wide.store, "orders", copies=True)
    version = order.version
    binding(later, "m-later")
    loaded = wide.store.load("o-later")
    assert loaded is not None and loaded.version == version  # nothing taken, nothing saved

    body = {"orderId": "o-later", "workflow": "wide", "lines": [{"n": i} for i in range(2 * WIDTH)]}
    sent = len(wide.transport.requests)
    assert wide.app.scheduler.submit(json.dumps(body).encode()) is Handled.DUPLICATE
    resent = [r.step for r in wide.transport.requests[sent:]]
    assert resent == [r.step for r in requests[1:]]  # the acceptance's, still in flight
