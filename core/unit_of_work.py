"""The one write path every use case takes: load → decide → save → notices → next step.

A use case (submit aside, which creates) names an order and a decision (a pure
transition of ``core.model.Order``); ``OrderChanges.change`` loads the order, applies
the decision, saves it with If-Match on what it read, and, when another writer came
first (``ConcurrencyConflict``), reloads and decides again, up to ``attempts`` times (or
as long as an ``OnConflict`` says: ``Crowded``, for an order many writers save at once).
Then it delivers the notices the save committed (the transactional outbox) and hands an
order whose active step is Pending to the ``Dispatcher``: the scheduler claims it in
process, the supervisor and the operator queue it for when it is due.

Decisions that the order refuses raise ``TransitionRefused`` (nothing is saved); an
order that does not exist is ``None``. Only ports are used: no Azure import.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from core import turns
from core.errors import ConcurrencyConflict
from core.model import Order
from core.ports import SavedNotices, StateStore
from core.states import OrderStatus, StepState
from core.turn_keeper import released_after

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How often a decision is retried when other writers keep moving the order first.
CONFLICT_ATTEMPTS = 5
#: The most attempts ``Crowded`` gives a decision, however many rivals the order has.
CROWDED_ATTEMPTS_MAX = 45
#: ``Crowded``'s wait before the n-th attempt again is random, up to n times this, in s...
CROWDED_WAIT_STEP = 0.005
#: ...and never more than this.
CROWDED_WAIT_MAX = 0.05


class OnConflict(Protocol):
    """Asked after a decision's save lost a race: whether to read and decide again."""

    def __call__(self, order: Order, lost: int) -> bool:
        """``order``: as the losing attempt decided it; ``lost``: conflicts so far, in a
        row. True: read it again and decide again (having waited, if it waits)."""
        ...


class Crowded:
    """The retry of a decision on an order that several writers save at once: a
    ``ForEach``'s items that end together each apply their reply to the one order record
    (If-Match), and every round of them only one wins. So: one more attempt per rival
    (another step of the order in flight, which may reply meanwhile), up to
    ``CROWDED_ATTEMPTS_MAX``, each after a short random wait that grows with the
    conflicts (the losers of one round do not all meet again in the next). An order
    with no rival (a step alone) keeps ``CONFLICT_ATTEMPTS`` and no wait. Each attempt is
    still one read and one If-Match save of one decision."""

    def __init__(
        self,
        sleep: Callable[[float], None],
        draw: Callable[[], float] = random.random,
    ) -> None:
        """``sleep`` waits that many seconds; ``draw`` is uniform in [0, 1) (injected:
        the tests)."""
        self._sleep = sleep
        self._draw = draw

    def __call__(self, order: Order, lost: int) -> bool:
        rivals = rivals_of(order)
        if lost >= min(CONFLICT_ATTEMPTS + rivals, CROWDED_ATTEMPTS_MAX):
            return False
        if rivals:
            self._sleep(self._draw() * min(CROWDED_WAIT_MAX, CROWDED_WAIT_STEP * lost))
        return True


def rivals_of(order: Order) -> int:
    """Steps of the order in flight (Processing) as decided: each may save it meanwhile."""
    return sum(1 for s in order.active_steps() if s.process_state is StepState.PROCESSING)


class Notices(Protocol):
    """Sends the notices a save committed, then removes them from the outbox."""

    def deliver(self, saved: SavedNotices) -> int: ...


class Dispatcher(Protocol):
    """What happens to an order whose active step is Pending after a change."""

    def __call__(self, order: Order) -> None: ...


class Released(Protocol):
    """Told when a change freed the order's slot (``core.turn_keeper.TurnKeeper.release``)."""

    def __call__(self, order: Order) -> object: ...


class Ended(Protocol):
    """Told when a change brought the order to a terminal status (its workflow, the status)."""

    def __call__(self, workflow: str, status: str) -> None: ...


@dataclass(frozen=True)
class Changed[T]:
    order: Order
    result: T
    saved: SavedNotices


class OrderChanges:
    def __init__(
        self,
        store: StateStore,
        notices: Notices,
        dispatch: Dispatcher,
        ended: Ended | None = None,
        released: Released | None = None,
    ):
        """``ended``: told when a saved change ends the order (the count of orders
        finished per workflow, ``observability.metrics.order_ended``); ``released``: told
        when a saved change frees the order's slot under per-key concurrency
        (``core.turn_keeper``: the next in line take it)."""
        self._store = store
        self._notices = notices
        self._dispatch = dispatch
        self._ended = ended
        self._released = released

    def change(
        self,
        order_id: str,
        decide: Callable[[Order], T],
        *,
        attempts: int = CONFLICT_ATTEMPTS,
        on_conflict: OnConflict | None = None,
        loaded: Order | None = None,
        after_save: Callable[[Order, T], None] | None = None,
    ) -> Changed[T] | None:
        """Apply ``decide`` to the order and commit it; None if there is no such order.

        ``attempts`` = 1 for a decision that must not be retried when it loses a race (a
        claim: the winner does the work); then ``ConcurrencyConflict`` is raised at once.
        ``on_conflict``, if given, decides instead of ``attempts`` whether a decision that
        lost a race is tried again (``Crowded``). ``loaded`` is an order already read, used
        for the first attempt. ``after_save`` runs between the save and the notices
        (logging, metrics, failpoints).
        """
        if attempts < 1 and on_conflict is None:
            raise ConcurrencyConflict(
                f"order {order_id} was not changed (no attempt allowed)", order_id=order_id
            )
        lost = 0
        while True:
            order = loaded if lost == 0 and loaded is not None else self._store.load(order_id)
            if order is None:
                return None
            before = order.status
            result = decide(order)  # TransitionRefused propagates: nothing to save
            turns.note_given_back(order)
            try:
                saved = self._store.save(order)
            except ConcurrencyConflict:
                lost += 1
                again = on_conflict(order, lost) if on_conflict is not None else lost < attempts
                if not again:
                    raise
                continue
            if after_save is not None:
                after_save(order, result)
            if self._ended is not None and order.status is not before and order.status.terminal:
                self._ended(order.plan.workflow, str(order.status))
            self._notices.deliver(saved)
            if needs_dispatch(order):
                self._dispatch(order)
            order.wakeups.clear()
            if self._released is not None and released_after(order, before):
                self._release(order)  # after its own notices: the next may start here
            return Changed(order, result, saved)

    def created(self, order: Order, saved: SavedNotices) -> None:
        """After a ``create``: the same notices and dispatch as after a change."""
        self._notices.deliver(saved)
        if needs_dispatch(order):
            self._dispatch(order)
        order.wakeups.clear()
        if self._released is not None and released_after(order, OrderStatus.PENDING):
            self._release(order)

    def _release(self, order: Order) -> None:
        """Free the order's slot; what fails here is the supervisor's sweep's to repair
        (the order is saved: its change must not be retried for this)."""
        assert self._released is not None
        try:
            self._released(order)
        except Exception as exc:  # noqa: BLE001 - the sweep releases it (core.turn_keeper)
            log.warning(
                "order %s: its slot under key %r was not released (%s); the supervisor's "
                "sweep will",
                order.order_id,
                turns.key_of(order),
                exc,
            )


def needs_dispatch(order: Order) -> bool:
    """Whether the scheduler should look at the order after a save: a step is Pending (to
    claim now or later), or a transition asked to be woken (a delay that began)."""
    if order.status.terminal:
        return False
    return bool(order.wakeups) or any(
        s.process_state is StepState.PENDING for s in order.active_steps()
    )
