"""The ``StateStore`` contract (and ``AgentControlStore``'s and ``OutageStore``'s, kept by
the same stores), one suite run on both adapters: ``TableStateStore`` on Azurite and
``InMemoryStateStore``. What passes here may be relied on of either, so the services'
unit tests on the in-memory store say something about Azure.

A few tests damage or add rows below the store (a stray row, a manual edit, an index
row gone): ``Raw`` does that the same way on both.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import UpdateMode

from core import controls
from core.controls import AgentControl, Limits, Pause
from core.errors import (
    ConcurrencyConflict,
    CorruptOrder,
    InvalidContinuationToken,
    OrderAlreadyExists,
    OrderNotFound,
    StorageUnavailable,
)
from core.messages import AgentReply
from core.model import Order
from core.order_message import decode_order, utf16_units
from core.outages import Outage, OutagePolicy, report_answer, report_failing
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.ports import IndexEntry, ListFilter, StateStore
from core.states import OrderStatus, StepState
from core.workflows import WORKFLOWS, Plan
from stores import entities, layout
from stores.memory import InMemoryStateStore
from stores.tables import TableStateStore
from tests.support import declarations, make_context

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
US = timedelta(microseconds=1)


def accept(order_id: str, workflow: str = "order", at: datetime = T0, **extra: Any) -> Order:
    message = decode_order(
        json.dumps({"orderId": order_id, "workflow": workflow, **extra}, ensure_ascii=False)
    )
    return Order.accept(message, Plan.of(WORKFLOWS[workflow], 30), at)


def succeeded(order: Order, result: dict[str, Any] | None = None) -> AgentReply:
    step = order.active_step()
    assert step is not None
    return AgentReply(
        order.order_id,
        step.step,
        step.attempt,
        step.complete_by,
        Outcome.SUCCEEDED,
        result or {},
        token=step.token_for(step.attempt),
    )


@dataclass
class Raw:
    """Rows below the store, on either adapter."""

    store: StateStore

    def rows(self, order_id: str) -> dict[str, dict[str, Any]]:
        """Every row of the order's partition that names it, by RowKey."""
        shard = layout.shard_of(order_id)
        if isinstance(self.store, TableStateStore):
            found: Any = self.store.table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": shard}
            )
        else:
            assert isinstance(self.store, InMemoryStateStore)
            found = self.store.rows(shard)
        return {e["RowKey"]: dict(e) for e in found if f"|{order_id}|" in e["RowKey"] + "|"}

    def put(self, entity: dict[str, Any]) -> None:
        if isinstance(self.store, TableStateStore):
            self.store.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        else:
            assert isinstance(self.store, InMemoryStateStore)
            self.store.put_row(entity)

    def delete(self, order_id: str, row: str) -> None:
        if isinstance(self.store, TableStateStore):
            self.store.table.delete_entity(layout.shard_of(order_id), row)
        else:
            assert isinstance(self.store, InMemoryStateStore)
            self.store.delete_row(layout.shard_of(order_id), row)


@pytest.fixture(params=["table", "memory"])
def store(request: pytest.FixtureRequest) -> StateStore:
    if request.param == "memory":
        return InMemoryStateStore()
    connection = request.getfixturevalue("storage_connection")
    return make_context(connection, request.getfixturevalue("tag")).store


@pytest.fixture
def raw(store: StateStore) -> Raw:
    return Raw(store)


def loaded(store: StateStore, order_id: str) -> Order:
    order = store.load(order_id)
    assert order is not None
    return order


def mine(entries: Iterator[IndexEntry], order_id: str) -> list[tuple[str, datetime]]:
    return [(e.step, e.at) for e in entries if e.order_id == order_id]


# --- round trips ---------------------------------------------------------------------------


def test_recent_is_the_order_as_last_written_and_no_read(store: StateStore) -> None:
    order = accept("o-recent", "fulfilment", replyTo="app-q", note="ü" * 10)
    assert store.recent("o-recent") is None
    store.create(order)
    assert store.recent("o-recent") == loaded(store, "o-recent") == order
    order.claim("instance-1", T0)
    order.apply_reply(succeeded(order), T0 + US)
    store.save(order)
    recent = store.recent("o-recent")
    assert recent == loaded(store, "o-recent") == order  # ETags and store_meta included
    assert recent is not None and recent is not order  # a copy of its own, to decide on
    recent.claim("instance-1", T0 + 2 * US)
    store.save(recent)
    assert loaded(store, "o-recent").steps[1].attempt == 1
    with pytest.raises(ConcurrencyConflict):  # stale: If-Match like any save
        order.claim("instance-2", T0 + 3 * US)
        store.save(order)


def test_create_then_load_gives_back_the_same_order(store: StateStore) -> None:
    order = accept("o-rt", "fulfilment", replyTo="app-q", sku="A-1", qty=2)
    saved = store.create(order)

    [notice] = saved.entries
    assert (notice.kind, notice.queue, notice.order_id) == ("status", "app-q", "o-rt")
    assert json.loads(notice.body)["status"] == "received"
    assert saved.partition == layout.shard_of("o-rt") == notice.partition
    # the object is left as stored: ETags, version, index, outbox handed over
    assert order.etag and order.steps[0].etag and not order.steps[0].changed
    assert order.version == 1 and order.outbox == []
    fresh = loaded(store, "o-rt")
    assert fresh == order  # every field, ETags and store_meta included
    assert fresh.body == {
        "orderId": "o-rt",
        "workflow": "fulfilment",
        "replyTo": "app-q",
        "sku": "A-1",
        "qty": 2,
    }
    assert [(s.step, s.process_state, s.complete_by) for s in fresh.steps] == [
        ("reserve-stock", StepState.PENDING, T0)
    ]
    assert [h["event"] for h in fresh.history] == ["received"]
    assert store.load("o-unknown") is None


