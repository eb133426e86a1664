"""Retention with archive on real Azurite (Table and Blob): finished orders past their
retention go to the archive and then out of the table, with their index rows; live
orders stay; a purge killed between archive and delete loses nothing and the next run
finishes the job; a restore brings one back, readable by the API (docs/contracts.md §3.12).
"""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from admin.archiving import Retainer
from bootstrap import AppContext
from core.errors import OrderAlreadyExists, OrderNotFound
from core.policy import RetryPolicy
from core.retention import Retention, parse_duration
from core.states import OrderStatus
from stores import layout
from stores.archive import decode_lines
from stores.kept import KeptMessages
from stores.retention_rows import TableRetention
from supervisor.aggregator import DashboardAggregator
from tests.integration.orders import accept, request_for
from tests.support import FakeClock, make_context

T0 = datetime(2026, 9, 1, 10, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=40)
POLICY = RetryPolicy(max_failure_count=1)


class Killed(Exception):
    """Stands for the process dying between writing the archive and deleting the rows."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def ctx(storage_connection: str, tag: str, clock: FakeClock) -> AppContext:
    return make_context(storage_connection, tag, clock=clock)


def seed(ctx: AppContext, order_id: str, at: datetime, end: str, workflow: str = "order") -> None:
    """An order created at ``at`` that ended ``end`` a minute later (or stays pending)."""
    ctx.store.create(accept(order_id, at, workflow))
    if end == "pending":
        return
    order = ctx.store.load(order_id)
    assert order is not None
    later = at + timedelta(minutes=1)
    for _ in range(len(order.plan.steps)):  # every step succeeds, or the first is refused
        request = request_for(order.claim("i", later))
        if end == "completed":
            order.apply_reply(request.succeeded({"ok": True}), later, POLICY)
        else:
            order.apply_reply(request.refused("HTTP 422 invalid"), later, POLICY)
        if str(order.status) == end:
            break
    assert str(order.status) == end
    ctx.store.delete_outbox(ctx.store.save(order))  # its notices went out


def test_an_order_whose_notices_were_not_sent_waits_for_them(ctx: AppContext) -> None:
    ctx.store.create(accept("n-1", T0))
    order = ctx.store.load("n-1")
    assert order is not None
    request = request_for(order.claim("i", T0))
    order.apply_reply(request.refused("HTTP 422 invalid"), T0, POLICY)
    saved = ctx.store.save(order)  # the operator alert is committed, not yet sent
    assert saved.entries
    rules = Retention.only(OrderStatus.ERROR, parse_duration("0s"))

    assert ctx.retainer.purge(rules=rules).kept["notices not yet sent"] == 1
    assert ctx.store.load("n-1") is not None
    ctx.store.delete_outbox(saved)
    assert ctx.retainer.purge(rules=rules).archived == 1


def partition_rows(ctx: AppContext, order_id: str) -> list[str]:
    """Every row of the order's partition that names it (records, index, outbox, tombstone)."""
    rows = ctx.store.table.query_entities(
        "PartitionKey eq @pk", parameters={"pk": layout.shard_of(order_id)}
    )
    return sorted(
        str(r["RowKey"])
        for r in rows
        if r.get("OrderID") == order_id or r.get("OrderRef") == order_id
    )


def archive_lines(ctx: AppContext) -> list[dict[str, Any]]:
    container = ctx.retainer._archive._container  # the test reads what a person would
    if not container.exists():
        return []
    lines = []
    for blob in container.list_blobs():
        data = container.download_blob(blob.name).readall()
        lines += [{**line, "blob": blob.name} for line in decode_lines(data)]
    return lines


