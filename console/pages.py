"""The console's page plumbing: templates, the per-request ``Page`` (base path, who is
signed in and what they may do, the CSRF token), form parsing, the role every route
needs (``access``) and the checks every POST passes.

No page ever carries the function key: the console's routes are anonymous to the
Functions host, and every one of them needs a principal (config/principals.py). The
settings a page reads (who is signed in, whether actions are on) are handed in by the
routes (``console/triggers.py``), which get them from the app.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import azure.functions as func

from config.principals import OPERATOR, Access, Principal, refusal
from config.settings import Settings
from console import security
from core.errors import ConcurrencyConflict, CorruptOrder, StorageUnavailable
from core.states import OrderStatus
from core.workflows import WORKFLOWS

HERE = Path(__file__).parent
ASSETS = {p.name: p for p in (HERE / "assets").iterdir() if p.is_file()}
#: What the list keeps in its URL (and carries into every link and form). ``waiting``:
#: the orders waiting for that event (the inbox, docs/contracts.md §3.13).
FILTER_KEYS = ("status", "workflow", "from", "to", "pageSize", "refresh", "waiting")
DEFAULT_STATUS = "error"


@cache
def templates() -> Any:
    import jinja2  # only when a page is first drawn: the other functions never pay for it

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    env.filters["compact"] = lambda value: json.dumps(
        value, separators=(",", ":"), ensure_ascii=False
    )
    return env


class Page:
    """One request's view of the console: its base path, who asks, its token."""

    def __init__(self, req: func.HttpRequest, settings: Settings):
        self.req = req
        path = urlsplit(req.url).path
        self.root = path[: path.index("/console") + len("/console")] if "/console" in path else ""
        held = security.cookie_token(req.headers.get("cookie"))
        self.csrf = held or security.new_token()
        self.new_cookie = held is None
        self.sign_in = settings.sign_in
        self.principal: Principal | None = settings.sign_in.principal(req.headers, req.params)
        #: why no action is offered ("" when they are): the switch, or a missing role
        self.read_only_why = ""
        if settings.console_read_only:
            self.read_only_why = "actions are turned off (CONSOLE_READ_ONLY)"
        elif self.principal is None or not self.principal.has(OPERATOR):
            self.read_only_why = f"acting needs the {OPERATOR} role"
        self.read_only = bool(self.read_only_why)

    @property
    def sign_out(self) -> str | None:
        """Where signing out goes (App Service authentication's own route), if signed in."""
        return "/.auth/logout" if self.sign_in.entra and self.principal is not None else None

    def url(self, path: str = "", params: Mapping[str, Any] | None = None) -> str:
        query = {k: str(v) for k, v in (params or {}).items() if v not in (None, "")}
        return f"{self.root}{path}" + (f"?{urlencode(query)}" if query else "")

    def render(self, template: str, status: int = 200, **context: Any) -> func.HttpResponse:
        message, failed = context.pop("message", None), context.pop("failed", False)
        if not message:
            message, failed = self._redirected_message()
        body = (
            templates()
            .get_template(template)
            .render(
                page=self,
                statuses=[s.value for s in OrderStatus],
                workflows=sorted(WORKFLOWS),
                message=message,
                failed=failed,
                **context,
            )
        )
        return func.HttpResponse(
            body, status_code=status, mimetype="text/html", charset="utf-8", headers=self._headers()
        )

    def _redirected_message(self) -> tuple[str | None, bool]:
        """The ``?message=`` this app redirected this browser with (``console/security.py``:
        its ``proof``), else none: a hand-written one is not shown."""
        message = self.req.params.get("message") or ""
        failed = self.req.params.get("failed") == "1"
        held = None if self.new_cookie else self.csrf
        if security.proven(held, message, failed, self.req.params.get("proof")):
            return message, failed
        return None, False

    def _headers(self, **more: str) -> dict[str, str]:
        headers = {**security.HEADERS, **security.transport_headers(self.req), **more}
        if self.new_cookie:  # the CSRF token, which a message's proof is also bound to
            secure = urlsplit(self.req.url).scheme == "https"
            headers["Set-Cookie"] = security.set_cookie(self.csrf, secure)
        return headers

    def redirect(self, path: str, params: Mapping[str, Any]) -> func.HttpResponse:
        """A 303 to ``path``; a ``message`` in ``params`` goes with its ``proof``, so the page
        it leads to shows it (``failed``: as a refusal)."""
        if params.get("message"):
            failed = str(params.get("failed", "")) == "1"
            proof = security.message_proof(self.csrf, str(params["message"]), failed)
            params = {**params, "proof": proof}
        headers = self._headers(Location=self.url(path, params))
        return func.HttpResponse(status_code=303, headers=headers)


