"""Service Bus requests that expired in their queue: "not called" when the broker's count
proves that no agent read them; otherwise left to the doubt their expiry assumed.

Contract 3.3 fixes a Service Bus request's time-to-live at the time left before its
deadline; the request queues dead-letter on expiration, and their dead-letter trigger
(``supervisor/triggers.py``) hands an expired request here with ``deliveries``, the
delivery count the Functions host gives that dead-letter delivery. A request never read
is no try (docs/contracts.md §3.11, 11): its report says what an agent that read it late
would have said ("deferred: not called"), and the step gets back the failure its expiry
counted. A doubt is never turned into "not called" (§3.11, 8): a request the count cannot
prove unread is not reported at all. Its attempt keeps what its expiry assumed (no
report: it may have applied, and it is counted), and a WARNING says why. That is no page:
the order already holds the doubt and decides on it as on any expiry with no report (a
later attempt's success settles it, as the idempotency key makes every attempt the same
effect; a step that ends with it unsettled is ``Error`` with the alert that it may have
applied), so an operator is paged for a doubt only when it is left standing. A stalled
remote whose agent died mid-call is such a doubt, and it mostly settles itself.

What the count says (the sources are in docs/failure-model.md, "An expired request's
delivery count"):

- Documented: the host's count starts at 1 (its .NET SDK adds 1 to the AMQP header's
  count of earlier deliveries). It grows by one each time a delivery under a lock ends
  unsettled, when the receiver abandons the message or its lock lapses; a released
  message is not counted. A locked message does not expire while its lock holds; when the
  lock ends, the message moves to the dead-letter queue. That queue is read under locks
  too, and the host abandons a message its function failed on.
- Inferred, not documented: the count goes with the message into the dead-letter queue,
  and the end of a lock after the message's expiry is counted before the move, as the
  general rule says and localbus does. ``tests/localbus/test_contract.py`` checks this
  on a real namespace.
- Unknown: whether the dead-letter queue counts its own failed deliveries. The general
  rule says it does; one user report (Azure/azure-sdk-for-net#53437) says a lapsed lock
  there is not counted.

So exactly 1 means that no delivery ended unsettled, neither one to an agent nor one to
this trigger: the request is reported unread. A count of 2 or more cannot tell an agent's
delivery, which may have called the remote, from this trigger's own earlier delivery that
failed, whose "not called" report may already have been sent. Nothing is reported then:
a retry never adds a false "maybe" after a "not called", and a request that was read
keeps its doubt. A count of 0 or none is not the host's count, so it proves nothing. The
price falls on the side of doubt only: a never-read request whose first report could not
be sent within the trigger's whole budget, or whose agent failed before calling (its
binding could not read the state), stays in doubt, as if its report had been lost.
"""

from __future__ import annotations

from typing import Literal

from core.errors import InvalidMessage
from core.outcome import Applied
from core.ports import AgentTransport, Clock
from messaging.wire import decode_request
from observability.logs import get_logger, order_context
from observability.metrics import METRICS

log = get_logger(__name__)

#: The dead-letter reason Service Bus gives a message that expired.
EXPIRED_REASON = "TTLExpiredException"
#: The host's count on a message's first delivery with no earlier one left unsettled.
UNREAD = 1

#: What :meth:`ExpiredRequests.report` did: ``reported`` (not called), ``maybe read``
#: (not reported: the count does not prove it unread) or ``no request``.
Verdict = Literal["reported", "maybe read", "no request"]


def maybe_read(deliveries: int | None) -> str:
    """Why an expired request was not reported "not called" (the WARNING's words): what
    the count cannot tell apart."""
    count = "no delivery count" if deliveries is None else f"delivery count {deliveries}"
    return (
        f"expired after an earlier delivery ({count}): an agent may have read it and "
        "called its remote, or the dead-letter trigger's own earlier run failed on it, "
        "before or after reporting it not called. This run cannot tell which and reports "
        "nothing: unless an earlier run did, its attempt stays in doubt (may have applied) "
        "until a later attempt's answer settles it; a step that ends with it unsettled is "
        "alerted then"
    )


def unsent_report(error: Exception) -> str:
    """The dead-letter alert's words for a request proven unread whose "not called"
    report could not be sent: an operator is told once, rather than the trigger retrying
    a report that may never go out (the dead-letter queue has no delivery limit)."""
    return (
        f"expired unread (delivery count {UNREAD}: no agent read it), but its not-called "
        f"report could not be sent ({type(error).__name__}: {error})"[:600]
        + ". Its attempt stays counted and in doubt until an operator states that it did "
        "not happen, which is safe: its remote was never called for it"
    )


class ExpiredRequests:
    def __init__(self, transport: AgentTransport, clock: Clock):
        self._transport = transport
        self._clock = clock

    def report(self, body: bytes, deliveries: int | None) -> Verdict:
        """Report an expired request as not called when ``deliveries`` (the host's count
        on this dead-letter delivery) proves it unread; else say why in a WARNING."""
        try:
            request = decode_request(body)
        except InvalidMessage:
            return "no request"
        with order_context(order_id=request.order_id, step=request.step, attempt=request.attempt):
            if deliveries != UNREAD:
                METRICS.inc("expired_requests_maybe_read")
                log.warning("request not reported as not called: %s", maybe_read(deliveries))
                return "maybe read"
            reply = request.deferred(
                f"{request.step}: not called: the request expired unread in its queue",
                self._clock(),
                Applied.NO,
            )
            self._transport.send_reply(reply, None)
            METRICS.inc("expired_requests_reported")
            log.warning("request expired unread in its queue: reported as not called")
        return "reported"