def test_finished_orders_past_retention_are_archived_then_deleted_live_ones_stay(
    ctx: AppContext,
) -> None:
    old = T0  # 40 days before NOW
    seed(ctx, "done-old-1", old, "completed")
    seed(ctx, "done-old-2", old + timedelta(hours=1), "completed", workflow="fulfilment")
    seed(ctx, "done-young", NOW - timedelta(days=2), "completed")
    seed(ctx, "error-old", old, "error")
    seed(ctx, "live-old", old, "pending")
    before = {i: partition_rows(ctx, i) for i in ("done-old-1", "done-young", "live-old")}

    report = ctx.retainer.purge(rules=Retention.parse("completed=30d"))

    assert report.archived == 2 and report.complete
    assert dict(report.by_kind) == {"order/completed": 1, "fulfilment/completed": 1}
    for gone in ("done-old-1", "done-old-2"):
        assert ctx.store.load(gone) is None
        # index rows gone too; activity rows are the dashboard timer's: it counts them
        # (once) and deletes them, archived or not (below)
        kept = [r for r in partition_rows(ctx, gone) if not r.startswith("activity|")]
        assert kept == [f"archived|{gone}"]
    assert partition_rows(ctx, "done-young") == before["done-young"]
    assert partition_rows(ctx, "live-old") == before["live-old"]
    error = ctx.store.load("error-old")
    assert error is not None and error.status is OrderStatus.ERROR  # never without --status
    listed, _ = ctx.store.list_by_status(OrderStatus.COMPLETED, 50, None)
    assert listed == ["done-young"]

    lines = {line["orderId"]: line for line in archive_lines(ctx)}
    assert set(lines) == {"done-old-1", "done-old-2"}
    one = lines["done-old-1"]
    assert one["blob"].startswith("order/2026/09/01/") and one["blob"].endswith(".jsonl.gz")
    assert lines["done-old-2"]["blob"].startswith("fulfilment/2026/09/01/")
    assert one["status"] == "completed" and one["order"]["steps"][0]["ProcessState"] == "Processed"
    records = {r for r in before["done-old-1"] if not r.startswith("activity|")}
    assert {r["RowKey"] for r in one["rows"]} == records

    again = ctx.retainer.purge(rules=Retention.parse("completed=30d"))
    assert again.archived == 0  # nothing left that is due

    # The purged orders' activity rows are still counted, once, then gone: nothing of an
    # archived order is left behind but its tombstone.
    report_ = DashboardAggregator(ctx.store, lambda: NOW, shards=layout.all_shards()).run()
    assert report_.counted >= 6
    for gone in ("done-old-1", "done-old-2"):
        assert partition_rows(ctx, gone) == [f"archived|{gone}"]


def test_a_purge_killed_between_archive_and_delete_loses_nothing_and_the_next_run_ends_it(
    ctx: AppContext, clock: FakeClock
) -> None:
    for i in range(5):
        seed(ctx, f"k-{i}", T0 + timedelta(minutes=i), "completed")
    rules = Retention.parse("completed=30d")

    def die() -> None:
        raise Killed

    dying = Retainer(
        TableRetention(ctx.store.table), ctx.retainer._archive, rules, clock, before_delete=die
    )
    with pytest.raises(Killed):
        dying.purge()
    assert all(ctx.store.load(f"k-{i}") is not None for i in range(5))  # none deleted
    assert {line["orderId"] for line in archive_lines(ctx)} == {f"k-{i}" for i in range(5)}

    report = ctx.retainer.purge(rules=rules)

    assert report.archived == 5
    assert all(ctx.store.load(f"k-{i}") is None for i in range(5))
    blobs = {line["blob"] for line in archive_lines(ctx)}
    assert len(blobs) == 2  # the killed run's copy stays; the tombstones name the second
    tomb = ctx.retainer.where("k-0")
    assert tomb is not None and tomb["blob"].endswith(report.blobs[0].split("/", 1)[1])


def test_a_run_stops_at_its_limit_and_the_next_resumes_where_it_stopped(
    ctx: AppContext,
) -> None:
    for i in range(7):
        seed(ctx, f"b-{i}", T0 + timedelta(minutes=i), "completed")
    rules = Retention.parse("completed=30d")

    first = ctx.retainer.purge(rules=rules, limit=4)
    second = ctx.retainer.purge(rules=rules, limit=4)

    assert (first.archived, first.complete) == (4, False)
    assert (second.archived, second.complete) == (3, True)
    assert all(ctx.store.load(f"b-{i}") is None for i in range(7))


def test_dry_run_names_what_would_go_and_changes_nothing(ctx: AppContext) -> None:
    seed(ctx, "d-old", T0, "completed")
    seed(ctx, "d-err", T0, "error")
    rows = partition_rows(ctx, "d-old")

    report = ctx.retainer.purge(
        dry_run=True, rules=Retention.only(OrderStatus.ERROR, parse_duration("0s"))
    )

    assert report.to_json()["wouldArchive"] == 1 and report.sample == ["d-err"]
    assert partition_rows(ctx, "d-old") == rows
    assert ctx.store.load("d-err") is not None
    assert archive_lines(ctx) == []


