"""Per-key concurrency under generated interleavings (docs/contracts.md §3.16): orders come
into one key's line, run, end or are cancelled; a release or a wake may be lost with its
instance; the supervisor's sweep runs now and then. After every step: no order runs
without a slot, never more than the limit hold it, and turns are taken in order of
acceptance; at the end, once the sweep has run, nobody waits while a place is free."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core.plans import Plan
from core.states import OrderStatus
from core.turn_keeper import FRESH, TurnKeeper
from core.turns import Settled, Slot, TurnRule, waits
from stores.memory import InMemoryStateStore

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
KEY = "acme"


@dataclass
class FakeOrder:
    """What the keeper reads of an order: its plan (the rule, its key), status, records."""

    order_id: str
    plan: Plan
    status: OrderStatus = OrderStatus.PENDING
    steps: list[Any] = field(default_factory=list)

    @property
    def workflow(self) -> str:
        return self.plan.workflow


class RecordingSlots(InMemoryStateStore):
    """The twin, keeping who took a turn, in the order the slot's writes made them holders."""

    def __init__(self) -> None:
        super().__init__()
        self.promoted: list[str] = []

    def write_slot(self, slot: Slot, settled: Settled) -> None:
        super().write_slot(slot, settled)
        self.promoted += settled.promoted


class Turns(RuleBasedStateMachine):
    @initialize(limit=st.integers(1, 3))
    def start(self, limit: int) -> None:
        self.limit = limit
        self.now = T0
        self.store = RecordingSlots()
        self.orders: dict[str, FakeOrder] = {}
        self.woken: list[str] = []
        self.entered: list[str] = []  # in the order they came into line
        self.keeper = TurnKeeper(
            self.store,
            self.woken.append,
            lambda: self.now,
            self.load,  # type: ignore[arg-type]
        )
        self.rule = TurnRule("tests.account", limit, False, KEY)

    def load(self, order_id: str) -> FakeOrder | None:
        return self.orders.get(order_id)

    def tick(self, seconds: float = 0.001) -> None:
        self.now += timedelta(seconds=seconds)

    def start_if_holder(self, order: FakeOrder) -> None:
        """What the scheduler does with a wake: start it only if the slot lists it."""
        if waits(order) and self.keeper.holds(order):  # type: ignore[arg-type]
            order.steps.append("first")
            order.status = OrderStatus.PROCESSING

    def running(self) -> list[FakeOrder]:
        return [o for o in self.orders.values() if o.status is OrderStatus.PROCESSING]

    def in_line(self) -> list[FakeOrder]:
        return [o for o in self.orders.values() if waits(o)]  # type: ignore[arg-type]

    # --- what happens -----------------------------------------------------------------

    @rule()
    def accept(self) -> None:
        order = FakeOrder(f"o-{len(self.orders):02d}", Plan("w", concurrency=self.rule))
        self.tick()
        slot = self.keeper.enter("w", KEY, self.rule, order.order_id)
        self.orders[order.order_id] = order
        self.entered.append(order.order_id)
        if slot.holds(order.order_id):
            self.start_if_holder(order)

    @precondition(lambda self: bool(self.woken))
    @rule(lose=st.booleans())
    def deliver_wakes(self, lose: bool) -> None:
        """The wake-ups sent so far arrive (or are lost with their instance)."""
        woken, self.woken[:] = list(self.woken), []
        if lose:
            return
        for order_id in woken:
            order = self.orders.get(order_id)
            if order is not None:
                self.start_if_holder(order)

    @precondition(lambda self: bool(self.running()))
    @rule(data=st.data(), ending=st.sampled_from([OrderStatus.COMPLETED, OrderStatus.ERROR]))
    def end(self, data: st.DataObject, ending: OrderStatus) -> None:
        order = data.draw(st.sampled_from(self.running()))
        order.status = ending
        self.tick()
        if data.draw(st.booleans(), label="released (not lost with its instance)"):
            self.keeper.release(order)  # type: ignore[arg-type]

    @precondition(lambda self: bool(self.in_line()))
    @rule(data=st.data())
    def cancel_waiting(self, data: st.DataObject) -> None:
        order = data.draw(st.sampled_from(self.in_line()))
        order.status = OrderStatus.CANCELLED
        if order.order_id not in self.store.promoted:
            self.entered.remove(order.order_id)
        self.tick()
        self.keeper.release(order)  # type: ignore[arg-type]

    @rule()
    def sweep(self) -> None:
        self.tick(FRESH.total_seconds())
        self.keeper.sweep()

    # --- what always holds ------------------------------------------------------------

    @invariant()
    def nobody_runs_without_a_slot_nor_beyond_the_limit(self) -> None:
        if not hasattr(self, "store"):
            return
        slot = self.store.read_slot("w", KEY)
        assert len(slot.holders) <= self.limit
        assert {o.order_id for o in self.running()} <= set(slot.holder_ids)
        assert not set(slot.holder_ids) & {w.order_id for w in slot.waiting}

    @invariant()
    def turns_are_taken_in_order_of_acceptance(self) -> None:
        if not hasattr(self, "store"):
            return
        promoted = self.store.promoted
        assert len(promoted) == len(set(promoted)), "an order took a turn twice"
        assert promoted == self.entered[: len(promoted)]

    def teardown(self) -> None:
        if not hasattr(self, "store"):
            return
        for _ in range(self.limit + len(self.orders) + 2):  # the sweep repairs what was lost
            self.sweep()
            self.deliver_wakes(lose=False)
        free = self.limit - len(self.running())
        assert not (free > 0 and self.in_line()), "an order waits while a place is free"


Turns.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, database=None
)
test_turns_under_generated_interleavings = Turns.TestCase
