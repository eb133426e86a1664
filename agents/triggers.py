"""The agents' blueprint: one function per declared agent, on its own request queue.

``run_agent_<agent>`` is triggered by ``agent-requests-<agent>`` (a Service Bus queue, or
a Storage queue with ``AGENT_TRANSPORT=storage``), so a slow or failing service never
holds up another's requests, and each function scales and is throttled on its own.
The agents come from the declarations (``declarations/``, ``core.workflows.AGENTS``),
read when this module is indexed. (The shared ``agent-requests`` queue of versions
before agents has no function: README, "Upgrading".)
"""

from __future__ import annotations

from collections.abc import Callable

import azure.functions as func

from bootstrap import app_context, index_time
from core import names
from core.errors import DuplicateRequest, InvalidMessage, UnboundMessage
from core.messages import decode_request
from core.settings import SERVICE_BUS, STORAGE, Transport
from core.workflows import AGENTS
from messaging.quarantine import quarantine
from observability.logs import get_logger

bp = func.Blueprint()
log = get_logger(__name__)
ON_STORAGE_QUEUES = index_time().transport is Transport.STORAGE


def _handle(
    raw: bytes, reply_to: str | None, agent: str, deliveries: int | None, copy: str | None = None
) -> None:
    ctx = app_context()
    try:
        request = decode_request(raw)
    except InvalidMessage as exc:
        queue = ctx.names.agent_queue(agent)
        quarantine(ctx.queues, queue, raw, exc.message, ctx.clock, keeper=ctx.kept)
        return
    try:
        ctx.agent_for(agent).handle(request, reply_to, max(deliveries or 1, 1), copy or None)
    except DuplicateRequest as exc:  # another copy of it runs the attempt: nothing to do
        log.info("%s", exc.message)
    except UnboundMessage as exc:  # forged, or for an attempt never claimed: never called
        queue = ctx.names.agent_queue(agent)
        quarantine(ctx.queues, queue, raw, exc.message, ctx.clock, keeper=ctx.kept)


def _register(function_name: str, queue: str, agent: str) -> None:
    """One trigger on ``queue`` named ``function_name`` (the worker needs distinct names
    and a real function object per trigger)."""
    if ON_STORAGE_QUEUES:

        def on_queue(msg: func.QueueMessage) -> None:
            # Storage queues detect no duplicates: the message id tells copies apart.
            _handle(msg.get_body(), None, agent, msg.dequeue_count, msg.id)

        handler: Callable[..., None] = on_queue
        handler.__name__ = handler.__qualname__ = function_name
        bp.function_name(function_name)(
            bp.queue_trigger(arg_name="msg", queue_name=queue, connection=STORAGE)(handler)
        )
    else:

        def on_message(msg: func.ServiceBusMessage) -> None:
            _handle(msg.get_body(), msg.reply_to, agent, msg.delivery_count)

        handler = on_message
        handler.__name__ = handler.__qualname__ = function_name
        bp.function_name(function_name)(
            bp.service_bus_queue_trigger(arg_name="msg", queue_name=queue, connection=SERVICE_BUS)(
                handler
            )
        )


for _agent in sorted(AGENTS.values(), key=lambda a: a.name):
    _register(_agent.function_name, names.Names().agent_queue(_agent.name), _agent.name)
