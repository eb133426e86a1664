"""The scheduler's blueprint: thin triggers that decode, call one function, return."""

from __future__ import annotations

import azure.functions as func

from bootstrap import app_context, index_time
from core import names
from core.errors import InvalidMessage
from core.settings import SERVICE_BUS, STORAGE, Transport
from messaging.quarantine import quarantine
from messaging.wire import decode_dispatch, decode_reply

bp = func.Blueprint()


@bp.queue_trigger(arg_name="msg", queue_name=names.ORDERS, connection=STORAGE)
def submit_order(msg: func.QueueMessage) -> None:
    raw = msg.get_body()
    ctx = app_context()
    ctx.ride_out(lambda: ctx.scheduler.submit(raw), what="submit")


@bp.queue_trigger(arg_name="msg", queue_name=names.ORDER_DISPATCH, connection=STORAGE)
def dispatch_order(msg: func.QueueMessage) -> None:
    _dispatch(msg.get_body())


def _dispatch(raw: bytes) -> None:
    """An order-dispatch message or a wake-up: ``{"orderId": ...}``, the step claimed if
    due (else queued again for when it is); a bad one quarantined to order-dispatch's
    poison queue, whichever queue it came from."""
    ctx = app_context()
    try:
        order_id = decode_dispatch(raw)
    except InvalidMessage as exc:
        quarantine(
            ctx.queues, ctx.names.order_dispatch, raw, exc.message, ctx.clock, keeper=ctx.kept
        )
        return
    ctx.ride_out(lambda: ctx.scheduler.dispatch(order_id), what="dispatch")


def _apply_reply(raw: bytes) -> None:
    ctx = app_context()
    try:
        reply = decode_reply(raw)
    except InvalidMessage as exc:
        quarantine(
            ctx.queues, ctx.names.agent_replies, raw, exc.message, ctx.clock, keeper=ctx.kept
        )
        return
    ctx.ride_out(lambda: ctx.scheduler.apply_reply(reply), what="reply")


if index_time().transport is Transport.STORAGE:

    @bp.queue_trigger(arg_name="msg", queue_name=names.AGENT_REPLIES, connection=STORAGE)
    def handle_agent_reply(msg: func.QueueMessage) -> None:
        _apply_reply(msg.get_body())

else:

    @bp.service_bus_queue_trigger(
        arg_name="msg", queue_name=names.AGENT_REPLIES, connection=SERVICE_BUS
    )
    def handle_agent_reply(msg: func.ServiceBusMessage) -> None:
        _apply_reply(msg.get_body())

    @bp.service_bus_queue_trigger(
        arg_name="msg", queue_name=names.ORDER_WAKEUPS, connection=SERVICE_BUS
    )
    def wake_order(msg: func.ServiceBusMessage) -> None:
        """A wake-up scheduled for a time (a delay's end, a retry after its backoff:
        messaging/dispatch.py), pushed here when the broker enqueues it: as
        ``dispatch_order``."""
        _dispatch(msg.get_body())


@bp.timer_trigger(
    arg_name="timer", schedule="%SUPERVISOR_SCHEDULE%", run_on_startup=False, use_monitor=True
)
def scheduler_sweep(timer: func.TimerRequest) -> None:
    """Safety net: dispatches whose message was lost, notices left in the outbox."""
    app_context().scheduler.sweep()
