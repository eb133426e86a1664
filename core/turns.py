"""Per-key concurrency, decided (docs/contracts.md §3.16): whose turn it is.

A workflow declared with ``Concurrency(key=fn, limit=n)`` runs at most ``n`` orders of
one key at once. The key is decided once, at acceptance (``decide_key``), and kept on
the order's plan with the rule it pins (``TurnRule.order_key``: ``key_of``). Each
key has a *slot*: who holds it (at most ``limit`` holders, each with the time it took
its turn) and who waits, in order of acceptance. What the slot does next is decided
here, without I/O (``settle``); ``core.turn_keeper`` reads and writes it through the
``TurnStore`` port (``stores.turns``: one Table partition per workflow and key).

An order frees its slot when it ends (``completed``, ``compensated``, ``cancelled``),
or goes to ``error`` unless the rule says ``hold_on_error`` (``releases``).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from core.concurrency import Concurrency
from core.flow import Context
from core.history import Happened
from core.states import OrderStatus

if TYPE_CHECKING:
    from core.model import Order

#: The longest key (characters): what a person can read, and a search row can carry.
MAX_KEY: Final = 256
#: Promotions written in one transaction (the slot row is the 100th operation).
MAX_PROMOTIONS: Final = 99


class TurnKeyRefused(Exception):
    """A key function that raised, or returned what is not a key: the order is refused
    at acceptance with this reason (docs/contracts.md §3.1)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class TurnRule:
    """What an order's plan pins of its workflow's ``Concurrency``: the key function's
    name (for people and the deploy check), the limit, and ``hold_on_error``."""

    key: str
    limit: int = 1
    hold_on_error: bool = False
    #: the order's own key, decided at its acceptance and kept with its plan ("": none)
    order_key: str = ""
    #: the order gave its slot back once (``gives_back``): should it run again (a cancel
    #: in error, late evidence), it takes one again first (``runs_again``)
    gave_back: bool = False

    @classmethod
    def of(cls, declared: Concurrency) -> TurnRule:
        described = declared.describe()
        return cls(str(described["key"]), declared.limit, declared.hold_on_error)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "limit": self.limit,
            "holdOnError": self.hold_on_error,
        }
        if self.order_key:
            out["orderKey"] = self.order_key
        if self.gave_back:
            out["gaveBack"] = True
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> TurnRule | None:
        if not raw:
            return None
        return cls(
            str(raw.get("key", "")),
            int(raw["limit"]),
            bool(raw.get("holdOnError")),
            str(raw.get("orderKey") or ""),
            bool(raw.get("gaveBack")),
        )

    def releases(self, status: OrderStatus) -> bool:
        """Whether an order in ``status`` no longer holds its slot."""
        return status.finished or (status is OrderStatus.ERROR and not self.hold_on_error)


def gives_back(order: Order) -> bool:
    """Whether the order, as it stands, holds no slot of its key: its rule releases its
    status, or it is in ``error`` with its unwinding over (nothing is left to resubmit
    or cancel, so ``hold_on_error`` holds nothing for anyone)."""
    rule = order.plan.concurrency
    if rule is None or not key_of(order):
        return False
    return rule.releases(order.status) or (order.status is OrderStatus.ERROR and order.unwound)


def runs_again(order: Order) -> bool:
    """Whether the order gave its slot back once and runs again since (an ``error`` order
    cancelled, or reopened by late evidence): no step of it is claimed until it holds a
    slot again (docs/contracts.md §3.16, "As built")."""
    rule = order.plan.concurrency
    if rule is None or not rule.gave_back or gives_back(order) or waits(order):
        return False
    return bool(key_of(order))


def note_given_back(order: Order) -> None:
    """Before a save: an order that gives its slot back in it is marked so, in its plan's
    rule (``TurnRule.gave_back``), for ``runs_again`` to read."""
    rule = order.plan.concurrency
    if rule is not None and not rule.gave_back and gives_back(order):
        order.plan = replace(order.plan, concurrency=replace(rule, gave_back=True))


def key_of(order: Order) -> str:
    """The order's key ("": it has none, and takes no turn)."""
    rule = order.plan.concurrency
    return rule.order_key if rule is not None else ""


def waits(order: Order) -> bool:
    """Accepted under a key and not started: it waits for its slot (``waitingFor``)."""
    return bool(key_of(order)) and not order.steps and order.status is OrderStatus.PENDING


def take_turn(order: Order, now: datetime) -> None:
    """Its turn came (the slot lists it as a holder): its first steps start."""
    from core import course  # the course asks ``waits`` first: imported when used

    if not waits(order) or order.cancel_requested:
        raise order.refuse("not-waiting", "the order does not wait for its turn")
    order.note(now, Happened.TURN_TAKEN, turn=key_of(order))
    course.start_group(order, order.plan.groups()[0], now)
    course.advance(order, now)
    order.touch(now)


def decide_key(declared: Concurrency, order_id: str, body: Mapping[str, Any]) -> str | None:
    """``declared.key`` of the order's acceptance context (its id, a copy of its data, no
    results): the key, or None (no limit for this order). ``TurnKeyRefused`` with a
    reason a person can act on if it raises or returns anything else."""
    ctx = Context(order_id, copy.deepcopy(dict(body)), MappingProxyType({}))
    name = declared.describe()["key"]
    try:
        key = declared.key(ctx)
    except Exception as exc:  # noqa: BLE001 - a bug in a declaration refuses its order only
        text = f"{type(exc).__name__}: {exc}"[:500]
        raise TurnKeyRefused(
            f"the workflow's concurrency key ({name}) raised {text}; the order was not "
            "accepted: fix the order's data or the key function, then send it again"
        ) from None
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY:
        what = f"a {type(key).__name__}" if not isinstance(key, str) else f"{len(key)} characters"
        raise TurnKeyRefused(
            f"the workflow's concurrency key ({name}) returned {what}; a key is a string of "
            f"1-{MAX_KEY} characters (or None: no limit for that order). The order was not "
            "accepted: fix the key function or the order's data, then send it again"
        )
    return key


