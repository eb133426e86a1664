"""Search by a step's result (docs/contracts.md §3.17), in memory: what a workflow may
declare (``"<step>.<field>"`` of a task or an ``Event``, searched by the field's name, one
declared name per query parameter across workflows), what ``GET /api/workflows`` shows of
it, what a plan pins, the rows a step's success writes in the save that records it, and
``GET /api/orders?rma=`` through the API's own function. On both stores and Azurite:
``tests/integration/test_store_contract.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import pytest

from admin import __main__ as cli
from admin.query import parse_filter
from bootstrap import reset_app_context
from core import workflows
from core.flow import Compensation, Delay, Event, StepSpec, Workflow
from core.outcome import Outcome
from core.plans import Plan
from core.ports import ListFilter
from core.search import check_fields, searchable
from core.states import OrderStatus, StepState
from core.workflows import Agent, DeclarationError, search_fields
from stores import layout
from tests.support import app_function, declarations, on_devhost
from tests.unit.test_agent_pause import App
from tests.unit.test_agent_pause import build as build_app
from tests.unit.test_fix_and_resubmit import sent
from tests.unit.test_search import found, search_rows, submit
from tests.unit.test_services_in_memory import Services, build, reply_to, stored

FIXTURE = "tests.fixtures.result_search"
RETURNS = ("customerId", "receive-return.rma", "inspected.grade", "refund.refundId")


def returns_flow(search: tuple[str, ...]) -> Workflow:
    return Workflow(
        "w-res",
        (
            StepSpec("receive-return", agent="desk", compensation=Compensation("undo-return")),
            Event("inspected", timeout_seconds=60),
            Delay("cool-off", seconds=5),
        ),
        search=search,
    )


# --- what a workflow may declare ---------------------------------------------------------


def test_a_step_result_field_is_searched_by_its_field_name_and_shown_with_its_source() -> None:
    flow = returns_flow(("customerId", "receive-return.rma", "inspected.grade"))
    assert flow.search == ("customerId", "receive-return.rma", "inspected.grade")
    assert flow.describe()["search"] == [
        {"name": "customerId", "parameter": "customerId", "from": "order"},
        {
            "name": "receive-return.rma",
            "parameter": "rma",
            "from": "result",
            "step": "receive-return",
        },
        {"name": "inspected.grade", "parameter": "grade", "from": "result", "step": "inspected"},
    ]


@pytest.mark.parametrize(
    ("search_", "says"),
    [
        (("receive-retrun.rma",), "step 'receive-retrun', which this workflow does not have"),
        (("receive-retrun.rma",), "its steps: receive-return, undo-return, inspected, cool-off"),
        (("cool-off.until",), "delay 'cool-off': a Delay's result is always {}"),
        (("undo-return.ref",), "compensation 'undo-return'"),
        (("receive-return.status",), "the order list's query string uses ?status= for"),
        (("receive-return.orderId",), "?orderId= would read as the order's envelope"),
        (("Receive.rma",), "not a field name"),
        (("receive-return.",), "not a field name"),
        (("receive-return.rma.id",), "not a field name"),
        (("receive-return.rma", "rma"), "'receive-return.rma' and 'rma'"),
        (("receive-return.rma", "inspected.rma"), "both would be searched by ?rma="),
        (("receive-return.rma", "receive-return.rma"), "more than once"),
    ],
)
def test_a_search_name_no_order_or_result_can_carry_is_refused_when_declared(
    search_: tuple[str, ...], says: str
) -> None:
    with pytest.raises(DeclarationError) as refused:
        returns_flow(search_)
    text = str(refused.value)
    assert says in text and "workflow 'w-res'" in text and "test_search_results.py:" in text


def declared(*flows: Workflow) -> SimpleNamespace:
    """A declarations module of ``flows`` (and the default ``order``)."""
    return SimpleNamespace(
        __file__="decls.py",
        AGENTS=[Agent("orders"), Agent("desk")],
        WORKFLOWS=[Workflow("order", (StepSpec("process", agent="orders"),)), *flows],
    )


def test_two_workflows_searching_one_parameter_by_two_names_are_refused_naming_both() -> None:
    rma_of_order = Workflow("w-plain", (StepSpec("s", agent="orders"),), search=("rma",))
    with pytest.raises(DeclarationError) as refused:
        workflows.validate(declared(returns_flow(("receive-return.rma",)), rma_of_order))
    text = str(refused.value)
    assert "'receive-return.rma' and 'rma' (workflow 'w-res' and workflow 'w-plain')" in text
    assert "?rma=" in text and "test_search_results.py:" in text
    other_step = Workflow(
        "w-other", (StepSpec("check-in", agent="desk"),), search=("check-in.rma",)
    )
    with pytest.raises(DeclarationError) as refused:
        workflows.validate(declared(returns_flow(("receive-return.rma",)), other_step))
    assert "'receive-return.rma' and 'check-in.rma'" in str(refused.value)
    # the same declared name in two workflows is one search, as a plain field is
    same = Workflow("w-same", (StepSpec("receive-return", agent="desk"),), search=RETURNS[1:2])
    checked = workflows.validate(declared(returns_flow(("receive-return.rma",)), same))
    assert set(checked["WORKFLOWS"]) == {"order", "w-res", "w-same"}


def test_the_declared_names_are_searched_by_their_parameters_with_who_declares_them() -> None:
    with declarations(FIXTURE):
        assert search_fields() == {
            "customerId": ("order", "returns"),
            "grade": ("returns",),
            "refundId": ("returns",),
            "rma": ("exchange", "return-undone", "returns"),
        }
        listed = cli.workflows_json()["workflows"]
        [returns] = [w for w in listed if w["workflow"] == "returns"]
        assert [(s["name"], s["from"], s.get("step")) for s in returns["search"]] == [
            ("customerId", "order", None),
            ("receive-return.rma", "result", "receive-return"),
            ("inspected.grade", "result", "inspected"),
            ("refund.refundId", "result", "refund"),
        ]
        assert parse_filter({"rma": "R-1"}) == ListFilter(None, search=("rma", "R-1"))
        with pytest.raises(ValueError) as refused:
            parse_filter({"receive-return.rma": "R-1"})
        assert "rma (exchange, return-undone, returns, from step receive-return's result)" in str(
            refused.value
        )


def test_a_plan_pins_its_result_fields() -> None:
    plan = Plan.of(returns_flow(("customerId", "receive-return.rma")), 30)
    assert plan.search == ("customerId", "receive-return.rma")
    assert plan.to_json()["search"] == ["customerId", "receive-return.rma"]
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_a_result_value_is_matched_as_an_order_value_is() -> None:
    results = {"receive-return": {"rma": 42.0, "id": True}, "inspected": {}}
    names = ("customerId", "receive-return.rma", "receive-return.id", "inspected.grade")
    assert searchable({"customerId": "c-1", "rma": "R-body"}, names, results) == {
        "customerId": "c-1",
        "receive-return.rma": "42",  # a number as its text; a bool is not searchable
    }
    not_an_object: Any = {"receive-return": ["R-1"]}
    assert searchable({}, ("receive-return.rma",), not_an_object) == {}
    assert check_fields(["a.b"]) == ("a.b",)


# --- the rows a step's success writes -------------------------------------------------------


@pytest.fixture
def s() -> Iterator[Services]:
    built = build()  # (the bootstrap puts the settings' declarations to use: then ours)
    with declarations(FIXTURE):
        yield built


def answer(s: Services, order_id: str, outcome: Outcome = Outcome.SUCCEEDED, **kw: Any) -> None:
    """The step the order's last request went out for answers."""
    s.scheduler.apply_reply(reply_to(sent(s, order_id)[-1], outcome, **kw))
    order = stored(s, order_id)
    if order.status is OrderStatus.PROCESSING and any(
        r.process_state is StepState.PENDING for r in order.active_steps()
    ):
        s.scheduler.dispatch(order_id)


