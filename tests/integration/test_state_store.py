"""The Table state store on real Azurite: transactions, ETags, indexes, paging."""

from __future__ import annotations

import json
import multiprocessing
import threading
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import TableClient

from core.errors import ConcurrencyConflict, OrderAlreadyExists, TransitionRefused
from core.messages import AgentReply
from core.model import Order
from core.order_message import decode_order
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus, StepState
from core.workflows import WORKFLOWS, Plan
from stores import layout
from stores.tables import TableStateStore
from tests.support import FakeClock, make_context

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def accept(order_id: str, workflow: str = "order", **extra: object) -> Order:
    message = decode_order(json.dumps({"orderId": order_id, "workflow": workflow, **extra}))
    return Order.accept(message, Plan.of(WORKFLOWS[workflow], 30), T0)


@pytest.fixture
def store(storage_connection: str, tag: str) -> TableStateStore:
    return make_context(storage_connection, tag).store


def rows(store: TableStateStore, order_id: str) -> list[str]:
    pk = layout.shard_of(order_id)
    return sorted(
        e["RowKey"]
        for e in store.table.query_entities("PartitionKey eq @pk", parameters={"pk": pk})
        if order_id in e["RowKey"]
    )


def test_create_writes_order_step_and_index_rows_in_one_partition(store: TableStateStore) -> None:
    order = accept("o-create", replyTo="app-q")
    saved = store.create(order)
    assert len(saved.entries) == 1  # the "received" notice, committed with the order
    keys = rows(store, "o-create")
    assert keys == sorted(
        [
            "order|o-create|order",
            "order|o-create|step|000|process",
            f"pending|{T0.strftime('%Y%m%dT%H%M%S.%fZ')}|o-create|process",
            layout.status_row("pending", "o-create", T0),
            saved.entries[0].row,
            # for the dashboard: the order started (stores/activity.py)
            f"activity|{T0.strftime('%Y%m%dT%H%M%S.%fZ')}|o-create|start",
        ]
    )
    step = store.table.get_entity(layout.shard_of("o-create"), "order|o-create|step|000|process")
    assert step["OrderID"] == "o-create" and step["Step"] == "process"
    assert step["LockedBy"] == "" and step["ProcessState"] == "Pending"
    assert step["FailureCount"] == 0 and step["Attempt"] == 0
    assert step["CompleteBy"] == T0


def test_create_is_atomic_when_any_row_already_exists(store: TableStateStore) -> None:
    # A stray row with the step's key makes the batch fail: nothing else may appear.
    store.table.create_entity(
        {"PartitionKey": layout.shard_of("o-atomic"), "RowKey": "order|o-atomic|step|000|process"}
    )
    with pytest.raises(OrderAlreadyExists):
        store.create(accept("o-atomic"))
    assert rows(store, "o-atomic") == ["order|o-atomic|step|000|process"]


def test_second_create_of_the_same_id_is_refused(store: TableStateStore) -> None:
    store.create(accept("o-twice"))
    with pytest.raises(OrderAlreadyExists):
        store.create(accept("o-twice"))


def test_load_round_trips_the_aggregate(store: TableStateStore) -> None:
    order = accept("o-rt", "fulfilment", replyTo="app-q", sku="A-1", qty=2)
    store.create(order)
    loaded = store.load("o-rt")
    assert loaded is not None
    assert loaded.body == order.body and loaded.plan == order.plan
    assert loaded.status is OrderStatus.PENDING
    assert [(s.step, s.process_state, s.complete_by) for s in loaded.steps] == [
        ("reserve-stock", StepState.PENDING, T0)
    ]
    assert store.load("o-missing") is None


def test_stale_etag_is_a_concurrency_conflict_and_changes_nothing(store: TableStateStore) -> None:
    store.create(accept("o-stale"))
    first, second = store.load("o-stale"), store.load("o-stale")
    assert first is not None and second is not None
    first.claim("a", T0)
    store.save(first)
    second.claim("b", T0)
    with pytest.raises(ConcurrencyConflict):
        store.save(second)
    now = store.load("o-stale")
    assert now is not None and now.steps[0].locked_by == "a" and now.steps[0].attempt == 1


def _claim_in_process(
    connection: str, table: str, order_id: str, n: int, barrier: object, results: object
) -> None:
    store = TableStateStore(TableClient.from_connection_string(connection, table))
    order = store.load(order_id)
    assert order is not None
    order.claim(f"proc-{n}", T0)
    barrier.wait(timeout=60)  # type: ignore[attr-defined]
    try:
        store.save(order)
        results.put(f"proc-{n}")  # type: ignore[attr-defined]
    except ConcurrencyConflict:
        results.put("lost")  # type: ignore[attr-defined]


