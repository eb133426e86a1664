"""Search by business keys (docs/contracts.md §3.14), in memory: what a workflow may declare,
what an order's value is as text, the search rows its transactions write and move, and
the operator's listing that reads them and checks each order it names. On Azurite:
``tests/integration/test_search.py``; both stores: ``tests/integration/test_store_contract.py``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from admin import __main__ as cli
from admin.query import parse_filter
from core.flow import StepSpec, Workflow
from core.outcome import Outcome
from core.plans import Plan
from core.ports import ListFilter
from core.search import MAX_SEARCH_FIELDS, MAX_VALUE_CHARS, digest, search_text
from core.states import OrderStatus
from core.workflows import DeclarationError, search_fields
from stores import layout
from tests.unit.test_fix_and_resubmit import sent
from tests.unit.test_services_in_memory import Services, build, reply_to, stored

CUSTOMER = ("customerId", "c-1")


def search(field: str, value: str, status: OrderStatus | None = None, **kw: Any) -> ListFilter:
    return ListFilter(status, search=(field, value), **kw)


def found(s: Services, where: ListFilter, page_size: int = 50) -> list[str]:
    """Every order a search lists, page after page."""
    ids: list[str] = []
    token: str | None = None
    for _ in range(100):
        page = s.admin.page(where, page_size, token)
        ids += [o["orderId"] for o in page["orders"]]
        token = page["continuationToken"]
        if token is None:
            return ids
    raise AssertionError("the pages never ended")


def submit(s: Services, order_id: str, workflow: str = "order", **data: Any) -> None:
    body = {"orderId": order_id, "workflow": workflow, **data}
    s.scheduler.submit(json.dumps(body).encode())
    s.clock.advance(1)  # each order a second newer than the last


def search_rows(s: Services, order_id: str) -> dict[str, dict[str, Any]]:
    rows = s.store.rows(layout.shard_of(order_id))
    return {
        str(r["RowKey"]): dict(r)
        for r in rows
        if str(r["RowKey"]).startswith("search|") and r["OrderRef"] == order_id
    }


# --- what a workflow may declare ------------------------------------------------------------


def test_a_workflow_names_the_fields_it_is_searched_by_and_its_plan_pins_them() -> None:
    flow = Workflow("w", (StepSpec("s", agent="a"),), search=("customerId", "email"))
    assert flow.search == ("customerId", "email")
    assert [(f["name"], f["parameter"], f["from"]) for f in flow.describe()["search"]] == [
        ("customerId", "customerId", "order"),
        ("email", "email", "order"),
    ]
    plan = Plan.of(flow, 30)
    assert plan.search == ("customerId", "email")
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    # a plan stored before search: found by nothing, and its JSON did not change
    old = {"workflow": "w", "steps": [s.to_json() for s in plan.steps]}
    assert Plan.from_json(old).search == ()
    assert "search" not in Plan.of(Workflow("w", (StepSpec("s", agent="a"),)), 30).to_json()


@pytest.mark.parametrize(
    ("search_", "says"),
    [
        ("customerId", "a tuple of field names"),
        (("customer id",), "not a field name"),
        (
            ("Customer.id",),
            "not a field name",
        ),  # "<step>.<field>": tests/unit/test_search_results.py
        (("1st",), "not a field name"),
        (("",), "not a field name"),
        (("x" * 65,), "not a field name"),
        ((42,), "not a field name"),
        (("orderId",), "the order's envelope"),
        (("workflow",), "the order's envelope"),
        (("replyTo",), "the order's envelope"),
        (("status",), "query string uses that name"),
        (("pageSize",), "query string uses that name"),
        (("email", "email"), "more than once"),
        (tuple(f"f{n}" for n in range(MAX_SEARCH_FIELDS + 1)), f"at most {MAX_SEARCH_FIELDS}"),
    ],
)
def test_a_search_field_declared_wrong_is_refused_naming_the_workflow_and_line(
    search_: Any, says: str
) -> None:
    with pytest.raises(DeclarationError) as refused:
        Workflow("w-bad", (StepSpec("s", agent="a"),), search=search_)
    text = str(refused.value)
    assert says in text and "workflow 'w-bad'" in text and "test_search.py:" in text


def test_the_searchable_fields_are_every_workflows_with_who_declares_them() -> None:
    assert search_fields() == {
        "customerId": ("checkout", "fulfilment", "order"),
        "email": ("fulfilment",),
    }


# --- what a value is as text ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("c-1", "c-1"),
        (" C-1 ", " C-1 "),  # exactly: case and spaces
        ("ü/#?\\", "ü/#?\\"),  # what a Table key refuses is only ever in a row's Value
        ("x" * MAX_VALUE_CHARS, "x" * MAX_VALUE_CHARS),
        (42, "42"),
        (-7, "-7"),
        (42.0, "42"),  # a whole number is the integer, however it was written
        (42.5, "42.5"),
        (1e100, "1e+100"),
        (2.0**60, "1.152921504606847e+18"),  # past 2**53 a float is not an exact integer
        (10**30, "1" + "0" * 30),
        ("", None),
        ("x" * (MAX_VALUE_CHARS + 1), None),
        (True, None),
        (None, None),
        ({"id": 1}, None),
        (["c-1"], None),
    ],
)
def test_a_value_is_matched_as_its_text(value: Any, text: str | None) -> None:
    assert search_text(value) == text


# --- the rows an order's transactions write ------------------------------------------------


def test_an_order_has_a_search_row_per_declared_field_it_carries_in_its_own_partition() -> None:
    s = build()
    submit(s, "o-1", "fulfilment", customerId="c-1", email="ann@example.com")
    submit(s, "o-2", "fulfilment", customerId=7, email=True)  # a bool is not searchable
    submit(s, "o-3", "order", email="ann@example.com")  # order searches by customerId only
    rows = search_rows(s, "o-1")
    assert sorted(r["Field"] for r in rows.values()) == ["customerId", "email"]
    key = layout.search_row("customerId", "c-1", "o-1", stored(s, "o-1").created_at)
    assert rows[key] == {
        "PartitionKey": layout.shard_of("o-1"),  # the order's partition: its transaction
        "RowKey": key,
        "OrderRef": "o-1",
        "Workflow": "fulfilment",
        "Field": "customerId",
        "Value": "c-1",
    }
    assert key.startswith(f"search|customerId|{digest('c-1')}|")
    assert [r["Value"] for r in search_rows(s, "o-2").values()] == ["7"]
    assert search_rows(s, "o-3") == {}


def test_a_finished_order_keeps_its_search_rows() -> None:
    s = build()
    submit(s, "o-done", customerId="c-1")
    s.scheduler.apply_reply(reply_to(sent(s, "o-done")[-1]))
    assert stored(s, "o-done").status is OrderStatus.COMPLETED
    assert len(search_rows(s, "o-done")) == 1
    assert found(s, search(*CUSTOMER)) == ["o-done"]


# --- listing what a search finds -----------------------------------------------------------


def fail(s: Services, order_id: str) -> None:
    """Its service refuses the order's request: error, not applied (so it can be fixed)."""
    request = sent(s, order_id)[-1]
    s.scheduler.apply_reply(reply_to(request, Outcome.REFUSED, error="HTTP 422 no"))
    assert stored(s, order_id).status is OrderStatus.ERROR


