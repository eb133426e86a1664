"""The dashboard's store methods (``dashboard.ports.DashboardStore``), one contract on both
adapters (``TableStateStore`` on Azurite, ``InMemoryStateStore``), and the aggregator on
Azurite: figures equal to what the orders did, bounded reads, a run killed after its
commit resumed without counting twice; the index repair and the retention purge beside
activity rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from core.errors import ConcurrencyConflict
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.ports import StateStore
from core.states import OrderStatus
from dashboard.figures import POISON, Activity, Figures
from dashboard.ports import RowWrite
from stores import layout
from stores.memory import InMemoryStateStore
from stores.tables import TableStateStore
from supervisor.aggregator import DashboardAggregator, figures_of
from tests.integration.test_store_contract import T0, Raw, accept, raw, store, succeeded

__all__ = ["raw", "store"]  # the contract suite's fixtures, parametrised by adapter


def dash(store: StateStore) -> InMemoryStateStore | TableStateStore:
    assert isinstance(store, InMemoryStateStore | TableStateStore)
    return store


def refused(order: Order) -> AgentReply:
    step = order.active_step()
    assert step is not None
    request = AgentRequest(
        order.order_id,
        step.step,
        step.attempt,
        step.complete_by,
        "",
        {},
        token=step.token_for(step.attempt),
    )
    return request.refused("HTTP 422 no")


def activity_keys(store: StateStore, order_id: str) -> list[str]:
    rows = dash(store).activity(layout.shard_of(order_id), T0 + timedelta(days=1), 1000)
    return [k for k, a in rows if a is not None and a.order_id == order_id]


def complete(store: StateStore, order_id: str, workflow: str = "order") -> None:
    order = accept(order_id, workflow)
    store.create(order)
    for n in range(len(order.plan.steps)):
        at = T0 + timedelta(seconds=n + 1)
        order.claim("i-1", at - timedelta(milliseconds=400))
        order.apply_reply(succeeded(order), at)
        store.save(order)


# --- the contract ---------------------------------------------------------------------------


def test_an_order_that_ends_in_error_twice_at_one_instant_writes_two_end_rows(
    store: StateStore,
) -> None:
    """Resubmitted and refused again at the same instant (a frozen or coarse clock): the
    second end row must not collide with the first (it would refuse the whole save)."""
    order = accept("o-twice")
    store.create(order)
    for _ in range(2):
        order.claim("i-1", T0)
        order.apply_reply(refused(order), T0, RetryPolicy(max_failure_count=1))
        assert order.status is OrderStatus.ERROR
        store.save(order)
        order.resubmit(T0, "op")
        store.save(order)
    ends = [k for k in activity_keys(store, "o-twice") if "|end-error-" in k]
    assert len(ends) == 2


def test_transitions_write_their_activity_rows_in_time_order(store: StateStore) -> None:
    order = accept("o-a")
    store.create(order)
    assert [k.rsplit("|", 1)[1] for k in activity_keys(store, "o-a")] == ["start"]
    order.claim("i-1", T0 + timedelta(seconds=1))
    store.save(order)  # a claim ends nothing
    assert len(activity_keys(store, "o-a")) == 1
    order.apply_reply(succeeded(order), T0 + timedelta(seconds=1.5))
    store.save(order)
    rows = dash(store).activity(layout.shard_of("o-a"), T0 + timedelta(days=1), 10)
    mine = [(k, a) for k, a in rows if a is not None and a.order_id == "o-a"]
    assert [k.rsplit("|", 1)[1] for k, _ in mine] == ["start", "a-0-1", "end-completed-3"]
    attempt = mine[1][1]
    assert (attempt.kind, attempt.step, attempt.agent, attempt.ending, attempt.millis) == (
        "attempt",
        "process",
        "orders",
        "succeeded",
        500,
    )
    assert mine[2][1].status == "completed" and mine[0][1].workflow == "order"
    # bounded, and only up to the time asked
    shard = layout.shard_of("o-a")
    assert len(dash(store).activity(shard, T0 + timedelta(days=1), 2)) == 2
    assert [a.kind for _, a in dash(store).activity(shard, T0 + timedelta(seconds=1), 10) if a] == [
        "started"
    ]
    # a reload and a save that changes nothing of that kind adds nothing
    again = store.load("o-a")
    assert again is not None
    store.save(again)
    assert len(activity_keys(store, "o-a")) == 3


def test_activity_rows_are_deleted_and_a_missing_one_is_no_error(store: StateStore) -> None:
    complete(store, "o-d")
    keys = activity_keys(store, "o-d")
    dash(store).delete_activity(layout.shard_of("o-d"), keys[:1])
    dash(store).delete_activity(layout.shard_of("o-d"), keys)
    assert activity_keys(store, "o-d") == []


def test_a_poison_activity_has_a_row_of_its_own(store: StateStore) -> None:
    dash(store).add_activity(Activity(T0, POISON, step="orders-poison"))
    found = [
        a
        for shard in layout.all_shards()
        for _, a in dash(store).activity(shard, T0 + timedelta(seconds=1), 10)
        if a is not None and a.kind == POISON
    ]
    assert len(found) == 1 and found[0].step == "orders-poison"


def test_dashboard_writes_are_all_or_nothing_and_conditional(store: StateStore) -> None:
    d = dash(store)
    etags = d.write_dashboard([RowWrite("min|a", {"Figures": "{}"}), RowWrite("min|b", {"N": 1})])
    with pytest.raises(ConcurrencyConflict):  # a create of a row that exists
        d.write_dashboard([RowWrite("min|c", {"N": 1}), RowWrite("min|a", {"N": 2})])
    assert [r.row for r in d.dashboard_rows("min|", "min|~")] == ["min|a", "min|b"]
    new = d.write_dashboard([RowWrite("min|a", {"N": 3}, etags["min|a"])])
    with pytest.raises(ConcurrencyConflict):  # a stale ETag
        d.write_dashboard([RowWrite("min|a", {"N": 4}, etags["min|a"])])
    with pytest.raises(ConcurrencyConflict):  # a delete with a stale ETag
        d.write_dashboard([RowWrite("min|a", None, etags["min|a"])])
    [a] = d.dashboard_rows("min|a", "min|a~")
    assert a.value["N"] == 3 and a.etag == new["min|a"]
    d.write_dashboard([RowWrite("min|a", None, a.etag)])
    assert [r.row for r in d.dashboard_rows("min|", "min|~", limit=5)] == ["min|b"]


def test_in_flight_lists_the_active_steps_with_agent_and_since(store: StateStore) -> None:
    waiting = accept("o-wait", "fulfilment")
    store.create(waiting)
    running = accept("o-run")
    store.create(running)
    running.claim("i-1", T0 + timedelta(seconds=2))
    store.save(running)
    complete(store, "o-done")
    found = {e.order_id: e for e in dash(store).in_flight()}
    assert set(found) == {"o-wait", "o-run"}
    assert (found["o-wait"].state, found["o-wait"].agent, found["o-wait"].since) == (
        "Pending",
        "inventory",
        T0,
    )
    assert (found["o-run"].state, found["o-run"].step, found["o-run"].since) == (
        "Processing",
        "process",
        T0 + timedelta(seconds=2),
    )


def test_the_index_repair_leaves_activity_rows_alone(store: StateStore, raw: Raw) -> None:
    order = accept("o-r")
    store.create(order)
    before = activity_keys(store, "o-r")
    pending = next(k for k in raw.rows("o-r") if k.startswith("pending|"))
    raw.put({"PartitionKey": layout.shard_of("o-r"), "RowKey": pending, "OrderRef": "o-r"})
    report = store.repair_index("o-r")
    assert report["rewritten"] == [pending]  # an index row without Agent is brought up to date
    assert activity_keys(store, "o-r") == before and before


# --- the aggregator on Azurite ---------------------------------------------------------------


@pytest.fixture
def table(storage_connection: str, tag: str) -> TableStateStore:
    from tests.support import make_context

    found = make_context(storage_connection, tag).store
    assert isinstance(found, TableStateStore)
    return found


def counted(store: TableStateStore) -> Figures:
    total = Figures()
    for row in store.dashboard_rows("min|", "min|~"):
        total.merge(figures_of(row))
    return total


def aggregator(store: TableStateStore, **kw: Any) -> DashboardAggregator:
    return DashboardAggregator(
        store, lambda: T0 + timedelta(minutes=5), shards=layout.all_shards(), **kw
    )


def refuse(store: TableStateStore, order_id: str) -> None:
    order = accept(order_id)
    store.create(order)
    order.claim("i-1", T0)
    step = order.active_step()
    assert step is not None
    reply = AgentReply(
        order_id,
        step.step,
        1,
        step.complete_by,
        Outcome.REFUSED,
        error="HTTP 400",
        token=step.token_for(1),
    )
    order.apply_reply(reply, T0 + timedelta(seconds=1))
    store.save(order)


def test_the_figures_are_what_the_orders_did_even_after_a_kill(table: TableStateStore) -> None:
    for n in range(6):
        complete(table, f"o-{n}")
    for n in range(3):
        complete(table, f"f-{n}", "fulfilment")
    refuse(table, "o-bad")
    rows = sum(len(activity_keys(table, o)) for o in [*(f"o-{n}" for n in range(6)), "o-bad"])
    assert rows == 6 * 3 + 4  # o-bad: start, its refused attempt, end-error, the alert

    class Killed(Exception):
        pass

    def kill(shard: str) -> None:
        raise Killed(shard)

    # bounded: 1 row per shard and round, 1 round
    first = aggregator(table, batch=1, rounds=1).run()
    assert 0 < first.counted <= 16
    with pytest.raises(Killed):  # dies right after a commit, before its deletes
        aggregator(table, after_commit=kill).run()
    for _ in range(5):
        if aggregator(table).run().counted == 0:
            break
    figures = counted(table)
    assert figures.started == {"order": 7, "fulfilment": 3}
    assert figures.finished == {"order|completed": 6, "order|error": 1, "fulfilment|completed": 3}
    assert figures.failures == {"orders|refused": 1}
    assert figures.alerts == 1
    assert sum(figures.durations["process|orders"].values()) == 6
    assert sum(figures.durations["charge-payment|payments"].values()) == 3
    leftover = [
        k
        for shard in layout.all_shards()
        for k, _ in table.activity(shard, T0 + timedelta(days=1), 10)
    ]
    assert leftover == []
