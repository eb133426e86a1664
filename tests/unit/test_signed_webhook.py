"""The relay of a provider's signed webhook (``examples/signed_webhook.py``, docs/operating.md
"A provider's signed webhook"): it checks the provider's signature, then posts the event to
the capability URL the step handed the provider, which is all that can deliver it
(docs/contracts.md §3.15). In memory, on the shop's checkout (its carrier calls back)."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from core.errors import Forbidden, TransitionRefused
from core.states import OrderStatus
from examples.signed_webhook import Rejected, relay, verify
from tests.unit.test_product_workflows import HOST, run_checkout, sent, succeed
from tests.unit.test_services_in_memory import Services, build, stored

SECRET = b"whsec-shared-with-the-provider"
NOW = 1_800_000_000.0


@pytest.fixture
def s() -> Services:
    return build(host=HOST)


def signed(payload: dict[str, Any], at: float = NOW, secret: bytes = SECRET) -> tuple[bytes, str]:
    body = json.dumps(payload).encode()
    mac = hmac.new(secret, f"{int(at)}".encode() + b"." + body, hashlib.sha256).hexdigest()
    return body, f"t={int(at)},v1={mac}"


def poster(s: Services) -> Any:
    """POST to the app's event route, as the relay would over HTTP: the order, the event and
    the capability are the URL's."""

    def post(url: str, event: dict[str, Any]) -> int:
        parts = urlsplit(url)
        _, _, order_id, _, name = parts.path.strip("/").split("/")
        [token] = parse_qs(parts.query)["token"]
        try:
            effect, _ = s.events.deliver_event(order_id, name, event, "relay", token=token)
        except Forbidden:
            return 403
        except TransitionRefused:
            return 409
        return 202 if effect == "kept" else 200

    return post


def shipped(s: Services, order_id: str) -> str:
    """Run a checkout to its ship step, which the carrier accepts; the URL the step gave it."""
    run_checkout(s, order_id)
    s.clock.advance(3)
    s.scheduler.dispatch(order_id)
    ship = sent(s, order_id)[-1]
    succeed(s, ship)  # 202: accepted, the parcel has not left yet
    assert ship.order is not None
    return str(ship.order["callback"]["url"])


def test_a_signed_webhook_completes_the_step_through_its_capability(s: Services) -> None:
    url = shipped(s, "c-w1")
    body, header = signed({"id": "p-9", "status": "left", "metadata": {"callback_url": url}})
    post = poster(s)
    assert relay(body, header, secret=SECRET, app_host=HOST, now=NOW, post=post) == 200
    order = stored(s, "c-w1")
    assert order.status is OrderStatus.COMPLETED
    assert order.find("ship").result == {"providerId": "p-9", "status": "left"}  # type: ignore[union-attr]
    # the provider retries the same call: the same event, nothing changes
    assert relay(body, header, secret=SECRET, app_host=HOST, now=NOW + 60, post=post) == 200


def test_what_is_not_the_providers_never_reaches_the_app(s: Services) -> None:
    url = shipped(s, "c-w2")
    payload = {"id": "p-1", "status": "left", "metadata": {"callback_url": url}}
    body, header = signed(payload)
    calls: list[str] = []

    def post(target: str, event: dict[str, Any]) -> int:
        calls.append(target)
        return 200

    forged = [
        (body.replace(b"left", b"lost"), header),  # the body changed under the signature
        signed(payload, secret=b"another-secret"),
        signed(payload, at=NOW - 3600),  # an old call replayed
        (body, "v1=" + header.split("v1=")[1]),  # no time
        signed({**payload, "metadata": {"callback_url": url.replace(HOST, "evil.example")}}),
        signed({**payload, "metadata": {"callback_url": f"http://{HOST}/api/agents/x"}}),
        signed({**payload, "status": "in-transit"}),  # says nothing of the effect yet
    ]
    for forged_body, forged_header in forged:
        with pytest.raises(Rejected):
            relay(forged_body, forged_header, secret=SECRET, app_host=HOST, now=NOW, post=post)
    assert calls == []
    assert stored(s, "c-w2").status is OrderStatus.PROCESSING


def test_the_capability_is_what_delivers_not_the_relay(s: Services) -> None:
    """A signed call that carries another order's URL, or a URL whose token was changed,
    is posted, and the app refuses it (403): the relay holds no key of its own."""
    shipped(s, "c-w3")
    other = shipped(s, "c-w4")
    tampered = other.replace("token=r1.", "token=r1.0")[: len(other)]
    for url in (tampered, other.replace("c-w4", "c-w3")):
        body, header = signed({"id": "p", "status": "left", "metadata": {"callback_url": url}})
        code = relay(body, header, secret=SECRET, app_host=HOST, now=NOW, post=poster(s))
        assert code == 403, url
    assert stored(s, "c-w3").status is OrderStatus.PROCESSING


def test_verify_takes_the_common_scheme() -> None:
    body, header = signed({"x": 1})
    verify(body, header, SECRET, NOW)
    with pytest.raises(Rejected, match="too old"):
        verify(body, header, SECRET, NOW + 301)
