"""Service Bus requests that expired unread: a report, not a page.

Contract 3.3 fixes a Service Bus request's time-to-live at the time left before its
deadline, so a request no agent read in time expires in its queue. A request never read
is no try (docs/contracts.md §3.11): the request queues dead-letter on expiration, and
their dead-letter trigger hands such a message here, which sends the report an agent
would have sent had it read the request late ("deferred: not called"). The step then
learns that the attempt applied nothing: no failure counted, no "may have applied".

A request the broker had delivered before it expired (its delivery count says so) may
have been called by an agent that died: its report says "maybe". A message that is not
a request the app can read is left to the poison path (an operator alert).
"""

from __future__ import annotations

from core.errors import InvalidMessage
from core.outcome import Applied
from core.ports import AgentTransport, Clock
from messaging.wire import decode_request
from observability.logs import get_logger, order_context
from observability.metrics import METRICS

log = get_logger(__name__)

#: The dead-letter reason Service Bus gives a message that expired.
EXPIRED_REASON = "TTLExpiredException"


class ExpiredRequests:
    def __init__(self, transport: AgentTransport, clock: Clock):
        self._transport = transport
        self._clock = clock

    def report(self, body: bytes, deliveries: int | None) -> bool:
        """Report an expired request as not called; False if ``body`` is no request."""
        try:
            request = decode_request(body)
        except InvalidMessage:
            return False
        read_before = (deliveries or 1) > 1  # the host counts from 1: 1 = never delivered
        with order_context(order_id=request.order_id, step=request.step, attempt=request.attempt):
            reply = request.deferred(
                f"{request.step}: not called: the request expired unread in its queue"
                + (" after an earlier delivery that may have called it" if read_before else ""),
                self._clock(),
                Applied.MAYBE if read_before else Applied.NO,
            )
            self._transport.send_reply(reply, None)
            METRICS.inc("expired_requests_reported", read=str(read_before).lower())
            log.warning("request expired unread in its queue: reported as not called")
        return True
