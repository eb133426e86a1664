"""Links the app hands out: where a remote calls back (docs/contracts.md §3.13).

A remote that answers later (a step with ``completes_on="<event>"``) is told where to say
how it ended: the order's event route, ``POST /api/orders/{orderId}/events/{event}`` with
``{"result": {...}}`` or ``{"refused": "<reason>"}``. ``events_url`` builds it from the
app's host name, ``WEBSITE_HOSTNAME``: Azure sets it (``<app>.azurewebsites.net``, served
over https), and so does the local host, devhost (``127.0.0.1:<port>``, http), as ``func
start`` does.

In Azure the route takes a function key, as the operator API does: give the remote a key
of its own (a function key of ``deliver_event``) to send as the ``x-functions-key``
header. Never put a key in the URL: what a step's ``input`` returns is kept in the
order's state, which operators read.

Declarations import it from ``core.workflows`` (``from core.workflows import events_url``).
"""

from __future__ import annotations

import os
from urllib.parse import quote

LOCAL_HOSTS = ("127.0.0.1:", "localhost:")


def events_url(order_id: str, event: str) -> str:
    """``<app>/api/orders/<order_id>/events/<event>``; a ``LookupError`` without
    ``WEBSITE_HOSTNAME`` (the step then fails, not applied, saying so)."""
    host = os.environ.get("WEBSITE_HOSTNAME", "")
    if not host:
        raise LookupError("WEBSITE_HOSTNAME is not set: the app does not know its own address")
    scheme = "http" if host.startswith(LOCAL_HOSTS) else "https"
    return f"{scheme}://{host}/api/orders/{quote(order_id)}/events/{quote(event)}"
