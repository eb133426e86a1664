"""Search by business keys (docs/contracts.md §3.14) on Azurite, through the real triggers
and the CLI: ``GET /api/orders?<field>=<value>`` with a status and across pages; a step's
result field (``?rma=``, §3.17) once the step succeeded and not before; a fixed
order found under its new value and not its old; a field no workflow declares, a 400
that says which are; a search row without its order not listed; archived orders taking
their rows with them and bringing them back on restore; and what a search costs in
table requests (``observability.opcount``): the same with 30 orders stored as with 330.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import azure.functions as func
import pytest
from azure.data.tables import TableClient, UpdateMode

from admin.query import parse_filter
from admin.service import OrderAdmin
from bootstrap import AppContext, reset_app_context
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.retention import Retention
from messaging.wire import decode_request
from observability import opcount
from stores import layout
from stores.tables import TableStateStore
from tests.integration.orders import accept, every_page, request_for
from tests.support import (
    FakeClock,
    app_function,
    declarations,
    drain_requests,
    make_context,
    run_cli,
)
from tests.unit.test_services_in_memory import reply_to

T0 = datetime(2026, 9, 1, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=40)
POLICY = RetryPolicy(max_failure_count=1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def ctx(storage_connection: str, tag: str, clock: FakeClock) -> Iterator[AppContext]:
    context = make_context(storage_connection, tag, clock=clock)  # a table of its own
    reset_app_context(context)
    yield context
    reset_app_context(None)


def end(ctx: AppContext, order_id: str, outcome: str) -> None:
    """The order's first step answered: ``completed`` (its one step succeeded) or
    ``error`` (refused: nothing applied); its notices sent."""
    order = ctx.store.load(order_id)
    assert order is not None
    request = request_for(order.claim("i", order.created_at))
    reply = request.succeeded({}) if outcome == "completed" else request.refused("HTTP 422 no")
    order.apply_reply(reply, order.created_at + timedelta(seconds=1), POLICY)
    assert str(order.status) == outcome
    ctx.store.delete_outbox(ctx.store.save(order))


def get(**params: str) -> tuple[int, Any]:
    request = func.HttpRequest(
        method="GET", url="http://localhost/api/orders", params=params, body=b""
    )
    response: func.HttpResponse = app_function("list_orders")(request)
    return response.status_code, json.loads(response.get_body())


def listed(**params: str) -> list[str]:
    """Every order the search lists, page after page, through the API."""

    def read(token: str | None) -> tuple[list[str], str | None]:
        status, page = get(**(params if token is None else {**params, "continuationToken": token}))
        assert status == 200, page
        return [o["orderId"] for o in page["orders"]], page["continuationToken"]

    return [order_id for ids in every_page(read, most=50) for order_id in ids]


def test_a_search_over_http_with_a_status_and_across_pages(ctx: AppContext) -> None:
    for i in range(9):
        customer = "c-1" if i % 3 else "c-2"  # c-1: 1, 2, 4, 5, 7, 8
        ctx.store.create(accept(f"h-{i}", T0 + timedelta(seconds=i), customerId=customer))
    for i in (2, 7):
        end(ctx, f"h-{i}", "error")
    end(ctx, "h-4", "completed")
    assert listed(customerId="c-1") == ["h-8", "h-7", "h-5", "h-4", "h-2", "h-1"]
    assert listed(customerId="c-1", pageSize="4") == ["h-8", "h-7", "h-5", "h-4", "h-2", "h-1"]
    status, first = get(customerId="c-1", pageSize="2")
    assert status == 200 and len(first["orders"]) == 2 and first["continuationToken"]
    assert first["orders"][0]["status"] == "pending" and first["orders"][1]["status"] == "error"
    assert listed(customerId="c-1", status="error") == ["h-7", "h-2"]
    assert listed(customerId="c-1", status="error", pageSize="1") == ["h-7", "h-2"]
    assert listed(customerId="c-1", status="completed") == ["h-4"]
    assert listed(customerId="c-2", status="error") == []
    assert listed(customerId="c-2", workflow="fulfilment") == []
    assert listed(customerId="c-9") == []
    assert listed(status="error") == ["h-7", "h-2"]  # the listing without a search, as before


def test_a_steps_result_field_is_found_over_http_once_the_step_succeeded(
    ctx: AppContext,
) -> None:
    """``search=("receive-return.rma",)`` (docs/contracts.md §3.17): ``?rma=`` finds the
    order from the save that records the step's success on, not before."""
    app_function("list_orders")  # the app, imported, put the settings' declarations to use
    with declarations("tests.fixtures.result_search"):
        ctx.store.create(accept("rma-1", T0, "exchange"))
        assert listed(rma="R-123") == []
        order = ctx.store.load("rma-1")
        assert order is not None
        request = request_for(order.claim("i", order.created_at))
        order.apply_reply(request.succeeded({"rma": "R-123"}), T0 + timedelta(seconds=1))
        ctx.store.delete_outbox(ctx.store.save(order))
        assert listed(rma="R-123") == ["rma-1"]
        assert listed(rma="R-123", status="completed") == ["rma-1"]
        assert listed(rma="R-12") == []


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"phone": "1"}, "'phone' is not a field orders can be searched by"),
        ({"phone": "1", "status": "error"}, "customerId (checkout, fulfilment, order)"),
        ({"customerId": "c", "email": "e"}, "search one field at a time"),
        ({"customerId": "x" * 257}, "at most 256 characters"),
        ({"customerId": "c", "status": "lost"}, "give ?status= one of"),
        ({"customerId": "c", "continuationToken": "nope"}, "continuationToken"),
    ],
)
def test_a_search_the_api_cannot_make_is_a_400_that_says_what_it_can(
    ctx: AppContext, params: dict[str, str], says: str
) -> None:
    status, answer = get(**params)
    assert status == 400 and says in answer["error"], answer


