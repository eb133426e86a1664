"""The agents' blueprint: one trigger on the agent request queue.

Every remote service has its own agent object (client, circuit breaker) in
``Agent``; requests name their remote path, so one queue serves them all.
"""

from __future__ import annotations

import os

import azure.functions as func

from core import names
from core.errors import InvalidMessage
from core.messages import decode_request
from core.settings import Transport, transport_from_env
from messaging.quarantine import quarantine
from runtime.context import app_context

bp = func.Blueprint()


def _handle(raw: bytes, reply_to: str | None) -> None:
    ctx = app_context()
    try:
        request = decode_request(raw)
    except InvalidMessage as exc:
        quarantine(
            ctx.queues, ctx.names.agent_requests, raw, exc.message, ctx.clock, keeper=ctx.kept
        )
        return
    ctx.agent.handle(request, reply_to)


if transport_from_env(os.environ) is Transport.STORAGE:

    @bp.queue_trigger(
        arg_name="msg", queue_name=names.AGENT_REQUESTS, connection="AzureWebJobsStorage"
    )
    def run_agent(msg: func.QueueMessage) -> None:
        _handle(msg.get_body(), None)

else:

    @bp.service_bus_queue_trigger(
        arg_name="msg", queue_name=names.AGENT_REQUESTS, connection="ServiceBusConnection"
    )
    def run_agent(msg: func.ServiceBusMessage) -> None:
        _handle(msg.get_body(), msg.reply_to)
