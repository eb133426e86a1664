"""A managed identity endpoint (the App Service protocol) and steps that require its
tokens: what an ``EntraToken`` agent meets in Azure, served locally.

The app's own ``azure.identity.ManagedIdentityCredential`` (azure-identity 1.27, through
MSAL's ``ManagedIdentityClient``) uses the App Service protocol when the environment
has ``IDENTITY_ENDPOINT`` and ``IDENTITY_HEADER``. Point ``IDENTITY_ENDPOINT`` at
``<simulator>/_identity/token`` and it asks, unchanged:

    GET /_identity/token?api-version=2019-08-01&resource=<scope without /.default>
        [&client_id=<AZURE_CLIENT_ID> | &object_id=... | &mi_res_id=...]
    X-IDENTITY-HEADER: <IDENTITY_HEADER>
    Metadata: true

and reads back (MSAL turns ``expires_on``, epoch seconds, into ``expires_in``):

    200 {"access_token": "<token>", "expires_on": "<epoch seconds>",
         "resource": "<resource>", "token_type": "Bearer", "client_id": "<id>"}

A wrong request gets ``{"statusCode": N, "message": "..."}`` (App Service's error shape;
MSAL reports it as ``invalid_scope`` with that text). The header is compared with the
secret the simulator was given (``--identity-header`` or ``SIMULATOR_IDENTITY_HEADER``);
without one, any non-empty header is accepted (a request without it is what a forged,
server-side request looks like, which is what the header is there to stop).

Tokens are random strings, remembered with their resource, identity and expiry
(24 h by default, like App Service's; MSAL refreshes a token of 2 h or more at half
its life, and one that expires within 5 minutes on every call).

``require`` maps a step to an audience: ``POST /<step>`` must then carry
``Authorization: Bearer <token>`` issued here for that audience (``api://x`` and
``api://x/.default`` are the same), not expired, not revoked; otherwise 401 with
``WWW-Authenticate: Bearer realm="simulator"`` (and ``error="invalid_token"`` when a
token was sent), nothing applied. Control: ``GET /_identity`` (tokens issued,
rules), ``POST /_identity`` with ``{"requireToken": {step: audience}, "revoke": true,
"tokenSeconds": n}`` (each optional; ``requireToken`` replaces the rules).
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from simulator.engine import Answer, json_answer
from simulator.faults import STEP_PATTERN

API_VERSION: Final = "2019-08-01"
DEFAULT_TOKEN_SECONDS: Final = 24 * 3600
MAX_TOKEN_SECONDS: Final = 7 * 24 * 3600
_IDENTITY_PARAMS: Final = ("client_id", "object_id", "mi_res_id")
SYSTEM_ASSIGNED: Final = "system-assigned"


def audience_of(scope: str) -> str:
    """``api://x/.default`` -> ``api://x`` (what azure-identity asks for)."""
    scope = scope.strip()
    return scope[: -len("/.default")] if scope.endswith("/.default") else scope


def parse_rule(text: str) -> tuple[str, str]:
    """``STEP=AUDIENCE`` -> (step, audience)."""
    step, sep, audience = text.partition("=")
    step, audience = step.strip(), audience_of(audience)
    if not sep or not STEP_PATTERN.fullmatch(step) or not audience:
        raise ValueError(f"{text!r} is not STEP=AUDIENCE (e.g. ship=api://carrier)")
    return step, audience


@dataclass(frozen=True, slots=True)
class Token:
    resource: str
    identity: str  # "client_id:<id>", "object_id:<id>", ... or "system-assigned"
    expires_on: float  # epoch seconds


