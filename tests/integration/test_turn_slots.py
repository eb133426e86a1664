"""The slots of per-key concurrency (``stores/turns.py``, docs/contracts.md §3.16) on both
stores: Azurite's Table service and the in-memory twin pass the same suite, and two
instances releasing and claiming one key at once never make more holders than the limit
(the slot row's ETag decides)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.errors import ConcurrencyConflict
from core.turn_keeper import TurnKeeper
from core.turns import Settled, Slot, settle
from stores.memory import InMemoryStateStore
from stores.tables import TableStateStore
from stores.turns import partition_of
from tests.support import make_context

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
Store = TableStateStore | InMemoryStateStore


@pytest.fixture(params=["table", "memory"])
def stores(request: pytest.FixtureRequest) -> tuple[Store, Store]:
    """Two stores on the same rows (two instances of the app): their own clients."""
    if request.param == "memory":
        memory = InMemoryStateStore()
        return memory, memory
    connection = request.getfixturevalue("storage_connection")
    tag = request.getfixturevalue("tag")
    return make_context(connection, tag).store, make_context(connection, tag).store


@pytest.fixture
def store(stores: tuple[Store, Store]) -> Store:
    return stores[0]


def test_the_line_is_kept_in_order_of_acceptance_and_a_place_once(store: Store) -> None:
    for n, order_id in enumerate(["c", "a", "b"]):
        store.add_waiter("w", "acme", order_id, T0 + timedelta(seconds=n))
    store.add_waiter("w", "acme", "c", T0 + timedelta(hours=1))  # again: keeps its place

    slot = store.read_slot("w", "acme")

    assert [w.order_id for w in slot.waiting] == ["c", "a", "b"]
    assert slot.etag is None and slot.holders == ()
    assert store.read_slot("w", "other").empty  # no key's line is another's


def test_a_slot_is_written_if_match_its_etag(store: Store) -> None:
    store.add_waiter("w", "k", "o-1", T0)
    store.add_waiter("w", "k", "o-2", T0 + timedelta(seconds=1))
    first = store.read_slot("w", "k")
    store.write_slot(first, settle(first, 1, T0))

    held = store.read_slot("w", "k")
    assert held.holder_ids == ["o-1"] and [w.order_id for w in held.waiting] == ["o-2"]
    assert held.holders[0].since == T0 and held.limit == 1
    with pytest.raises(ConcurrencyConflict):  # decided on what the write above replaced
        store.write_slot(first, settle(first, 2, T0))
    with pytest.raises(ConcurrencyConflict):  # its row exists: a create loses
        store.write_slot(Slot("w", "k"), Settled((), (), (), True))
    assert store.read_slot("w", "k") == held


def test_a_write_of_the_slot_row_alone_is_if_match_too(store: Store) -> None:
    store.add_waiter("w", "k", "o-1", T0)
    first = store.read_slot("w", "k")
    store.write_slot(first, settle(first, 1, T0))
    held = store.read_slot("w", "k")

    store.write_slot(held, Settled((), (), (), True, 1))  # o-1 leaves; nobody waits

    with pytest.raises(ConcurrencyConflict):  # decided on what that write replaced
        store.write_slot(held, Settled((), (), (), True, 1))
    assert store.read_slot("w", "k").holders == ()


def test_a_write_of_one_row_is_sent_as_that_operation_not_as_a_batch(
    storage_connection: str, tag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One operation in a batch costs the SDK its multipart body (a thread pool per batch,
    the answer parsed by ``email``); alone it is the same billed, all-or-nothing write."""
    store = make_context(storage_connection, tag).store
    assert isinstance(store, TableStateStore)
    batches: list[int] = []
    submit = store._table.submit_transaction

    def counted(operations: list[Any], **kwargs: Any) -> Any:
        batches.append(len(operations))
        return submit(operations, **kwargs)

    monkeypatch.setattr(store._table, "submit_transaction", counted)
    store.add_waiter("w", "k", "o-1", T0)
    store.add_waiter("w", "k", "o-2", T0 + timedelta(seconds=1))
    slot = store.read_slot("w", "k")
    store.write_slot(slot, settle(slot, 1, T0))  # promotes o-1: its row dropped, a batch
    held = store.read_slot("w", "k")
    store.write_slot(held, Settled(held.holders, (), (), True, 2))  # the slot row alone

    assert batches == [2]
    assert store.read_slot("w", "k").limit == 2


def test_a_write_that_drops_a_row_already_gone_applies_nothing(store: Store) -> None:
    store.add_waiter("w", "k", "o-1", T0)
    slot = store.read_slot("w", "k")
    decided = settle(slot, 1, T0)
    store.write_slot(slot, settle(slot, 0, T0, leaving=("o-1",)))  # it left the line

    with pytest.raises(ConcurrencyConflict):
        store.write_slot(store.read_slot("w", "k"), decided)

    assert store.read_slot("w", "k").holders == ()


def test_keys_are_listed_while_they_have_a_slot(store: Store) -> None:
    key = "ACME/Ltd #7? ünïcode " + "x" * 230  # any 1-256 characters
    store.add_waiter("w", key, "o-1", T0)
    slot = store.read_slot("w", key)
    store.write_slot(slot, settle(slot, 1, T0))

    assert ("w", key) in list(store.turn_keys(100))
    held = store.read_slot("w", key)
    assert not store.forget_slot(held)  # someone holds it
    store.write_slot(held, settle(held, 1, T0, leaving=("o-1",)))
    empty = store.read_slot("w", key)
    assert empty.empty and store.forget_slot(empty)
    assert ("w", key) not in list(store.turn_keys(100))
    assert store.read_slot("w", key) == Slot("w", key)
    assert partition_of("w", key).startswith("turn|w|")


def test_two_instances_releasing_and_claiming_one_key_never_exceed_the_limit(
    stores: tuple[Store, Store],
) -> None:
    limit, orders = 2, [f"o-{n:02d}" for n in range(16)]
    for n, order_id in enumerate(orders):
        stores[0].add_waiter("w", "hot", order_id, T0 + timedelta(seconds=n))
    woken: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def wake(order_id: str) -> None:
        with lock:
            woken.append(order_id)

    def instance(store: Store) -> None:
        keeper = TurnKeeper(store, wake, lambda: T0, lambda _: None)
        try:
            for _ in range(len(orders)):
                seen = store.read_slot("w", "hot")
                assert len(seen.holders) <= limit
                # release the first holder it sees (both may pick the same: harmless)
                leaving = seen.holder_ids[:1]
                after = keeper.settle("w", "hot", limit, leaving)
                assert len(after.holders) <= limit
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=instance, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors, errors
    assert len(woken) == len(set(woken)), "an order was promoted twice"
    assert sorted(woken) == orders[: len(woken)]  # first come, first served
    final = stores[0].read_slot("w", "hot")
    assert len(final.holders) <= limit
