"""The ledger of applied effects: what the simulated remote world actually did.

One entry per applied effect, in the order applied:

    {"seq", "at", "orderId", "step", "idempotencyKey", "kind": "effect"|"compensation",
     "compensates": step|null, "undid": bool|null, "request": {...}, "response": {...},
     "ids": {field: id}|null}

``request`` is the call's body as received; ``ids`` the id an effect handed out (for
example ``{"reservation": "reservation-1f0c9a2e"}``), or the one a compensation named to
undo (``simulator.engine``: a compensation must name the id its step handed out). A
callback (``simulator.callbacks``) is an entry too, once settled, ``"kind":
"callback"``, with ``"callback": {"url", "body", "answer", "tries", "fault"}``; the
helpers at the bottom count effects and compensations only.

The server keeps it in memory and, with a path, appends each entry to a JSONL
file as it is applied (flushed), so a test can read it after killing the app.
The helpers at the bottom are for tests and the demo.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

Effect = dict[str, Any]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Ledger:
    """Thread-safe, append-only record of effects; knows which effects still stand."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._lock = threading.Lock()
        self._entries: list[Effect] = []
        # (orderId, step) of effects applied and not undone, so a compensation
        # can tell in O(1) whether it had something to undo.
        self._standing: set[tuple[str, str]] = set()
        self._compensations = 0
        self._callbacks = 0
        self._path = Path(path) if path is not None else None
        self._file: TextIO | None = None
        if self._path is not None:
            # One file is one server's life: seq restarts at 1, so start empty.
            self._file = self._path.open("w", encoding="utf-8")

    def append(
        self,
        *,
        at: str,
        order_id: str,
        step: str,
        key: str,
        response: dict[str, Any],
        compensates: str | None,
        request: dict[str, Any] | None = None,
        ids: dict[str, str] | None = None,
    ) -> Effect:
        """Record one applied effect (or compensation, when ``compensates`` names a step)."""
        with self._lock:
            undid: bool | None = None
            if compensates is not None:
                target = (order_id, compensates)
                undid = target in self._standing
                self._standing.discard(target)
                self._compensations += 1
            else:
                self._standing.add((order_id, step))
            entry: Effect = {
                "seq": len(self._entries) + 1,
                "at": at,
                "orderId": order_id,
                "step": step,
                "idempotencyKey": key,
                "kind": "effect" if compensates is None else "compensation",
                "compensates": compensates,
                "undid": undid,
                "request": request,
                "response": response,
                "ids": ids,
            }
            self._write(entry)
            return entry

    def append_callback(
        self,
        *,
        order_id: str,
        step: str,
        key: str,
        url: str,
        body: dict[str, Any],
        answer: int | str | None,
        tries: int,
        fault: str | None,
    ) -> Effect:
        """Record a settled callback: delivered (``answer`` 2xx), refused or unreachable
        after ``tries``, or never sent (``fault`` "lost", ``answer`` None)."""
        with self._lock:
            self._callbacks += 1
            entry: Effect = {
                "seq": len(self._entries) + 1,
                "at": now_iso(),
                "orderId": order_id,
                "step": step,
                "idempotencyKey": key,
                "kind": "callback",
                "compensates": None,
                "undid": None,
                "callback": {
                    "url": url,
                    "body": body,
                    "answer": answer,
                    "tries": tries,
                    "fault": fault,
                },
            }
            self._write(entry)
            return entry

    def _write(self, entry: Effect) -> None:
        self._entries.append(entry)
        if self._file is not None:
            self._file.write(json.dumps(entry, separators=(",", ":")) + "\n")
            self._file.flush()

    def entries(self) -> list[Effect]:
        with self._lock:
            return [dict(entry) for entry in self._entries]

    def counts(self) -> tuple[int, int, int]:
        """(effects and compensations, of which compensations; callbacks)."""
        with self._lock:
            return len(self._entries) - self._callbacks, self._compensations, self._callbacks

    def clear(self) -> None:
        """Forget everything; the file, if any, is truncated to match."""
        with self._lock:
            self._entries.clear()
            self._standing.clear()
            self._compensations = 0
            self._callbacks = 0
            if self._file is not None:
                self._file.seek(0)
                self._file.truncate()
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def load_ledger(path: str | Path) -> list[Effect]:
    """Read a JSONL ledger. A torn last line (writer killed mid-write) is ignored;
    a bad line anywhere else is an error."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    effects: list[Effect] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            effects.append(json.loads(line))
        except ValueError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON ledger entry") from None
    return effects


def applied(effects: Iterable[Effect]) -> list[Effect]:
    """The effects and compensations of a ledger (not its callbacks)."""
    return [e for e in effects if e.get("kind") != "callback"]


def double_effects(effects: Iterable[Effect]) -> list[tuple[str, str]]:
    """(orderId, step) pairs whose effect was applied more than once.

    The simulator applies a key at most once, so a pair here means the product
    sent the same step under different idempotency keys: a product bug.
    """
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for effect in applied(effects):
        counts[(effect["orderId"], effect["step"])] += 1
    return [pair for pair, count in counts.items() if count > 1]


def effects_by_order(effects: Iterable[Effect]) -> dict[str, list[str]]:
    """orderId -> the steps applied for it (effects and compensations), in order."""
    steps: dict[str, list[str]] = defaultdict(list)
    for effect in sorted(applied(effects), key=lambda e: e["seq"]):
        steps[effect["orderId"]].append(effect["step"])
    return dict(steps)


def standing_effects(effects: Iterable[Effect]) -> dict[str, list[str]]:
    """orderId -> steps whose effect still stands (applied and not undone), in order.

    For invariants such as "every order is either fully done or fully undone".
    """
    standing: dict[str, list[str]] = defaultdict(list)
    for effect in sorted(applied(effects), key=lambda e: e["seq"]):
        steps = standing[effect["orderId"]]
        if effect["kind"] == "effect":
            steps.append(effect["step"])
        elif effect["undid"] and effect["compensates"] in steps:
            steps.remove(effect["compensates"])
    return {order: steps for order, steps in standing.items() if steps}
