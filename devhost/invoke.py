"""Hand each invocation to the Functions Python runtime, count what runs, and what every
queue trigger's listener shares (:class:`Listener`).

Every trigger kind goes through :class:`Invoker`: shutdown waits for all invocations at one
place, every failure is logged the same way (one ERROR with the traceback; successes at
DEBUG). Its ``runner`` is :meth:`hostrun.worker.WorkerRuntime.call` under ``python -m
devhost``; unit tests pass one of their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from devhost.app_loader import FunctionSpec
from hostrun.shapes import Trigger

if TYPE_CHECKING:
    from devhost.unreadable import UnreadableQueues

log = logging.getLogger("devhost")


def start_thread(name: str, target: Callable[..., object], *args: object) -> threading.Thread:
    """Start ``target(*args)`` in a daemon thread: nothing it runs may hold the process open."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Outcome:
    """What one invocation gave: its return value, or the exception it raised."""

    value: Any = None
    error: Exception | None = None

    @property
    def succeeded(self) -> bool:
        return self.error is None


#: What runs one invocation: (function, trigger as the host has it) -> value; raises if failed.
Runner = Callable[[FunctionSpec, Trigger], Any]


class Invoker:
    """Hands invocations to ``runner`` and counts them."""

    def __init__(self, runner: Runner) -> None:
        self._running, self.runner = 0, runner
        self._lock = threading.Lock()

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    def call(self, spec: FunctionSpec, trigger: Trigger, detail: str = "") -> Outcome:
        """Call ``spec``'s function. Never raises: a failure is logged (with its traceback
        and ``detail``, e.g. the message id) and returned."""
        started, suffix = time.monotonic(), f" ({detail})" if detail else ""
        with self._lock:
            self._running += 1
        try:
            result = self.runner(spec, trigger)  # raises if the invocation failed
        except Exception as error:  # any user error is one failed invocation
            elapsed = time.monotonic() - started
            log.exception("function %s failed after %.3f s%s", spec.name, elapsed, suffix)
            return Outcome(error=error)
        finally:
            with self._lock:
                self._running -= 1
        elapsed = time.monotonic() - started
        log.debug("function %s succeeded in %.3f s%s", spec.name, elapsed, suffix)
        return Outcome(value=result)


class Listener:
    """A queue trigger's listener, Storage or Service Bus: one function, its messages run on
    a pool of its host.json concurrency, and every receive told to ``unreadable``."""

    def __init__(self, spec: FunctionSpec, invoker: Invoker, concurrency: int) -> None:
        self.spec, self.invoker = spec, invoker
        self.source = str(spec.trigger.get("queueName", ""))
        self._pool = ThreadPoolExecutor(concurrency, f"devhost-{spec.name}")
        self.unreadable: UnreadableQueues | None = None
        self._failing = False  # the last receive failed
        self.log = logging.getLogger(type(self).__module__)

    def invoke(self, trigger: Trigger, detail: str) -> bool:
        """One invocation with this message; True if it succeeded."""
        return self.invoker.call(self.spec, trigger, detail=detail).succeeded

    def report_receive(self, error: Exception | None = None) -> None:
        """A receive worked, or failed with ``error``: the first failure in a row is logged
        as a WARNING (the others at DEBUG), the receive that works after them at INFO."""
        if error is not None:
            level = logging.DEBUG if self._failing else logging.WARNING
            self.warn("cannot read queue %s: %s", self.source, error, level=level)
        elif self._failing:
            self.warn("queue %s answers again", self.source, level=logging.INFO)
        self._failing = error is not None
        if self.unreadable is not None and error is None:
            self.unreadable.read(self.source)
        elif self.unreadable is not None:
            self.unreadable.failed(self.source, error)

    def warn(self, text: str, *args: Any, level: int = logging.WARNING) -> None:
        self.log.log(level, f"function %s: {text}", self.spec.name, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)
