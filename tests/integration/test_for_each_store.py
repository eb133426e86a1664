"""A ``ForEach`` of ``MAX_ITEMS`` items, ``MAX_ITEM_CONCURRENCY`` at a time, through the
Table store on real Azurite (docs/contracts.md §3.16, §3.2).

Every save of an order is one entity group transaction, and Azure refuses one of more
than 100 operations: the order with 100 lines, ``MAX_ITEM_CONCURRENCY`` (25) in flight,
claimed by the dispatcher in a save of their own (three operations an item), is run,
halted by one item refused for good while the others are in flight, and cancelled while
25 are in flight, each change saved; its item records load back under their names, and the
listing and search find it as any order. The pipeline runs in process (the agents call
a real simulator), with ``tests.fixtures.shop_items``'s ``bulk`` workflow.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from bootstrap import AppContext
from core.item_names import MAX_ITEM_CONCURRENCY, MAX_ITEMS
from core.ports import ListFilter
from core.states import OrderStatus, StepState
from messaging.wire import decode_reply, decode_request
from scheduler.service import Handled
from stores.tables import TableStateStore
from tests.integration.test_pipeline import pump, submit
from tests.support import declarations, drain, drain_requests

ITEMS = "tests.fixtures.shop_items"
#: Azure's bound on one entity group transaction.
MAX_OPERATIONS = 100


@pytest.fixture(autouse=True)
def items(ctx: AppContext) -> Iterator[None]:
    """After the bootstrap (which uses the suite's declarations): the same agents, and
    the ``bulk`` workflow beside the shop's."""
    with declarations(ITEMS):
        yield


@pytest.fixture
def transactions(ctx: AppContext, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of operations of every transaction the store submits, in order."""
    store = ctx.store
    assert isinstance(store, TableStateStore)
    sizes: list[int] = []
    submit_ops = store._submit

    def counted(order_id: str, ops: list[Any]) -> list[Any]:
        sizes.append(len(ops))
        return submit_ops(order_id, ops)

    monkeypatch.setattr(store, "_submit", counted)
    return sizes


def bulk(order_id: str, refused: int | None = None) -> dict[str, Any]:
    lines: list[dict[str, Any]] = [{"sku": f"S-{i:03d}"} for i in range(MAX_ITEMS)]
    if refused is not None:
        lines[refused]["simulate"] = {"pick-line": "permanent"}
    return {"orderId": order_id, "workflow": "bulk", "customerId": f"c-{order_id}", "lines": lines}


def past_the_first_step(ctx: AppContext) -> None:
    """One round of the pipeline: ``process`` answered, its report creates the first items
    and the scheduler claims them in a save of their own."""
    for text in drain_requests(ctx):
        request = decode_request(text)
        asyncio.run(ctx.agent_for(request.agent).handle(request))
    for text in drain(ctx, ctx.names.agent_replies):
        ctx.scheduler.apply_reply(decode_reply(text))
    for text in drain(ctx, ctx.names.order_dispatch):
        ctx.scheduler.dispatch(json.loads(text)["orderId"])


def in_flight(ctx: AppContext, order_id: str) -> list[str]:
    order = ctx.store.load(order_id)
    assert order is not None
    return [s.step for s in order.steps if s.process_state is StepState.PROCESSING]


def test_a_hundred_items_at_the_cap_run_in_one_transaction_each(
    ctx: AppContext, tag: str, transactions: list[int]
) -> None:
    order_id = f"{tag}-ok"
    assert submit(ctx, bulk(order_id)) is Handled.ACCEPTED
    past_the_first_step(ctx)
    assert len(in_flight(ctx, order_id)) == MAX_ITEM_CONCURRENCY
    pump(ctx, rounds=400)
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPLETED
    names = [s.step for s in order.steps if s.step.startswith("pick[")]
    assert names == [f"pick[{i}]" for i in range(MAX_ITEMS)]
    assert all(order.find(n).process_state is StepState.PROCESSED for n in names)  # type: ignore[union-attr]
    results = order.find("pick").result  # type: ignore[union-attr]
    assert results == {"items": [{"sku": f"S-{i:03d}"} for i in range(MAX_ITEMS)]}
    assert max(transactions) <= MAX_OPERATIONS, transactions
    print(f"\n{len(transactions)} transactions, at most {max(transactions)} operations")


def test_one_item_refused_with_the_cap_in_flight_halts_and_every_applied_item_is_undone(
    ctx: AppContext, tag: str, transactions: list[int]
) -> None:
    order_id = f"{tag}-halt"
    assert submit(ctx, bulk(order_id, refused=5)) is Handled.ACCEPTED
    past_the_first_step(ctx)
    assert len(in_flight(ctx, order_id)) == MAX_ITEM_CONCURRENCY
    pump(ctx, rounds=400)
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.COMPENSATED
    item = order.find("pick[5]")
    assert item is not None and item.process_state is StepState.ERROR
    applied = [s.step for s in order.steps if s.step.startswith("pick[") and s.result]
    undone = [s.step for s in order.steps if s.step.startswith("unpick[")]
    # those in flight beside it, and those started as the first ended, applied: each undone
    assert len(applied) >= MAX_ITEM_CONCURRENCY - 1
    assert sorted(undone) == sorted(f"un{name}" for name in applied)
    assert max(transactions) <= MAX_OPERATIONS, transactions


def test_a_cancel_with_the_cap_in_flight_saves_and_undoes_each_as_it_ends(
    ctx: AppContext, tag: str, transactions: list[int]
) -> None:
    order_id = f"{tag}-cancel"
    assert submit(ctx, bulk(order_id)) is Handled.ACCEPTED
    past_the_first_step(ctx)
    assert len(in_flight(ctx, order_id)) == MAX_ITEM_CONCURRENCY
    ctx.admin.cancel(order_id, "ops", "the customer called")
    pump(ctx, rounds=400)
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.CANCELLED
    picked = [s.step for s in order.steps if s.step.startswith("pick[")]
    assert picked == [f"pick[{i}]" for i in range(MAX_ITEM_CONCURRENCY)]  # none started after
    undone = sorted(s.step for s in order.steps if s.step.startswith("unpick["))
    assert undone == sorted(f"unpick[{i}]" for i in range(MAX_ITEM_CONCURRENCY))
    assert max(transactions) <= MAX_OPERATIONS, transactions


def test_the_order_loads_back_and_is_listed_and_found_as_any_order(
    ctx: AppContext, tag: str
) -> None:
    order_id = f"{tag}-found"
    assert submit(ctx, bulk(order_id)) is Handled.ACCEPTED
    past_the_first_step(ctx)
    loaded = ctx.store.load(order_id)
    assert loaded is not None
    # every record under its own name: the first step, the head, the items in item order
    assert [s.step for s in loaded.steps] == ["process", "pick"] + [
        f"pick[{i}]" for i in range(MAX_ITEM_CONCURRENCY)
    ]
    # what its acceptance claimed may be sent again by a redelivered order, not the lines
    # claimed after (the claim's time against the stored CreatedAt, read back exactly)
    assert loaded.resendable("process", 1) and not loaded.resendable("pick[0]", 1)
    listed, _ = ctx.store.list_by_status(ListFilter(OrderStatus.PROCESSING), 50, None)
    assert listed == [order_id]
    found, _ = ctx.store.list_by_status(
        ListFilter(None, search=("customerId", f"c-{order_id}")), 50, None
    )
    assert found == [order_id]
