"""The scheduler's blueprint: thin triggers that decode, call one function, return.

What they use of the app, the process's app (``bootstrap.uses``), is named once below."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import azure.functions as func

from bootstrap import index_time, uses
from config.settings import SERVICE_BUS, STORAGE, Transport
from core import names
from core.errors import InvalidMessage
from messaging import bound
from messaging.wire import decode_dispatch, decode_reply

bp = func.Blueprint()
#: What these triggers use of the app.
_scheduler = uses(lambda app: app.scheduler)
_names = uses(lambda app: app.names)
_quarantine = uses(lambda app: app.quarantine)
_ride_out = uses(lambda app: app.ride_out)
_send = uses(lambda app: app.queues.send)
ON_STORAGE_QUEUES = index_time().transport is Transport.STORAGE
#: Where these functions' messages may leave through output bindings, which wake the
#: receiving function of this instance (``messaging.bound``); the submitter's first
#: requests too.
HOPS = bound.hop_queues()
FIRST_HOPS = bound.hop_queues(first_requests=ON_STORAGE_QUEUES)


def _sends(handler: Callable[[Any], None], trigger_type: Any, hops: list[str] = HOPS) -> Any:
    return bound.bind(bp, handler, trigger_type, hops, _send, STORAGE)


def submit_order(msg: func.QueueMessage) -> None:
    raw = msg.get_body()
    scheduler = _scheduler()
    _ride_out()(lambda: scheduler.submit(raw), what="submit")


def dispatch_order(msg: func.QueueMessage) -> None:
    _dispatch(msg.get_body())


bp.queue_trigger(arg_name="msg", queue_name=names.ORDERS, connection=STORAGE)(
    _sends(submit_order, func.QueueMessage, FIRST_HOPS)
)
bp.queue_trigger(arg_name="msg", queue_name=names.ORDER_DISPATCH, connection=STORAGE)(
    _sends(dispatch_order, func.QueueMessage)
)


def _dispatch(raw: bytes) -> None:
    """An order-dispatch message or a wake-up: ``{"orderId": ...}``, the step claimed if
    due (else queued again for when it is); a bad one quarantined to order-dispatch's
    poison queue, whichever queue it came from."""
    try:
        order_id = decode_dispatch(raw)
    except InvalidMessage as exc:
        _quarantine()(_names().order_dispatch, raw, exc.message)
        return
    scheduler = _scheduler()
    _ride_out()(lambda: scheduler.dispatch(order_id), what="dispatch")


def _apply_reply(raw: bytes) -> None:
    try:
        reply = decode_reply(raw)
    except InvalidMessage as exc:
        _quarantine()(_names().agent_replies, raw, exc.message)
        return
    scheduler = _scheduler()
    _ride_out()(lambda: scheduler.apply_reply(reply), what="reply")


if ON_STORAGE_QUEUES:

    def handle_agent_reply(msg: func.QueueMessage) -> None:
        _apply_reply(msg.get_body())

    bp.queue_trigger(arg_name="msg", queue_name=names.AGENT_REPLIES, connection=STORAGE)(
        _sends(handle_agent_reply, func.QueueMessage)
    )

else:

    def handle_agent_reply(msg: func.ServiceBusMessage) -> None:  # type: ignore[misc]
        _apply_reply(msg.get_body())

    def wake_order(msg: func.ServiceBusMessage) -> None:
        """A wake-up scheduled for a time (a delay's end, a retry after its backoff:
        messaging/dispatch.py), pushed here when the broker enqueues it: as
        ``dispatch_order``."""
        _dispatch(msg.get_body())

    for _handler, _queue in (
        (handle_agent_reply, names.AGENT_REPLIES),
        (wake_order, names.ORDER_WAKEUPS),
    ):
        bp.service_bus_queue_trigger(arg_name="msg", queue_name=_queue, connection=SERVICE_BUS)(
            _sends(_handler, func.ServiceBusMessage)
        )


@bp.timer_trigger(
    arg_name="timer", schedule="%SUPERVISOR_SCHEDULE%", run_on_startup=False, use_monitor=True
)
def scheduler_sweep(timer: func.TimerRequest) -> None:
    """Safety net: dispatches whose message was lost, notices left in the outbox."""
    _scheduler().sweep()
