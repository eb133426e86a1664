"""Call a user function the way the Python worker does, and count what is running.

Every trigger kind goes through :class:`Invoker`, so shutdown can wait for all running
invocations at one place, and every failure is logged the same way (one ERROR record with
the traceback); successes are logged at DEBUG.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import azure.functions as func
from azure.functions import _abc as azf_abc

from devhost.app_loader import CONTEXT_PARAMETER, FunctionSpec

log = logging.getLogger("devhost")


class _TraceContext(azf_abc.TraceContext):
    @property
    def trace_state(self) -> str:
        return ""

    @property
    def trace_parent(self) -> str:
        return ""

    @property
    def attributes(self) -> dict[str, str]:
        return {}


class _RetryContext(azf_abc.RetryContext):
    @property
    def retry_count(self) -> int:
        return 0

    @property
    def max_retry_count(self) -> int:
        return 0

    @property
    def exception(self) -> Any:
        return None


class InvocationContext(func.Context):
    """The ``context`` parameter: invocation id, function name and directory."""

    def __init__(self, function_name: str, function_directory: str) -> None:
        self._invocation_id = str(uuid.uuid4())
        self._function_name = function_name
        self._function_directory = function_directory
        self._local = threading.local()
        self._local.invocation_id = self._invocation_id

    @property
    def invocation_id(self) -> str:
        return self._invocation_id

    @property
    def thread_local_storage(self) -> Any:
        return self._local

    @property
    def function_name(self) -> str:
        return self._function_name

    @property
    def function_directory(self) -> str:
        return self._function_directory

    @property
    def trace_context(self) -> azf_abc.TraceContext:
        return _TraceContext()

    @property
    def retry_context(self) -> azf_abc.RetryContext:
        return _RetryContext()


class OutValue(func.Out[Any]):
    """An output parameter (``func.Out``): the HTTP response when it is not ``$return``."""

    def __init__(self) -> None:
        self._value: Any = None

    def set(self, val: Any) -> None:
        self._value = val

    def get(self) -> Any:
        return self._value


@dataclass(frozen=True)
class Outcome:
    """What one invocation gave: its return value, or the exception it raised."""

    value: Any = None
    error: Exception | None = None

    @property
    def succeeded(self) -> bool:
        return self.error is None


class Invoker:
    """Runs user functions (async ones in a private event loop) and tracks them."""

    def __init__(self) -> None:
        self._running = 0
        self._idle = threading.Condition()

    @property
    def running(self) -> int:
        with self._idle:
            return self._running

    def call(
        self,
        spec: FunctionSpec,
        trigger_value: Any,
        extra: Mapping[str, Any] | None = None,
        detail: str = "",
    ) -> Outcome:
        """Call ``spec``'s function. Never raises: a failure is logged (with its traceback
        and ``detail``, e.g. the message id) and returned, so every trigger kind handles user
        errors the same way."""
        kwargs: dict[str, Any] = {spec.trigger_arg: trigger_value, **(extra or {})}
        if spec.wants_context:
            kwargs[CONTEXT_PARAMETER] = InvocationContext(spec.name, spec.directory)
        started = time.monotonic()
        with self._idle:
            self._running += 1
        try:
            result = spec.func(**kwargs)
            if inspect.isawaitable(result):
                result = asyncio.run(_await(result))
        except Exception as error:  # any user error is one failed invocation
            log.exception(
                "function %s failed after %.3f s%s",
                spec.name,
                time.monotonic() - started,
                f" ({detail})" if detail else "",
            )
            return Outcome(error=error)
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()
        log.debug(
            "function %s succeeded in %.3f s%s",
            spec.name,
            time.monotonic() - started,
            f" ({detail})" if detail else "",
        )
        return Outcome(value=result)

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing runs; False if something still runs after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True


async def _await(awaitable: Any) -> Any:
    return await awaitable
