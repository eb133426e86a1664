"""Replies handed over in process: the agent applies its reply itself when it can.

The reply queue exists so that an agent and the scheduler need not share a process. Where
they do (every instance of this app runs every function, unless a function is disabled
with ``AzureWebJobs.<function>.Disabled``), a reply that travelled through the queue would
cost a send, a receive and a delete, and the reply handler's polling delay, for nothing
the queue adds: applying a reply is the same fenced, conditional write whoever makes it
(the attempt, the deadline and If-Match decide whether it counts; docs/contracts.md §3.3).

So ``InlineReplies`` wraps the agent transport: a reply bound for the app's own reply
queue is given to the scheduler's ``apply_reply`` in the agent's invocation. Whatever
that does (applied, noted as late evidence, dropped as stale) is what the reply handler
would have done with it. If it cannot finish (the store does not answer, the order keeps
changing, any error), the reply goes to the reply queue as before, and the handler applies
it there: a reply applied twice is a duplicate, and duplicates are stale by construction.
A reply addressed to another queue (a Service Bus ``ReplyTo`` that is not the app's) is
sent, never applied here.

Nothing is lost by a crash either: until the agent's invocation returns, its request is
not settled, so a process that dies mid-apply gets the request redelivered, the remote is
called again with the same idempotency key, and the reply comes again.
"""

from __future__ import annotations

from collections.abc import Callable

from core.messages import AgentReply, AgentRequest
from core.ports import AgentTransport
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)


class InlineReplies:
    """An ``AgentTransport`` that applies replies to ``own_queue`` with ``apply`` first."""

    def __init__(
        self, transport: AgentTransport, apply: Callable[[AgentReply], object], own_queue: str
    ) -> None:
        self._transport = transport
        self._apply = apply
        self._own_queue = own_queue

    def send_request(self, request: AgentRequest) -> bool:
        return self._transport.send_request(request)

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        if reply_to in (None, self._own_queue):
            try:
                handled = self._apply(reply)
            except Exception as exc:  # noqa: BLE001 - the reply queue is the way that always works
                METRICS.inc("inline_reply_fallbacks")
                log.warning(
                    "reply not applied in process (%s: %s); sending it to %s",
                    type(exc).__name__,
                    exc,
                    self._own_queue,
                )
            else:
                METRICS.inc("inline_replies", handled=str(handled))
                return True
        return self._transport.send_reply(reply, reply_to)
