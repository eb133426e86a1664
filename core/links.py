"""Links the app hands out: where a remote calls back (docs/contracts.md §3.13, §3.15).

A remote that answers later (a step with ``completes_on="<event>"``, or an
``Event(..., by="machine")``) is told where to say how it ended: ``events_url(order_id,
event)``, called from the step's ``input``, gives the order's event route with a
**capability**: ``.../api/orders/{orderId}/events/{event}?token=<token>``. The token is
unguessable and bound to the order, the event and the run (the step's key round: a fix
that changes what the step sends is a new run, and the earlier run's URL then answers
``409 stale``). The URL is all a remote needs: no function key, and a key alone delivers
nothing. The token never appears in logs, alerts, the history or the console
(``redact``).

The host is the app's own, ``WEBSITE_HOSTNAME``: Azure sets it (``<app>.azurewebsites.net``,
served over https), and so does the local host, devhost (``127.0.0.1:<port>``, http), as
``func start`` does. The settings read it once (``config.settings``); the composition root
hands it here (``serve_at``) when it wires the app: core reads no environment.

Declarations import it from ``core.workflows`` (``from core.workflows import events_url``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from core.model import Order
    from core.steps import StepRecord

LOCAL_HOSTS = ("127.0.0.1:", "localhost:")


@dataclass(frozen=True)
class _Running:
    order: Order
    record: StepRecord


_running: ContextVar[_Running | None] = ContextVar("running_step", default=None)
#: The app's own host name, as the composition root set it (empty: not known).
_host = ""


def serve_at(host: str) -> None:
    """The app's own host name (``Settings.hostname``, from ``WEBSITE_HOSTNAME``): set once
    by the composition root, before any step runs."""
    global _host  # noqa: PLW0603
    _host = host.strip()


def served_at() -> str:
    """The host name ``events_url`` builds links on (empty: none set)."""
    return _host


@contextlib.contextmanager
def running_for(order: Order, record: StepRecord) -> Iterator[None]:
    """While a step's function runs: the order and the record it decides for, so that
    ``events_url`` can bind its capability to them."""
    token = _running.set(_Running(order, record))
    try:
        yield
    finally:
        _running.reset(token)


def events_url(order_id: str, event: str) -> str:
    """``<app>/api/orders/<order_id>/events/<event>?token=<capability>``, from a step's
    function of that order; a ``LookupError`` elsewhere, or without ``WEBSITE_HOSTNAME``
    (the step then fails, not applied, saying so)."""
    running = _running.get()
    if running is None or running.order.order_id != order_id:
        raise LookupError(
            f"events_url({order_id!r}, {event!r}) is called from a step's input of that order "
            "(the URL carries a capability bound to the step's run)"
        )
    from core.inbox import capability, new_event_key

    order = running.order
    planned = order.plan.step_for_event(event)
    if planned is None:
        raise LookupError(f"workflow {order.plan.workflow} declares no event {event!r}")
    if not planned.by_machine:
        raise LookupError(
            f"event {event!r} is a person's decision (an operator delivers it): it has no "
            'callback URL; declare it Event(..., by="machine") for a remote to deliver it'
        )
    host = _host
    if not host:
        raise LookupError("WEBSITE_HOSTNAME is not set: the app does not know its own address")
    if planned.name == running.record.step:
        run = running.record.key_round
    else:
        taker = order.find(planned.name)
        run = taker.key_round if taker is not None else 1
    if not order.event_key:
        order.event_key = new_event_key()
    token = capability(order.event_key, order_id, event, run)
    scheme = "http" if host.startswith(LOCAL_HOSTS) else "https"
    return f"{scheme}://{host}/api/orders/{quote(order_id)}/events/{quote(event)}?token={token}"


def redact(text: str) -> str:
    """``text`` with every capability in it replaced (what people may read)."""
    from core.redact import without_capabilities

    return without_capabilities(text)
