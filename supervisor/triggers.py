"""The supervisor's blueprint: the deadline sweep on SUPERVISOR_SCHEDULE, and one trigger
per poison queue (and, on Service Bus, per dead-letter sub-queue) that turns every
message given up on into an operator alert (``supervisor/poison.py``).

The alert triggers are ``async def``, their storage work on threads of their own
(``AppContext.alert_threads``, shared by all of them): there are two for each agent, and on the
runtime's pool, which is sized to hold every synchronous function's host.json
concurrency at once (``infra/platform-settings.json``), each agent a team declares would
have added 40 threads to what the pool must hold. Alerts are rare; a burst of them waits
for these threads, never another function for the pool's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import azure.functions as func

from bootstrap import app_context, current_app_context, index_time, uses
from config.settings import SERVICE_BUS, STORAGE, Transport
from core import names
from supervisor.expired import EXPIRED_REASON, unsent_report
from supervisor.poison import Poisoned

bp = func.Blueprint()
#: What these triggers use of the app.
_supervisor = uses(lambda app: app.supervisor)
_outages = uses(lambda app: app.outages)
_dashboard = uses(lambda app: app.dashboard)
_poison = uses(lambda app: app.poison)
_expired_requests = uses(lambda app: app.expired_requests)
_alert_threads = uses(lambda app: app.alert_threads)
_settings = uses(lambda app: app.settings)
_ride_out = uses(lambda app: app.ride_out)


async def _off_the_loop(work: Callable[[], object], what: str) -> None:
    """``work`` (which rides storage trouble out for the trigger's budget) on the alert
    triggers' threads (``AppContext.alert_threads``), bounded by that budget and a minute
    more."""
    if current_app_context() is None:  # built off the event loop: it reads the environment
        await asyncio.to_thread(app_context)
    bound = _settings().ride_out_seconds + 60.0
    await _alert_threads().run(work, bound=bound, what=what)


@bp.timer_trigger(
    arg_name="timer", schedule="%SUPERVISOR_SCHEDULE%", run_on_startup=False, use_monitor=True
)
def supervise(timer: func.TimerRequest) -> None:
    _supervisor().run()
    # The agents' outage alerts still owed after their grace (messaging/outages.py).
    _outages().finish()


@bp.timer_trigger(
    arg_name="timer",
    schedule=index_time().dashboard_schedule,
    run_on_startup=False,
    use_monitor=True,
)
def aggregate_dashboard(timer: func.TimerRequest) -> None:
    """The console dashboard's figures from the orders' activity rows, and the stuck
    check (``supervisor/aggregator.py``; ``DASHBOARD_SCHEDULE``)."""
    _dashboard().run()


def _poison_queue_trigger(queue: str) -> None:
    async def handler(msg: func.QueueMessage) -> None:
        # The copy on the poison queue has its own dequeue count (1 on its first
        # delivery), not the failures that put it there: say nothing rather than 1.
        body = msg.get_body()

        def alert() -> None:
            _ride_out()(lambda: _poison().alert(Poisoned(queue, body, None)), what="poison alert")

        await _off_the_loop(alert, "the poison alert")

    _register(handler, f"alert_{queue.replace('-', '_')}", queue, queue_trigger=True)


def _dead_letter_trigger(queue: str, *, requests: bool) -> None:
    path = f"{queue}/$DeadLetterQueue"

    async def handler(msg: func.ServiceBusMessage) -> None:
        props = msg.application_properties or {}
        reason = props.get("DeadLetterReason") or getattr(msg, "dead_letter_reason", None)
        detail = props.get("DeadLetterErrorDescription") or getattr(
            msg, "dead_letter_error_description", None
        )
        why = " - ".join(str(x) for x in (reason, detail) if x) or None
        body, deliveries = msg.get_body(), msg.delivery_count

        def alert() -> None:
            said = why
            if requests and reason == EXPIRED_REASON:
                # Proven unread by its count: a report that it was not called; else its
                # attempt keeps the doubt its expiry assumed, which the order decides on
                # (expired.py): neither is a page. A report that cannot be sent is one,
                # not a retry that may loop unseen (a dead-letter queue has no limit).
                try:
                    verdict = _ride_out()(
                        lambda: _expired_requests().report(body, deliveries),
                        what="expired request report",
                    )
                except Exception as exc:  # noqa: BLE001 - told to an operator below
                    said = "; ".join(x for x in (why, unsent_report(exc)) if x)
                else:
                    if verdict in ("reported", "maybe read"):
                        return
            _ride_out()(
                lambda: _poison().alert(Poisoned(path, body, deliveries, said)),
                what="dead-letter alert",
            )

        await _off_the_loop(alert, "the dead-letter alert")

    _register(handler, f"alert_{queue.replace('-', '_')}_dead_letters", path, queue_trigger=False)


def _register(
    handler: Callable[..., Coroutine[Any, Any, None]], name: str, queue: str, *, queue_trigger: bool
) -> None:
    handler.__name__ = handler.__qualname__ = name
    if queue_trigger:
        trigger = bp.queue_trigger(arg_name="msg", queue_name=queue, connection=STORAGE)
    else:
        trigger = bp.service_bus_queue_trigger(
            arg_name="msg", queue_name=queue, connection=SERVICE_BUS
        )
    bp.function_name(name=name)(trigger(handler))


for _queue in names.Names().poison_queues():
    _poison_queue_trigger(_queue)

if index_time().transport is not Transport.STORAGE:
    for _queue in names.Names().agent_queues():
        _dead_letter_trigger(_queue, requests=True)
    _dead_letter_trigger(names.AGENT_REPLIES, requests=False)
    _dead_letter_trigger(names.ORDER_WAKEUPS, requests=False)
