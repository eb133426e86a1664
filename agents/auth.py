"""How an HTTP agent proves who it is to its remote service (``core.workflows.Auth``).

``HttpTry`` (``agents.remote``) asks its ``RequestAuth`` for headers on every try, inside the
try: a try whose credentials cannot be had is a try that applied nothing and sent
nothing (transient: ``applied: no``), with an error that says so.

- ``NoAuth``: no header.
- ``ApiKey(header)``: the value of the app setting ``AGENT_<NAME>_API_KEY``, read once
  when the agent is built. In Azure the setting can be a Key Vault reference, which the
  platform resolves before the app starts (a rotated secret reaches the app within a
  day, or at once on a restart or a settings change); a key is never in code or in
  Bicep. A missing or empty setting, or a Key Vault reference
  the platform could not resolve, is a ``SettingsError`` naming the setting, when the
  agent is built (its first request), before any call.
- ``EntraToken(scope)``: ``Authorization: Bearer <token>`` from
  ``azure.identity.ManagedIdentityCredential`` (the user-assigned identity named by the
  setting ``AZURE_CLIENT_ID`` when set, else the system-assigned one), one credential
  per agent, built with the agent. The token is held and reused until its
  ``refresh_on`` or 5 minutes before it expires (azure-core's rule), then asked for
  again: azure-identity 1.27's managed identity credential (MSAL's
  ``ManagedIdentityClient``) answers from its own in-memory token cache, and goes to
  the identity endpoint only when it holds no token for the scope, when the token
  expires within 5 minutes, or past its ``refresh_on`` (half its lifetime for tokens of
  2 hours or more), keeping the old token if that refresh fails. Its HTTP calls have no
  retries of their own (``retry_total=0``: the client's retry loop retries) and
  timeouts of the agent's own; each fetch is bounded by the try's time left.

Authentication failures (docs/failure-model.md):

- 401 with an Entra token: the token may be stale or revoked. Within the same try, a
  fresh token is fetched once (with the challenge's claims when the remote sent a CAE
  ``insufficient_claims`` challenge) and, if it differs from the one that try sent, the
  request is sent again; a token another try fetched after this one was sent is sent
  without fetching again (unless the challenge asks for claims). A 401 that persists is
  a refusal (``failed``, nothing applied).
- 401 with an API key, and 403 always: a refusal at once (``failed``, nothing applied):
  asking again with the same credentials cannot help; the operator fixes the key, the
  role assignment or the remote's configuration and resubmits.
- No credentials (the identity endpoint fails, times out, or there is no managed
  identity): a transient try that applied nothing; retried with backoff, and, failing
  for every order, it trips the breaker and the orders wait as in an outage.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from config.settings import SettingsError
from core import workflows
from observability.logs import get_logger

log = get_logger(__name__)

#: The app setting naming a user-assigned managed identity (its client id).
CLIENT_ID_SETTING: Final = "AZURE_CLIENT_ID"
#: Headers the client sets itself: credentials never replace them.
RESERVED_HEADERS: Final = frozenset(
    {"idempotency-key", "content-type", "accept-encoding", "traceparent", "tracestate"}
)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: An app setting the platform could not resolve keeps the reference as its value.
_KEY_VAULT_REFERENCE = "@microsoft.keyvault("
#: ``claims`` for a token refresh without a CAE challenge: any non-empty claims make
#: MSAL's managed identity client skip its cache (``acquire_token_for_client``); the App
#: Service and IMDS endpoints do not receive them.
_NO_CLAIMS: Final = "{}"
#: Ask for a new token when the one held expires within this (azure-core's window; MSAL
#: itself takes a token expiring within 5 minutes as expired).
REFRESH_WINDOW_SECONDS: Final = 300


class CredentialError(Exception):
    """The credentials for a call could not be had (the request is not sent)."""


class RequestAuth(Protocol):
    async def headers(self, timeout: float) -> dict[str, str]:
        """The headers for one try, within ``timeout`` seconds; raises if none."""
        ...

    async def refresh(
        self, challenge: str | None, timeout: float, refused: Mapping[str, str] | None = None
    ) -> bool:
        """After a 401 (``challenge``: its ``WWW-Authenticate``): get fresh credentials.
        True if they differ from those refused (``refused``: the headers the refused try
        sent; by default those held now), so that sending again may help."""
        ...

    def close(self) -> None: ...


class NoHeaders:
    """``NoAuth``."""

    async def headers(self, timeout: float) -> dict[str, str]:
        return {}

    async def refresh(
        self, challenge: str | None, timeout: float, refused: Mapping[str, str] | None = None
    ) -> bool:
        return False

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ApiKeyHeader:
    """``ApiKey``: one header with the key (never logged, never in ``repr``)."""

    header: str
    key: str

    def __repr__(self) -> str:
        return f"ApiKeyHeader(header={self.header!r}, key=<{len(self.key)} characters>)"

    async def headers(self, timeout: float) -> dict[str, str]:
        return {self.header: self.key}

    async def refresh(
        self, challenge: str | None, timeout: float, refused: Mapping[str, str] | None = None
    ) -> bool:
        return False  # the same setting gives the same key until the app restarts

    def close(self) -> None:
        pass


class TokenCredential(Protocol):
    def get_token(self, *scopes: str, claims: str | None = None, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class _Held:
    token: str
    expires_on: float  # epoch seconds
    refresh_on: float | None


class EntraBearer:
    """``EntraToken``: ``Authorization: Bearer`` from a token credential (in production,
    one ``ManagedIdentityCredential`` per agent).

    The token is kept and reused, as azure-core's ``BearerTokenCredentialPolicy`` does:
    the credential is asked again only past the token's ``refresh_on``, or within
    ``REFRESH_WINDOW_SECONDS`` of its expiry, or after a 401 (then past its own cache).
    (Asking it on every try would be correct too, MSAL's cache answers, but costs a
    lock, a cache search and two INFO log records per try.)"""

    def __init__(self, scope: str, credential: TokenCredential, *, name: str = "agent"):
        self.scope = scope
        self.credential = credential
        self._held: _Held | None = None
        self._lock = threading.Lock()
        # Token fetches run here so that a try waits for one at most its time left; a
        # fetch that outlives its try ends by the credential's own HTTP timeouts.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=4, thread_name_prefix=f"token-{name}"
        )

    async def headers(self, timeout: float) -> dict[str, str]:
        with self._lock:
            held = self._held
        if held is None or _due(held, time.time()):
            held = await self._fetch(None, timeout)
        return {"Authorization": f"Bearer {held.token}"}

    async def refresh(
        self, challenge: str | None, timeout: float, refused: Mapping[str, str] | None = None
    ) -> bool:
        # Compared with the token this try sent, not with the one held now: a revoked token
        # meets every try in flight, and another try may have replaced it meanwhile (the
        # identity endpoint may then give this one the same fresh token).
        with self._lock:
            held = self._held.token if self._held is not None else None
        sent = _token_of(refused) if refused is not None else held
        claims = claims_of(challenge)
        if claims is None and held is not None and held != sent:
            # Already replaced: send that one, without asking again. (A CAE challenge asks
            # for claims that token may lack: it always fetches.)
            return True
        log.warning("the remote refused the token for %s (401): getting a fresh one", self.scope)
        return (await self._fetch(claims or _NO_CLAIMS, timeout)).token != sent

    async def _fetch(self, claims: str | None, timeout: float) -> _Held:
        def fetch() -> _Held:
            info = getattr(self.credential, "get_token_info", None)
            if callable(info):  # azure-core's SupportsTokenInfo: it says when to refresh
                got = info(self.scope, options={"claims": claims} if claims else None)
            else:
                got = self.credential.get_token(self.scope, claims=claims)
            token = getattr(got, "token", None)
            if not isinstance(token, str) or not token:
                raise CredentialError("the credential returned no token")
            refresh_on = getattr(got, "refresh_on", None)
            return _Held(token, float(got.expires_on), float(refresh_on) if refresh_on else None)

        if timeout <= 0:
            raise CredentialError(f"no time left to get a token for {self.scope}")
        # The credential is a blocking client: it runs on this agent's token threads, and
        # the try awaits it on its event loop, at most its time left.
        future = asyncio.wrap_future(self._pool.submit(fetch))
        try:
            held = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise CredentialError(
                f"no token for {self.scope} within {timeout:.1f} s (the identity endpoint is slow)"
            ) from None
        except Exception as exc:
            raise CredentialError(
                f"no token for {self.scope}: {type(exc).__name__}: {_first_line(exc)}"
            ) from exc
        with self._lock:
            self._held = held
        return held

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.credential, "close", None)
        if callable(close):
            close()


def _token_of(headers: Mapping[str, str]) -> str | None:
    """The token in headers ``EntraBearer.headers`` made, or None."""
    return headers.get("Authorization", "").removeprefix("Bearer ") or None


def _due(held: _Held, now: float) -> bool:
    """Time to ask the credential again (azure-core's rule, without its jitter)."""
    if held.refresh_on is not None and now >= held.refresh_on:
        return True
    return held.expires_on - now < REFRESH_WINDOW_SECONDS


def claims_of(challenge: str | None) -> str | None:
    """The claims of a CAE challenge (``Bearer error="insufficient_claims",
    claims="<base64url JSON>"``), decoded; None for any other challenge."""
    if not challenge or "insufficient_claims" not in challenge:
        return None
    match = re.search(r'claims="([^"]+)"', challenge)
    if match is None:
        return None
    encoded = match.group(1)
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
    except ValueError:
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


# --- built from the declaration ------------------------------------------------------------


def auth_for(
    spec: workflows.Agent,
    env: Mapping[str, str],
    *,
    credential: TokenCredential | None = None,
) -> RequestAuth:
    """The ``RequestAuth`` of an HTTP agent. ``credential``: for tests; by default, an
    ``EntraToken`` agent gets its own ``ManagedIdentityCredential``."""
    auth = spec.auth
    if isinstance(auth, workflows.ApiKey):
        return ApiKeyHeader(_header_name(spec, auth.header), api_key_of(spec, env))
    if isinstance(auth, workflows.EntraToken):
        return EntraBearer(
            auth.scope,
            credential or managed_identity(spec, env),
            name=spec.name,
        )
    return NoHeaders()


def api_key_of(spec: workflows.Agent, env: Mapping[str, str]) -> str:
    setting = spec.api_key_setting
    value = env.get(setting, "").strip()
    if not value:
        raise SettingsError(
            f"agent {spec.name!r} authenticates with an API key: set the app setting "
            f"{setting} (in Azure, a Key Vault reference: "
            f"@Microsoft.KeyVault(SecretUri=...)); it is not set"
        )
    if value.lower().startswith(_KEY_VAULT_REFERENCE):
        raise SettingsError(
            f"{setting} is a Key Vault reference the platform did not resolve: check that "
            "the secret exists and that the app's identity may read it (Key Vault Secrets "
            "User); the app setting's 'Key Vault reference' status says why"
        )
    if any(c in value for c in "\r\n\0"):
        raise SettingsError(f"{setting} holds a line break or NUL: it cannot be a header value")
    return value


def _header_name(spec: workflows.Agent, header: str) -> str:
    if not _HEADER_NAME.fullmatch(header) or header.lower() in RESERVED_HEADERS:
        raise SettingsError(
            f"{spec.declared_at}: agent {spec.name!r}: {header!r} cannot carry an API key "
            f"(a header name, and none of {', '.join(sorted(RESERVED_HEADERS))})"
        )
    return header


def managed_identity(spec: workflows.Agent, env: Mapping[str, str]) -> TokenCredential:
    """The app's managed identity for one agent: user-assigned when ``AZURE_CLIENT_ID``
    is set. Locally, ``IDENTITY_ENDPOINT`` and ``IDENTITY_HEADER`` point it at the
    simulator's App Service identity endpoint (``simulator/identity.py``)."""
    from azure.identity import ManagedIdentityCredential

    client_id = env.get(CLIENT_ID_SETTING, "").strip() or None
    return ManagedIdentityCredential(
        client_id=client_id,
        # For its HTTP pipeline (azure-core): no retries of its own, our timeouts.
        retry_total=0,
        connection_timeout=spec.connect_seconds,
        read_timeout=spec.max_try_seconds,
    )