def test_a_search_lists_the_orders_with_that_value_newest_first_of_any_status() -> None:
    s = build()
    for n in range(12):
        submit(s, f"o-{n:02d}", customerId="c-1" if n % 3 == 0 else f"c-other-{n}")
    fail(s, "o-03")
    assert found(s, search(*CUSTOMER)) == ["o-09", "o-06", "o-03", "o-00"]
    assert found(s, search(*CUSTOMER, OrderStatus.ERROR)) == ["o-03"]
    assert found(s, search(*CUSTOMER, OrderStatus.PENDING)) == []
    assert found(s, search(*CUSTOMER, OrderStatus.PROCESSING)) == ["o-09", "o-06", "o-00"]
    assert found(s, search(*CUSTOMER, workflow="fulfilment")) == []
    created = stored(s, "o-06").created_at
    assert found(s, search(*CUSTOMER, created_from=created)) == ["o-09", "o-06"]
    assert found(s, search("customerId", "c-none")) == []


def test_a_search_pages_with_a_continuation_token_across_shards() -> None:
    s = build()
    ids = [f"p-{n:02d}" for n in range(23)]
    for order_id in ids:
        submit(s, order_id, customerId="c-1")
    assert len({layout.shard_of(i) for i in ids}) > 8
    first = s.admin.page(search(*CUSTOMER), 10)
    assert len(first["orders"]) == 10 and first["continuationToken"]
    assert found(s, search(*CUSTOMER), 10) == list(reversed(ids))
    assert found(s, search(*CUSTOMER), 23) == list(reversed(ids))


