"""The invariants of per-key concurrency (docs/contracts.md §3.16), over every order of an
example and the slots of their keys, as stored after a transition:

- T1: never more orders of a key running steps at once than its limit, and none running
  without holding a slot (running: a step Processing, or an attempt claimed and not
  ended; ``@undo``: only its compensations run; ``@again``: it held the slot before and
  runs on after it gave it back);
- T2: turns in acceptance order (an order takes its first turn only when every order of
  its key accepted before it took one, or left the line);
- T3: no slot leaked once the example settled after a supervisor sweep (every holder's
  order still running, or in error with ``hold_on_error``);
- T4: an order waiting in line for its first turn has no step record (one that gave its
  slot back and runs again, cancelled or reopened by evidence, waits with its steps);
- T5: once the example settled, no order still waits (each ran or was cancelled).

Pure functions of the model's vocabulary and the slots read (``World.slot``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from core.turns import Slot
from tests.model.signatures import Finding
from tests.model.vocabulary import OrderSnap, finished


@dataclass
class Keyed:
    """The orders of an example that take turns: each one's key, the order they were
    accepted in, and which of them ever held a slot (what T2 compares)."""

    limit: int
    hold: bool
    keys: dict[str, str]  # order id -> key
    accepted: list[str]  # order ids, earliest first
    held: set[str] = field(default_factory=set)

    def of(self, key: str) -> list[str]:
        return [o for o in self.accepted if self.keys.get(o) == key]


def running(snap: OrderSnap | None) -> bool:
    """A step of it Processing, or an attempt claimed and not ended."""
    return snap is not None and any(s.state == "processing" or s.in_flight for s in snap.steps)


def waiting(slot: Slot, order_id: str) -> bool:
    """In the slot's line, not holding it."""
    position = slot.position(order_id)
    return position is not None and position > 0


def after_transition(
    keyed: Keyed, snaps: Mapping[str, OrderSnap | None], slots: Mapping[str, Slot]
) -> list[Finding]:
    """T1, T2 and T4 after one transition; notes who holds a slot now (``keyed.held``)."""
    out: list[Finding] = []
    for key, slot in slots.items():
        orders = keyed.of(key)
        holders = set(slot.holder_ids)
        if len(holders) > keyed.limit:
            out.append(Finding("T1-over-limit", f"key {key}: holders {sorted(holders)}", "slot"))
        busy = [o for o in orders if running(snaps.get(o))]
        for order_id in busy:
            if order_id not in holders:
                snap = snaps.get(order_id)
                out.append(
                    Finding(
                        "T1-running-without-slot",
                        f"{order_id} ({snap.status if snap else '-'}) runs {_states(snap)} "
                        f"and the slot of {key} holds {sorted(holders)}",
                        _where(keyed, order_id, snap),
                    )
                )
        if len(busy) > keyed.limit:
            # ``@undo``: those beyond the holders only undo (the same bug as T1 ``@undo``)
            outside = {_where(keyed, o, snaps.get(o)) for o in busy if o not in holders}
            where = outside.pop() if len(outside) == 1 and "" not in outside else "running"
            out.append(Finding("T1-over-limit", f"key {key}: {busy} run at once", where))
        for order_id in orders:
            snap = snaps.get(order_id)
            # one that held a slot and runs again after giving it back waits with its steps
            if (
                waiting(slot, order_id)
                and snap is not None
                and snap.steps
                and order_id not in keyed.held
            ):
                out.append(
                    Finding(
                        "T4-waiting-with-steps",
                        f"{order_id} waits in line for {key} with {_states(snap)}",
                    )
                )
        for order_id in [o for o in orders if o in holders and o not in keyed.held]:
            before = orders[: orders.index(order_id)]
            skipped = [o for o in before if waiting(slot, o) and not _ended(snaps.get(o))]
            if skipped:
                out.append(
                    Finding(
                        "T2-turn-out-of-order",
                        f"{order_id} took its turn for {key} while {skipped}, accepted "
                        "before it, still wait",
                    )
                )
        keyed.held |= holders
    return out


def settled(
    keyed: Keyed, snaps: Mapping[str, OrderSnap | None], slots: Mapping[str, Slot]
) -> list[Finding]:
    """T3 and T5, once the world calmed down and the supervisor swept the slots."""
    out: list[Finding] = []
    for key, slot in slots.items():
        for holder in slot.holder_ids:
            snap = snaps.get(holder)
            status = snap.status if snap is not None else "missing"
            kept = status == "error" and keyed.hold
            if snap is None or finished(status) or (status == "error" and not kept):
                out.append(
                    Finding("T3-slot-leaked", f"{holder} ({status}) still holds the slot of {key}")
                )
    for order_id, snap in snaps.items():
        if snap is None or order_id not in keyed.keys or finished(snap.status):
            continue  # (a line row left by an order that ended is released in its turn)
        line = slots.get(keyed.keys[order_id])
        stuck = snap.status == "pending" and not snap.steps and not finished(snap.status)
        if stuck or (line is not None and waiting(line, order_id)):
            out.append(
                Finding(
                    "T5-waiting-stuck",
                    f"{order_id} ({snap.status}, cancel requested: {snap.cancel_requested}) "
                    f"still waits for its turn",
                )
            )
    return out


def _where(keyed: Keyed, order_id: str, snap: OrderSnap | None) -> str:
    """How an order runs without its slot: ``undo`` (only its compensations), ``again``
    (it held the slot before, and runs on after giving it back), or "" (it never held
    it)."""
    if _undoing(snap):
        return "undo"
    return "again" if order_id in keyed.held else ""


def _ended(snap: OrderSnap | None) -> bool:
    return snap is not None and finished(snap.status)


def _undoing(snap: OrderSnap | None) -> bool:
    """Only compensations of it run (an order undone after it gave its slot back)."""
    return snap is not None and all(
        not s.action for s in snap.steps if s.state == "processing" or s.in_flight
    )


def _states(snap: OrderSnap | None) -> str:
    if snap is None:
        return "no order"
    return ", ".join(f"{s.name}:{s.state}" for s in snap.steps) or "no steps"