def test_a_transition_round_trips_every_field_of_the_step(store: StateStore) -> None:
    order = accept("o-fields", replyTo="app-q")
    store.create(order)
    order.claim("instance-1", T0)
    store.save(order)
    reply = AgentReply(
        "o-fields",
        "process",
        1,
        T0,
        Outcome.TRANSIENT,
        error="HTTP 503 é😀",
        applied=Applied.MAYBE,
        token=order.steps[0].token_for(1),
    )
    order.apply_reply(reply, T0 + timedelta(seconds=1, microseconds=7), RetryPolicy())
    store.save(order)
    step = order.steps[0]
    assert step.maybe_applied == [1] and step.singled_out and step.failure_count == 1
    fresh = loaded(store, "o-fields")
    assert fresh == order
    assert fresh.version == 3 and fresh.steps[0].last_error == "HTTP 503 é😀"
    # and a success with a result, on the copy just loaded
    due = fresh.steps[0].not_before  # paced: a step timeout after the first attempt
    fresh.claim("instance-2", due)
    store.save(fresh)
    fresh.apply_reply(succeeded(fresh, {"ok": 1, "ids": ["a", "é"]}), due + timedelta(seconds=1))
    store.save(fresh)
    final = loaded(store, "o-fields")
    assert final == fresh and final.status is OrderStatus.COMPLETED
    assert final.steps[0].result == {"ok": 1, "ids": ["a", "é"]}


def test_a_60_kb_body_round_trips_over_several_properties(store: StateStore, raw: Raw) -> None:
    notes = "é😀" * 7_000 + "x" * 18_000  # 60,000 bytes of UTF-8, 39,000 UTF-16 units
    order = accept("o-big", notes=notes)
    assert utf16_units(json.dumps(order.body, ensure_ascii=False)) > entities.BODY_PART_UNITS
    store.create(order)
    record = raw.rows("o-big")[layout.order_row("o-big")]
    assert record["BodyParts"] == 2 and "Body1" in record
    fresh = loaded(store, "o-big")
    assert fresh.body["notes"] == notes and fresh == order
    fresh.claim("i", T0)
    store.save(fresh)
    assert loaded(store, "o-big").body["notes"] == notes


