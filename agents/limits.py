"""At most N calls of one agent at once, per instance (``core.workflows.Agent.concurrency``).

An attempt takes a slot before its first try and gives it back when it ends (its
retries and their backoff included: N attempts in progress); each try is handed the
slot (``agents.outcomes.TryKind.run``). A call that cannot be stopped when its
attempt ends (a Python handler still running in its thread) holds the slot until it
returns, so "at most N at once" holds for what really runs. An
attempt that gets no slot while a try could still start is not called at all: the
client reports it ``deferred`` (no failure of the order).
"""

from __future__ import annotations

import threading


class Slot:
    """One slot, held by its attempt and by any call the attempt left running; free
    again when the last of them lets go."""

    def __init__(self, slots: CallSlots):
        self._slots = slots
        self._holders = 1
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            if self._holders <= 0:
                raise RuntimeError("this slot was given back already")
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            free = self._holders == 0
        if free:
            self._slots._give_back()


class CallSlots:
    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("a concurrency limit is at least 1")
        self.limit = limit
        self._semaphore = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._taken = 0

    def take(self, wait: float) -> Slot | None:
        """A slot, waiting at most ``wait`` seconds for one; None if none came free."""
        if not self._semaphore.acquire(timeout=max(wait, 0.0)):
            return None
        with self._lock:
            self._taken += 1
        return Slot(self)

    def _give_back(self) -> None:
        with self._lock:
            self._taken -= 1
        self._semaphore.release()

    @property
    def in_use(self) -> int:
        with self._lock:
            return self._taken