def test_workflow_rules_and_recently_finished_orders_are_kept(ctx: AppContext) -> None:
    seed(ctx, "w-order", T0, "completed")
    seed(ctx, "w-fulfil", T0, "completed", workflow="fulfilment")
    # Created long ago, finished yesterday: kept for its whole retention from then.
    ctx.store.create(accept("w-late", T0))
    late = ctx.store.load("w-late")
    assert late is not None
    yesterday = NOW - timedelta(days=1)
    request = request_for(late.claim("i", yesterday))
    late.apply_reply(request.succeeded({}), yesterday, POLICY)
    ctx.store.save(late)

    report = ctx.retainer.purge(rules=Retention.parse("completed=30d,fulfilment/completed=90d"))

    assert report.sample == ["w-order"]
    assert ctx.store.load("w-fulfil") is not None and ctx.store.load("w-late") is not None
    assert report.kept["its workflow keeps it longer"] == 1
    assert report.kept["not due (finished recently, or its workflow keeps it longer)"] == 1


def test_restore_brings_an_archived_order_back_readable_by_the_api(ctx: AppContext) -> None:
    seed(ctx, "r-1", T0, "completed")
    original = ctx.admin.show("r-1")
    ctx.retainer.purge(rules=Retention.parse("completed=30d"))
    with pytest.raises(OrderNotFound):
        ctx.admin.show("r-1")
    where = ctx.retainer.where("r-1")
    assert where is not None and where["status"] == "completed"

    restored = ctx.retainer.restore("r-1")

    assert restored["restored"] is True
    assert ctx.admin.show("r-1") == original
    assert ctx.retainer.where("r-1") is None
    listed, _ = ctx.store.list_by_status(OrderStatus.COMPLETED, 50, None)
    assert listed == ["r-1"]  # its index row is back
    with pytest.raises(OrderAlreadyExists):
        ctx.retainer.restore("r-1")
    # Kept again for its retention, counted from the restore.
    assert ctx.retainer.purge(rules=Retention.parse("completed=30d")).archived == 0


def test_the_rows_left_by_an_archived_order_go_when_its_blob_does(
    ctx: AppContext, clock: FakeClock
) -> None:
    seed(ctx, "t-1", T0, "completed")
    seed(ctx, "t-2", T0 + timedelta(days=20), "completed")
    rules = Retention.parse("completed=10d")
    ctx.retainer.purge(rules=rules)
    ctx.dashboard.run()  # the activity rows: the dashboard timer's, counted and deleted
    assert partition_rows(ctx, "t-1") == ["archived|t-1"]  # and its twin, named by Ref

    clock.advance(ctx.retainer.archive_days * 86400 - 86400)  # a day short for both
    assert ctx.retainer.purge(rules=rules).tombstones_expired == 0
    clock.advance(2 * 86400)
    report = ctx.retainer.purge(rules=rules)

    assert report.tombstones_expired == 2
    assert ctx.retainer.where("t-1") is None and ctx.retainer.where("t-2") is None
    left = ctx.store.table.query_entities(
        "PartitionKey eq @pk", parameters={"pk": layout.shard_of("t-1")}
    )
    assert not [r for r in left if "t-1" in str(r["RowKey"])]


def test_restore_of_an_id_never_archived_is_not_found(ctx: AppContext) -> None:
    with pytest.raises(OrderNotFound):
        ctx.retainer.restore("never-was")


def test_archive_blobs_are_gzip_json_lines(ctx: AppContext) -> None:
    seed(ctx, "g-1", T0, "completed")
    report = ctx.retainer.purge(rules=Retention.parse("completed=30d"))
    container = ctx.retainer._archive._container
    data = container.download_blob(report.blobs[0].split("/", 1)[1]).readall()
    text = gzip.decompress(data).decode("utf-8")
    assert text.endswith("\n") and json.loads(text.splitlines()[0])["orderId"] == "g-1"


