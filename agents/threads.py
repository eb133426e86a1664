"""Threads of their own for blocking work off the event loop: each agent's, around its
calls, and the alert triggers' (one set for all of them: ``AppContext.alert_threads``,
``supervisor.triggers``).

The agents are ``async def`` (``agents.triggers``): the runtime awaits them on its event
loop, and a call to a remote holds a coroutine there, never a thread (the Azure Functions
Python guide: I/O-bound functions are async). What an agent still does with blocking
clients runs here, on threads of its own agent, never on the runtime's shared pool or on
its event loop:

- reading the claim a request speaks for (``agents.binding``: the Table SDK);
- handing over the reply (``messaging.inline``: applying it in process, which claims and
  dispatches the next step; else sending it on the reply queue: the Storage queue or
  Service Bus SDK);
- reading the agent's runtime controls when they are due (``core.control_cache``).

Each is bounded in time here (``bound``): the SDK clients bound each request, and the
work rides storage trouble out for a known budget, so a bound passed means something
hangs. The invocation then fails as a storage error does (``StorageUnavailable``: the
host delivers the request again), and the thread finishes on its own.

One agent has at most ``THREADS`` of them: as many invocations as the host runs of one
function at once on an instance (host.json: 16 + 8 messages on Storage queues, 16 on
Service Bus). So one agent whose storage work is slow delays its own invocations only:
another agent's work never waits for these threads, nor for the runtime's.
A Python agent's handler runs on a thread of its own per run, bounded by the agent's
concurrency limit (``agents.python``, ``agents.limits``).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from core.errors import StorageUnavailable

#: At least the invocations one instance runs of one function at once (host.json).
THREADS: Final = 32


class OwnThreads:
    """At most ``size`` threads of ``name``'s own (an agent's, or the alert triggers'),
    started when its invocations need them, named ``agent-<name>_<n>``."""

    def __init__(self, name: str, size: int = THREADS):
        self.name = name
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"agent-{name}")

    async def run[T](self, work: Callable[[], T], *, bound: float, what: str) -> T:
        """``work()`` on one of these threads, with the caller's context (its log fields
        and trace); ``StorageUnavailable`` if it takes longer than ``bound`` s."""
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        future = loop.run_in_executor(self._pool, context.run, work)
        try:
            return await asyncio.wait_for(future, bound)
        except TimeoutError:
            raise StorageUnavailable(
                f"{what} of agent {self.name} did not finish within {bound:.0f} s (it runs "
                "on; the request will be delivered again)"
            ) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