def test_a_record_over_the_services_limits_is_refused_whole(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parts too large for one string property (32K UTF-16 units): the store refuses the write.
    monkeypatch.setattr(entities, "BODY_PART_UNITS", 40_000)
    order = accept("o-huge", notes="y" * 39_000)
    with pytest.raises(StorageUnavailable):
        store.create(order)
    assert store.load("o-huge") is None
    assert order.version == 0 and order.etag is None
    assert not mine(store.due_pending(T0), "o-huge")


def test_records_that_cannot_be_read_are_a_corrupt_order(store: StateStore, raw: Raw) -> None:
    store.create(accept("o-bad"))
    store.create(accept("o-good"))
    record = raw.rows("o-bad")[layout.order_row("o-bad")]
    del record["Plan"]  # a manual edit gone wrong
    raw.put(record)
    with pytest.raises(CorruptOrder) as caught:
        store.load("o-bad")
    assert caught.value.order_id == "o-bad"
    assert loaded(store, "o-good").order_id == "o-good"  # the others still read


# --- create ---------------------------------------------------------------------------------


def test_a_second_create_of_an_id_is_refused_and_changes_nothing(store: StateStore) -> None:
    store.create(accept("o-twice", sku="first", replyTo="app-q"))
    again = accept("o-twice", at=T0 + timedelta(seconds=5), sku="second", replyTo="app-q")
    with pytest.raises(OrderAlreadyExists) as caught:
        store.create(again)
    assert caught.value.order_id == "o-twice"
    assert again.version == 0 and again.etag is None and len(again.outbox) == 1
    stored = loaded(store, "o-twice")
    assert stored.body["sku"] == "first" and stored.version == 1
    # its notice was not committed either
    assert [e.row for e in store.stale_outbox(T0 + timedelta(minutes=1))] == [
        layout.outbox_row(T0, "o-twice", "1-0")
    ]


def test_create_is_all_or_nothing_when_any_of_its_rows_exists(store: StateStore, raw: Raw) -> None:
    stray = layout.step_row("o-atomic", 0, "process")
    raw.put({"PartitionKey": layout.shard_of("o-atomic"), "RowKey": stray, "Note": "stray"})
    with pytest.raises(OrderAlreadyExists):
        store.create(accept("o-atomic", replyTo="app-q"))
    assert list(raw.rows("o-atomic")) == [stray]
    assert store.load("o-atomic") is None
    assert not mine(store.due_pending(T0), "o-atomic")
    assert store.list_by_status(OrderStatus.PENDING, 10, None) == ([], None)


# --- conditional saves ----------------------------------------------------------------------


def test_a_lost_update_is_a_conflict_and_writes_nothing(store: StateStore) -> None:
    store.create(accept("o-race", replyTo="app-q"))
    first, second = loaded(store, "o-race"), loaded(store, "o-race")
    first.claim("a", T0)
    store.save(first)
    second.claim("b", T0 + timedelta(seconds=1))  # another deadline, another outbox row
    with pytest.raises(ConcurrencyConflict) as caught:
        store.save(second)
    assert caught.value.order_id == "o-race"
    assert second.version == 1 and len(second.outbox) == 1  # left as it was
    now = loaded(store, "o-race")
    assert now == first and now.steps[0].locked_by == "a"
    assert mine(store.expired_processing(T0 + timedelta(hours=1)), "o-race") == [
        ("process", T0 + timedelta(seconds=30))
    ]
    assert [e.row.rsplit("|", 1)[1] for e in store.stale_outbox(T0 + timedelta(hours=1))] == [
        "1-0",
        "2-0",
    ]
    # the winner's object saves again as on any store
    first.apply_reply(succeeded(first), T0 + timedelta(seconds=2))
    store.save(first)
    assert loaded(store, "o-race").status is OrderStatus.COMPLETED


def test_saving_an_unchanged_stale_copy_is_a_conflict(store: StateStore) -> None:
    store.create(accept("o-stale"))
    stale = loaded(store, "o-stale")
    current = loaded(store, "o-stale")
    current.claim("a", T0)
    store.save(current)
    with pytest.raises(ConcurrencyConflict):
        store.save(stale)  # the order record is always written with If-Match
    store.save(current)  # no change: still its own ETag's write
    assert loaded(store, "o-stale") == current


def test_a_changed_step_record_is_written_only_if_unchanged_since_loaded(
    store: StateStore, raw: Raw
) -> None:
    store.create(accept("o-step"))
    order = loaded(store, "o-step")
    row = layout.step_row("o-step", 0, "process")
    raw.put(raw.rows("o-step")[row])  # the same values, written again: a new ETag
    order.claim("a", T0)
    with pytest.raises(ConcurrencyConflict):
        store.save(order)
    assert loaded(store, "o-step").steps[0].process_state is StepState.PENDING


def test_a_new_step_record_that_exists_already_is_a_conflict(store: StateStore, raw: Raw) -> None:
    store.create(accept("o-next", "fulfilment"))
    order = loaded(store, "o-next")
    order.claim("a", T0)
    store.save(order)
    racing = layout.step_row("o-next", 1, "charge-payment")
    raw.put({"PartitionKey": layout.shard_of("o-next"), "RowKey": racing, "Note": "racer"})
    order.apply_reply(succeeded(order), T0 + timedelta(seconds=1))  # adds charge-payment
    with pytest.raises(ConcurrencyConflict):
        store.save(order)
    raw.delete("o-next", racing)
    stored = loaded(store, "o-next")
    assert [s.step for s in stored.steps] == ["reserve-stock"]
    assert stored.steps[0].process_state is StepState.PROCESSING


def test_concurrent_claims_in_threads_have_exactly_one_winner(store: StateStore) -> None:
    store.create(accept("o-threads"))
    copies = [loaded(store, "o-threads") for _ in range(6)]
    barrier = threading.Barrier(len(copies))
    wins: list[str] = []

    def claim(n: int) -> None:
        copies[n].claim(f"t-{n}", T0)
        barrier.wait(timeout=30)
        try:
            store.save(copies[n])
            wins.append(f"t-{n}")
        except ConcurrencyConflict:
            pass

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(len(copies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(wins) == 1
    final = loaded(store, "o-threads")
    assert final.steps[0].locked_by == wins[0] and final.steps[0].attempt == 1


# --- index ------------------------------------------------------------------------------------


def test_the_index_follows_every_transition(store: StateStore) -> None:
    policy = RetryPolicy(max_failure_count=3, soft_threshold=0)
    store.create(accept("o-idx"))
    # Pending, due at T0: due at T0 (inclusive), not a microsecond before
    assert mine(store.due_pending(T0), "o-idx") == [("process", T0)]
    assert mine(store.due_pending(T0 - US), "o-idx") == []
    assert mine(store.expired_processing(T0 + timedelta(days=1)), "o-idx") == []

    order = loaded(store, "o-idx")
    deadline = order.claim("a", T0).complete_by
    store.save(order)
    assert mine(store.due_pending(T0 + timedelta(days=1)), "o-idx") == []
    # Processing: expired strictly after its deadline
    assert mine(store.expired_processing(deadline), "o-idx") == []
    assert mine(store.expired_processing(deadline + US), "o-idx") == [("process", deadline)]

    order.expire(deadline + timedelta(seconds=5), policy)  # back to Pending, with a backoff
    store.save(order)
    due = order.steps[0].complete_by
    assert due > deadline + timedelta(seconds=5)
    assert mine(store.expired_processing(deadline + timedelta(days=1)), "o-idx") == []
    assert mine(store.due_pending(due - US), "o-idx") == []
    assert mine(store.due_pending(due), "o-idx") == [("process", due)]

    order.claim("b", due)
    store.save(order)
    order.apply_reply(succeeded(order), due + timedelta(seconds=1))
    store.save(order)
    assert mine(store.due_pending(due + timedelta(days=1)), "o-idx") == []
    assert mine(store.expired_processing(due + timedelta(days=1)), "o-idx") == []
    assert store.list_by_status(OrderStatus.COMPLETED, 10, None) == (["o-idx"], None)
    for status in (OrderStatus.PENDING, OrderStatus.PROCESSING):
        assert store.list_by_status(status, 10, None) == ([], None)


def test_a_save_goes_on_when_an_index_row_is_already_gone(store: StateStore, raw: Raw) -> None:
    store.create(accept("o-gone"))
    order = loaded(store, "o-gone")
    raw.delete("o-gone", layout.pending_row(T0, "o-gone", "process"))
    order.claim("a", T0)
    store.save(order)
    assert mine(store.expired_processing(T0 + timedelta(minutes=1)), "o-gone") == [
        ("process", T0 + timedelta(seconds=30))
    ]
    assert loaded(store, "o-gone") == order


def test_repair_index_rebuilds_what_the_state_implies(store: StateStore, raw: Raw) -> None:
    store.create(accept("o-fix"))
    pending = layout.pending_row(T0, "o-fix", "process")
    status = layout.status_row("pending", "o-fix", T0)
    clean = store.repair_index("o-fix")
    assert clean["repaired"] is False and clean["kept"] == sorted([pending, status])

    before = loaded(store, "o-fix")
    stray = layout.processing_row(T0, "o-fix", "process")
    raw.delete("o-fix", pending)
    shard = layout.shard_of("o-fix")
    raw.put({"PartitionKey": shard, "RowKey": stray, "OrderRef": "o-fix", "StepName": "process"})
    raw.put({"PartitionKey": shard, "RowKey": status, "OrderRef": "o-fix", "Workflow": "other"})
    assert mine(store.due_pending(T0), "o-fix") == []

    report = store.repair_index("o-fix")
    assert report == {
        "orderId": "o-fix",
        "status": "pending",
        "removed": [stray],
        "added": [pending],
        "rewritten": [status],
        "kept": [],
        "repaired": True,
    }
    assert mine(store.due_pending(T0), "o-fix") == [("process", T0)]
    assert mine(store.expired_processing(T0 + timedelta(days=1)), "o-fix") == []
    assert store.repair_index("o-fix")["repaired"] is False
    # the repair is conditional on the order record: a copy read before it is stale
    before.claim("a", T0)
    with pytest.raises(ConcurrencyConflict):
        store.save(before)
    with pytest.raises(OrderNotFound):
        store.repair_index("o-nobody")


# --- outbox -------------------------------------------------------------------------------


def test_notices_are_committed_with_their_transition(store: StateStore) -> None:
    order = accept("o-out", replyTo="app-q")
    created = store.create(order)
    # stale_outbox: committed strictly before ``before``
    assert list(store.stale_outbox(T0)) == []
    assert list(store.stale_outbox(T0 + US)) == list(created.entries)

    order.claim("a", T0 + timedelta(seconds=1))
    order.expire(T0 + timedelta(seconds=40), RetryPolicy(max_failure_count=1))
    assert order.status is OrderStatus.ERROR
    failed = store.save(order)
    kinds = [(e.kind, e.queue) for e in failed.entries]
    assert kinds == [("status", "app-q"), ("alert", None), ("status", "app-q")]
    assert [json.loads(e.body).get("status") for e in failed.entries] == [
        "processing",
        None,
        "error",
    ]
    alert = json.loads(failed.entries[1].body)
    assert alert["orderId"] == "o-out" and alert["step"] == "process"
    assert alert["failureCount"] == 1
    assert len({e.row for e in failed.entries}) == 3
    assert list(store.stale_outbox(T0 + timedelta(minutes=5))) == [
        *created.entries,
        *failed.entries,
    ]

    store.delete_outbox(created)
    store.delete_outbox([failed.entries[1]])
    store.delete_outbox(created)  # gone already: nothing to do, no error
    left = list(store.stale_outbox(T0 + timedelta(minutes=5)))
    assert left == [failed.entries[0], failed.entries[2]]
    store.delete_outbox(failed)
    assert list(store.stale_outbox(T0 + timedelta(minutes=5))) == []
    assert loaded(store, "o-out") == order  # deleting notices does not touch the order


# --- listing ----------------------------------------------------------------------------------


def all_pages(store: StateStore, where: ListFilter, size: int) -> list[list[str]]:
    pages: list[list[str]] = []
    token: str | None = None
    for _ in range(100):
        ids, token = store.list_by_status(where, size, token)
        assert len(ids) <= size
        pages.append(ids)
        if token is None:
            return pages
        assert isinstance(token, str) and token
    raise AssertionError("the pages never ended")


def test_listing_is_newest_first_paged_filtered_and_counted(store: StateStore) -> None:
    ids = [f"n-{i:02d}" for i in range(30)]  # a second apart: n-29 is the newest
    for i, order_id in enumerate(ids):
        workflow = "fulfilment" if i % 3 == 0 else "order"
        store.create(accept(order_id, workflow, at=T0 + timedelta(seconds=i)))
    assert len({layout.shard_of(i) for i in ids}) > 8  # spread over the shards

    pending = ListFilter(OrderStatus.PENDING)
    pages = all_pages(store, pending, 7)
    assert [i for p in pages for i in p] == list(reversed(ids))
    assert [len(p) for p in pages[:4]] == [7, 7, 7, 7]
    assert pages[4] == ["n-01", "n-00"] and pages[5:] in ([], [[]])
    assert all_pages(store, pending, 100) == [list(reversed(ids))]

    fulfilment = ListFilter(OrderStatus.PENDING, workflow="fulfilment")
    assert [i for p in all_pages(store, fulfilment, 4) for i in p] == [
        f"n-{i:02d}" for i in (27, 24, 21, 18, 15, 12, 9, 6, 3, 0)
    ]
    window = ListFilter(  # from inclusive, to exclusive
        OrderStatus.PENDING,
        created_from=T0 + timedelta(seconds=10),
        created_to=T0 + timedelta(seconds=14),
    )
    assert [i for p in all_pages(store, window, 3) for i in p] == ["n-13", "n-12", "n-11", "n-10"]
    both = ListFilter(OrderStatus.PENDING, "fulfilment", window.created_from, window.created_to)
    assert all_pages(store, both, 10) == [["n-12"]]

    assert store.count_by_status(pending) == 30
    assert store.count_by_status(pending, cap=11) == 11
    assert store.count_by_status(fulfilment) == 10
    assert store.count_by_status(window) == 4
    assert store.count_by_status(ListFilter(OrderStatus.ERROR)) == 0

    # a status change moves the order from one listing to the other
    order = loaded(store, "n-20")
    order.claim("i", T0 + timedelta(minutes=1))
    store.save(order)
    assert "n-20" not in [i for p in all_pages(store, pending, 50) for i in p]
    assert store.list_by_status(OrderStatus.PROCESSING, 5, None) == (["n-20"], None)
    assert store.count_by_status(pending) == 29


def test_a_token_the_store_never_made_is_refused(store: StateStore) -> None:
    for i in range(3):
        store.create(accept(f"t-{i}", at=T0 + timedelta(seconds=i)))
    ids, token = store.list_by_status(OrderStatus.PENDING, 2, None)
    assert ids == ["t-2", "t-1"] and token is not None
    assert store.list_by_status(OrderStatus.PENDING, 2, token) == (["t-0"], None)
    for bad in ("status|pending|x", "", "12|t-0", token + "|", "x" * 300):
        with pytest.raises(InvalidContinuationToken):
            store.list_by_status(OrderStatus.PENDING, 2, bad)
    # well formed but pointing past everything: an empty page, not an error
    assert store.list_by_status(OrderStatus.PENDING, 2, "9999999999999|zz") == ([], None)


def test_a_malformed_index_row_is_skipped_not_read_as_an_order(store: StateStore, raw: Raw) -> None:
    """An index row without its order reference (a manual edit) is logged and skipped: a
    sweep must not go looking for an order called "None"."""
    shard = layout.shard_of("o-bad-index")
    raw.put({"PartitionKey": shard, "RowKey": layout.pending_row(T0, "o-bad-index", "process")})
    raw.put(
        {
            "PartitionKey": shard,
            "RowKey": layout.processing_row(T0, "o-bad-index", "process"),
            "OrderRef": "o-bad-index",
        }
    )
    due = [e.order_id for e in store.due_pending(T0 + timedelta(seconds=1))]
    expired = [e.order_id for e in store.expired_processing(T0 + timedelta(seconds=1))]
    assert "None" not in due and "o-bad-index" not in due
    assert "o-bad-index" not in expired  # no StepName: skipped as well


# --- search rows (docs/contracts.md §3.14) ------------------------------------------------------


def searched(field: str, value: str, **kw: Any) -> ListFilter:
    return ListFilter(None, search=(field, value), **kw)


def search_keys(raw: Raw, order_id: str) -> list[str]:
    return sorted(k for k in raw.rows(order_id) if k.startswith("search|"))


def test_search_rows_list_newest_first_paged_by_workflow_and_time(store: StateStore) -> None:
    ids = [f"s-{i:02d}" for i in range(20)]  # a second apart: s-19 is the newest
    for i, order_id in enumerate(ids):
        workflow = "fulfilment" if i % 4 == 0 else "order"
        customer = "c-1" if i % 2 == 0 else "c-2"
        store.create(accept(order_id, workflow, at=T0 + timedelta(seconds=i), customerId=customer))
    evens = [f"s-{i:02d}" for i in range(18, -1, -2)]
    assert len({layout.shard_of(i) for i in evens}) > 5  # spread over the shards
    pages = all_pages(store, searched("customerId", "c-1"), 3)
    assert [i for p in pages for i in p] == evens
    assert [len(p) for p in pages[:3]] == [3, 3, 3]
    assert all_pages(store, searched("customerId", "c-1"), 100) == [evens]
    fulfilment = searched("customerId", "c-1", workflow="fulfilment")
    listed = [i for p in all_pages(store, fulfilment, 2) for i in p]
    assert listed == ["s-16", "s-12", "s-08", "s-04", "s-00"]
    window = searched(
        "customerId",
        "c-2",
        created_from=T0 + timedelta(seconds=5),
        created_to=T0 + timedelta(seconds=9),
    )
    assert all_pages(store, window, 10) == [["s-07", "s-05"]]
    assert store.count_by_status(searched("customerId", "c-2")) == 10
    assert all_pages(store, searched("customerId", "c-3"), 10) == [[]]
    assert all_pages(store, searched("email", "c-1"), 10) == [[]]  # not that field's rows


def test_a_value_a_key_cannot_hold_is_searched_by_its_digest(store: StateStore, raw: Raw) -> None:
    value = "A/B\\C#?\u0007 ü " + "z" * 200  # what Table keys refuse, and long
    store.create(accept("s-odd", customerId=value))
    [key] = search_keys(raw, "s-odd")
    assert value not in key and raw.rows("s-odd")[key]["Value"] == value
    assert store.list_by_status(searched("customerId", value), 5, None) == (["s-odd"], None)


def test_search_rows_move_with_the_orders_data_in_its_save(store: StateStore, raw: Raw) -> None:
    """A fix of the order's data (``Order.resubmit`` with a patch) is a save like this one:
    the row of the old value goes and the new one comes in the same transaction."""
    store.create(accept("s-move", "fulfilment", customerId="c-old", email="a@x"))
    order = loaded(store, "s-move")
    before = search_keys(raw, "s-move")
    order.body["customerId"] = "c-new"
    store.save(order)
    after = search_keys(raw, "s-move")
    assert len(before) == len(after) == 2 and len(set(before) & set(after)) == 1
    assert store.list_by_status(searched("customerId", "c-new"), 5, None) == (["s-move"], None)
    assert store.list_by_status(searched("customerId", "c-old"), 5, None) == ([], None)
    assert store.list_by_status(searched("email", "a@x"), 5, None) == (["s-move"], None)
    order = loaded(store, "s-move")
    del order.body["email"]
    order.claim("i", T0)  # a transition too: the rows stay with any status
    store.save(order)
    assert store.list_by_status(searched("email", "a@x"), 5, None) == ([], None)
    assert len(search_keys(raw, "s-move")) == 1


def test_repair_index_rebuilds_search_rows_and_a_stray_one_lists_no_order(
    store: StateStore, raw: Raw
) -> None:
    store.create(accept("s-fix", customerId="c-1"))
    [key] = search_keys(raw, "s-fix")
    raw.delete("s-fix", key)
    assert store.list_by_status(searched("customerId", "c-1"), 5, None) == ([], None)
    assert store.repair_index("s-fix")["added"] == [key]
    assert store.list_by_status(searched("customerId", "c-1"), 5, None) == (["s-fix"], None)
    # a row that names no order is listed by the store as any row is; the order it names
    # is not there, and the caller checks every order it loads (``ListFilter.matches``)
    ghost = layout.search_row("customerId", "c-1", "s-ghost", T0 + timedelta(seconds=1))
    raw.put(
        {
            "PartitionKey": layout.shard_of("s-ghost"),
            "RowKey": ghost,
            "OrderRef": "s-ghost",
            "Workflow": "order",
            "Field": "customerId",
            "Value": "c-1",
        }
    )
    ids, _ = store.list_by_status(searched("customerId", "c-1"), 5, None)
    assert ids == ["s-ghost", "s-fix"] and store.load("s-ghost") is None
    where = searched("customerId", "c-1")
    assert where.matches(loaded(store, "s-fix"))


@pytest.fixture
def result_search(store: StateStore) -> Iterator[None]:
    """The declarations of ``tests/fixtures/result_search.py``: workflows searched by a
    step's result (docs/contracts.md §3.17); after the store (its bootstrap puts the
    settings' declarations to use)."""
    with declarations("tests.fixtures.result_search"):
        yield


def accept_returns(order_id: str, workflow: str = "exchange", **extra: Any) -> Order:
    return accept(order_id, workflow, **extra)


@pytest.mark.usefixtures("result_search")
def test_a_steps_result_field_gets_its_search_row_in_the_save_that_records_it(
    store: StateStore, raw: Raw
) -> None:
    store.create(accept_returns("s-rma", "returns", customerId="c-1"))
    assert [k.split("|")[1] for k in search_keys(raw, "s-rma")] == ["customerId"]
    assert store.list_by_status(searched("rma", "R-1"), 5, None) == ([], None)
    order = loaded(store, "s-rma")
    order.claim("i", T0)
    order.apply_reply(succeeded(order, {"rma": "R-1"}), T0 + timedelta(seconds=1))
    store.save(order)
    rma_row = layout.search_row("rma", "R-1", "s-rma", T0)
    assert [k.split("|")[1] for k in search_keys(raw, "s-rma")] == ["customerId", "rma"]
    assert raw.rows("s-rma")[rma_row]["Field"] == "receive-return.rma"
    assert raw.rows("s-rma")[rma_row]["Value"] == "R-1"
    assert store.list_by_status(searched("rma", "R-1"), 5, None) == (["s-rma"], None)
    assert searched("rma", "R-1").matches(loaded(store, "s-rma"))
    # a new result for the step replaces the row in the save that records it
    order = loaded(store, "s-rma")
    [record] = [r for r in order.steps if r.step == "receive-return"]
    record.result, record.changed = {"rma": "R-2"}, True
    store.save(order)
    assert store.list_by_status(searched("rma", "R-1"), 5, None) == ([], None)
    assert store.list_by_status(searched("rma", "R-2"), 5, None) == (["s-rma"], None)
    assert not searched("rma", "R-1").matches(loaded(store, "s-rma"))
    # and a repair rebuilds it from the step's result
    [key] = [k for k in search_keys(raw, "s-rma") if k.startswith("search|rma|")]
    raw.delete("s-rma", key)
    assert store.repair_index("s-rma")["added"] == [key]


@pytest.mark.usefixtures("result_search")
def test_a_result_field_stays_searchable_when_its_step_is_undone(store: StateStore) -> None:
    store.create(accept_returns("s-undo", "return-undone"))
    order = loaded(store, "s-undo")
    order.claim("i", T0)
    order.apply_reply(succeeded(order, {"rma": "R-9"}), T0 + timedelta(seconds=1))
    store.save(order)
    order = loaded(store, "s-undo")
    order.claim("i", T0 + timedelta(seconds=2))
    step = order.active_step()
    assert step is not None and step.step == "refund"
    refusal = replace(succeeded(order), outcome=Outcome.REFUSED, result=None, error="HTTP 422")
    order.apply_reply(refusal, T0 + timedelta(seconds=3), RetryPolicy(max_failure_count=1))
    store.save(order)
    order = loaded(store, "s-undo")  # receive-return is undone: cancel-return runs
    order.claim("i", T0 + timedelta(seconds=4))
    order.apply_reply(succeeded(order), T0 + timedelta(seconds=5))
    store.save(order)
    undone = loaded(store, "s-undo")
    assert undone.status is OrderStatus.COMPENSATED
    [record] = [r for r in undone.steps if r.step == "receive-return"]
    assert record.process_state is StepState.COMPENSATED
    assert store.list_by_status(searched("rma", "R-9"), 5, None) == (["s-undo"], None)
    assert ListFilter(OrderStatus.COMPENSATED, search=("rma", "R-9")).matches(undone)


# --- the agents' runtime controls (AgentControlStore) ----------------------------------------

DECLARED_LIMITS = Limits(32, None)


def test_a_control_round_trips_with_its_audit_entry(store: Any) -> None:
    assert store.read_controls() == {}
    paused, entry = controls.pause(AgentControl("carrier"), DECLARED_LIMITS, "alice", "r1", T0)
    stored = store.write_control(paused, entry)
    assert stored.etag is not None
    [(name, found)] = store.read_controls().items()
    assert name == "carrier" and found == stored  # every field, the ETag included
    later = T0 + timedelta(seconds=90)
    limited, entry2 = controls.set_limits(
        found, DECLARED_LIMITS, "bob", "quota", later, concurrency=3, rate=0.25
    )
    stored2 = store.write_control(limited, entry2)
    assert stored2.etag != stored.etag
    again = store.read_controls()["carrier"]
    assert (again.concurrency, again.rate, again.version) == (3, 0.25, 2)
    assert again.pause == Pause(T0, "alice", "r1") and again.changed_by == "bob"
    resumed, entry3 = controls.resume(again, DECLARED_LIMITS, "carol", "", later)
    store.write_control(resumed, entry3)
    final = store.read_controls()["carrier"]
    assert final.pause is None and final.resumed_at == later
    entries, token = store.audit_page(10)
    assert token is None
    assert [e.to_json() for e in entries] == [e.to_json() for e in (entry3, entry2, entry)]


def test_a_control_write_is_conditional_and_all_or_nothing(store: Any) -> None:
    paused, entry = controls.pause(AgentControl("orders"), DECLARED_LIMITS, "alice", "r", T0)
    first = store.write_control(paused, entry)
    # someone else created it meanwhile: a create over it is a conflict
    with pytest.raises(ConcurrencyConflict):
        store.write_control(paused, entry)
    # a write on what was read before the last change is a conflict
    resumed, entry2 = controls.resume(first, DECLARED_LIMITS, "bob", "", T0)
    store.write_control(resumed, entry2)
    stale, entry3 = controls.set_limits(
        first, DECLARED_LIMITS, "carol", "", T0 + timedelta(seconds=5), concurrency=2
    )
    with pytest.raises(ConcurrencyConflict):
        store.write_control(stale, entry3)
    # neither refused write left anything: the control, and two audit entries
    assert store.read_controls()["orders"].pause is None
    assert store.read_controls()["orders"].concurrency is None
    entries, _ = store.audit_page(10)
    assert [e.action for e in entries] == ["resume", "pause"]


def test_the_audit_pages_newest_first_and_filters_by_agent(store: Any) -> None:
    made = []
    control = {"orders": AgentControl("orders"), "carrier": AgentControl("carrier")}
    for n in range(7):
        agent = "orders" if n % 2 else "carrier"
        at = T0 + timedelta(seconds=n // 2)  # two changes in the same millisecond, often
        current = control[agent]
        change = controls.resume if current.paused else controls.pause
        after, entry = change(current, DECLARED_LIMITS, "op", f"change {n}", at)
        control[agent] = store.write_control(after, entry)
        made.append(entry)
    newest_first = sorted(made, key=lambda e: e.at, reverse=True)
    seen, token = [], None
    while True:
        page, token = store.audit_page(3, token)
        seen += page
        assert len(page) <= 3
        if token is None:
            break
    assert [e.at for e in seen] == [e.at for e in newest_first]
    assert sorted(e.reason for e in seen) == sorted(e.reason for e in made)
    carrier, token = store.audit_page(10, None, "carrier")
    assert token is None and [e.reason for e in carrier] == [f"change {n}" for n in (6, 4, 2, 0)]
    for bad in ("audit|x", "", "status|pending|x", "audit|123|orders|abc"):
        with pytest.raises(InvalidContinuationToken):
            store.audit_page(3, bad)


def test_controls_are_not_orders_and_orders_are_not_controls(store: Any) -> None:
    paused, entry = controls.pause(AgentControl("orders"), DECLARED_LIMITS, "alice", "r", T0)
    store.write_control(paused, entry)
    store.create(accept("o-beside", replyTo="app-q"))
    far = T0 + timedelta(days=3650)
    assert [e.order_id for e in store.due_pending(far)] == ["o-beside"]
    assert list(store.expired_processing(far)) == []
    assert [e.order_id for e in store.stale_outbox(far)] == ["o-beside"]
    assert store.list_by_status(OrderStatus.PENDING, 10, None) == (["o-beside"], None)
    assert list(store.read_controls()) == ["orders"]


# --- the agents' shared outage records (OutageStore) ------------------------------------------


def _outage(agent: str = "carrier") -> Outage:
    first = report_failing(
        Outage(agent), T0, T0 + timedelta(seconds=10), "HTTP 503", T0, OutagePolicy()
    )
    assert first is not None
    alerted = report_failing(
        first, T0, T0 + timedelta(seconds=300), "HTTP 502 \u202e", T0, OutagePolicy()
    )
    assert alerted is not None and alerted.owed
    return alerted


def test_an_outage_record_round_trips_every_field(store: Any) -> None:
    assert store.read_outages() == {}
    stored = store.write_outage(_outage())
    assert stored.etag is not None
    assert store.read_outages() == {"carrier": stored}  # every field, the ETag included

    ended = report_answer(stored, T0 + timedelta(seconds=400), T0 + timedelta(seconds=400))
    assert ended is not None and len(ended.owed) == 2 and ended.past
    again = store.write_outage(ended)
    assert again.etag != stored.etag
    assert store.read_outages()["carrier"] == again


def test_an_outage_write_is_conditional(store: Any) -> None:
    first = store.write_outage(_outage())
    with pytest.raises(ConcurrencyConflict):  # created meanwhile by another instance
        store.write_outage(_outage())
    newer = store.write_outage(replace(first, reason="newer"))
    with pytest.raises(ConcurrencyConflict):  # decided on what was read before that
        store.write_outage(replace(first, reason="stale"))
    assert store.read_outages()["carrier"] == newer


def test_outages_are_neither_controls_nor_orders(store: Any) -> None:
    paused, entry = controls.pause(AgentControl("carrier"), DECLARED_LIMITS, "alice", "r", T0)
    store.write_control(paused, entry)
    store.write_outage(_outage("carrier"))
    store.write_outage(_outage("orders"))
    store.create(accept("o-beside"))
    assert list(store.read_controls()) == ["carrier"]
    assert sorted(store.read_outages()) == ["carrier", "orders"]
    far = T0 + timedelta(days=3650)
    assert [e.order_id for e in store.due_pending(far)] == ["o-beside"]
    entries, _ = store.audit_page(10)
    assert [e.action for e in entries] == ["pause"]


def test_steps_held_for_a_pause_are_found_whatever_their_due_time(
    store: StateStore, raw: Raw
) -> None:
    for order_id, agent in (("h-1", "orders"), ("h-2", "orders"), ("h-3", "inventory")):
        order = accept(order_id, "order" if agent == "orders" else "fulfilment")
        order.hold_for_pause(agent, T0, T0 + timedelta(hours=1 + len(order_id)))
        store.create(order)
    store.create(accept("h-free"))  # Pending, due, not held
    assert sorted(e.order_id for e in store.held_pending("orders")) == ["h-1", "h-2"]
    assert [(e.order_id, e.step) for e in store.held_pending("inventory")] == [
        ("h-3", "reserve-stock")
    ]
    assert list(store.held_pending("carrier")) == []
    assert [e.order_id for e in store.due_pending(T0)] == ["h-free"]  # the held wait

    # claimed after the resume: no longer held
    order = loaded(store, "h-1")
    order.claim("i-1", T0 + timedelta(seconds=10), resumed=True)
    store.save(order)
    assert [e.order_id for e in store.held_pending("orders")] == ["h-2"]
    fresh = loaded(store, "h-1").steps[0]
    assert fresh.paused_for == "" and fresh.process_state is StepState.PROCESSING

    # the mark is part of the index row: a repair keeps it, or puts it back
    assert store.repair_index("h-2")["repaired"] is False
    [row] = [k for k in raw.rows("h-2") if k.startswith("pending|")]
    raw.put(
        {
            "PartitionKey": layout.shard_of("h-2"),
            "RowKey": row,
            "OrderRef": "h-2",
            "StepName": "process",
        }
    )
    assert list(store.held_pending("orders")) == []
    assert store.repair_index("h-2")["rewritten"] == [row]
    assert [e.order_id for e in store.held_pending("orders")] == ["h-2"]
    held = loaded(store, "h-2").steps[0]
    assert (held.paused_for, held.paused_since) == ("orders", T0)


# --- what a workflow can say (docs/contracts.md §3.13) ------------------------------------------


@pytest.fixture
def flows() -> Iterator[None]:
    from tests.support import declarations

    with declarations():
        yield


def test_a_parallel_group_has_an_index_row_per_step_and_both_round_trip(
    store: StateStore, raw: Raw, flows: None
) -> None:
    order = accept("o-trip", "trip")
    store.create(order)
    order.claim("i", T0, step="book-flight")
    store.save(order)
    keys = raw.rows("o-trip")
    assert any(k.startswith("processing|") and k.endswith("|book-flight") for k in keys)
    assert any(k.startswith("pending|") and k.endswith("|book-hotel") for k in keys)
    fresh = loaded(store, "o-trip")
    assert {s.step: str(s.process_state) for s in fresh.steps} == {
        "book-flight": "Processing",
        "book-hotel": "Pending",
    }
    due = {e.step for e in store.due_pending(T0) if e.order_id == "o-trip"}
    assert due == {"book-hotel"}


def test_inputs_events_waits_decisions_and_results_round_trip(
    store: StateStore, raw: Raw, flows: None
) -> None:
    order = accept("o-appr", "approval", amount=5000)
    order.deliver_event("captured", {"result": {"ref": "é" * 40_000}}, T0, "bank", "early")
    store.create(order)
    order = loaded(store, "o-appr")
    assert order.events["captured"]["payload"] == {"result": {"ref": "é" * 40_000}}
    order.claim("i", T0)
    reserve = order.find("reserve")
    assert reserve is not None
    big = {"reservation": "r" * 50_000}  # over one property: kept whole, in parts
    order.apply_reply(
        AgentReply("o-appr", "reserve", 1, T0, Outcome.SUCCEEDED, big, token=reserve.token_for(1)),
        T0,
        RetryPolicy(),
    )
    store.save(order)
    fresh = loaded(store, "o-appr")
    approved = fresh.find("approved")
    assert approved is not None and approved.waiting_for == {"event": "approved"}
    assert approved.decided == {"when": True}
    assert fresh.find("reserve").result == big  # type: ignore[union-attr]
    keys = raw.rows("o-appr")
    assert any(k.startswith("waiting|approved|") for k in keys)
    page, _ = store.list_by_status(ListFilter(OrderStatus.PROCESSING, waiting="approved"), 10, None)
    assert page == ["o-appr"]
    fresh.deliver_event("approved", {"result": {"by": "ann"}}, T0, "ops")
    store.save(fresh)
    again = loaded(store, "o-appr")
    assert again.find("approved").result == {"by": "ann"}  # type: ignore[union-attr]
    assert (
        again.events["approved"]["taken"] == "approved"
        and "payload" not in again.events["approved"]
    )
    assert not any(k.startswith("waiting|approved|") for k in raw.rows("o-appr"))
    hold = again.find("hold")
    assert hold is not None and hold.waiting_for == {"until": "2026-11-22T10:10:00.000Z"}


def test_a_skipped_step_and_an_input_round_trip(store: StateStore, flows: None) -> None:
    order = accept("o-ret", "returns", items=["boots"])
    store.create(order)
    order = loaded(store, "o-ret")
    order.claim("i", T0)
    desk = order.find("receive-return")
    assert desk is not None
    order.apply_reply(
        AgentReply(
            "o-ret",
            "receive-return",
            1,
            T0,
            Outcome.SUCCEEDED,
            {"rma": "R"},
            token=desk.token_for(1),
        ),
        T0,
        RetryPolicy(),
    )
    store.save(order)
    restock = loaded(store, "o-ret").find("restock")
    assert restock is not None and restock.input == {"rma": "R", "items": ["boots"]}
    small = accept("o-small", "approval", amount=5)
    store.create(small)
    small = loaded(store, "o-small")
    small.claim("i", T0)
    reserve = small.find("reserve")
    assert reserve is not None
    small.apply_reply(
        AgentReply("o-small", "reserve", 1, T0, Outcome.SUCCEEDED, {}, token=reserve.token_for(1)),
        T0,
        RetryPolicy(),
    )
    store.save(small)
    skipped = loaded(store, "o-small").find("approved")
    assert skipped is not None and skipped.process_state is StepState.SKIPPED
