"""What keeps the console's actions from being forged, and its pages from running input.

- Never anonymous, and never the function key: every route needs a principal, signed in
  with App Service authentication (Microsoft Entra ID) in Azure, and the app role for
  what it does (``console.pages.access``, config/principals.py); no page, link or form
  carries a key.
- Actions are POSTs that need a CSRF token: a random value in a ``SameSite=Strict``,
  ``HttpOnly`` cookie that must equal the form's ``csrf`` field (double submit: a page on
  another site can neither read the cookie nor make the browser send it). A browser's
  ``Origin`` and ``Sec-Fetch-Site`` headers, when sent, must say "same origin".
- A page shows a ``?message=`` only when the app redirected with it: the redirect after
  an action carries ``proof``, an HMAC of the message under the browser's CSRF token
  (``message_proof``). A link anyone else writes, or the same link in another browser,
  shows no message, so a crafted URL cannot put official-looking words on a page.
- Pages are Jinja2 templates with autoescaping on, and every answer sends a
  Content-Security-Policy that allows only the app's own scripts, styles and images.
- Every answer served over https (the console's and the operator API's) sends
  ``Strict-Transport-Security``: a browser that has seen it uses https only for the host,
  so neither its sign-in cookie nor an API caller's key or token goes out in clear text.
  Not over plain http (``func start``, devhost), where the standard forbids it (RFC 6797
  §7.2).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable, Mapping
from http.cookies import CookieError, SimpleCookie
from typing import Final
from urllib.parse import urlsplit

import azure.functions as func

COOKIE: Final = "console_csrf"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,64}")

HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # order ids and filters stay out of other sites' logs
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
}


#: One year; not ``includeSubDomains``: the app's host name may sit under a domain whose
#: other hosts are not the app's to decide for.
HSTS: Final = "max-age=31536000"


def served_over_https(url: str, headers: Mapping[str, str]) -> bool:
    """Whether the request came over https: its URL says so, or the front end that
    ended TLS does (``X-Forwarded-Proto``, App Service's)."""
    forwarded = (headers.get("x-forwarded-proto") or "").split(",")[0].strip().lower()
    return urlsplit(url).scheme.lower() == "https" or forwarded == "https"


def transport_headers(req: func.HttpRequest) -> dict[str, str]:
    """``Strict-Transport-Security`` for a request served over https; nothing otherwise."""
    return {"Strict-Transport-Security": HSTS} if served_over_https(req.url, req.headers) else {}


def with_hsts(
    route: Callable[[func.HttpRequest], func.HttpResponse],
) -> Callable[[func.HttpRequest], func.HttpResponse]:
    """A route whose every answer carries ``transport_headers`` (the operator API's)."""

    @functools.wraps(route)
    def answered(req: func.HttpRequest) -> func.HttpResponse:
        response = route(req)
        for name, value in transport_headers(req).items():
            response.headers[name] = value
        return response

    return answered


def cookie_token(cookie_header: str | None) -> str | None:
    """The CSRF token the browser holds, if it holds a well-formed one."""
    if not cookie_header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(cookie_header)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None and _TOKEN.fullmatch(morsel.value) else None


def new_token() -> str:
    return secrets.token_urlsafe(32)


def set_cookie(token: str, secure: bool) -> str:
    return f"{COOKIE}={token}; Path=/; SameSite=Strict; HttpOnly" + ("; Secure" if secure else "")


def message_proof(token: str, message: str, failed: bool) -> str:
    """What a redirect adds to its ``message`` (and ``failed``) so that the page it leads
    to shows them: an HMAC under the browser's own CSRF token, which no other site, and
    no other browser, knows."""
    signed = f"console-message\x00{int(failed)}\x00{message}".encode("utf-8", "surrogatepass")
    return hmac.new(token.encode("ascii"), signed, hashlib.sha256).hexdigest()[:32]


def proven(token: str | None, message: str, failed: bool, proof: str | None) -> bool:
    """Whether ``message`` came from this app's redirect to the browser holding ``token``."""
    return (
        token is not None
        and bool(message)
        and proof is not None
        and proof.isascii()
        and hmac.compare_digest(message_proof(token, message, failed), proof)
    )


def forged(
    cookie_header: str | None,
    form_token: str | None,
    origin: str | None,
    fetch_site: str | None,
    host: str,
) -> str | None:
    """Why a POST must be refused as possibly cross-site, or None when it is not."""
    if fetch_site and fetch_site.lower() not in ("same-origin", "none"):
        return f"the browser says this request came from another site ({fetch_site})"
    # "null" is what a browser sends from a page whose Referrer-Policy is no-referrer (as
    # the console's): not evidence either way; the token decides.
    if origin and origin != "null" and urlsplit(origin).netloc.lower() != host.lower():
        return "the request came from another origin"
    held = cookie_token(cookie_header)
    # The form's token must have a token's shape first: compare_digest raises TypeError
    # for a str that is not ASCII, and a field like "é" is a wrong token (403), not a 500.
    # (The shape is public: checking it first tells nothing of the cookie's value.)
    if (
        held is None
        or not form_token
        or not _TOKEN.fullmatch(form_token)
        or not hmac.compare_digest(held, form_token)
    ):
        return "the form's security token is missing or stale: reload the page and try again"
    return None
