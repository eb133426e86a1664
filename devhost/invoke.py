"""Call a user function the way the Python worker does, and count what is running.

Every trigger kind goes through :class:`Invoker`, so shutdown waits for all running
invocations at one place and every failure is logged the same way (one ERROR record with
the traceback); successes are logged at DEBUG.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from devhost.app_loader import FunctionSpec

log = logging.getLogger("devhost")


def start_thread(name: str, target: Callable[..., object], *args: object) -> threading.Thread:
    """Start ``target(*args)`` in a daemon thread: neither a function nor a broken storage
    or broker endpoint may hold the process open (what it holds is leased, so it returns)."""
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


class Invoker:
    """Runs user functions (async ones in a private event loop), or hands them to ``runner``
    (``--runtime worker``: azure-functions-runtime, see hostrun/), and counts them."""

    def __init__(self, runner: Callable[[FunctionSpec, Any], Any] | None = None) -> None:
        self._running, self.runner = 0, runner
        self._lock = threading.Lock()

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    def call(self, spec: FunctionSpec, trigger_value: Any, detail: str = "") -> Outcome:
        """Call ``spec``'s function. Never raises: a failure is logged (with its traceback
        and ``detail``, e.g. the message id) and returned."""
        started = time.monotonic()
        suffix = f" ({detail})" if detail else ""
        with self._lock:
            self._running += 1
        try:
            if self.runner is not None:  # the runtime raises when the invocation failed
                result = self.runner(spec, trigger_value)
            else:
                result = spec.func(**{spec.trigger_arg: trigger_value})
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
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
