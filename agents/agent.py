"""The agent: turns one request into one remote call and always one reply.

The reply says what the attempt did (docs/contracts.md §3.3, docs/failure-model.md):
``succeeded``, ``failed`` (refused: nothing applied), ``transient`` (this order's
failure; ``applied`` no/maybe) or ``deferred`` (not called, or the remote is down for
everyone; ``notBefore``). A request that arrives after its deadline is not called and
is reported as deferred, so the expiry the supervisor counted is corrected. A success
is always reported, however late: it is evidence that the step applied.

Sending the reply is retried here for a while (storage or broker trouble) rather than
by failing the invocation, which would call the remote again.

``handle`` is a coroutine: the agent's function is ``async def`` (``agents.triggers``), so
the runtime awaits it on its event loop and a slow remote holds a coroutine, not a
thread. The work around the call that uses blocking clients (reading the claim, handing
the reply over) runs on the agent's own threads (``agents.threads``), bounded in time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from agents.outcomes import CallOutcome, Running, Try
from agents.runner import AttemptRunner
from agents.threads import OwnThreads
from config.settings import DEFAULT_RIDE_OUT_SECONDS
from core.errors import StorageUnavailable
from core.messages import AgentReply, AgentRequest
from core.outcome import Applied, Outcome
from core.ports import AgentTransport, Clock
from messaging.resilience import ride_out
from observability import failpoints, telemetry
from observability.logs import get_logger, order_context
from observability.metrics import METRICS

log = get_logger(__name__)

#: How long the agent keeps trying to hand its reply over before it gives the
#: invocation back to the host (which redelivers the request).
REPLY_SEND_SECONDS = 60.0
#: What a ride-out on the agent's threads may take past its own budget (its last try's
#: storage requests) before the agent stops waiting for it.
BLOCKING_MARGIN_SECONDS = 60.0


class Binding(Protocol):
    """The request as its claim says it (``agents.binding.RequestBinding``); ``copy``: the
    transport message's id, where copies of a request must be told apart."""

    def __call__(self, request: AgentRequest, copy: str | None = None) -> AgentRequest: ...

    def at_hand(self, request: AgentRequest, copy: str | None = None) -> AgentRequest | None:
        """The same, when it needs no request to the store (None: call it)."""
        ...