def rows_by_field(s: Services, order_id: str) -> dict[str, str]:
    return {r["Field"]: r["Value"] for r in search_rows(s, order_id).values()}


def test_a_result_field_is_indexed_in_the_save_that_records_the_steps_success(s: Services) -> None:
    submit(s, "r-1", "returns", customerId="c-1", rma="R-in-the-order")
    assert rows_by_field(s, "r-1") == {"customerId": "c-1"}  # not the order's own rma
    assert found(s, ListFilter(None, search=("rma", "R-in-the-order"))) == []
    answer(s, "r-1", result={"rma": "R-123", "grade": "not this one"})
    assert rows_by_field(s, "r-1") == {"customerId": "c-1", "receive-return.rma": "R-123"}
    [key] = [k for k, r in search_rows(s, "r-1").items() if r["Field"] == "receive-return.rma"]
    assert key == layout.search_row("rma", "R-123", "r-1", stored(s, "r-1").created_at)
    assert found(s, ListFilter(None, search=("rma", "R-123"))) == ["r-1"]
    # an Event's result is what was delivered
    s.admin.deliver_event("r-1", "inspected", {"result": {"grade": "B"}}, "ann")
    s.scheduler.dispatch("r-1")  # refund
    assert found(s, ListFilter(None, search=("grade", "B"))) == ["r-1"]
    answer(s, "r-1", result={"refundId": "RF-9"})  # refund
    assert found(s, ListFilter(OrderStatus.PROCESSING, search=("refundId", "RF-9"))) == ["r-1"]
    # notify fails for good: the refund is undone, and is still found by its id
    answer(s, "r-1", Outcome.REFUSED, error="HTTP 422 no such address")
    answer(s, "r-1", result={})  # reverse-refund
    order = stored(s, "r-1")
    assert order.status is OrderStatus.COMPENSATED
    assert found(s, ListFilter(None, search=("refundId", "RF-9"))) == ["r-1"]
    assert rows_by_field(s, "r-1") == {
        "customerId": "c-1",
        "receive-return.rma": "R-123",
        "inspected.grade": "B",
        "refund.refundId": "RF-9",
    }


