"""The state store and the sweeps against damaged data, on real Azurite.

- One bad row (an order whose records cannot be parsed, a malformed index row, an
  outbox row that cannot be deleted) never ends a supervisor run or a sweep: the
  rest are handled, the bad order gets ONE operator alert per process.
- Index rows that diverge from the state (deleted or added by hand, a restore, a
  layout change) never make saves fail forever; ``repair_index`` rebuilds them,
  conditional on the order record's ETag.
- A write whose answer is lost, and whose check is lost too, is reported as unknown
  (503, exit status 3), never as refused (409).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import azure.functions as func
import pytest
import requests
from azure.core.exceptions import ServiceRequestError
from azure.data.tables import TableServiceClient, UpdateMode

from admin import triggers
from admin.__main__ import main
from bootstrap import AppContext, bootstrap, reset_app_context
from bootstrap.clients import retry_options
from core.errors import CorruptOrder, InvalidContinuationToken, StorageUnavailable
from core.messages import AgentReply
from core.model import Order
from core.order_message import decode_order
from core.outcome import Outcome
from core.states import OrderStatus, StepState
from core.timefmt import sortable
from core.workflows import WORKFLOWS, Plan
from messaging.storage_queues import StorageQueues
from messaging.wire import decode_request
from scheduler.service import Handled
from stores import layout
from stores.tables import TableStateStore
from tests.integration.test_storage_faults import FaultyAdapter, faulty_transport, is_batch
from tests.support import FakeClock, drain_json, drain_requests, make_context, settings_from


@pytest.fixture
def ctx(storage_connection: str, tag: str, clock: FakeClock) -> AppContext:
    return make_context(storage_connection, tag, clock=clock, max_failures=3, timeout=30)


def same_shard(tag: str, count: int) -> list[str]:
    """``count`` order ids in one shard (so their rows are read in a known order)."""
    ids: list[str] = []
    n = 0
    while len(ids) < count:
        candidate = f"{tag}-{n}"
        if not ids or layout.shard_of(candidate) == layout.shard_of(ids[0]):
            ids.append(candidate)
        n += 1
    return ids


def rows(store: TableStateStore, order_id: str) -> list[str]:
    return sorted(
        e["RowKey"]
        for e in store.table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": layout.shard_of(order_id)}
        )
        if f"|{order_id}|" in e["RowKey"] or e["RowKey"].endswith(f"|{order_id}")
    )


def index_rows(store: TableStateStore, order_id: str) -> list[str]:
    return [r for r in rows(store, order_id) if layout.is_index_row(r)]


def corrupt(store: TableStateStore, order_id: str, **properties: Any) -> None:
    """Overwrite properties of the order record, as a bad manual edit would."""
    store.table.update_entity(
        {
            "PartitionKey": layout.shard_of(order_id),
            "RowKey": layout.order_row(order_id),
            **properties,
        },
        mode=UpdateMode.MERGE,
    )


def submit(ctx: AppContext, order_id: str) -> None:
    assert ctx.scheduler.submit(json.dumps({"orderId": order_id}).encode()) is Handled.ACCEPTED


def accepted(order_id: str, ctx: AppContext, **fields: str) -> Order:
    message = decode_order(json.dumps({"orderId": order_id, **fields}))
    return Order.accept(message, Plan.of(WORKFLOWS["order"], 30), ctx.clock())


def alerts_for(ctx: AppContext) -> list[dict[str, Any]]:
    return drain_json(ctx, ctx.names.operator_alerts)


def alert_records(caplog: pytest.LogCaptureFixture, order_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"OPERATOR ALERT order={order_id} ")
    ]


# --- task 7: one bad row never ends a run -----------------------------------------------


def test_load_reports_unreadable_records_as_a_corrupt_order(ctx: AppContext, tag: str) -> None:
    order_id = f"{tag}-bad"
    submit(ctx, order_id)
    corrupt(ctx.store, order_id, Plan="{not json")

    with pytest.raises(CorruptOrder) as info:
        ctx.store.load(order_id)

    assert info.value.order_id == order_id
    assert info.value.retryable is False
    assert "cannot be read" in info.value.message


def test_the_supervisor_recovers_the_rest_and_alerts_once_about_a_corrupt_order(
    ctx: AppContext, clock: FakeClock, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    bad, good = same_shard(tag, 2)
    submit(ctx, bad)
    clock.advance(1)  # the bad one expires first: it is read first
    submit(ctx, good)
    drain_requests(ctx)
    corrupt(ctx.store, bad, Plan="{not json")
    clock.advance(40)

    with caplog.at_level(logging.ERROR):
        first = ctx.supervisor.run()
        clock.advance(40)
        second = ctx.supervisor.run()

    assert (first.examined, first.retried) == (2, 1)
    assert len(first.errors) == 1 and first.errors[0].startswith(f"{bad}: CorruptOrder")
    good_order = ctx.store.load(good)
    assert good_order is not None and good_order.steps[0].process_state is StepState.PENDING
    assert (second.examined, second.retried, len(second.errors)) == (1, 0, 1)
    [alert] = alerts_for(ctx)
    assert (alert["orderId"], alert["step"]) == (bad, "process")
    assert "cannot be read" in alert["reason"]
    assert len(alert_records(caplog, bad)) == 1
    assert sum(bad in r.getMessage() and "cannot handle" in r.getMessage() for r in caplog.records)
    assert sum(r.exc_info is not None for r in caplog.records if bad in r.getMessage()) == 1


def test_the_sweep_dispatches_the_rest_and_alerts_once_about_a_corrupt_order(
    ctx: AppContext, clock: FakeClock, tag: str, caplog: pytest.LogCaptureFixture
) -> None:
    bad, good = same_shard(tag, 2)
    ctx.store.create(accepted(bad, ctx))  # Pending, never dispatched (a lost dispatch)
    clock.advance(1)
    ctx.store.create(accepted(good, ctx))
    step_row = layout.step_row(bad, 0, "process")
    damaged = ctx.store.table.get_entity(layout.shard_of(bad), step_row)
    del damaged["ProcessState"]  # a property missing altogether
    ctx.store.table.update_entity(damaged, mode=UpdateMode.REPLACE)
    clock.advance(20)

    with caplog.at_level(logging.ERROR):
        first = ctx.scheduler.sweep()
        second = ctx.scheduler.sweep()

    assert first.dispatched == 1 and len(first.errors) == 1 and bad in first.errors[0]
    assert [decode_request(t).order_id for t in drain_requests(ctx)] == [good]
    assert second.dispatched == 0 and len(second.errors) == 1
    assert [a["orderId"] for a in alerts_for(ctx)] == [bad]
    assert len(alert_records(caplog, bad)) == 1


def test_a_malformed_index_row_is_skipped_not_fatal(
    ctx: AppContext, clock: FakeClock, tag: str
) -> None:
    order_id = f"{tag}-ok"
    submit(ctx, order_id)
    drain_requests(ctx)
    shard = layout.shard_of(order_id)
    for row in ("processing|garbage", "processing|20200101T000000.000000Z|no-order-ref|x"):
        ctx.store.table.create_entity({"PartitionKey": shard, "RowKey": row, "Junk": 1})
    clock.advance(40)

    report = ctx.supervisor.run()

    assert (report.examined, report.retried, report.errors) == (1, 1, [])


def test_an_outbox_row_that_cannot_be_deleted_stays_for_the_sweep(
    ctx: AppContext, clock: FakeClock, tag: str
) -> None:
    """The notice went out; deleting its outbox row fails (connection refused): no error
    for the caller, and the row stays, so the sweep sends the notice again (at least once)."""

    class RefusesDeletes:
        def __init__(self, table: Any) -> None:
            self._table = table

        def delete_entity(self, *args: Any, **kwargs: Any) -> None:
            raise ServiceRequestError("connection refused")

        def __getattr__(self, name: str) -> Any:
            return getattr(self._table, name)

    order_id = f"{tag}-outbox"
    saved = ctx.store.create(accepted(order_id, ctx, replyTo=f"st-{tag}"))
    assert saved.entries  # the "received" notice, committed with the order
    failing = TableStateStore(RefusesDeletes(ctx.store.table))  # type: ignore[arg-type]
    failing.delete_outbox(saved)  # no exception: the caller's work is done
    later = clock() + timedelta(days=1)
    assert [e.row for e in ctx.store.stale_outbox(later)] == [e.row for e in saved.entries]
    ctx.store.delete_outbox(saved)  # the sweep's turn: now it goes
    assert list(ctx.store.stale_outbox(later)) == []


def test_an_outbox_row_that_cannot_be_read_does_not_stop_the_sweep(
    ctx: AppContext, clock: FakeClock, tag: str
) -> None:
    order_id = f"{tag}-after-outbox"
    ctx.store.create(accepted(order_id, ctx))
    shard = layout.shard_of(order_id)
    ctx.store.table.create_entity(
        {"PartitionKey": shard, "RowKey": f"outbox|{sortable(clock())}|x|1", "Nothing": "else"}
    )
    ctx.store.table.create_entity(
        {
            "PartitionKey": shard,
            "RowKey": f"outbox|{sortable(clock())}|y|1",
            "OrderRef": "y",
            "NoticeKind": "alert",
            "Queue": "",
            "Body": "{not json",
        }
    )
    clock.advance(60)

    report = ctx.scheduler.sweep()

    assert report.dispatched == 1
    assert [decode_request(t).order_id for t in drain_requests(ctx)] == [order_id]


# --- task 8: index rows that diverged ------------------------------------------------------


def test_a_save_succeeds_when_the_processing_row_was_deleted_by_hand(
    ctx: AppContext, tag: str
) -> None:
    order_id = f"{tag}-gone"
    submit(ctx, order_id)  # claimed: Processing
    [processing] = [r for r in index_rows(ctx.store, order_id) if r.startswith("processing|")]
    ctx.store.table.delete_entity(layout.shard_of(order_id), processing)
    order = ctx.store.load(order_id)
    assert order is not None
    step = order.steps[0]

    order.apply_reply(
        AgentReply(
            order_id,
            "process",
            step.attempt,
            step.complete_by,
            Outcome.SUCCEEDED,
            {"ok": 1},
            token=step.token_for(step.attempt),
        ),
        ctx.clock(),
    )
    ctx.store.save(order)

    final = ctx.store.load(order_id)
    assert final is not None and final.status is OrderStatus.COMPLETED
    assert index_rows(ctx.store, order_id) == [
        layout.status_row("completed", order_id, final.created_at)
    ]


def test_a_save_succeeds_when_every_row_it_would_delete_is_gone(ctx: AppContext, tag: str) -> None:
    order_id = f"{tag}-allgone"
    ctx.store.create(accepted(order_id, ctx))
    for row in index_rows(ctx.store, order_id):  # pending| and status|pending|
        ctx.store.table.delete_entity(layout.shard_of(order_id), row)
    order = ctx.store.load(order_id)
    assert order is not None

    order.claim("me", ctx.clock())
    ctx.store.save(order)

    assert [r.split("|")[0] for r in index_rows(ctx.store, order_id)] == ["processing", "status"]
    again = ctx.store.load(order_id)
    assert again is not None and again.steps[0].locked_by == "me"


def test_repair_removes_a_stray_index_row(ctx: AppContext, clock: FakeClock, tag: str) -> None:
    order_id = f"{tag}-stray"
    submit(ctx, order_id)  # Processing
    before = index_rows(ctx.store, order_id)
    stray = layout.pending_row(clock() - timedelta(hours=1), order_id, "process")
    ctx.store.table.create_entity(
        {
            "PartitionKey": layout.shard_of(order_id),
            "RowKey": stray,
            "OrderRef": order_id,
            "StepName": "process",
        }
    )
    assert [e.order_id for e in ctx.store.due_pending(clock())] == [order_id]

    report = ctx.admin.repair_index(order_id)

    assert report["repaired"] is True
    assert (report["removed"], report["added"], report["rewritten"]) == ([stray], [], [])
    assert index_rows(ctx.store, order_id) == before
    assert list(ctx.store.due_pending(clock())) == []
    assert ctx.admin.repair_index(order_id)["repaired"] is False  # idempotent


def test_repair_restores_missing_index_rows(ctx: AppContext, clock: FakeClock, tag: str) -> None:
    order_id = f"{tag}-missing"
    submit(ctx, order_id)
    before = index_rows(ctx.store, order_id)
    for row in before:
        ctx.store.table.delete_entity(layout.shard_of(order_id), row)
    clock.advance(40)
    assert ctx.supervisor.run().examined == 0  # the supervisor cannot see it

    report = ctx.admin.repair_index(order_id)

    assert sorted(report["added"]) == before and report["removed"] == []
    assert index_rows(ctx.store, order_id) == before
    assert ctx.supervisor.run().retried == 1  # supervised again


def test_repair_rewrites_an_index_row_with_wrong_properties(ctx: AppContext, tag: str) -> None:
    order_id = f"{tag}-wrong"
    submit(ctx, order_id)
    [processing] = [r for r in index_rows(ctx.store, order_id) if r.startswith("processing|")]
    ctx.store.table.update_entity(
        {
            "PartitionKey": layout.shard_of(order_id),
            "RowKey": processing,
            "OrderRef": order_id,
            "StepName": "not-this-step",
        },
        mode=UpdateMode.REPLACE,
    )

    report = ctx.admin.repair_index(order_id)

    assert report["rewritten"] == [processing]
    entity = ctx.store.table.get_entity(layout.shard_of(order_id), processing)
    assert entity["StepName"] == "process"


def test_repair_cannot_race_a_save(
    ctx: AppContext, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    order_id = f"{tag}-race"
    submit(ctx, order_id)
    shard = layout.shard_of(order_id)
    stray = f"status|error|{order_id}"
    ctx.store.table.create_entity({"PartitionKey": shard, "RowKey": stray, "OrderRef": order_id})
    table = ctx.store.table
    real_submit = table.submit_transaction
    interleaved: list[str] = []

    def submit_after_a_save(ops: Any, **kwargs: Any) -> Any:
        if not interleaved:
            # Between the repair's read and its write, the reply is applied: the order
            # completes, and the processing row the repair read is no longer wanted.
            interleaved.append("save")
            order = ctx.store.load(order_id)
            assert order is not None
            step = order.steps[0]
            order.apply_reply(
                AgentReply(
                    order_id,
                    "process",
                    step.attempt,
                    step.complete_by,
                    Outcome.SUCCEEDED,
                    {},
                    token=step.token_for(step.attempt),
                ),
                ctx.clock(),
            )
            ctx.store.save(order)
        return real_submit(ops, **kwargs)

    monkeypatch.setattr(table, "submit_transaction", submit_after_a_save)

    report = ctx.store.repair_index(order_id)

    assert interleaved == ["save"]
    assert report["status"] == "completed" and report["removed"] == [stray]
    final = ctx.store.load(order_id)
    assert final is not None
    assert index_rows(ctx.store, order_id) == [
        layout.status_row("completed", order_id, final.created_at)
    ]


def test_repair_of_an_unknown_order_is_not_found(ctx: AppContext, tag: str) -> None:
    from core.errors import OrderNotFound

    with pytest.raises(OrderNotFound):
        ctx.admin.repair_index(f"{tag}-nobody")


def test_repair_index_from_the_command_line(
    storage_connection: str, capsys: pytest.CaptureFixture[str]
) -> None:
    default = bootstrap(
        settings_from(
            {
                "AzureWebJobsStorage": storage_connection,
                "AGENT_TRANSPORT": "storage",
                "REMOTE_SERVICE_URL": "http://127.0.0.1:9",
            }
        )
    )
    default.provision()
    order_id = f"cli-repair-{uuid.uuid4().hex[:8]}"
    default.store.create(accepted(order_id, default))
    [status_row] = [r for r in index_rows(default.store, order_id) if r.startswith("status|")]
    default.store.table.delete_entity(layout.shard_of(order_id), status_row)

    code = main(["--connection", storage_connection, "repair-index", order_id])

    assert code == 0
    assert json.loads(capsys.readouterr().out)["added"] == [status_row]
    assert main(["--connection", storage_connection, "repair-index", f"{order_id}-x"]) == 4


# --- task 9: continuation tokens on the real store ------------------------------------------


def test_pages_follow_through_the_http_function(ctx: AppContext, tag: str) -> None:
    ids = {f"{tag}-p{n:03d}" for n in range(60)}
    for order_id in ids:
        ctx.store.create(accepted(order_id, ctx))
    reset_app_context(ctx)
    try:
        seen: list[str] = []
        token = ""
        for _ in range(10):
            params = {"status": "pending", "pageSize": "25"}
            if token:
                params["continuationToken"] = token
            response = triggers.list_orders(
                func.HttpRequest("GET", "/api/orders", params=params, body=b"")
            )
            assert response.status_code == 200
            page = json.loads(response.get_body())
            seen += [o["orderId"] for o in page["orders"]]
            token = page["continuationToken"]
            if not token:
                break
        assert sorted(seen) == sorted(ids)
    finally:
        reset_app_context(None)


@pytest.mark.parametrize(
    "position",
    [
        {"PartitionKey": "zzz", "RowKey": "zzz"},
        {"PartitionKey": "1!12!c2hhcmQtMDM-", "RowKey": "1!8!eHl6"},
        {"PartitionKey": "shard-03", "RowKey": "~"},
    ],
)
def test_a_well_formed_forged_position_is_an_answer_or_a_400_never_a_500(
    ctx: AppContext, position: dict[str, str]
) -> None:
    real = [f"forged-{n}" for n in range(3)]
    for order_id in real:
        ctx.store.create(accepted(order_id, ctx))
    token = f"3:{json.dumps(position)}"
    try:
        ids, _ = ctx.store.list_by_status(OrderStatus.PENDING, 10, token)
    except InvalidContinuationToken:
        return  # refused as a token this store never made: a 400
    # an answer: a page of real pending orders (from wherever the position points), or none
    assert set(ids) <= set(real), ids


def test_a_corrupt_order_in_a_listing_is_named_not_fatal(ctx: AppContext, tag: str) -> None:
    bad, good = f"{tag}-lbad", f"{tag}-lgood"
    for order_id in (bad, good):
        ctx.store.create(accepted(order_id, ctx))
    corrupt(ctx.store, bad, Body="{not json")

    page = ctx.admin.page(OrderStatus.PENDING)

    assert [o["orderId"] for o in page["orders"]] == [good]
    assert [u["orderId"] for u in page["unreadable"]] == [bad]


# --- task 11: an unknown outcome is never a false refusal ----------------------------------


def is_writeid_read(request: requests.PreparedRequest) -> bool:
    return request.method == "GET" and "WriteId" in (request.url or "")


@pytest.fixture
def faulty(
    storage_connection: str, tag: str, clock: FakeClock
) -> Iterator[tuple[AppContext, FaultyAdapter]]:
    adapter = FaultyAdapter()  # its "applied-500": applied, then a 500 (the SDK retries)
    context = make_context(storage_connection, tag, clock=clock)
    tables = TableServiceClient.from_connection_string(
        storage_connection, transport=faulty_transport(adapter), **retry_options("table")
    )
    from azure.storage.queue import QueueServiceClient

    queues = QueueServiceClient.from_connection_string(
        storage_connection, transport=faulty_transport(adapter), **retry_options("queue")
    )
    context.__dict__["store"] = TableStateStore(tables.get_table_client(context.names.state_table))
    context.__dict__["queues"] = StorageQueues(queues)
    yield context, adapter
    reset_app_context(None)


def in_error(ctx: AppContext, order_id: str) -> None:
    submit(ctx, order_id)
    [request] = [decode_request(t) for t in drain_requests(ctx) if order_id in t]
    ctx.scheduler.apply_reply(request.refused("HTTP 422 card declined"))
    order = ctx.store.load(order_id)
    assert order is not None and order.status is OrderStatus.ERROR


#: How the transaction's answer is lost: no answer at all (a read timeout: the SDK does
#: not retry the POST), or a 500 after it applied (the SDK retries: 412, "refused").
LOSSES = ["lose", "applied-500"]


def lose_the_answer_and_the_check(adapter: FaultyAdapter, loss: str = "lose") -> None:
    adapter.add(is_batch, loss)
    # The check re-reads WriteId: 503 on the first try and on every retry (3).
    adapter.add(is_writeid_read, "503", "503", "503", "503")


@pytest.mark.parametrize("loss", LOSSES)
def test_an_applied_resubmit_whose_answer_and_check_are_lost_is_503_not_409(
    faulty: tuple[AppContext, FaultyAdapter], storage_connection: str, tag: str, loss: str
) -> None:
    ctx, adapter = faulty
    order_id = f"{tag}-unknown"
    in_error(ctx, order_id)
    lose_the_answer_and_the_check(adapter, loss)
    reset_app_context(ctx)

    response = triggers.resubmit_order(
        func.HttpRequest(
            "POST",
            f"/api/orders/{order_id}/resubmit",
            route_params={"orderId": order_id},
            body=b"",
        )
    )

    assert [i.split()[0] for i in adapter.injected] == [loss, "503", "503", "503", "503"]
    assert response.status_code == 503
    body = json.loads(response.get_body())
    assert "unknown" in body["error"] and "retry" in body["error"]
    # It did apply: a 409 ("not in error") would have been a lie.
    clean = make_context(storage_connection, tag).store.load(order_id)
    assert clean is not None and clean.status is OrderStatus.PROCESSING


@pytest.mark.parametrize("loss", LOSSES)
def test_the_store_raises_storage_unavailable_when_it_cannot_tell(
    faulty: tuple[AppContext, FaultyAdapter], tag: str, loss: str
) -> None:
    ctx, adapter = faulty
    order_id = f"{tag}-unknown-store"
    in_error(ctx, order_id)
    order = ctx.store.load(order_id)
    assert order is not None
    order.resubmit(ctx.clock(), "op")
    lose_the_answer_and_the_check(adapter, loss)

    with pytest.raises(StorageUnavailable, match=r"outcome of the write .* is unknown"):
        ctx.store.save(order)


def test_the_cli_exits_3_when_the_outcome_is_unknown(
    faulty: tuple[AppContext, FaultyAdapter],
    tag: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ctx, adapter = faulty
    order_id = f"{tag}-unknown-cli"
    in_error(ctx, order_id)
    lose_the_answer_and_the_check(adapter)
    monkeypatch.setattr("admin.__main__._context", lambda connection: ctx)

    code = main(["resubmit", order_id, "--as", "ops"])

    out, err = capsys.readouterr()
    assert code == 3
    assert "outcome of the write" in json.loads(out)["error"]
    assert "unknown" in err