class AgentWorker:
    """The running side of one declared agent (``core.workflows.Agent`` is its
    declaration): takes its requests, calls its remote, sends one reply each."""

    def __init__(
        self,
        remote: AttemptRunner[Any],
        transport: AgentTransport,
        clock: Clock,
        bind: Binding | None = None,
        sleep: Callable[[float], None] = time.sleep,
        *,
        ride_out_seconds: float = DEFAULT_RIDE_OUT_SECONDS,
        threads: OwnThreads | None = None,
    ):
        """``bind``: the request as its claim says it (``agents.binding``: path, key and
        body from the state store; ``UnboundMessage`` for a request no claim speaks for).
        Without it (unit tests of the calling discipline) the request is taken as it is.
        Where the transport detects no duplicates, it is given the message's id and refuses
        a copy whose attempt another copy took (``DuplicateRequest``: nothing called).
        ``threads``: the agent's own threads, where the binding and the reply's hand-over
        run (with their ride-outs: ``sleep`` waits there); one of its own by default."""
        self._remote = remote
        self._transport = transport
        self._clock = clock
        self._bind = bind
        self._sleep = sleep
        self._ride_out_seconds = ride_out_seconds
        self._threads = threads or OwnThreads("agent")

    async def blocking[T](self, work: Callable[[], T], *, bound: float, what: str) -> T:
        """``work`` on this agent's own threads (``agents.threads``), off the event loop."""
        return await self._threads.run(work, bound=bound, what=what)

    async def handle(
        self,
        request: AgentRequest,
        reply_to: str | None = None,
        deliveries: int = 1,
        copy: str | None = None,
    ) -> Outcome:
        """Call the remote for one request and send exactly one reply (plus, for a Python
        handler that outlives the attempt, its later reports). ``deliveries``: how often
        the transport has delivered this request (an earlier delivery may have called the
        remote and died before it could report: doubt, unless this call settles it).
        ``copy``: the transport message's id, where copies of one request must be told
        apart (the binding's); ``DuplicateRequest`` for a copy whose attempt another took."""
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
            if self._bind is not None:
                bind, asked = self._bind, request
                # Before any call, so waiting out a storage outage here is safe; a request
                # no claim speaks for raises UnboundMessage: quarantined, never called.
                # Most often the claim was made here and is at hand: no thread needed.
                at_hand = bind.at_hand(asked, copy)
                request = (
                    at_hand
                    if at_hand is not None
                    else await self._threads.run(
                        lambda: ride_out(
                            lambda: bind(asked, copy),
                            what="request binding",
                            seconds=self._ride_out_seconds,
                            sleep=self._sleep,
                        ),
                        bound=self._ride_out_seconds + BLOCKING_MARGIN_SECONDS,
                        what="the request's binding",
                    )
                )
            elif request.order is None:  # too large to travel, and no state to read it from
                raise StorageUnavailable(
                    "the request carries no order body and this agent cannot read orders",
                    order_id=request.order_id,
                    step=request.step,
                )
            outcome = await self._remote.call(request)
            if deliveries > 1 and outcome.kind != "succeeded" and not outcome.settled:
                if outcome.applied is Applied.NO:
                    METRICS.inc("agent_redelivered_doubt")
                outcome = replace(
                    outcome,
                    applied=Applied.MAYBE,
                    error=f"{outcome.error} (delivery {deliveries}: an earlier delivery of "
                    "this request may have called the remote)",
                )
            reply = replace(_reply(request, outcome), trace=telemetry.carrier() or request.trace)
            if reply.outcome is Outcome.SUCCEEDED:
                reply = replace(reply, answered_at=self._clock())
            failpoints.hit("agent-after-call")
            if self._clock() >= request.complete_by:
                METRICS.inc("agent_late_replies", outcome=reply.outcome.wire)
                log.warning("reporting %s after the deadline (late evidence)", reply.outcome)
            await self._threads.run(
                lambda: self._send(reply, reply_to),
                bound=REPLY_SEND_SECONDS + BLOCKING_MARGIN_SECONDS,
                what="the reply's hand-over",
            )
            if outcome.running is not None:
                self._follow(request, outcome.running, reply_to)
            # By agent and answer kind: the outcome and whether it may have applied (a
            # success carries no ``applied``: it applied).
            METRICS.inc(
                "agent_replies",
                outcome=reply.outcome.wire,  # the workbook reads the wire's words
                applied=reply.applied or "yes",
                agent=request.agent,
            )
            log.info(
                "replied %s after %d tries%s",
                reply.outcome,
                outcome.tries,
                f": {reply.error}" if reply.error else "",
            )
            return reply.outcome

    def _follow(self, request: AgentRequest, running: Running, reply_to: str | None) -> None:
        """A Python handler runs on past its attempt: renew the report that it runs (which
        holds the step's compensation) until it ends, then report what it did, like a
        remote's late answer (docs/contracts.md §3.11). The reports are sent from the run's
        watcher thread (``agents.python``), one per run that outlives its attempt."""

        runner = running.runner

        def heartbeat(until: datetime) -> None:
            self._send_late(
                request.transient(
                    f"{request.step}: the handler still runs",
                    Applied.MAYBE,
                    running_until=until,
                    runner=runner,
                ),
                reply_to,
            )

        def ended(result: Try) -> None:
            METRICS.inc("python_agent_late_outcomes", applied=result.applied)
            log.warning("the handler that outlived its attempt ended: applied %s", result.applied)
            if result.applied is Applied.YES:
                late = replace(request.succeeded(result.result or {}), answered_at=self._clock())
            elif not result.retryable:
                late = request.refused(result.error, Applied.NO, settled=result.settles)
            else:
                maybe = result.applied is Applied.MAYBE
                late = request.transient(result.error, Applied.MAYBE if maybe else Applied.NO)
            self._send_late(replace(late, runner=runner, run_ended=True), reply_to)

        running.watch(heartbeat, ended)

    def _send_late(self, reply: AgentReply, reply_to: str | None) -> None:
        try:
            self._send(reply, reply_to)
        except Exception as exc:  # noqa: BLE001 - a watcher thread: log, never die silently
            METRICS.inc("agent_late_report_failures")
            log.error("a late report of %s could not be sent: %s", reply.step, exc)

    def _send(self, reply: AgentReply, reply_to: str | None) -> None:
        ride_out(
            lambda: self._transport.send_reply(reply, reply_to),
            what="reply send",
            seconds=REPLY_SEND_SECONDS,
            max_wait=5,  # a reply is small and late evidence is still evidence: try often
            sleep=self._sleep,
        )


def _reply(request: AgentRequest, outcome: CallOutcome) -> AgentReply:
    running = outcome.running.until() if outcome.running is not None else None
    runner = outcome.running.runner if outcome.running is not None else None
    if outcome.kind is Outcome.SUCCEEDED:
        return request.succeeded(outcome.result or {})
    if outcome.kind is Outcome.REFUSED:
        return request.refused(outcome.error, outcome.applied, settled=outcome.settled)
    if outcome.kind is Outcome.TRANSIENT:
        return request.transient(
            outcome.error,
            outcome.applied,
            running_until=running,
            runner=runner,
            evidence_at=outcome.evidence_at,
        )
    return request.deferred(
        outcome.error,
        outcome.not_before or request.complete_by,
        outcome.applied,
        running_until=running,
        runner=runner,
        paused=outcome.paused,
    )
