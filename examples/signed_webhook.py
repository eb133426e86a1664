"""Relay a provider's signed webhook to the order's capability URL.

A remote that answers later is told where to call back: the URL ``events_url`` gives its
step (docs/contracts.md §3.15), with a capability bound to the order, the event and the
run. Many providers cannot call a URL per request: they call one endpoint per account
and sign each call with a secret shared with you. Put this in front of them: it checks
the provider's signature, takes the capability URL the step handed the provider (in the
request's metadata, which the provider echoes back), and posts the event there. It needs
no key of the app and holds none: the capability is the only thing that can deliver.

The signature here is the common scheme (Stripe's, and many others'): a header
``t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the shared secret>``, five
minutes of tolerance. Adapt ``verify`` to your provider's; keep the rest.

Host it as an HTTP function of its own (docs/operating.md, "A provider's signed
webhook"), or anywhere that can reach the app.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

#: How old a signed call may be (its ``t``): a replayed call after that is refused.
TOLERANCE_SECONDS: Final = 300
#: What the provider says of the effect, and what the order's event says.
SUCCEEDED: Final = frozenset({"succeeded", "delivered", "left"})
REFUSED: Final = frozenset({"failed", "refused", "cancelled"})


class Rejected(Exception):
    """The call is not the provider's, is too old, or names no event of this app."""


def verify(body: bytes, header: str, secret: bytes, now: float) -> None:
    """``Rejected`` unless ``header`` is the provider's signature of ``body``, recent."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    stamp, given = parts.get("t", ""), parts.get("v1", "")
    if not stamp.isdigit() or not given:
        raise Rejected("no signature")
    if abs(now - int(stamp)) > TOLERANCE_SECONDS:
        raise Rejected("the signature is too old (a replay?)")
    expected = hmac.new(secret, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given):
        raise Rejected("the signature does not match")


def event_of(payload: Mapping[str, Any], app_host: str) -> tuple[str, dict[str, Any]]:
    """The capability URL the step gave the provider, and the event's body for it."""
    metadata = payload.get("metadata")
    url = metadata.get("callback_url") if isinstance(metadata, Mapping) else None
    if not isinstance(url, str):
        raise Rejected("the call names no callback_url")
    parts = urlsplit(url)
    # only this app's own event route: a signed call must not make us post elsewhere
    if parts.netloc != app_host or "/api/orders/" not in parts.path or "token=" not in parts.query:
        raise Rejected("callback_url is not an event URL of this app")
    status = str(payload.get("status", ""))
    if status in SUCCEEDED:
        return url, {"result": {"providerId": payload.get("id"), "status": status}}
    if status in REFUSED:
        return url, {"refused": f"the provider says {status}: {payload.get('reason', '')}"[:1000]}
    raise Rejected(f"status {status!r} says nothing of the effect yet")


def relay(
    body: bytes,
    header: str,
    *,
    secret: bytes,
    app_host: str,
    now: float,
    post: Callable[[str, dict[str, Any]], int],
) -> int:
    """Check, then post the event to its capability URL; returns the app's HTTP status
    (200 taken, 202 kept, 409 stale or too late: the provider need not retry those)."""
    verify(body, header, secret, now)
    try:
        payload = json.loads(body)
    except ValueError as exc:
        raise Rejected(f"the body is not JSON: {exc}") from None
    if not isinstance(payload, Mapping):
        raise Rejected("the body is not a JSON object")
    url, event = event_of(payload, app_host)
    return post(url, event)