KILLED_RUN = """
import sys
from dataclasses import replace
from bootstrap import bootstrap
from core.names import Names
from core.retention import Retention
from tests.support import FakeClock, settings_from
from datetime import datetime

connection, tag, now = sys.argv[1:4]
settings = settings_from({
    "AzureWebJobsStorage": connection,
    "AGENT_TRANSPORT": "storage",
    "ORDERS_FAILPOINTS": "purge-after-archive",
})
ctx = bootstrap(settings, names=Names.unique(tag), clock=FakeClock(datetime.fromisoformat(now)))
ctx.retainer.purge(rules=Retention.parse("completed=30d"))
print("not killed")
"""


def test_a_purge_process_killed_after_archiving_resumes_in_the_next_run(
    ctx: AppContext, storage_connection: str, tag: str
) -> None:
    """The same window as above, with a real SIGKILL (the failpoint) in another process."""
    for i in range(3):
        seed(ctx, f"p-{i}", T0 + timedelta(minutes=i), "completed")

    run = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, storage_connection, tag, NOW.isoformat()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert run.returncode == -signal.SIGKILL, run.stderr
    assert "not killed" not in run.stdout
    assert all(ctx.store.load(f"p-{i}") is not None for i in range(3))
    assert len(archive_lines(ctx)) == 3
    report = ctx.retainer.purge(rules=Retention.parse("completed=30d"))
    assert report.archived == 3 and all(ctx.store.load(f"p-{i}") is None for i in range(3))
    assert len(archive_lines(ctx)) == 6  # two copies, none lost


def test_kept_messages_past_kept_days_are_archived_then_deleted(ctx: AppContext) -> None:
    """Every invalid order too large for its rejection record is kept as a row: without
    retention they would add up for ever. Past KEPT_DAYS (30 by default) they go to the
    archive, whole, and then out of the table; younger ones stay."""
    kept = KeptMessages(ctx.store.table)
    old_text = '{"orderId": "not valid!", "note": "' + "\U0001f600" * 20_000 + '"}'
    old = kept.keep("orders", old_text, "orderId must be ...", NOW - timedelta(days=31))
    older = kept.keep("agent-requests-orders", "x" * 70_000, "bad", NOW - timedelta(days=45))
    young = kept.keep("orders", "young", "bad", NOW - timedelta(days=29))
    assert ctx.retainer.kept_days == 30

    dry = ctx.retainer.purge(dry_run=True)
    assert dry.to_json()["keptMessagesWouldArchive"] == 2
    assert {kept.get(r) is not None for r in (old, older, young)} == {True}

    report = ctx.retainer.purge()

    assert report.to_json()["keptMessagesArchived"] == 2 and report.complete
    assert kept.get(old) is None and kept.get(older) is None
    assert kept.get(young) is not None
    lines = {line["row"]: line for line in archive_lines(ctx)}
    assert set(lines) == {old, older}
    assert lines[old]["text"] == old_text and lines[old]["kind"] == "kept"
    assert lines[old]["blob"].startswith("_kept/")
    assert lines[older]["queue"] == "agent-requests-orders"
    assert ctx.retainer.purge().kept_messages == 0  # nothing left to do


def test_a_purge_narrowed_to_orders_leaves_kept_messages_alone(ctx: AppContext) -> None:
    kept = KeptMessages(ctx.store.table)
    row = kept.keep("orders", "old", "bad", NOW - timedelta(days=31))
    rules = Retention.only(OrderStatus.COMPLETED, parse_duration("1d"))
    assert ctx.retainer.purge(rules=rules, kept_messages=False).kept_messages == 0
    assert kept.get(row) is not None


def test_error_orders_go_180_days_after_their_last_change_by_default(ctx: AppContext) -> None:
    """An order left in ``error`` was kept for ever unless a rule named it; the default
    settings now archive it 180 days after its last change."""
    seed(ctx, "e-old", NOW - timedelta(days=181), "error")
    seed(ctx, "e-young", NOW - timedelta(days=179), "error")
    assert str(ctx.retainer.rules) == "completed=30d,compensated=90d,cancelled=90d,error=180d"

    report = ctx.retainer.purge()

    assert report.by_kind["order/error"] == 1 and report.sample == ["e-old"]
    assert ctx.store.load("e-old") is None and ctx.store.load("e-young") is not None
    assert [line["orderId"] for line in archive_lines(ctx)] == ["e-old"]
