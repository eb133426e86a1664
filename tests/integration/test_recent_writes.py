"""Replies applied on what this process last wrote (stores/recent.py), on real Azurite.

What ``TableStateStore.recent`` returns must be what a read would return; and when another
instance changed the order since, the If-Match of the save catches it: the reply is
applied on a fresh read, and the other instance's change is kept.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.messages import AgentReply
from core.model import Order
from core.outcome import Outcome
from core.states import OrderStatus, StepState
from scheduler.service import Handled
from stores import entities
from stores.tables import TableStateStore
from tests.support import FakeClock, make_context, status_queue


def count_loads(store: TableStateStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids ``store.load`` is called with from now on (it still reads)."""
    calls: list[str] = []
    load = store.load

    def counted(order_id: str) -> Order | None:
        calls.append(order_id)
        return load(order_id)

    monkeypatch.setattr(store, "load", counted)
    return calls


def stored_state(order: Order) -> dict[str, Any]:
    """Everything a decision and a save read of ``order``: its records, ETags, index."""
    meta = {k: v for k, v in order.store_meta.items() if k != "rows"}
    return {
        "order": entities.order_entity(order, "-"),
        "steps": [entities.step_entity(s) for s in order.steps],
        "etags": [order.etag, *(s.etag for s in order.steps)],
        "version": order.version,
        "meta": meta,
    }


def same_as_read(store: TableStateStore, order_id: str) -> Order:
    recent, loaded = store.recent(order_id), store.load(order_id)
    assert recent is not None and loaded is not None
    assert stored_state(recent) == stored_state(loaded)
    return recent


def success(order: Order, step: str) -> AgentReply:
    record = order.find(step)
    assert record is not None
    return AgentReply(
        order.order_id,
        step,
        record.attempt,
        record.complete_by,
        Outcome.SUCCEEDED,
        {},
        token=record.token_for(record.attempt),
    )


def test_recent_is_what_a_read_returns_after_every_save(
    storage_connection: str, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    ctx = make_context(storage_connection, tag, clock=clock)
    order_id = f"{tag}-recent"
    reply_to = status_queue(ctx, tag)
    body = {"orderId": order_id, "workflow": "fulfilment", "replyTo": reply_to, "sku": "é-1"}
    assert ctx.scheduler.submit(json.dumps(body).encode()) is Handled.ACCEPTED
    order = same_as_read(ctx.store, order_id)
    loads = count_loads(ctx.store, monkeypatch)
    for step in ("reserve-stock", "charge-payment", "ship"):
        clock.advance(1.5)
        assert ctx.scheduler.apply_reply(success(order, step)) is Handled.APPLIED
        assert loads == []  # applied on what this process wrote: no read
        order = same_as_read(ctx.store, order_id)  # the reply's save and the next claim
        loads.clear()
    assert order.status is OrderStatus.COMPLETED


def test_a_reply_on_a_stale_recent_write_is_applied_on_a_fresh_read(
    storage_connection: str, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    mine = make_context(storage_connection, tag, clock=clock)
    other = make_context(storage_connection, tag, clock=clock)  # another instance
    order_id = f"{tag}-stale"
    mine.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    kept = mine.store.recent(order_id)
    assert kept is not None
    # Meanwhile the other instance changes the order (the stuck check's alert): what this
    # instance remembers is now stale, though its step is still the claim being reported.
    theirs = other.store.load(order_id)
    assert theirs is not None
    theirs.mark_stuck("process", "stuck for a test", clock())
    other.store.save(theirs)

    clock.advance(1)
    loads = count_loads(mine.store, monkeypatch)
    assert mine.scheduler.apply_reply(success(kept, "process")) is Handled.APPLIED
    assert loads == [order_id]  # the save on the stale copy was refused: read, decided again
    final = mine.store.load(order_id)
    assert final is not None
    assert final.status is OrderStatus.COMPLETED
    assert final.steps[0].process_state is StepState.PROCESSED
    assert final.stuck_alerted == "process:1"  # the other instance's change is not lost
    assert stored_state(same_as_read(mine.store, order_id)) == stored_state(final)


def test_a_reply_for_another_attempt_reads_the_order(
    storage_connection: str, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    ctx = make_context(storage_connection, tag, clock=clock)
    order_id = f"{tag}-other-attempt"
    ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode())
    kept = ctx.store.recent(order_id)
    assert kept is not None
    late = success(kept, "process")
    stale = AgentReply(
        late.order_id, late.step, 2, late.complete_by, late.outcome, {}, token=late.token
    )
    loads = count_loads(ctx.store, monkeypatch)
    assert ctx.scheduler.apply_reply(stale) is Handled.UNBOUND  # no attempt 2: quarantined
    assert loads == [order_id]  # not the claim it reports on: read as before
    assert ctx.scheduler.apply_reply(late) is Handled.APPLIED
    assert loads == [order_id]
