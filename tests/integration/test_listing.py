"""Listing orders newest first, with filters, counts and bulk actions, on real Azurite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bootstrap import AppContext
from core.errors import InvalidContinuationToken, TransitionRefused
from core.policy import RetryPolicy
from core.ports import ListFilter
from core.states import OrderStatus
from stores import layout
from tests.integration.orders import accept, every_page, request_for
from tests.support import make_context

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
POLICY = RetryPolicy(max_failure_count=1)


@pytest.fixture
def ctx(storage_connection: str, tag: str) -> AppContext:
    return make_context(storage_connection, tag)  # a table of its own: counts are exact


def fail(ctx: AppContext, order_id: str) -> None:
    """Take a stored pending order to ``error``: one attempt, refused by its service (a
    definite failure: nothing applied, so a cancel needs no statement)."""
    order = ctx.store.load(order_id)
    assert order is not None
    step = order.claim("i", order.created_at)
    order.apply_reply(request_for(step).refused("HTTP 422 invalid"), order.created_at, POLICY)
    assert order.status is OrderStatus.ERROR and not step.may_have_applied
    ctx.store.save(order)


def all_pages(ctx: AppContext, where: ListFilter, size: int) -> list[list[str]]:
    return every_page(lambda token: ctx.store.list_by_status(where, size, token))


def test_pages_are_newest_first_across_shards(ctx: AppContext) -> None:
    ids = [f"n-{i:03d}" for i in range(45)]  # created a second apart: n-044 is the newest
    for i, order_id in enumerate(ids):
        ctx.store.create(accept(order_id, T0 + timedelta(seconds=i)))
    assert len({layout.shard_of(i) for i in ids}) > 8  # the orders really are spread

    pages = all_pages(ctx, ListFilter(OrderStatus.PENDING), 10)

    assert [len(p) for p in pages] == [10, 10, 10, 10, 5]
    assert [i for p in pages for i in p] == list(reversed(ids))


def test_a_page_that_ends_exactly_at_the_last_order_has_no_next_page(ctx: AppContext) -> None:
    for i in range(6):
        ctx.store.create(accept(f"e-{i}", T0 + timedelta(seconds=i)))
    pages = all_pages(ctx, ListFilter(OrderStatus.PENDING), 3)
    # A full last page may still say "maybe more" (a shard returned a full page); then
    # the next page is empty, never a repeat.
    assert [i for p in pages for i in p] == [f"e-{i}" for i in reversed(range(6))]
    assert pages[-1] == [] or len(pages) == 2


def test_workflow_and_time_range_filters(ctx: AppContext) -> None:
    for i in range(12):
        workflow = "fulfilment" if i % 3 == 0 else "order"
        ctx.store.create(accept(f"f-{i:02d}", T0 + timedelta(minutes=i), workflow))

    fulfilment = ListFilter(OrderStatus.PENDING, workflow="fulfilment")
    assert [i for p in all_pages(ctx, fulfilment, 2) for i in p] == ["f-09", "f-06", "f-03", "f-00"]

    # from inclusive, to exclusive
    window = ListFilter(
        OrderStatus.PENDING,
        created_from=T0 + timedelta(minutes=3),
        created_to=T0 + timedelta(minutes=7),
    )
    assert [i for p in all_pages(ctx, window, 50) for i in p] == ["f-06", "f-05", "f-04", "f-03"]
    both = ListFilter(
        OrderStatus.PENDING, "fulfilment", T0 + timedelta(minutes=3), T0 + timedelta(minutes=7)
    )
    assert [i for p in all_pages(ctx, both, 50) for i in p] == ["f-06", "f-03"]
    assert ctx.store.count_by_status(window) == 4
    assert ctx.store.count_by_status(fulfilment) == 4


def test_counts_follow_the_status_and_stop_at_the_cap(ctx: AppContext) -> None:
    for i in range(7):
        ctx.store.create(accept(f"c-{i}", T0 + timedelta(seconds=i)))
    for order_id in ("c-1", "c-4"):
        fail(ctx, order_id)

    counts = ctx.admin.counts()
    assert counts["pending"] == 5 and counts["error"] == 2 and counts["completed"] == 0
    assert set(counts) == {s.value for s in OrderStatus}
    assert ctx.store.count_by_status(ListFilter(OrderStatus.PENDING), cap=3) == 3
    errors = ctx.admin.page(ListFilter(OrderStatus.ERROR))["orders"]
    assert [o["orderId"] for o in errors] == ["c-4", "c-1"]
    assert errors[0]["failedStep"] == "process"


def test_a_row_from_before_the_time_part_still_lists_last_and_pages_on(ctx: AppContext) -> None:
    for i in range(3):
        ctx.store.create(accept(f"l-{i}", T0 + timedelta(seconds=i)))
    # What a store written by an earlier version holds: status|<status>|<id>.
    legacy = accept("l-old", T0 - timedelta(days=1))
    ctx.store.create(legacy)
    shard = layout.shard_of("l-old")
    new_row = layout.status_row("pending", "l-old", legacy.created_at)
    ctx.store.table.delete_entity(shard, new_row)
    ctx.store.table.create_entity(
        {"PartitionKey": shard, "RowKey": "status|pending|l-old", "OrderRef": "l-old"}
    )

    pages = all_pages(ctx, ListFilter(OrderStatus.PENDING), 3)
    assert [i for p in pages for i in p] == ["l-2", "l-1", "l-0", "l-old"]
    ids, token = ctx.store.list_by_status(ListFilter(OrderStatus.PENDING), 3, None)
    assert ids == ["l-2", "l-1", "l-0"]
    assert token is not None
    assert ctx.store.list_by_status(ListFilter(OrderStatus.PENDING), 1, token)[0] == ["l-old"]
    # a legacy position: only legacy rows with a later id follow it
    assert ctx.store.list_by_status(ListFilter(OrderStatus.PENDING), 4, "~l-0")[0] == ["l-old"]
    assert ctx.store.list_by_status(ListFilter(OrderStatus.PENDING), 4, "~l-p")[0] == []
    # the repair moves it to the new layout
    assert ctx.store.repair_index("l-old")["repaired"] is True
    keys = [
        e["RowKey"]
        for e in ctx.store.table.query_entities(
            "PartitionKey eq @pk and OrderRef eq @id", parameters={"pk": shard, "id": "l-old"}
        )
        if e["RowKey"].startswith("status|")
    ]
    assert keys == [new_row]


def test_a_token_this_store_never_made_is_refused(ctx: AppContext) -> None:
    with pytest.raises(InvalidContinuationToken):
        ctx.store.list_by_status(ListFilter(OrderStatus.PENDING), 5, "status|pending|x")
    # well formed but pointing nowhere: an empty page, not an error
    ids, token = ctx.store.list_by_status(ListFilter(OrderStatus.PENDING), 5, "0000000000000|zz")
    assert (ids, token) == ([], None)


def test_bulk_resubmit_changes_each_order_and_reports_each_refusal(ctx: AppContext) -> None:
    for i in range(4):
        ctx.store.create(accept(f"b-{i}", T0 + timedelta(seconds=i)))
    for order_id in ("b-0", "b-1", "b-2"):
        fail(ctx, order_id)
    where = ListFilter(OrderStatus.ERROR)
    targets = ctx.admin.bulk_targets(where)
    assert targets == ["b-2", "b-1", "b-0"]
    assert ctx.admin.bulk_targets(where, limit=2) == ["b-2", "b-1"]

    result = ctx.admin.bulk("resubmit", [*targets, "b-3", "b-none"], "ops (test)", "fixed it")

    assert result["done"] == ["b-2", "b-1", "b-0"]
    assert [r["orderId"] for r in result["refused"]] == ["b-3", "b-none"]
    assert "only an order in error" in result["refused"][0]["reason"]
    assert "no order" in result["refused"][1]["reason"]
    order = ctx.store.load("b-0")
    assert order is not None and order.status is OrderStatus.PROCESSING
    resubmitted = [h for h in order.history if h["event"] == "resubmitted"]
    assert resubmitted[-1]["by"] == "ops (test)" and resubmitted[-1]["reason"] == "fixed it"
    with pytest.raises(ValueError, match="action"):
        ctx.admin.bulk("delete", targets, "ops", "x")
    with pytest.raises(TransitionRefused):
        ctx.admin.resubmit("b-0", "ops", "again")
