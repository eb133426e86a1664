"""Per-key concurrency (docs/contracts.md §3.16) on the in-memory store and a fake clock:
the declaration, the key at acceptance, the line, release and wake, cancel of a waiting
order, ``hold_on_error``, resubmit, and the supervisor's repair of the slots."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from admin.plans import differences, fingerprint
from admin.query import parse_filter
from core.concurrency import MAX_TURN_LIMIT
from core.errors import ConcurrencyConflict, TransitionRefused
from core.model import Order
from core.outcome import Outcome
from core.ports import ListFilter
from core.states import OrderStatus
from core.turn_keeper import FRESH, IDLE_RECHECK, MISSING_GRACE, TurnKeeper
from core.turns import Slot, TurnRule, key_of, settle, waits
from core.workflows import (
    Concurrency,
    DeclarationError,
    Plan,
    StepSpec,
    Workflow,
    search_fields,
)
from scheduler.service import Handled
from stores.memory import InMemoryStateStore
from tests.support import declarations
from tests.unit.test_services_in_memory import T0, Services, build, expire, reply_to, stored
from tests.unit.test_turn_machine import FakeOrder


@pytest.fixture
def s() -> Iterator[Services]:
    services = build()  # (the bootstrap puts the settings' declarations to use: then ours)
    with declarations("tests.fixtures.turns"):
        yield services


def send(s: Services, order_id: str, workflow: str = "serial", **body: Any) -> Handled:
    message = {"orderId": order_id, "workflow": workflow, "replyTo": "app-status", **body}
    return s.scheduler.submit(json.dumps(message).encode())


def pump(s: Services) -> list[str]:
    """Handle every order-dispatch message sent so far (as the dispatch trigger does)."""
    woken = [m["orderId"] for m in s.queues.on(s.names.order_dispatch)]
    s.queues.sent = [m for m in s.queues.sent if m.queue != s.names.order_dispatch]
    for order_id in woken:
        s.scheduler.dispatch(order_id)
    return woken


def requested(s: Services) -> list[str]:
    return [r.order_id for r in s.transport.requests]


def finish(s: Services, order_id: str, outcome: Outcome = Outcome.SUCCEEDED) -> None:
    [request] = [r for r in s.transport.requests if r.order_id == order_id][-1:]
    extra = {} if outcome is Outcome.SUCCEEDED else {"error": "refused"}
    s.scheduler.apply_reply(reply_to(request, outcome, **extra))


def turn(s: Services, order_id: str) -> dict[str, Any]:
    return dict(s.admin.show(order_id)["turn"])


def rejected(s: Services) -> list[dict[str, Any]]:
    return s.queues.on(s.names.orders_rejected)


# --- the declaration -----------------------------------------------------------------------


def one(ctx: Any) -> str:
    return "k"


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"key": one, "limit": 0}, "limit=0"),
        ({"key": one, "limit": MAX_TURN_LIMIT + 1}, "1-1000"),
        ({"key": one, "limit": True}, "whole number"),
        ({"key": one, "hold_on_error": "yes"}, "hold_on_error"),
        ({"key": "account"}, "function of one argument"),
        ({"key": lambda a, b: a}, "exactly one argument"),
        ({"key": None}, "needs key=fn"),
    ],
)
def test_a_bad_concurrency_is_refused_where_it_is_declared(
    kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(DeclarationError, match=says) as refused:
        Concurrency(**kwargs)
    assert "test_turns.py:" in str(refused.value)


def test_a_workflow_takes_only_a_concurrency() -> None:
    with pytest.raises(DeclarationError, match="Concurrency\\(key=fn"):
        Workflow("w", (StepSpec("s"),), concurrency="account")  # type: ignore[arg-type]


def test_the_workflow_describes_and_the_plan_pins_its_concurrency() -> None:
    flow = Workflow(
        "w", (StepSpec("s"),), concurrency=Concurrency(one, limit=3, hold_on_error=True)
    )
    assert flow.describe()["concurrency"] == {
        "key": f"{__name__}.one",
        "limit": 3,
        "holdOnError": True,
    }
    plan = Plan.of(flow, 30)
    assert plan.concurrency == TurnRule(f"{__name__}.one", 3, True)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert (
        Plan.from_json(Plan.of(Workflow("v", (StepSpec("s"),)), 30).to_json()).concurrency is None
    )


# --- the key at acceptance --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("account", "says"),
    [
        ("boom", "raised RuntimeError: no account service"),
        (42, "returned a int"),
        ("x" * 257, "returned 257 characters"),
        ("", "returned 0 characters"),
    ],
)
def test_a_key_that_fails_rejects_the_order_with_the_reason(
    s: Services, account: Any, says: str
) -> None:
    assert send(s, "o-bad", account=account) is Handled.REJECTED

    [record] = rejected(s)
    assert says in record["reason"] and "tests.fixtures.turns.account" in record["reason"]
    assert json.loads(record["message"])["orderId"] == "o-bad"  # kept as it came (§3.1)
    assert s.store.load("o-bad") is None
    assert s.store.read_slot("serial", "42").empty
    # a declaration's function that failed is told, whatever else happens (§3.17)
    [alert] = s.queues.on(s.names.operator_alerts)
    assert alert["orderId"] == "o-bad" and says in alert["reason"]


def test_an_order_whose_key_is_none_runs_unlimited(s: Services) -> None:
    send(s, "o-1")
    send(s, "o-2")

    assert requested(s) == ["o-1", "o-2"]
    assert key_of(stored(s, "o-1")) == "" and "turn" not in s.admin.show("o-1")


# --- the line ---------------------------------------------------------------------------------


def test_one_order_per_key_runs_and_the_others_wait_in_order_of_acceptance(s: Services) -> None:
    for n in (1, 2, 3):
        assert send(s, f"a-{n}", account="acme") is Handled.ACCEPTED
        s.clock.advance(1)
    send(s, "b-1", account="globex")

    assert requested(s) == ["a-1", "b-1"]  # another key's line delays nobody
    waiting = stored(s, "a-2")
    assert waiting.status is OrderStatus.PENDING and waiting.steps == [] and waits(waiting)
    shown = s.admin.show("a-2")
    assert shown["waitingFor"] == [{"turn": "acme"}]
    assert shown["turn"] == {"key": "acme", "position": 1, "holders": ["a-1"], "waiting": 2}
    assert turn(s, "a-1")["position"] == 0 and turn(s, "a-3")["position"] == 2
    assert [m["status"] for m in s.queues.on("app-status") if m["orderId"] == "a-2"] == ["received"]
    # costing nothing while they wait: no index row a sweep reads names them
    later = T0.replace(year=2027)
    assert {e.order_id for e in s.store.due_pending(later)} <= {"a-1", "b-1"}
    assert {e.order_id for e in s.store.expired_processing(later)} <= {"a-1", "b-1"}


def test_the_end_of_an_order_starts_the_next_in_line(s: Services) -> None:
    for n in (1, 2, 3):
        send(s, f"a-{n}", account="acme")

    finish(s, "a-1")

    assert stored(s, "a-1").status is OrderStatus.COMPLETED
    assert requested(s) == ["a-1", "a-2"]  # started in the same invocation
    assert pump(s) == []  # no message needed
    told = [(m["orderId"], m["status"]) for m in s.queues.on("app-status")]
    assert told.index(("a-1", "completed")) < told.index(("a-2", "processing"))
    assert stored(s, "a-2").status is OrderStatus.PROCESSING
    assert turn(s, "a-3") == {"key": "acme", "position": 1, "holders": ["a-2"], "waiting": 1}
    assert turn(s, "a-1")["position"] is None
    history = [h["event"] for h in stored(s, "a-2").history]
    assert history[:3] == ["received", "waiting", "turn-taken"]


def test_the_next_that_cannot_start_at_once_is_woken_by_a_message(s: Services) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")
    s.store.fail_next(1, only={"load"})  # the in-process start of a-2 cannot read it

    finish(s, "a-1")

    assert requested(s) == ["a-1"] and turn(s, "a-2")["position"] == 0
    assert pump(s) == ["a-2"]
    assert requested(s) == ["a-1", "a-2"]


def test_a_limit_of_two_runs_two_at_once(s: Services) -> None:
    for n in (1, 2, 3):
        send(s, f"p-{n}", "pair", account="acme")

    assert requested(s) == ["p-1", "p-2"]
    finish(s, "p-2")
    assert requested(s) == ["p-1", "p-2", "p-3"]


def test_an_order_over_items_takes_its_turn_as_a_whole(s: Services) -> None:
    send(s, "i-1", "serial-items", account="acme", lines=["x", "y"])
    send(s, "i-2", "serial-items", account="acme", lines=["z"])

    assert sorted(r.step for r in s.transport.requests) == ["pick[0]", "pick[1]"]
    for request in list(s.transport.requests):
        s.scheduler.apply_reply(reply_to(request))

    assert stored(s, "i-1").status is OrderStatus.COMPLETED
    assert [(r.order_id, r.step) for r in s.transport.requests][-1] == ("i-2", "pick[0]")


def test_a_wake_alone_starts_nothing(s: Services) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")

    assert s.scheduler.dispatch("a-2") is Handled.NOTHING_TO_DO  # not its turn
    assert requested(s) == ["a-1"] and waits(stored(s, "a-2"))


def test_a_redelivered_waiting_order_keeps_its_place(s: Services) -> None:
    for n in (1, 2, 3):
        send(s, f"a-{n}", account="acme")
        s.clock.advance(1)

    assert send(s, "a-2", account="acme") is Handled.DUPLICATE

    assert turn(s, "a-2")["position"] == 1 and turn(s, "a-3")["position"] == 2
    assert requested(s) == ["a-1"]


def test_a_finished_order_redelivered_takes_no_place(s: Services) -> None:
    send(s, "a-1", account="acme")
    finish(s, "a-1")

    assert send(s, "a-1", account="acme") is Handled.DUPLICATE

    assert s.store.read_slot("serial", "acme").holders == ()


def test_a_running_order_redelivered_keeps_its_slot_and_nobody_else_starts(s: Services) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")

    assert send(s, "a-1", account="acme") is Handled.DUPLICATE

    slot = s.store.read_slot("serial", "acme")
    assert slot.holder_ids == ["a-1"] and [w.order_id for w in slot.waiting] == ["a-2"]
    assert requested(s) == ["a-1", "a-1"]  # its first request again (``_duplicate``), no other
    finish(s, "a-1")
    assert requested(s)[-1] == "a-2"


def test_a_finished_order_redelivered_behind_a_holder_takes_no_place(s: Services) -> None:
    for n in (1, 2, 3):
        send(s, f"a-{n}", account="acme")
        s.clock.advance(1)
    finish(s, "a-1")  # a-2 runs, a-3 waits

    assert send(s, "a-1", account="acme") is Handled.DUPLICATE

    slot = s.store.read_slot("serial", "acme")
    assert slot.holder_ids == ["a-2"] and [w.order_id for w in slot.waiting] == ["a-3"]
    finish(s, "a-2")
    assert requested(s)[-1] == "a-3"


def test_an_order_id_reused_under_another_key_leaves_no_place_behind(s: Services) -> None:
    send(s, "a-1", account="acme")

    assert send(s, "a-1", account="globex", note="another") is Handled.REJECTED

    assert s.store.read_slot("serial", "globex").empty
    send(s, "g-1", account="globex")
    assert requested(s) == ["a-1", "g-1"]  # globex's slot was not held by the stray


class Requests:
    """The storage requests a store is asked for, by kind, as the Table store makes them:
    ``query`` (a range of a partition: a load, a slot's read), ``batch`` (one entity group
    transaction: a create, a save, a slot's or a line row's write), ``delete`` (one per
    outbox row of a notice delivered)."""

    def __init__(self, store: InMemoryStateStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[str] = []
        for name, kind in (("_range", "query"), ("_transact", "batch")):
            monkeypatch.setattr(store, name, self._counted(getattr(store, name), kind))
        for name in ("create", "save"):
            monkeypatch.setattr(store, name, self._counted(getattr(store, name), "batch"))
        delete_outbox = store.delete_outbox

        def deleted(saved: Any) -> None:
            entries = saved if isinstance(saved, list) else saved.entries
            self.made.extend("delete" for _ in entries)
            delete_outbox(saved)

        monkeypatch.setattr(store, "delete_outbox", deleted)

    def _counted(self, method: Any, kind: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.made.append(kind)
            return method(*args, **kwargs)

        return counted

    def during(self, act: Any) -> list[str]:
        self.made.clear()
        act()
        return sorted(self.made)


def test_an_order_that_waits_costs_three_requests_to_accept(
    s: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")  # the next in line: it looks once more after its save
    count = Requests(s.store, monkeypatch)

    # its place in line, the slot read (full: nothing written), the order's create and
    # its "received" notice's outbox row; no read of the order first (a redelivery's
    # create fails instead) and none after
    made = count.during(lambda: send(s, "a-3", account="acme"))
    assert made == ["batch", "batch", "delete", "query"]
    assert turn(s, "a-3")["position"] == 2


def test_the_next_in_line_looks_again_after_its_save_and_starts_if_promoted_meanwhile(
    s: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    send(s, "a-1", account="acme")
    original = s.store.create

    def create_after_a_release(order: Order) -> Any:
        # a-1 ends between a-2's place in line and a-2's save: the wake finds no order
        if order.order_id == "a-2":
            finish(s, "a-1")
            assert s.store.read_slot("serial", "acme").holder_ids == ["a-2"]
        return original(order)

    monkeypatch.setattr(s.store, "create", create_after_a_release)
    send(s, "a-2", account="acme")

    assert requested(s) == ["a-1", "a-2"]
    assert stored(s, "a-2").status is OrderStatus.PROCESSING


# --- cancel, hold_on_error, resubmit ------------------------------------------------------


def test_a_waiting_order_is_cancelled_at_once(s: Services) -> None:
    for n in (1, 2, 3):
        send(s, f"a-{n}", account="acme")

    view = s.admin.cancel("a-2", by="ops", reason="customer changed mind")

    assert view["status"] == "cancelled"
    assert stored(s, "a-2").steps == []
    assert [w.order_id for w in s.store.read_slot("serial", "acme").waiting] == ["a-3"]
    finish(s, "a-1")
    assert requested(s) == ["a-1", "a-3"]


def test_an_order_in_error_frees_its_slot(s: Services) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")

    finish(s, "a-1", Outcome.REFUSED)

    assert stored(s, "a-1").status is OrderStatus.ERROR
    assert requested(s) == ["a-1", "a-2"]


def test_hold_on_error_keeps_the_slot_until_the_operator_acts(s: Services) -> None:
    send(s, "h-1", "held", account="acme")
    send(s, "h-2", "held", account="acme")

    finish(s, "h-1", Outcome.REFUSED)

    assert stored(s, "h-1").status is OrderStatus.ERROR
    assert pump(s) == [] and turn(s, "h-2")["holders"] == ["h-1"]
    s.admin.resubmit("h-1", by="ops", reason="fixed the remote")  # it holds: goes on
    assert pump(s) == ["h-1"]
    finish(s, "h-1")
    assert requested(s)[-1] == "h-2"


def test_an_order_held_on_error_that_gave_its_slot_back_takes_one_again_to_resubmit(
    s: Services,
) -> None:
    """``hold_on_error`` keeps the slot while the operator may act, not once the unwinding
    is over (``turns.gives_back``): an order resubmitted after that takes a slot again
    first, or is refused, as any that gave its slot back (found by the model, seed 505)."""
    send(s, "w-1", "held-wait", account="acme")
    send(s, "w-2", "held-wait", account="acme")
    finish(s, "w-1")  # processed: it waits for its approval
    s.clock.advance(61)
    s.supervisor.run()  # the approval timed out: nothing to undo, process's effect stands
    assert stored(s, "w-1").status is OrderStatus.ERROR and stored(s, "w-1").unwound
    pump(s)
    assert turn(s, "w-1")["holders"] == ["w-2"]

    with pytest.raises(TransitionRefused, match="is taken"):
        s.admin.resubmit("w-1", by="ops", reason="ask again")

    assert stored(s, "w-1").status is OrderStatus.ERROR  # not running beside w-2
    finish(s, "w-2")
    s.clock.advance(61)
    s.supervisor.run()
    pump(s)
    s.admin.resubmit("w-1", by="ops", reason="ask again")  # the slot is free: it takes it
    assert turn(s, "w-1")["holders"] == ["w-1"]


def test_a_resubmit_takes_a_slot_again_or_is_refused_naming_the_holder(s: Services) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")
    finish(s, "a-1", Outcome.REFUSED)  # a-2 runs now

    with pytest.raises(TransitionRefused, match="a-2 running") as refused:
        s.admin.resubmit("a-1", by="ops")
    assert refused.value.reason == "turn-busy"
    assert stored(s, "a-1").status is OrderStatus.ERROR
    assert s.store.read_slot("serial", "acme").waiting == ()  # no place in line taken

    finish(s, "a-2")
    assert pump(s) == []
    s.admin.resubmit("a-1", by="ops")
    assert turn(s, "a-1")["position"] == 0
    assert stored(s, "a-1").status is OrderStatus.PROCESSING


# --- the supervisor's repair ------------------------------------------------------------------


def test_a_release_lost_with_its_instance_is_repaired_by_the_next_supervision(
    s: Services,
) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")
    s.store.fail_next(1, only={"read_slot"})  # the release after a-1's save fails

    finish(s, "a-1")

    assert stored(s, "a-1").status is OrderStatus.COMPLETED
    assert pump(s) == [] and turn(s, "a-2")["holders"] == ["a-1"]
    s.clock.advance(FRESH.total_seconds())
    report = s.supervisor.run()
    assert report.turns is not None and report.turns.released == 1
    assert pump(s) == ["a-2"]  # the supervisor wakes it with a message
    assert requested(s) == ["a-1", "a-2"]


def test_a_holder_killed_mid_step_holds_its_slot_exactly_as_long_as_its_order_runs(
    s: Services,
) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")
    for _ in range(20):  # its instance died: no report ever comes; the supervisor retries
        if stored(s, "a-1").status.terminal:
            break
        assert turn(s, "a-2")["holders"] == ["a-1"] and "a-2" not in requested(s)
        expire(s)
        pump(s)

    assert stored(s, "a-1").status is OrderStatus.ERROR
    assert "a-2" in requested(s)  # woken by the supervisor's change that ended a-1
    assert turn(s, "a-2")["holders"] == ["a-2"]


def test_a_lost_wake_is_sent_again_by_the_supervisor(s: Services) -> None:
    send(s, "a-1", account="acme")
    send(s, "a-2", account="acme")
    s.store.fail_next(1, only={"read_slot"})  # a-1's own release fails: repaired below
    finish(s, "a-1")
    # an instance released it and died before it could wake a-2
    TurnKeeper(s.store, lambda _: None, s.clock, s.store.load).release(stored(s, "a-1"))
    assert turn(s, "a-2")["position"] == 0 and waits(stored(s, "a-2"))

    s.clock.advance(FRESH.total_seconds())
    report = s.supervisor.run()

    assert report.turns is not None and report.turns.woken == 1
    assert pump(s) == ["a-2"]
    assert stored(s, "a-2").status is OrderStatus.PROCESSING


def test_a_holder_whose_order_never_came_is_released_after_the_grace(s: Services) -> None:
    s.store.add_waiter(
        "serial", "acme", "ghost", T0 - timedelta(seconds=1)
    )  # its submitter died after this
    send(s, "a-1", account="acme")
    assert waits(stored(s, "a-1")) and turn(s, "a-1")["holders"] == ["ghost"]
    assert pump(s) == ["ghost"]  # woken: there is no such order (yet)

    s.clock.advance(FRESH.total_seconds())
    s.supervisor.run()
    assert pump(s) == []  # within the grace its order may still come

    s.clock.advance(MISSING_GRACE.total_seconds())
    s.supervisor.run()
    assert pump(s) == ["a-1"]
    assert requested(s) == ["a-1"]


def test_the_sweep_forgets_an_empty_slot(s: Services) -> None:
    send(s, "a-1", account="acme")
    finish(s, "a-1")
    assert list(s.store.turn_keys(10)) == [("serial", "acme")]

    s.clock.advance(FRESH.total_seconds())
    report = s.supervisor.run()

    assert report.turns is not None and report.turns.forgotten == 1
    assert list(s.store.turn_keys(10)) == []
    send(s, "a-2", account="acme")  # a key used again is listed again
    assert list(s.store.turn_keys(10)) == [("serial", "acme")]


# --- the slot, decided and kept ---------------------------------------------------------------


def test_settle_fills_from_the_head_and_drops_a_holder_s_second_row() -> None:
    slot = InMemoryStateStore()
    slot.add_waiter("w", "k", "late", T0.replace(minute=5))
    slot.add_waiter("w", "k", "early", T0)
    read = slot.read_slot("w", "k")

    decided = settle(read, 1, T0)

    assert decided.promoted == ("early",) and decided.drop == ("early",)
    slot.write_slot(read, decided)
    slot.add_waiter("w", "k", "early", T0)  # a redelivery of it
    again = settle(slot.read_slot("w", "k"), 1, T0)
    assert again.promoted == () and again.drop == ("early",)
    assert Slot("w", "k").position("x") is None


class _Racing(InMemoryStateStore):
    """A store where another writer changes the slot just before our first write."""

    def __init__(self) -> None:
        super().__init__()
        self.raced = False

    def write_slot(self, slot: Slot, settled: Any) -> None:
        if not self.raced:
            self.raced = True
            other = self.read_slot(slot.workflow, slot.key)
            super().write_slot(other, settle(other, 1, T0))
        super().write_slot(slot, settled)


def test_a_writer_that_loses_the_slot_reads_it_again_and_never_exceeds_the_limit() -> None:
    store = _Racing()
    woken: list[str] = []
    keeper = TurnKeeper(store, woken.append, lambda: T0, lambda _: None)
    store.add_waiter("w", "k", "first", T0)
    store.add_waiter("w", "k", "second", T0.replace(minute=1))

    slot = keeper.settle("w", "k", 1)

    assert slot.holder_ids == ["first"]
    assert store.read_slot("w", "k").holder_ids == ["first"]
    assert woken == []  # the other writer promoted it: its wake is that writer's


def test_a_slot_that_keeps_changing_gives_up_with_a_conflict() -> None:
    class Always(InMemoryStateStore):
        def write_slot(self, slot: Slot, settled: Any) -> None:
            raise ConcurrencyConflict("taken")

    store = Always()
    store.add_waiter("w", "k", "o", T0)
    with pytest.raises(ConcurrencyConflict, match="kept changing"):
        TurnKeeper(store, print, lambda: T0, lambda _: None).settle("w", "k", 1)


def test_an_order_without_a_key_is_not_released() -> None:
    order = Order.__new__(Order)
    order.plan = Plan("w")
    keeper = TurnKeeper(InMemoryStateStore(), print, lambda: T0, lambda _: None)
    assert keeper.release(order) is None and keeper.view(order) is None


# --- search by key (§3.14) --------------------------------------------------------------------


def test_operators_find_the_orders_of_a_key(s: Services) -> None:
    for n in (1, 2):
        send(s, f"a-{n}", account="acme")
        s.clock.advance(1)
    send(s, "b-1", account="globex")
    send(s, "n-1")  # no key

    assert "serial" in search_fields()["turn"]
    where = parse_filter({"turn": "acme"})
    assert where == ListFilter(None, search=("turn", "acme"))
    page = s.admin.page(where, 50, None)
    assert [o["orderId"] for o in page["orders"]] == ["a-2", "a-1"]  # newest first
    waiting = parse_filter({"turn": "acme", "status": "pending"})
    assert [o["orderId"] for o in s.admin.page(waiting, 50, None)["orders"]] == ["a-2"]


def test_the_deploy_guard_groups_plans_whatever_their_key_and_notes_a_new_rule() -> None:
    flow = Workflow("w", (StepSpec("s"),), concurrency=Concurrency(one, limit=1))
    plan = Plan.of(flow, 30)
    rule = plan.concurrency
    assert rule is not None
    acme = replace(plan, concurrency=replace(rule, order_key="acme"))
    globex = replace(plan, concurrency=replace(rule, order_key="globex"))

    assert fingerprint(acme) == fingerprint(globex) == fingerprint(plan)
    assert differences(acme, flow) == []
    wider = Workflow("w", (StepSpec("s"),), concurrency=Concurrency(one, limit=5))
    [note] = differences(acme, wider)
    assert note.startswith("concurrency: ") and "'limit': 5" in note


def test_the_sweep_goes_through_every_key_in_turn() -> None:
    store = InMemoryStateStore()
    for key in ("k1", "k2", "k3"):
        store.add_waiter("w", key, f"o-{key}", T0)
        store.write_slot(store.read_slot("w", key), settle(store.read_slot("w", key), 1, T0))
    keeper = TurnKeeper(store, print, lambda: T0, lambda _: None)

    seen = [keeper.sweep(keys=2).keys for _ in range(3)]

    assert seen == [2, 1, 2]  # then from the start again
    assert len(list(store.turn_keys(10))) == 3


def test_a_running_order_nobody_waits_behind_costs_no_read_each_sweep() -> None:
    store = InMemoryStateStore()
    store.add_waiter("w", "k", "o-1", T0)
    store.write_slot(store.read_slot("w", "k"), settle(store.read_slot("w", "k"), 1, T0))
    now = [T0 + MISSING_GRACE]
    loads: list[str] = []
    running = FakeOrder("o-1", Plan("w", concurrency=TurnRule("fn", 1, False, "k")))
    running.status, running.steps = OrderStatus.PROCESSING, ["first"]

    def load(order_id: str) -> Any:
        loads.append(order_id)
        return running

    keeper = TurnKeeper(store, print, lambda: now[0], load)
    for _ in range(10):
        keeper.sweep()
        now[0] += timedelta(seconds=10)
    assert loads == ["o-1"]  # once when first seen, then every IDLE_RECHECK
    now[0] += IDLE_RECHECK
    keeper.sweep()
    assert loads == ["o-1", "o-1"]
    store.add_waiter("w", "k", "o-2", now[0])  # someone waits behind it: read each run
    keeper.sweep()
    keeper.sweep()
    assert loads == ["o-1"] * 4