@pytest.mark.parametrize("trial", range(5))
def test_concurrent_claimers_in_threads_exactly_one_wins(
    store: TableStateStore, trial: int
) -> None:
    order_id = f"o-race-{trial}"
    store.create(accept(order_id))
    loaded = [store.load(order_id) for _ in range(8)]
    barrier = threading.Barrier(8)
    wins: list[str] = []

    def claim(n: int) -> None:
        order = loaded[n]
        assert order is not None
        order.claim(f"thread-{n}", T0)
        barrier.wait()
        try:
            store.save(order)
            wins.append(f"thread-{n}")
        except ConcurrencyConflict:
            pass

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(wins) == 1
    final = store.load(order_id)
    assert final is not None and final.steps[0].locked_by == wins[0]
    assert final.steps[0].attempt == 1


def test_concurrent_claimers_in_processes_exactly_one_wins(
    storage_connection: str, tag: str
) -> None:
    ctx = make_context(storage_connection, tag)
    mp = multiprocessing.get_context("spawn")
    for trial in range(2):
        order_id = f"o-proc-{trial}"
        ctx.store.create(accept(order_id))
        barrier, results = mp.Barrier(4), mp.Queue()
        procs = [
            mp.Process(
                target=_claim_in_process,
                args=(storage_connection, ctx.names.state_table, order_id, n, barrier, results),
            )
            for n in range(4)
        ]
        for p in procs:
            p.start()
        try:
            outcomes = [results.get(timeout=90) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
        winners = [o for o in outcomes if o != "lost"]
        assert len(winners) == 1, outcomes
        final = ctx.store.load(order_id)
        assert final is not None and final.steps[0].locked_by == winners[0]


def test_index_rows_follow_the_state_and_leave_when_finished(store: TableStateStore) -> None:
    store.create(accept("o-idx"))
    order = store.load("o-idx")
    assert order is not None
    assert [e.order_id for e in store.due_pending(T0) if e.order_id == "o-idx"] == ["o-idx"]
    step = order.claim("a", T0)
    store.save(order)
    assert not [e for e in store.due_pending(T0 + timedelta(hours=1)) if e.order_id == "o-idx"]
    expired = [
        e
        for e in store.expired_processing(step.complete_by + timedelta(seconds=1))
        if e.order_id == "o-idx"
    ]
    assert [(e.step, e.at) for e in expired] == [("process", step.complete_by)]
    assert not [e for e in store.expired_processing(step.complete_by) if e.order_id == "o-idx"]
    order.apply_reply(
        AgentReply(
            "o-idx", "process", 1, T0, Outcome.SUCCEEDED, {"ok": 1}, token=step.token_for(1)
        ),
        T0 + timedelta(seconds=1),
    )
    store.save(order)
    keys = rows(store, "o-idx")
    assert not any(k.startswith(("pending|", "processing|")) for k in keys)
    assert layout.status_row("completed", "o-idx", order.created_at) in keys
    assert not any(k.startswith("status|processing|") for k in keys)


def test_supervisor_and_late_reply_racing_on_one_step_exactly_one_wins(
    store: TableStateStore,
) -> None:
    for trial in range(6):
        order_id = f"o-late-{trial}"
        store.create(accept(order_id))
        order = store.load(order_id)
        assert order is not None
        step = order.claim("a", T0)
        store.save(order)
        # Both read the same version; the reply is in time by its own clock,
        # the supervisor's clock says the deadline passed.
        by_reply, by_supervisor = store.load(order_id), store.load(order_id)
        assert by_reply is not None and by_supervisor is not None
        by_reply.apply_reply(
            AgentReply(order_id, "process", 1, T0, Outcome.SUCCEEDED, {}, token=step.token_for(1)),
            step.complete_by - timedelta(seconds=1),
        )
        by_supervisor.expire(step.complete_by + timedelta(seconds=5), RetryPolicy())
        contenders = [by_reply, by_supervisor] if trial % 2 else [by_supervisor, by_reply]
        outcomes = []
        for contender in contenders:
            try:
                store.save(contender)
                outcomes.append("won")
            except ConcurrencyConflict:
                outcomes.append("lost")
        assert outcomes == ["won", "lost"]
        final = store.load(order_id)
        assert final is not None
        expected = StepState.PROCESSED if contenders[0] is by_reply else StepState.PENDING
        assert final.steps[0].process_state is expected


def test_list_by_status_pages_across_shards(store: TableStateStore) -> None:
    ids = {f"o-list-{n:03d}" for n in range(130)}
    for order_id in ids:
        store.create(accept(order_id))
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page, token = store.list_by_status(OrderStatus.PENDING, 50, token)
        assert len(page) <= 50
        seen.extend(page)
        pages += 1
        if token is None:
            break
        assert len(page) == 50  # every page but the last is full
    assert sorted(seen) == sorted(ids)
    assert pages == 3


def test_a_refused_transition_leaves_the_store_untouched(storage_connection: str, tag: str) -> None:
    """Through the operator's path (load, transition, save): a refused resubmit or cancel
    writes nothing. Every row of the order (records, index rows, outbox) keeps its ETag and
    its content, no notice is queued, and the order read back is the one stored before."""
    ctx = make_context(storage_connection, tag)
    store = ctx.store
    status_queue = f"status-{tag}"  # the order's replyTo, this test's own
    store.create(accept("o-refused", replyTo=status_queue))
    done = accept("o-done")
    done.claim("i", T0)
    done.apply_reply(
        AgentReply(
            "o-done",
            "process",
            1,
            T0,
            Outcome.SUCCEEDED,
            {},
            token=done.steps[0].token_for(1),
        ),
        T0 + timedelta(seconds=1),
    )
    store.create(done)  # completed: nothing left to cancel
    ctx.queues.ensure(status_queue)

    def snapshot(order_id: str) -> dict[str, tuple[str, dict[str, object]]]:
        pk = layout.shard_of(order_id)
        rows: dict[str, tuple[str, dict[str, object]]] = {}
        for e in store.table.query_entities("PartitionKey eq @pk", parameters={"pk": pk}):
            if order_id in e["RowKey"]:
                etag = e.metadata["etag"]
                assert etag is not None, f"{e['RowKey']} was read without an ETag"
                rows[e["RowKey"]] = (etag, dict(e))
        return rows

    def queued() -> int:
        return sum(
            len(ctx.queues.client(q).peek_messages(max_messages=32))
            for q in (status_queue, ctx.names.operator_alerts)
        )

    before = {o: snapshot(o) for o in ("o-refused", "o-done")}
    notices_before = queued()
    assert before["o-refused"] and before["o-done"]

    with pytest.raises(TransitionRefused) as not_in_error:
        ctx.admin.resubmit("o-refused", "op")  # a pending order is not in error
    with pytest.raises(TransitionRefused) as finished:
        ctx.admin.cancel("o-done", "op")

    assert (not_in_error.value.reason, finished.value.reason) == ("not-in-error", "finished")
    assert {o: snapshot(o) for o in ("o-refused", "o-done")} == before
    assert queued() == notices_before
    reread = store.load("o-refused")
    assert reread is not None
    assert reread.status is OrderStatus.PENDING
    assert [(s.process_state, s.attempt) for s in reread.steps] == [(StepState.PENDING, 0)]


def test_clock_is_only_what_the_caller_passes(storage_connection: str, tag: str) -> None:
    """Every time the services act on comes from the clock the context was given, never the
    wall clock. The clock is set hours in the past (T0): by the wall clock the step's
    deadline would be long gone, so the agent request would not be sent (its time-to-live
    would be 0) and the supervisor would expire the step at once."""
    from core.timefmt import iso, parse_iso

    clock = FakeClock(T0)
    ctx = make_context(storage_connection, tag, clock=clock, timeout=30)
    assert str(ctx.scheduler.submit(json.dumps({"orderId": "o-clock"}).encode())) == "accepted"
    ctx.scheduler.dispatch("o-clock")  # nothing to do if the submit dispatched already

    order = ctx.store.load("o-clock")
    assert order is not None
    [step] = order.steps
    assert order.created_at == T0
    assert step.process_state is StepState.PROCESSING
    assert step.complete_by == T0 + timedelta(seconds=30)
    [claim] = [h for h in step.history if h["event"] == "claimed"]
    assert parse_iso(claim["at"]) == T0
    requests = ctx.queues.client(ctx.names.agent_queue("orders")).peek_messages(max_messages=32)
    assert [json.loads(r.content)["completeBy"] for r in requests] == [
        iso(T0 + timedelta(seconds=30))
    ]

    clock.advance(5)  # before the deadline on the given clock
    ctx.supervisor.run()
    again = ctx.store.load("o-clock")
    assert again is not None and again.steps[0].process_state is StepState.PROCESSING

    expired_at = clock.advance(30)  # past the deadline and the supervisor's skew grace
    ctx.supervisor.run()
    after = ctx.store.load("o-clock")
    assert after is not None
    [expiry] = [h for h in after.steps[0].history if h["event"] == "expired"]
    assert parse_iso(expiry["at"]) == expired_at
    assert (after.steps[0].process_state, after.steps[0].failure_count) == (StepState.PENDING, 1)
