"""The agents' blueprint: one function per declared agent, on its own request queue.

``run_agent_<agent>`` is triggered by ``agent-requests-<agent>`` (a Service Bus queue, or
a Storage queue with ``AGENT_TRANSPORT=storage``), so a slow or failing service never
holds up another's requests, and each function scales and is throttled on its own.
The agents come from the declarations (``declarations/``, ``core.workflows.AGENTS``),
read when this module is indexed. (The shared ``agent-requests`` queue of versions
before agents has no function: docs/operating.md, "Upgrading".)

The functions are ``async def``: an agent waits on the network (its remote, for up to a
step's timeout), and the Python runtime awaits async functions on its event loop instead
of running them on its one thread pool, which every synchronous function of the
instance shares. So a remote that answers slowly holds a coroutine, not a thread, and
cannot starve the scheduler or another agent of threads, whatever the pool's size (the
Azure Functions Python guide: I/O-bound functions are async). Nothing here blocks the
loop: the blocking work of an agent runs on its own threads (``agents.threads``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import azure.functions as func

from agents.agent import AgentWorker
from bootstrap import current_app_context, index_time, uses
from config.settings import SERVICE_BUS, STORAGE, Transport
from core import names
from core.errors import DuplicateRequest, InvalidMessage, UnboundMessage
from core.workflows import AGENTS
from messaging import bound
from messaging.wire import decode_request
from observability.logs import get_logger

bp = func.Blueprint()
log = get_logger(__name__)
ON_STORAGE_QUEUES = index_time().transport is Transport.STORAGE
#: What these triggers use of the app: the agents (each built on first use), and the
#: quarantine of a message that cannot be read.
_agent_for = uses(lambda app: app.agent_for)
_names = uses(lambda app: app.names)
_keep_aside = uses(lambda app: app.quarantine)
_send = uses(lambda app: app.queues.send)
#: Where an agent's invocation's messages may leave through output bindings: a dispatch
#: (``messaging.bound``; its requests and replies leave at once, with the SDK).
HOPS = bound.hop_queues()
#: A quarantine is a send and a table write, each bounded by its client.
QUARANTINE_BOUND = 120.0


async def _handle(
    raw: bytes, reply_to: str | None, agent: str, deliveries: int | None, copy: str | None = None
) -> None:
    worker = await _worker(agent)
    try:
        request = decode_request(raw)
    except InvalidMessage as exc:
        await _quarantine(worker, agent, raw, exc.message)
        return
    try:
        await worker.handle(request, reply_to, max(deliveries or 1, 1), copy or None)
    except DuplicateRequest as exc:  # another copy of it runs the attempt: nothing to do
        log.info("%s", exc.message)
    except UnboundMessage as exc:  # forged, or for an attempt never claimed: never called
        await _quarantine(worker, agent, raw, exc.message)


async def _worker(agent: str) -> AgentWorker:
    """The agent, built on first use off the event loop (building it may create the state
    table and reads the environment)."""
    ctx = current_app_context()
    worker = ctx.built_agent(agent) if ctx is not None else None
    if worker is None:
        worker = await asyncio.to_thread(lambda: _agent_for()(agent))
    return worker


async def _quarantine(worker: AgentWorker, agent: str, raw: bytes, reason: str) -> None:
    def keep() -> None:
        _keep_aside()(_names().agent_queue(agent), raw, reason)

    await worker.blocking(keep, bound=QUARANTINE_BOUND, what="quarantine")


def _register(function_name: str, queue: str, agent: str) -> None:
    """One trigger on ``queue`` named ``function_name`` (the worker needs distinct names
    and a real function object per trigger)."""
    if ON_STORAGE_QUEUES:

        async def on_queue(msg: func.QueueMessage) -> None:
            # Storage queues detect no duplicates: the message id tells copies apart.
            await _handle(msg.get_body(), None, agent, msg.dequeue_count, msg.id)

        handler: Callable[..., Coroutine[Any, Any, None]] = on_queue
        handler.__name__ = handler.__qualname__ = function_name
        bp.function_name(function_name)(
            bp.queue_trigger(arg_name="msg", queue_name=queue, connection=STORAGE)(
                bound.bind(bp, handler, func.QueueMessage, HOPS, _send, STORAGE)
            )
        )
    else:

        async def on_message(msg: func.ServiceBusMessage) -> None:
            await _handle(msg.get_body(), msg.reply_to, agent, msg.delivery_count)

        handler = on_message
        handler.__name__ = handler.__qualname__ = function_name
        bound_handler = bound.bind(bp, handler, func.ServiceBusMessage, HOPS, _send, STORAGE)
        bp.function_name(function_name)(
            bp.service_bus_queue_trigger(arg_name="msg", queue_name=queue, connection=SERVICE_BUS)(
                bound_handler
            )
        )


for _agent in sorted(AGENTS.values(), key=lambda a: a.name):
    _register(_agent.function_name, names.Names().agent_queue(_agent.name), _agent.name)