def test_a_search_with_a_status_fills_its_page_from_the_rows_after() -> None:
    """Rows that name orders of another status are read past, so a page is full unless
    the rows run out (at most ``SEARCH_READS`` reads a page)."""
    s = build()
    for n in range(8):
        submit(s, f"e-{n}", customerId="c-1")
        if n < 4:
            fail(s, f"e-{n}")  # the four oldest are in error, the four newest are not
    page = s.admin.page(search(*CUSTOMER, OrderStatus.ERROR), 3)
    assert [o["orderId"] for o in page["orders"]] == ["e-3", "e-2", "e-1"]
    rest = s.admin.page(search(*CUSTOMER, OrderStatus.ERROR), 3, page["continuationToken"])
    assert [o["orderId"] for o in rest["orders"]] == ["e-0"]


def test_a_string_and_a_number_with_the_same_text_are_found_by_the_same_search() -> None:
    s = build()
    submit(s, "n-str", customerId="42")
    submit(s, "n-int", customerId=42)
    submit(s, "n-float", customerId=42.0)
    submit(s, "n-text", customerId="42.0")
    assert found(s, search("customerId", "42")) == ["n-float", "n-int", "n-str"]
    assert found(s, search("customerId", "42.0")) == ["n-text"]


def test_a_fixed_order_is_found_under_its_new_value_and_not_its_old() -> None:
    s = build()
    submit(s, "f-1", customerId="c-old")
    fail(s, "f-1")
    before = set(search_rows(s, "f-1"))
    s.admin.resubmit("f-1", "ann", "wrong customer", {"customerId": "c-new"})
    after = set(search_rows(s, "f-1"))
    assert len(before) == len(after) == 1 and before != after  # moved in the fix's save
    assert found(s, search("customerId", "c-new")) == ["f-1"]
    assert found(s, search("customerId", "c-old")) == []
    s.scheduler.dispatch("f-1")
    fail(s, "f-1")
    s.admin.resubmit("f-1", "ann", "no customer after all", {"customerId": None})
    assert search_rows(s, "f-1") == {}
    assert found(s, search("customerId", "c-new")) == []


def test_rows_that_name_no_such_order_or_another_value_are_not_listed() -> None:
    s = build()
    submit(s, "real", customerId="c-2")
    created = stored(s, "real").created_at
    for order_id, created_at in (("ghost", created), ("real", created + timedelta(seconds=5))):
        key = layout.search_row("customerId", "c-1", order_id, created_at)
        s.store.put_row(
            {
                "PartitionKey": layout.shard_of(order_id),
                "RowKey": key,
                "OrderRef": order_id,
                "Workflow": "order",
                "Field": "customerId",
                "Value": "c-1",
            }
        )
    submit(s, "match", customerId="c-1")
    assert found(s, search(*CUSTOMER)) == ["match"]
    assert s.admin.bulk_targets(search(*CUSTOMER)) == ["match"]
    # the order's repair removes a stray row of its own
    assert s.admin.repair_index("real")["removed"] == [
        layout.search_row("customerId", "c-1", "real", created + timedelta(seconds=5))
    ]


