"""The console's page plumbing: templates, the per-request ``Page`` (base path, the
function key to carry, the CSRF token), form parsing, and the checks every POST passes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import azure.functions as func

from bootstrap import app_context
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
    """One request's view of the console: its base path, the key to carry, its token."""

    def __init__(self, req: func.HttpRequest):
        self.req = req
        path = urlsplit(req.url).path
        self.root = path[: path.index("/console") + len("/console")] if "/console" in path else ""
        self.code = req.params.get("code") or ""
        held = security.cookie_token(req.headers.get("cookie"))
        self.csrf = held or security.new_token()
        self.new_cookie = held is None
        self.read_only = app_context().settings.console_read_only

    def url(self, path: str = "", params: Mapping[str, Any] | None = None) -> str:
        query = {k: str(v) for k, v in (params or {}).items() if v not in (None, "")}
        if self.code:
            query["code"] = self.code
        return f"{self.root}{path}" + (f"?{urlencode(query)}" if query else "")

    def render(self, template: str, status: int = 200, **context: Any) -> func.HttpResponse:
        body = (
            templates()
            .get_template(template)
            .render(
                page=self,
                statuses=[s.value for s in OrderStatus],
                workflows=sorted(WORKFLOWS),
                message=context.pop("message", None) or self.req.params.get("message"),
                failed=context.pop("failed", False) or self.req.params.get("failed") == "1",
                **context,
            )
        )
        headers = {**security.HEADERS, **security.transport_headers(self.req)}
        if self.new_cookie:
            secure = urlsplit(self.req.url).scheme == "https"
            headers["Set-Cookie"] = security.set_cookie(self.csrf, secure)
        return func.HttpResponse(
            body, status_code=status, mimetype="text/html", charset="utf-8", headers=headers
        )

    def redirect(self, path: str, params: Mapping[str, Any]) -> func.HttpResponse:
        headers = {
            **security.HEADERS,
            **security.transport_headers(self.req),
            "Location": self.url(path, params),
        }
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
            "message.html", 403, message="The console is read-only here.", failed=True
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
    {*FILTER_KEYS, "page", "code", "message", "failed", "searchField", "searchValue"}
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