#: A form's body, at most (a larger one reads as empty, and is refused for what it lacks).
MAX_FORM_BYTES = 64_000


def form_of(req: func.HttpRequest, limit: int = MAX_FORM_BYTES) -> dict[str, str]:
    """A urlencoded form; ``limit``: a larger limit for a form that carries an order's
    data (the fix editor's)."""
    body = req.get_body() or b""
    if len(body) > limit:
        return {}
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def guard(page: Page, form: Mapping[str, str]) -> func.HttpResponse | None:
    """A refusal for a POST that is read-only or may be forged; None lets it through."""
    if page.read_only:
        return page.render(
            "message.html", 403, message=f"Read-only: {page.read_only_why}.", failed=True
        )
    why = security.forged(
        page.req.headers.get("cookie"),
        form.get("csrf"),
        page.req.headers.get("origin"),
        page.req.headers.get("sec-fetch-site"),
        page.req.headers.get("host") or urlsplit(page.req.url).netloc,
    )
    if why is not None:
        return page.render("message.html", 403, message=f"Refused: {why}.", failed=True)
    return None


Route = Callable[[func.HttpRequest], func.HttpResponse]
#: App Service authentication's sign-in route for Microsoft Entra ID.
SIGN_IN_PATH = "/.auth/login/aad"


def sign_in_url(req: func.HttpRequest) -> str:
    """The sign-in page, coming back to this page (a path on this host: the platform
    refuses redirects elsewhere unless allowed)."""
    parts = urlsplit(req.url)
    back = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{SIGN_IN_PATH}?post_login_redirect_uri={quote(back, safe='')}"


def access(need: Access, settings: Callable[[], Settings]) -> Callable[[Route], Route]:
    """The console route does ``need``: a caller who may not gets the message page (403),
    or, not signed in where sign-in is on, the sign-in page (a GET) or a 401. The route
    carries its ``access`` (tests/integration/test_roles.py reads it). ``settings``: the
    app's, asked for at each request."""

    def decorate(route: Route) -> Route:
        @functools.wraps(route)
        def checked(req: func.HttpRequest) -> func.HttpResponse:
            page = Page(req, settings())
            refused = refusal(page.principal, need, page.sign_in, console=True)
            if refused is None:
                return route(req)
            if refused.sign_in and req.method.upper() == "GET":
                headers = {
                    **security.HEADERS,
                    **security.transport_headers(req),
                    "Location": sign_in_url(req),
                }
                return func.HttpResponse(status_code=302, headers=headers)
            return page.render("message.html", refused.status, message=refused.reason, failed=True)

        checked.access = need  # type: ignore[attr-defined]
        return checked

    return decorate


def trouble(page: Page, call: Callable[[], func.HttpResponse]) -> func.HttpResponse:
    """The store's troubles as pages a person can act on."""
    try:
        return call()
    except (StorageUnavailable, ConcurrencyConflict) as exc:
        return page.render(
            "message.html", 503, message=f"Try again in a moment: {exc.message}", failed=True
        )
    except CorruptOrder as exc:
        return page.render("message.html", 500, message=exc.message, failed=True)


#: The names the console's list and its forms use for themselves; any other name in a
#: list's URL (or a bulk form) is a field to search by (docs/contracts.md §3.14), which
#: ``admin.query.parse_filter`` checks (an undeclared one: a 400 page).
OWN_PARAMS = frozenset(
    {*FILTER_KEYS, "page", "code", "message", "failed", "proof", "searchField", "searchValue"}
    | {"csrf", "action", "reason", "ids"}
)


def filters_of(params: Mapping[str, str]) -> dict[str, str]:
    """The list's filters from a query string or a form: ``FILTER_KEYS`` and the search
    (``<field>=<value>``), if any. An order that waits for an event is ``processing``:
    that is the status a ``waiting`` filter implies; a URL that names another is refused
    by ``admin.query.parse_filter`` (a 400 page), not corrected. A search lists orders of
    every status unless the URL names one."""
    kept = {k: params.get(k, "") for k in FILTER_KEYS}
    searched = {k: params.get(k, "") for k in params if k not in OWN_PARAMS}
    kept["waiting"] = kept["waiting"].strip()
    implied = "processing" if kept["waiting"] else DEFAULT_STATUS
    if any(searched.values()) and not kept["waiting"]:
        implied = ""  # any status
    kept["status"] = kept["status"] or implied
    return {**kept, **searched}


def search_of(filters: Mapping[str, str]) -> tuple[str, str] | None:
    """The search a list's filters hold: ``(field, value)``, or None."""
    for name, value in filters.items():
        if name not in FILTER_KEYS and value:
            return name, value
    return None