def test_a_fixed_order_is_found_under_its_new_value_and_not_its_old(ctx: AppContext) -> None:
    data = {"orderId": "fx-1", "customerId": "c-old", "note": "n"}
    ctx.scheduler.submit(json.dumps(data).encode())
    [first] = [decode_request(t) for t in drain_requests(ctx)]
    ctx.scheduler.apply_reply(reply_to(first, Outcome.REFUSED, error="HTTP 422 customer"))
    assert listed(customerId="c-old", status="error") == ["fx-1"]
    request = func.HttpRequest(
        method="POST",
        url="http://localhost/api/orders/fx-1/resubmit",
        route_params={"orderId": "fx-1"},
        body=json.dumps({"reason": "wrong customer", "patch": {"customerId": "c-new"}}).encode(),
    )
    assert app_function("resubmit_order")(request).status_code == 200
    assert listed(customerId="c-new") == ["fx-1"]
    assert listed(customerId="c-old") == []


def put_search_row(table: TableClient, order_id: str, value: str, at: datetime) -> None:
    table.upsert_entity(
        {
            "PartitionKey": layout.shard_of(order_id),
            "RowKey": layout.search_row("customerId", value, order_id, at),
            "OrderRef": order_id,
            "Workflow": "order",
            "Field": "customerId",
            "Value": value,
        },
        mode=UpdateMode.REPLACE,
    )


def test_a_search_row_without_its_order_or_its_value_is_not_listed(ctx: AppContext) -> None:
    ctx.store.create(accept("real", T0, customerId="c-2"))
    put_search_row(ctx.store.table, "ghost", "c-1", T0 + timedelta(seconds=2))
    put_search_row(ctx.store.table, "real", "c-1", T0 + timedelta(seconds=3))
    ctx.store.create(accept("match", T0 + timedelta(seconds=1), customerId="c-1"))
    assert listed(customerId="c-1") == ["match"]
    assert listed(customerId="c-1", pageSize="1") == ["match"]


def test_an_archived_order_takes_its_search_rows_and_a_restore_brings_them_back(
    ctx: AppContext,
) -> None:
    ctx.store.create(accept("ar-1", T0, "fulfilment", customerId="c-1", email="a@x"))
    for _ in range(3):  # reserve-stock, charge-payment, ship
        order = ctx.store.load("ar-1")
        assert order is not None
        order.apply_reply(request_for(order.claim("i", T0)).succeeded({}), T0, POLICY)
        ctx.store.delete_outbox(ctx.store.save(order))
    assert listed(customerId="c-1", status="completed") == ["ar-1"]

    assert ctx.retainer.purge(rules=Retention.parse("completed=30d")).archived == 1
    rows = ctx.store.table.query_entities(
        "PartitionKey eq @pk", parameters={"pk": layout.shard_of("ar-1")}
    )
    assert [r["RowKey"] for r in rows if str(r["RowKey"]).startswith("search|")] == []
    assert listed(customerId="c-1") == [] and listed(email="a@x") == []

    ctx.retainer.restore("ar-1")
    assert listed(customerId="c-1") == ["ar-1"] and listed(email="a@x") == ["ar-1"]


