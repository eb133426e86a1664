"""Per-key concurrency, kept (docs/contracts.md §3.16): a slot read, decided
(``core.turns.settle``), written If-Match, and the orders whose turn came woken.

- **Acceptance** (``enter``): the order is put in line first (its waiting row), then the
  slot is filled from the head of the line; the order starts now only if that made it a
  holder (nobody jumps the line). A process that dies in between leaves a waiting row
  that the next fill of the key promotes; a holder whose order never came is released by
  the sweep after ``grace``.
- **Release** (``release``): an order that ended (or went to ``error`` without
  ``hold_on_error``) leaves the slot, and the next in line take it, in one transaction;
  each is woken (``wake``: the scheduler starts it in process, else an order-dispatch
  message), and starts only if the slot lists it when it is looked at (``holds``: a
  message alone proves nothing). Idempotent: a second release changes nothing.
- **Sweep** (``sweep``, the supervisor's timer): per listed key (every key in turn, a
  bounded number per run), a holder whose order ended (or never came, after ``grace``)
  is released, one whose order still waits is woken again (its wake was lost), free
  places are filled, and an empty slot is forgotten. A holder is read while someone
  waits behind it or early in its turn, else every ``IDLE_RECHECK``; the sweep reads no
  order that waits.

Only ports are used (``TurnStore``, a wake-up sender, a loader of orders).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from core import turns
from core.errors import ConcurrencyConflict, OrderError
from core.turns import MAX_PROMOTIONS, Slot, SweepReport, TurnRule, TurnStore, settle

if TYPE_CHECKING:
    from core.model import Order

log = logging.getLogger(__name__)

#: How long a holder may be missing (its acceptance still on its way) before the sweep
#: releases it: an order is created seconds after it took its place.
MISSING_GRACE: Final = timedelta(minutes=5)
#: A holder younger than this is not looked at by the sweep: its start is under way (in
#: the invocation that promoted it). Short, so that a wake lost with its instance is sent
#: again by the next run (a second wake is harmless: the order starts once).
FRESH: Final = timedelta(seconds=1)
#: Writers of one slot at once before a change gives up (each retry reads it again).
ATTEMPTS: Final = 10
#: Keys a sweep looks at, and orders it reads, per run.
SWEEP_KEYS: Final = 200
SWEEP_LOADS: Final = 500
#: How often the holders of a key nobody waits for are read (their order ended and the
#: release was lost: it holds nobody up until someone comes, who then waits one run).
IDLE_RECHECK: Final = timedelta(minutes=5)
#: Keys whose last such read a process remembers (then it forgets them all).
MAX_IDLE_KEYS: Final = 10_000


class TurnKeeper:
    def __init__(
        self,
        store: TurnStore,
        wake: Callable[[str], None],
        clock: Callable[[], datetime],
        load: Callable[[str], Order | None],
        *,
        grace: timedelta = MISSING_GRACE,
    ):
        """``wake``: queue an order to be looked at now (order-dispatch); ``load``: an
        order as stored (None: there is none)."""
        self._store = store
        self._wake = wake
        self._clock = clock
        self._load = load
        self._grace = grace
        #: where the next sweep goes on in the list of keys ("": from the start)
        self._cursor = ""
        #: when this process last read the holders of a key nobody waits for
        self._idle: dict[str, datetime] = {}

    # --- acceptance and release ---------------------------------------------------------

    def enter(
        self,
        workflow: str,
        key: str,
        rule: TurnRule,
        order_id: str,
        accepted: datetime | None = None,
    ) -> Slot:
        """Put the order in line (at ``accepted``, its place by acceptance; default now),
        then fill the slot: the slot as left (``holds``: it may start now). Others
        promoted meanwhile are woken; the order itself is not."""
        self._store.add_waiter(workflow, key, order_id, accepted or self._clock())
        return self.settle(workflow, key, rule.limit, quiet=(order_id,))

    def holds_again(self, order: Order) -> bool:
        """An order that runs again after giving its slot back (``turns.runs_again``):
        whether it holds one now; if not, it is put in line (once) and the slot filled
        from the head, and it waits to be woken as any order in line."""
        rule = order.plan.concurrency
        assert rule is not None
        key = turns.key_of(order)
        if self._store.read_slot(order.workflow, key).holds(order.order_id):
            return True
        # its place is its acceptance's: it was accepted before those who came since
        slot = self.enter(order.workflow, key, rule, order.order_id, order.created_at)
        return slot.holds(order.order_id)

    def release(self, order: Order, wake: Callable[[str], None] | None = None) -> Slot | None:
        """After a save: an order whose status frees its slot leaves it (or its line), and
        the next take it, each woken by ``wake`` (default: the keeper's, a message).
        None: nothing to release."""
        rule = order.plan.concurrency
        if rule is None or not turns.gives_back(order):
            return None
        key = turns.key_of(order)
        return self.settle(order.workflow, key, rule.limit, (order.order_id,), wake=wake)

    def settle(
        self,
        workflow: str,
        key: str,
        limit: int,
        leaving: Collection[str] = (),
        *,
        quiet: Collection[str] = (),
        wake: Callable[[str], None] | None = None,
    ) -> Slot:
        """Read, decide and write the slot until the write holds (``ConcurrencyConflict``
        after ``ATTEMPTS`` writers came first); wake each order promoted (but ``quiet``),
        with ``wake`` if given."""
        wake = wake or self._wake
        for _ in range(ATTEMPTS):
            slot = self._store.read_slot(workflow, key)
            decided = settle(slot, limit, self._clock(), leaving)
            if not decided.changed:
                return slot
            try:
                self._store.write_slot(slot, decided)
            except ConcurrencyConflict:
                continue
            for order_id in decided.promoted:
                log.info("order %s takes its turn for key %r", order_id, key)
                if order_id not in quiet:
                    wake(order_id)
            if len(decided.drop) < MAX_PROMOTIONS:
                return decided.after(slot)
        raise ConcurrencyConflict(
            f"the slot of key {key!r} of workflow {workflow} kept changing; try again"
        )

    # --- reads ------------------------------------------------------------------------------

    def holds(self, order: Order) -> bool:
        """Whether the slot lists the order as a holder (what may start it)."""
        if not turns.key_of(order):
            return False
        return self._store.read_slot(order.workflow, turns.key_of(order)).holds(order.order_id)

    def view(self, order: Order) -> dict[str, Any] | None:
        """``{"key", "position", "holders", "waiting"}`` for an order with a key."""
        if not turns.key_of(order):
            return None
        return self._store.read_slot(order.workflow, turns.key_of(order)).view(order.order_id)

    # --- the sweep ------------------------------------------------------------------------

    def sweep(self, keys: int = SWEEP_KEYS, loads: int = SWEEP_LOADS) -> SweepReport:
        """Repair what a process that died left (see the module); bounded per run: ``keys``
        slots, from where the last run stopped (all of them in turn), and ``loads`` orders."""
        report = SweepReport()
        budget = [loads]
        listed = list(self._store.turn_keys(keys, after=self._cursor))
        self._cursor = _row(*listed[-1]) if len(listed) >= keys else ""
        for workflow, key in listed:
            report.keys += 1
            try:
                self._sweep_key(workflow, key, budget, report)
            except OrderError as exc:
                report.errors.append(f"{workflow}/{key}: {exc}")
                log.warning("turns sweep: key %r of %s: %s", key, workflow, exc)
            if budget[0] <= 0:
                break
        return report

    def _sweep_key(self, workflow: str, key: str, budget: list[int], report: SweepReport) -> None:
        slot = self._store.read_slot(workflow, key)
        now = self._clock()
        leaving: list[str] = []
        limit = slot.limit
        # Holders are read while someone waits behind them, or soon after they took their
        # turn (a lost wake, an order that never came); else, nobody being held up, at
        # most every IDLE_RECHECK: a running order costs no read per run.
        line = slot.position_count()
        idle = _row(workflow, key)
        recheck = now - self._idle.get(idle, datetime.min.replace(tzinfo=now.tzinfo))
        if recheck >= IDLE_RECHECK:
            if len(self._idle) >= MAX_IDLE_KEYS:
                self._idle.clear()
            self._idle[idle] = now
        for holder in slot.holders:
            age = now - holder.since
            if age < FRESH or budget[0] <= 0:
                continue
            if not line and age >= self._grace and recheck < IDLE_RECHECK:
                continue
            budget[0] -= 1
            order = self._load(holder.order_id)
            if order is None:
                if now - holder.since >= self._grace:
                    leaving.append(holder.order_id)
                continue
            rule = order.plan.concurrency
            if turns.key_of(order) != key or order.workflow != workflow or rule is None:
                leaving.append(holder.order_id)
                continue
            limit = rule.limit
            if turns.gives_back(order):
                leaving.append(holder.order_id)
            elif turns.waits(order):
                report.woken += 1
                self._wake(order.order_id)
        if not limit:  # a slot whose row says no limit: none of its holders was read
            return
        before = set(slot.holder_ids)
        after = self.settle(workflow, key, limit, leaving)
        report.released += len(before - set(after.holder_ids))
        report.promoted += len(set(after.holder_ids) - before)
        if after.empty and self._store.forget_slot(self._store.read_slot(workflow, key)):
            report.forgotten += 1


def released_after(order: Order, before_status: Any) -> bool:
    """Whether a change from ``before_status`` made the order free its slot."""
    rule = order.plan.concurrency
    if not turns.key_of(order) or rule is None or order.status is before_status:
        return False
    return turns.gives_back(order)


def _row(workflow: str, key: str) -> str:
    """A key's place in the list of keys (``TurnStore.turn_keys``' order)."""
    return f"{workflow}|{turns.key_digest(key)}"
