"""Group commit: what threads of one process ask of one order at once, done in one save.

The lines of a ``ForEach`` that end together each bring a reply for the one order record,
and each reply is a load, a decision and a save If-Match. Applied one by one, every
round only one save wins and the others read the order again and decide again
(``core.unit_of_work.Crowded``). ``Together`` lets the first caller for an order lead:
it takes what is waiting for that order (itself first, at most ``most``), runs it as one
batch (one load, the decisions one after the other, one save), and hands each caller its
own result; callers that came meanwhile wait, and the first of them leads the next
batch. A caller alone is its own batch, at no cost but a lock.

Only the process's own callers are grouped: another instance's replies still meet this
one's at the save's If-Match, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast


@dataclass(eq=False)
class _Entry[I, R]:
    item: I
    woken: threading.Event = field(default_factory=threading.Event)
    leads: bool = False
    finished: bool = False
    value: R | None = None
    error: BaseException | None = None

    def result(self) -> R:
        if self.error is not None:
            raise self.error
        return cast(R, self.value)  # set with ``finished``


class Together[I, R]:
    """``run(key, item, batch)``: ``batch(items)`` gives one result (or exception) per item,
    in order; items of one key that wait together go in one call, at most ``most``."""

    def __init__(self, most: int) -> None:
        if most < 1:
            raise ValueError("a batch holds at least one item")
        self._most = most
        self._lock = threading.Lock()
        self._queued = threading.Condition(self._lock)
        self._waiting: dict[str, list[_Entry[I, R]]] = {}
        self._led: set[str] = set()
        self._leading = threading.local()  # the keys this thread leads a batch of now

    def run(self, key: str, item: I, batch: Callable[[list[I]], Sequence[R | BaseException]]) -> R:
        if key in getattr(self._leading, "keys", ()):  # asked from within its own batch
            [alone] = batch([item])
            if isinstance(alone, BaseException):
                raise alone
            return alone
        entry: _Entry[I, R] = _Entry(item)
        with self._lock:
            self._waiting.setdefault(key, []).append(entry)
            if key not in self._led:
                self._led.add(key)
                entry.leads = True
            self._queued.notify_all()
        if not entry.leads:
            entry.woken.wait()  # finished by a leader, or made the leader
        if not entry.finished:
            self._lead(key, batch)
        return entry.result()

    def await_waiting(self, key: str, count: int, timeout: float) -> bool:
        """Wait until ``count`` callers wait for ``key`` (not yet taken into a batch);
        False if they did not within ``timeout`` seconds. For tests: a batch held open
        until the callers it races with have come."""
        with self._queued:
            return self._queued.wait_for(
                lambda: len(self._waiting.get(key, ())) >= count, timeout=timeout
            )

    def _lead(self, key: str, batch: Callable[[list[I]], Sequence[R | BaseException]]) -> None:
        """Run the waiting items (the leader's own first: it heads the line) as one batch,
        settle each, then hand the lead to the next waiting, or give it up."""
        with self._lock:
            line = self._waiting[key]
            taken, line[:] = line[: self._most], line[self._most :]
        mine: set[str] = self._leading.__dict__.setdefault("keys", set())
        mine.add(key)
        try:
            results: Sequence[R | BaseException] = batch([e.item for e in taken])
            if len(results) != len(taken):
                raise RuntimeError(f"a batch of {len(taken)} gave {len(results)} results")
        except BaseException as exc:  # noqa: BLE001 - each caller gets it as its own
            results = [exc] * len(taken)
        finally:
            mine.discard(key)
        for entry, result in zip(taken, results, strict=True):
            if isinstance(result, BaseException):
                entry.error = result
            else:
                entry.value = result
            entry.finished = True
        with self._lock:
            line = self._waiting[key]
            if line:
                line[0].leads = True
                line[0].woken.set()
            else:
                del self._waiting[key]
                self._led.discard(key)
        for entry in taken:
            entry.woken.set()