def counting(s: Services) -> dict[str, int]:
    """Rows the store reads and orders it loads, from now on."""
    seen = {"rows": 0, "loads": 0}
    store = s.store
    read, load = store._range, store.load

    def counted_range(*args: Any, **kwargs: Any) -> Any:
        rows = read(*args, **kwargs)
        seen["rows"] += len(rows)
        return rows

    def counted_load(order_id: str) -> Any:
        seen["loads"] += 1
        return load(order_id)

    store._range = counted_range  # type: ignore[method-assign]
    store.load = counted_load  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("others", [40, 400])
def test_what_a_search_reads_grows_with_the_orders_that_match_not_with_all(others: int) -> None:
    s = build()
    for n in range(others):
        submit(s, f"x-{n:03d}", customerId=f"c-{n}")
    submit(s, "the-one", customerId="c-wanted")
    seen = counting(s)
    page = s.admin.page(search("customerId", "c-wanted"), 50)
    assert [o["orderId"] for o in page["orders"]] == ["the-one"]
    # one search row read, one order loaded (its two records): whatever else is stored
    assert seen == {"rows": 1 + 2, "loads": 1}


# --- the query string ----------------------------------------------------------------------


def test_the_query_string_names_a_search_by_a_declared_field() -> None:
    assert parse_filter({"customerId": "c-1"}) == ListFilter(None, search=CUSTOMER)
    assert parse_filter({"customerId": "c-1", "status": "error"}) == ListFilter(
        OrderStatus.ERROR, search=CUSTOMER
    )
    assert parse_filter({"customerId": "", "status": "error"}) == ListFilter(OrderStatus.ERROR)
    assert parse_filter({"email": "a b@x", "code": "key"}).search == ("email", "a b@x")


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"phone": "1"}, "'phone' is not a field orders can be searched by"),
        ({"phone": "1"}, "customerId (checkout, fulfilment, order); email (fulfilment)"),
        ({"customerId": "c", "email": "e"}, "search one field at a time"),
        ({"customerId": "x" * (MAX_VALUE_CHARS + 1)}, "at most 256 characters"),
        ({"customerId": ""}, "give ?status="),
        ({"customerId": "c", "status": "lost"}, "give ?status= one of"),
    ],
)
def test_a_search_the_list_cannot_make_says_what_it_can(params: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=None) as refused:
        parse_filter(params)
    assert says in str(refused.value)


def cli_where(**kw: Any) -> Callable[[], ListFilter]:
    args = argparse.Namespace(**{"status": None, "workflow": None, "where": None, **kw})
    return lambda: cli._where(args)


def test_the_cli_searches_with_where() -> None:
    assert cli_where(where=["customerId=c-1"])() == ListFilter(None, search=CUSTOMER)
    assert cli_where(where=["email=a=b"], status="error")() == ListFilter(
        OrderStatus.ERROR, search=("email", "a=b")
    )
    for wrong, says in (
        ({"where": ["customerId"]}, "FIELD=VALUE"),
        ({"where": ["customerId="]}, "needs a value"),
        ({"where": ["status=error"]}, "FIELD=VALUE"),
        ({"where": ["phone=1"]}, "not a field orders can be searched by"),
        ({}, "give --status, or --where"),
    ):
        with pytest.raises(ValueError) as refused:
            cli_where(**wrong)()
        assert says in str(refused.value)
    parsed = cli.parse_args(["orders", "--where", "customerId=c-1"])
    assert parsed.command == "orders" and parsed.where == ["customerId=c-1"]


def test_the_cli_refuses_two_searches_with_the_apis_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--where a=1 --where b=2`` is refused (exit 2, on stderr), never a search of one."""
    with pytest.raises(ValueError) as api:
        parse_filter({"customerId": "c-1", "email": "a@b"})
    for argv in (
        ["orders", "--where", "customerId=c-1", "--where", "email=a@b"],
        ["list", "--where", "customerId=c-1", "--where", "customerId=c-2"],
    ):
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2
        captured = capsys.readouterr()
        assert "search one field at a time" in captured.err and not captured.out
    assert str(api.value) == "search one field at a time (got customerId, email)"
    with pytest.raises(SystemExit):
        cli.parse_args(["orders", "--where", "customerId=c-1", "--where", "email=a@b"])
    assert "search one field at a time (got customerId, email)" in capsys.readouterr().err