class IdentityEndpoint:
    """Issues tokens and checks them. Thread-safe."""

    def __init__(
        self,
        *,
        header: str | None = None,
        require: Mapping[str, str] | None = None,
        token_seconds: int = DEFAULT_TOKEN_SECONDS,
    ) -> None:
        self._header = header or None
        self._lock = threading.Lock()
        self._tokens: dict[str, Token] = {}
        self._require: dict[str, str] = {}
        self._issued = 0
        self._refused_requests = 0
        self._refused_calls = 0
        self._token_seconds = DEFAULT_TOKEN_SECONDS
        self.configure(require=require or {}, token_seconds=token_seconds)

    # --- the identity endpoint ------------------------------------------------------

    def issue(self, query: str, header: str | None) -> Answer:
        """Serve ``GET /_identity/token?<query>`` with ``X-IDENTITY-HEADER: header``."""
        if not header or (
            self._header is not None and not hmac.compare_digest(header, self._header)
        ):
            return self._refuse(401, "The X-IDENTITY-HEADER header is missing or wrong.")
        params = dict(parse_qsl(query, keep_blank_values=True))
        if params.get("api-version") != API_VERSION:
            return self._refuse(400, f"api-version must be {API_VERSION}.")
        resource = params.get("resource", "").strip()
        if not resource:
            return self._refuse(400, "A resource is required.")
        chosen = [name for name in _IDENTITY_PARAMS if params.get(name)]
        if len(chosen) > 1:
            return self._refuse(400, "Give at most one of client_id, object_id, mi_res_id.")
        identity = f"{chosen[0]}:{params[chosen[0]]}" if chosen else SYSTEM_ASSIGNED
        token = "sim-" + secrets.token_urlsafe(32)
        with self._lock:
            expires_on = int(time.time()) + self._token_seconds
            self._tokens[token] = Token(audience_of(resource), identity, expires_on)
            self._issued += 1
        payload: dict[str, Any] = {
            "access_token": token,
            "expires_on": str(expires_on),
            "resource": resource,
            "token_type": "Bearer",
        }
        if chosen:
            payload[chosen[0]] = params[chosen[0]]
        return json_answer(200, payload)

    def _refuse(self, status: int, message: str) -> Answer:
        with self._lock:
            self._refused_requests += 1
        return json_answer(status, {"statusCode": status, "message": message})

    # --- protected steps ----------------------------------------------------------------

    def check(self, step: str, authorization: str | None) -> Answer | None:
        """None if ``POST /<step>`` may go on; else the 401 to answer."""
        with self._lock:
            audience = self._require.get(step)
        if audience is None:
            return None
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return self._unauthorized(step, None, f"Step {step!r} requires a bearer token.")
        with self._lock:
            found = self._tokens.get(token.strip())
        if found is None:
            reason = "The token was not issued here, or was revoked."
        elif found.expires_on <= time.time():
            reason = "The token has expired."
        elif found.resource != audience:
            reason = f"The token is for {found.resource!r}, not {audience!r}."
        else:
            return None
        return self._unauthorized(step, "invalid_token", reason)

    def _unauthorized(self, step: str, error: str | None, reason: str) -> Answer:
        with self._lock:
            self._refused_calls += 1
        challenge = 'Bearer realm="simulator"'
        if error:
            challenge += f', error="{error}"'  # the reason is in the body (any characters)
        return json_answer(401, {"error": reason}, (("WWW-Authenticate", challenge),))

    # --- control ----------------------------------------------------------------------

    def configure(
        self,
        *,
        require: Mapping[str, str] | None = None,
        revoke: bool = False,
        token_seconds: int | None = None,
    ) -> dict[str, Any]:
        rules: dict[str, str] | None = None
        if require is not None:
            rules = {}
            for step, audience in require.items():
                if not isinstance(step, str) or not isinstance(audience, str):
                    raise ValueError("requireToken maps step names to audiences (strings).")
                rules.update([parse_rule(f"{step}={audience}")])
        if token_seconds is not None and (
            isinstance(token_seconds, bool)
            or not isinstance(token_seconds, int)
            or not 1 <= token_seconds <= MAX_TOKEN_SECONDS
        ):
            raise ValueError(f"tokenSeconds must be an integer from 1 to {MAX_TOKEN_SECONDS}.")
        with self._lock:
            if rules is not None:
                self._require = rules
            if revoke:
                self._tokens.clear()
            if token_seconds is not None:
                self._token_seconds = token_seconds
        return self.status()

    def configure_json(self, body: Any) -> dict[str, Any]:
        """``POST /_identity``: ValueError (a 400) for anything else than documented."""
        if not isinstance(body, dict) or set(body) - {"requireToken", "revoke", "tokenSeconds"}:
            raise ValueError('Send {"requireToken": {step: audience}, "revoke": true, '
                             '"tokenSeconds": n} (each optional).')  # fmt: skip
        require = body.get("requireToken")
        if require is not None and not isinstance(require, dict):
            raise ValueError("requireToken maps step names to audiences.")
        revoke = body.get("revoke", False)
        if not isinstance(revoke, bool):
            raise ValueError("revoke is true or false.")
        return self.configure(
            require=require, revoke=revoke, token_seconds=body.get("tokenSeconds")
        )

    def revoke(self) -> None:
        self.configure(revoke=True)

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "tokensIssued": self._issued,
                "tokensValid": sum(1 for t in self._tokens.values() if t.expires_on > time.time()),
                "identities": sorted({t.identity for t in self._tokens.values()}),
                "requireToken": dict(self._require),
                "tokenSeconds": self._token_seconds,
                "headerChecked": self._header is not None,
                "refusedTokenRequests": self._refused_requests,
                "refusedCalls": self._refused_calls,
            }

    @property
    def issued(self) -> int:
        with self._lock:
            return self._issued


__all__ = ["API_VERSION", "IdentityEndpoint", "audience_of", "parse_rule"]
