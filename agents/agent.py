"""The agent: turns one request into one remote call and, in time, one reply.

Success or a permanent failure: reply. ``CompleteBy`` passed (before, during
or after the call): stop, send nothing, repair nothing; the supervisor owns
the step from then on.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from agents.remote import RemoteServiceClient
from core.errors import DeadlineExceeded, RemoteCallFailed
from core.messages import AgentReply, AgentRequest
from core.ports import AgentTransport, Clock
from runtime import failpoints, telemetry
from runtime.logs import get_logger, order_context
from runtime.metrics import METRICS

log = get_logger(__name__)


class AgentOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TOO_LATE = "too-late"


class Agent:
    def __init__(self, remote: RemoteServiceClient, transport: AgentTransport, clock: Clock):
        self._remote = remote
        self._transport = transport
        self._clock = clock

    def handle(self, request: AgentRequest, reply_to: str | None = None) -> AgentOutcome:
        with (
            order_context(order_id=request.order_id, step=request.step, attempt=request.attempt),
            telemetry.span(
                "agent.call",
                request.trace,
                orderId=request.order_id,
                step=request.step,
                attempt=request.attempt,
            ),
        ):
            if self._clock() >= request.complete_by:
                METRICS.inc("agent_too_late")
                log.warning("request arrived after its deadline; dropped")
                return AgentOutcome.TOO_LATE
            reply: AgentReply
            try:
                result = self._remote.call(request)
            except DeadlineExceeded as exc:
                METRICS.inc("agent_too_late")
                log.warning("gave up at the deadline, no reply sent: %s", exc)
                return AgentOutcome.TOO_LATE
            except RemoteCallFailed as exc:
                reply = request.failed(exc.message[:1000])
            else:
                reply = request.succeeded(result)
            reply = replace(reply, trace=telemetry.carrier() or request.trace)
            failpoints.hit("agent-after-call")
            if self._clock() >= request.complete_by:
                METRICS.inc("agent_too_late")
                log.warning("finished after the deadline; no reply sent (%s)", reply.outcome)
                return AgentOutcome.TOO_LATE
            if not self._transport.send_reply(reply, reply_to):
                return AgentOutcome.TOO_LATE
            METRICS.inc("agent_replies", outcome=reply.outcome)
            log.info("replied %s", reply.outcome)
            return AgentOutcome(reply.outcome)