def test_a_step_that_failed_is_not_found_by_its_result_and_one_order_per_workflow(
    s: Services,
) -> None:
    submit(s, "r-failed", "returns")
    answer(s, "r-failed", Outcome.REFUSED, error="HTTP 422 no")
    assert stored(s, "r-failed").status is OrderStatus.COMPENSATED  # it unwound
    assert rows_by_field(s, "r-failed") == {}
    submit(s, "x-1", "exchange")
    answer(s, "x-1", result={"rma": "R-7"})
    submit(s, "r-2", "returns")
    answer(s, "r-2", result={"rma": "R-7"})
    assert found(s, ListFilter(None, search=("rma", "R-7"))) == ["r-2", "x-1"]
    assert found(s, ListFilter(None, workflow="exchange", search=("rma", "R-7"))) == ["x-1"]


def test_a_row_whose_value_is_not_the_orders_result_lists_nothing(s: Services) -> None:
    """A digest could collide: the search checks each order's own value, read from its
    step's result as its plan names it."""
    submit(s, "r-own", "returns")
    answer(s, "r-own", result={"rma": "R-own"})
    created = stored(s, "r-own").created_at
    s.store.put_row(
        {
            "PartitionKey": layout.shard_of("r-own"),
            "RowKey": layout.search_row("rma", "R-other", "r-own", created),
            "OrderRef": "r-own",
            "Workflow": "returns",
            "Field": "receive-return.rma",
            "Value": "R-other",
        }
    )
    assert found(s, ListFilter(None, search=("rma", "R-other"))) == []
    assert found(s, ListFilter(None, search=("rma", "R-own"))) == ["r-own"]


# --- through the API ---------------------------------------------------------------------


@pytest.fixture
def app() -> Iterator[App]:
    built = build_app()
    app_function("list_orders")  # the app, imported, put the settings' declarations to use
    reset_app_context(on_devhost(built.ctx))  # GET /api/orders asks who calls
    with declarations(FIXTURE):
        yield built
    reset_app_context(None)


def get_orders(**params: str) -> tuple[int, Any]:
    request = func.HttpRequest(
        method="GET", url="http://localhost/api/orders", params=params, body=b""
    )
    response: func.HttpResponse = app_function("list_orders")(request)
    return response.status_code, json.loads(response.get_body())


def test_get_orders_finds_by_rma_once_receive_return_succeeded_and_not_before(app: App) -> None:
    app.submit("api-1", workflow="returns", customerId="c-1")
    assert get_orders(rma="R-123") == (200, {"orders": [], "continuationToken": None})
    [request] = [r for r in app.transport.requests if r.order_id == "api-1"]
    app.ctx.scheduler.apply_reply(reply_to(request, result={"rma": "R-123"}))
    status, page = get_orders(rma="R-123")
    assert status == 200 and [o["orderId"] for o in page["orders"]] == ["api-1"]
    assert get_orders(rma="R-123", status="completed")[1]["orders"] == []
    assert get_orders(rma="R-999")[1]["orders"] == []
    status, refused = get_orders(**{"receive-return.rma": "R-123"})
    assert (
        status == 400
        and "rma (exchange, return-undone, returns, from step receive-return's result)"
        in (refused["error"])
    )
