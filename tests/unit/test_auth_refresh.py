"""The Entra token refresh after a 401 when tries run concurrently (``agents.auth``).

A revoked token meets every try in flight. The try whose 401 comes first fetches a
fresh token; a try refused a moment later must compare what the credential gives with
the token *it sent*, not with the one the first try has just put in its place, or a
retryable 401 becomes a refusal (``failed``) for an order that only came second.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from typing import Any

import httpx
import pytest

from agents.auth import ApiKeyHeader, EntraBearer, NoHeaders
from agents.outcomes import CallOutcome
from agents.pacing import RemotePolicy
from agents.remote import HttpTry
from agents.runner import AttemptRunner
from tests.unit.test_remote_client import FakeClock, make_request

CARRIER = "api://carrier"
INVALID = 'Bearer error="invalid_token"'


class Credential:
    """An identity endpoint that issues ``tokens`` in turn, then keeps answering the last
    (as App Service's and IMDS's own token caches do)."""

    def __init__(self, *tokens: str):
        self.tokens = list(tokens)
        self.calls: list[str | None] = []  # the claims of each fetch
        self._lock = threading.Lock()

    def get_token(self, *scopes: str, claims: str | None = None, **kwargs: Any) -> Any:
        with self._lock:
            self.calls.append(claims)
            token = self.tokens[min(len(self.calls), len(self.tokens)) - 1]
        return type("AccessToken", (), {"token": token, "expires_on": time.time() + 3600})()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_try_refused_after_another_try_refreshed_gets_true_for_the_new_token() -> None:
    credential = Credential("t-1", "t-2")
    auth = EntraBearer(CARRIER, credential)
    try:
        sent_a = asyncio.run(auth.headers(1))
        sent_b = asyncio.run(auth.headers(1))  # both tries send t-1; both get a 401
        assert sent_a == sent_b == bearer("t-1")

        assert asyncio.run(auth.refresh(INVALID, 1, sent_a)) is True  # try A: a fresh t-2
        assert (
            asyncio.run(auth.refresh(INVALID, 1, sent_b)) is True
        )  # try B: t-2 is not what it sent
        assert asyncio.run(auth.headers(1)) == bearer("t-2")
        # B sends A's fresh token: no second trip to the identity endpoint for it.
        assert credential.calls == [None, "{}"]
    finally:
        auth.close()


def test_a_token_refused_again_is_still_no_reason_to_send_again() -> None:
    credential = Credential("t-1", "t-2")
    auth = EntraBearer(CARRIER, credential)
    try:
        asyncio.run(auth.headers(1))
        assert asyncio.run(auth.refresh(INVALID, 1, bearer("t-1"))) is True
        # t-2 refused too, and the endpoint has nothing newer: a refusal.
        assert asyncio.run(auth.refresh(INVALID, 1, bearer("t-2"))) is False
        assert credential.calls == [None, "{}", "{}"]
        # Without the credentials sent, the token held is taken as the one refused.
        assert asyncio.run(auth.refresh(INVALID, 1)) is False
    finally:
        auth.close()


def test_a_cae_challenge_still_fetches_a_token_with_its_claims() -> None:
    # The token another try fetched need not satisfy the claims this try was asked for.
    claims = '{"access_token":{"nbf":{"essential":true,"value":"1700000000"}}}'
    encoded = base64.urlsafe_b64encode(claims.encode()).decode().rstrip("=")
    challenge = f'Bearer realm="", error="insufficient_claims", claims="{encoded}"'
    credential = Credential("t-1", "t-2", "t-3")
    auth = EntraBearer(CARRIER, credential)
    try:
        sent = asyncio.run(auth.headers(1))
        assert asyncio.run(auth.refresh(INVALID, 1, sent)) is True  # another try: t-2
        assert asyncio.run(auth.refresh(challenge, 1, sent)) is True
        assert credential.calls == [None, "{}", claims]
        assert asyncio.run(auth.headers(1)) == bearer("t-3")
    finally:
        auth.close()


@pytest.mark.parametrize("auth", [NoHeaders(), ApiKeyHeader("X-Key", "k-1")])
def test_other_credentials_never_change_on_refresh(auth: Any) -> None:
    assert asyncio.run(auth.refresh(INVALID, 1, asyncio.run(auth.headers(1)))) is False


def test_two_concurrent_tries_refused_one_after_the_other_both_go_through() -> None:
    """Both tries send t-1 before either hears back; the first 401 is answered at once,
    the second only after the first try has sent again with its fresh token."""
    credential = Credential("t-1", "t-2")
    auth = EntraBearer(CARRIER, credential)
    seen: list[tuple[str | None, str]] = []

    async def until(condition: Any) -> None:
        deadline = time.monotonic() + 3
        while not condition() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    def stale() -> list[str | None]:
        return [key for key, token in seen if token == "Bearer t-1"]

    async def handler(request: httpx.Request) -> httpx.Response:
        key, token = request.headers.get("Idempotency-Key"), request.headers["Authorization"]
        seen.append((key, token))
        if token != "Bearer t-1":
            return httpx.Response(200, json={"ok": True})
        if stale()[0] == key:  # the first refused: once the other try has sent t-1 too
            await until(lambda: len(stale()) == 2)
        else:  # the second: once the first has refreshed and sent again
            await until(lambda: (stale()[0], "Bearer t-2") in seen)
        return httpx.Response(
            401, json={"error": "unauthorized"}, headers={"WWW-Authenticate": INVALID}
        )

    clock = FakeClock()
    client = AttemptRunner(
        HttpTry(
            "http://remote.test/api", transport=httpx.MockTransport(handler), clock=clock, auth=auth
        ),
        RemotePolicy(min_try_seconds=0.0),
        clock=clock,
        sleep=clock.asleep,
    )
    try:
        assert asyncio.run(auth.headers(1)) == bearer("t-1")  # held from earlier calls

        async def both() -> list[CallOutcome]:  # at once, on one loop, as the runtime runs them
            calls = [client.call(make_request(order_id=o)) for o in ("o-1", "o-2")]
            return list(await asyncio.wait_for(asyncio.gather(*calls), 10))

        outcomes = asyncio.run(both())
    finally:
        client.close()

    assert [(o.kind, o.tries) for o in outcomes] == [("succeeded", 1)] * 2, (outcomes, seen)
    assert sorted(seen) == sorted(
        [(f"{o}:process", f"Bearer {t}") for o in ("o-1", "o-2") for t in ("t-1", "t-2")]
    )
    assert credential.calls == [None, "{}"]  # one token, one fresh one