def key_digest(key: str) -> str:
    """A fixed-width stand-in for a key in table keys (any character may be in a key)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class Holder:
    order_id: str
    since: datetime


@dataclass(frozen=True)
class Waiter:
    order_id: str
    at: datetime


@dataclass(frozen=True)
class Slot:
    """One key's slot as read: its holders, its waiting orders in order of acceptance
    (earliest first, ties by order id), and the ETag of its row (None: no row yet)."""

    workflow: str
    key: str
    holders: tuple[Holder, ...] = ()
    waiting: tuple[Waiter, ...] = ()
    etag: str | None = None
    #: the limit its last writer applied (0: not known), for the sweep
    limit: int = 0

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.waiting, key=lambda w: (w.at, w.order_id)))
        object.__setattr__(self, "waiting", ordered)

    @property
    def holder_ids(self) -> list[str]:
        return [h.order_id for h in self.holders]

    def holds(self, order_id: str) -> bool:
        return order_id in self.holder_ids

    def position(self, order_id: str) -> int | None:
        """0: it holds the slot; n: the n-th in line; None: neither."""
        if self.holds(order_id):
            return 0
        line = [w.order_id for w in self.waiting if not self.holds(w.order_id)]
        return line.index(order_id) + 1 if order_id in line else None

    def view(self, order_id: str) -> dict[str, Any]:
        """What the API, the CLI and the console show of the order's turn."""
        return {
            "key": self.key,
            "position": self.position(order_id),
            "holders": self.holder_ids,
            "waiting": self.position_count(),
        }

    def position_count(self) -> int:
        """How many wait in line (not holding it)."""
        return len([w for w in self.waiting if not self.holds(w.order_id)])

    @property
    def empty(self) -> bool:
        return not self.holders and not self.waiting


@dataclass(frozen=True)
class Settled:
    """What ``settle`` decided: the holders to write, the waiting rows to delete (by order
    id), who took a turn, and whether anything is to be written."""

    holders: tuple[Holder, ...]
    drop: tuple[str, ...]
    promoted: tuple[str, ...]
    changed: bool
    limit: int = 1

    def after(self, slot: Slot) -> Slot:
        """The slot as this decision leaves it (its ETag is not known here)."""
        waiting = tuple(w for w in slot.waiting if w.order_id not in self.drop)
        return Slot(slot.workflow, slot.key, self.holders, waiting, slot.etag, self.limit)


def settle(slot: Slot, limit: int, now: datetime, leaving: Collection[str] = ()) -> Settled:
    """The slot after ``leaving`` gave it up (or stopped waiting), filled from the head of
    the line while fewer than ``limit`` hold it (first come, first served: nobody jumps
    the line). A waiting row of an order that holds already (a redelivered acceptance)
    is dropped; at most ``MAX_PROMOTIONS`` rows change in one write."""
    gone = set(leaving)
    holders = [h for h in slot.holders if h.order_id not in gone]
    held = {h.order_id for h in holders}
    drop: list[str] = []
    promoted: list[str] = []
    for waiter in slot.waiting:
        if len(drop) >= MAX_PROMOTIONS:
            break
        if waiter.order_id in gone or waiter.order_id in held:
            drop.append(waiter.order_id)
        elif len(holders) < limit:
            holders.append(Holder(waiter.order_id, now))
            held.add(waiter.order_id)
            promoted.append(waiter.order_id)
            drop.append(waiter.order_id)
    changed = bool(drop) or tuple(holders) != slot.holders
    changed = changed or (slot.etag is not None and slot.limit != limit)
    return Settled(tuple(holders), tuple(drop), tuple(promoted), changed, limit)


@dataclass
class SweepReport:
    """What a sweep of the slots did (``TurnKeeper.sweep``)."""

    keys: int = 0
    released: int = 0  # holders whose order had ended, or never came
    woken: int = 0  # holders whose order still waited for its turn
    promoted: int = 0
    forgotten: int = 0  # empty slots removed
    errors: list[str] = field(default_factory=list)


class TurnStore(Protocol):
    """The slots (``stores.turns``)."""

    def read_slot(self, workflow: str, key: str) -> Slot:
        """The slot of ``key`` with its waiting orders (an empty one if it has no row)."""
        ...

    def add_waiter(self, workflow: str, key: str, order_id: str, at: datetime) -> None:
        """Put the order in line (idempotent: an order already in line keeps its place)."""
        ...

    def write_slot(self, slot: Slot, settled: Settled) -> None:
        """The slot's holders and the waiting rows dropped, in one transaction If-Match
        the slot's ETag (a create when it had no row); ``ConcurrencyConflict`` if another
        writer came first."""
        ...

    def turn_keys(self, limit: int, after: str = "") -> Iterable[tuple[str, str]]:
        """(workflow, key) of slots that have rows, at most ``limit``, in the order of
        ``f"{workflow}|{key_digest(key)}"``, those after ``after``."""
        ...

    def forget_slot(self, slot: Slot) -> bool:
        """Remove an empty slot (If-Match its ETag) and its entry in the keys' list; False
        if it changed meanwhile (it stays listed)."""
        ...