def test_the_cli_searches_with_orders_where(
    default_ctx: AppContext, storage_connection: str, tag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI reads the app's own table (default names), as an operator's would."""
    customer = f"c-{tag}"  # the table is shared: this test's customer is its own
    default_ctx.store.create(accept(f"{tag}-1", T0, customerId=customer))
    default_ctx.store.create(accept(f"{tag}-2", T0 + timedelta(seconds=1), customerId=customer))
    end(default_ctx, f"{tag}-1", "error")

    def run(*args: str) -> tuple[int, Any]:
        return run_cli(capsys, storage_connection, *args)

    code, out = run("orders", "--where", f"customerId={customer}", "--all")
    assert code == 0 and [o["orderId"] for o in out["orders"]] == [f"{tag}-2", f"{tag}-1"]
    code, out = run("orders", "--where", f"customerId={customer}", "--status", "error")
    assert code == 0 and [o["orderId"] for o in out["orders"]] == [f"{tag}-1"]
    code, out = run("list", "--where", f"customerId={customer}", "--page-size", "1")
    assert code == 0 and [o["orderId"] for o in out["orders"]] == [f"{tag}-2"]
    assert out["continuationToken"]
    code, out = run("orders", "--where", "phone=1")
    assert code == 2 and "customerId (checkout, fulfilment, order)" in out["error"]
    code, out = run("orders")
    assert code == 2 and "--where" in out["error"]


def counted(ctx: AppContext, connection: str) -> tuple[OrderAdmin, Counter[str]]:
    """An admin over the test's table whose client counts its requests (the op counter)
    and the entities its answers hold."""
    entities: Counter[str] = Counter()

    def read(response: Any) -> None:
        try:
            body = json.loads(response.http_response.text() or "{}")
        except ValueError:
            return
        if isinstance(body, dict):
            entities["entities"] += len(body["value"]) if "value" in body else 1

    table = TableClient.from_connection_string(
        connection,
        table_name=ctx.names.state_table,
        raw_request_hook=opcount.OpCounter("table"),
        raw_response_hook=read,
    )
    store = TableStateStore(table)
    return OrderAdmin(store, ctx.notices, ctx.dispatch_queue, ctx.clock, controls=store), entities


def cost_of_one_search(admin: OrderAdmin, entities: Counter[str]) -> dict[str, int]:
    entities.clear()
    before = opcount.snapshot()
    page = admin.page(parse_filter({"customerId": "c-wanted"}), 50)
    assert [o["orderId"] for o in page["orders"]] == ["the-one"]
    spent = opcount.snapshot() - before
    return {"requests": sum(spent.values()), "queries": spent["app:table.query"], **entities}


def test_what_a_search_costs_grows_with_the_orders_that_match_not_with_all(
    ctx: AppContext, storage_connection: str
) -> None:
    for i in range(30):
        ctx.store.create(accept(f"x-{i:03d}", T0 + timedelta(seconds=i), customerId=f"c-{i}"))
    ctx.store.create(accept("the-one", T0, customerId="c-wanted"))
    admin, entities = counted(ctx, storage_connection)
    few = cost_of_one_search(admin, entities)
    for i in range(30, 330):
        ctx.store.create(accept(f"x-{i:03d}", T0 + timedelta(seconds=i), customerId=f"c-{i}"))
    many = cost_of_one_search(admin, entities)
    assert few == many, (few, many)
    # one range query per shard (16) for the search rows, one for the order it names and
    # one for the agents' controls (is its agent paused?); three entities: the search row
    # and the order's two records (order and step); no control row is stored
    assert many == {"requests": 18, "queries": 18, "entities": 3}, many
    assert layout.SHARDS == 16
