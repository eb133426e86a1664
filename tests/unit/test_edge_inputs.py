"""Inputs at the edges of what the operator API and the console accept: times out of
range, JSON nested too deep, a CSRF token that is not ASCII. Each is a 4xx with a
reason, never a 500.

The HTTP functions are called directly on a stub context (no storage), as in
``test_admin_hardening.py``: what is refused is refused before any I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import azure.functions as func
import pytest

from admin import triggers
from admin.query import parse_filter, parse_time
from bootstrap import reset_app_context
from config.principals import SignIn
from console import security
from console import triggers as console
from stores.listing import key_range
from tests.support import DEV_OPERATOR
from tests.unit.test_admin_hardening import (
    StubAdmin,
    StubContext,
    answer,
    get,
    post,
    real_admin,
)

RANGE = ("1970-01-01", "2199-12-31")


@pytest.fixture
def context() -> Iterator[StubContext]:
    stub = StubContext(StubAdmin())
    # devhost's sign-in: the console needs a principal (an operator here)
    stub.settings = SimpleNamespace(
        console_read_only=False, sign_in=SignIn(dev_default=DEV_OPERATOR)
    )
    reset_app_context(stub)  # type: ignore[arg-type]
    try:
        yield stub
    finally:
        reset_app_context(None)


# --- creation times out of range ------------------------------------------------------------

OUT_OF_RANGE = [
    {"to": "9999-12-31"},  # the day after is past datetime's last day
    {"from": "0001-01-01T00:00+01:00"},  # in UTC, before datetime's first day
    {"from": "9999-12-31T23:00-02:00"},  # in UTC, after datetime's last day
    {"to": "3000-01-01"},  # past what the status rows' keys can count (2286)
    {"from": "1900-01-01"},  # before what they count from (1970)
    {"from": "1969-12-31T23:59:59Z"},
    {"to": "2200-01-01T00:00"},
]


@pytest.mark.parametrize("params", OUT_OF_RANGE)
def test_the_parser_refuses_times_out_of_range_with_the_range(params: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"between 1970-01-01 and 2199-12-31") as refused:
        parse_filter({"status": "error", **params})
    assert next(iter(params)) in str(refused.value)  # it names the parameter


@pytest.mark.parametrize(
    ("name", "raw", "end", "expected"),
    [
        ("from", "1970-01-01", False, datetime(1970, 1, 1, tzinfo=UTC)),
        ("from", "1970-01-01T01:00+01:00", False, datetime(1970, 1, 1, tzinfo=UTC)),
        ("to", "2199-12-31", True, datetime(2200, 1, 1, tzinfo=UTC)),  # the whole day
        ("to", "2199-12-31T23:59:59", True, datetime(2199, 12, 31, 23, 59, 59, tzinfo=UTC)),
    ],
)
def test_the_ends_of_the_range_are_accepted(
    name: str, raw: str, end: bool, expected: datetime
) -> None:
    assert parse_time(name, raw, end=end) == expected


def test_the_widest_range_still_makes_well_formed_keys() -> None:
    where = parse_filter({"status": "error", "from": "1970-01-01", "to": "2199-12-31"})
    low, high = key_range(where)
    for key in (low, high):
        time_part = key.split("|")[2]
        assert len(time_part) == 13 and time_part.isdigit()
    assert low < high


@pytest.mark.parametrize("params", OUT_OF_RANGE)
def test_a_time_out_of_range_is_a_400_with_a_json_error(
    context: StubContext, params: dict[str, str]
) -> None:
    context.admin = real_admin()

    status, body = answer(triggers.list_orders(get("/api/orders", {"status": "error", **params})))

    assert status == 400
    assert all(end in body["error"] for end in RANGE)


def test_the_console_list_refuses_a_time_out_of_range_with_a_page(context: StubContext) -> None:
    context.admin = real_admin()
    request = func.HttpRequest("GET", "http://h/api/console", params={"to": "9999-12-31"}, body=b"")

    response = console.console_list(request)

    assert response.status_code == 400
    assert all(end in response.get_body().decode() for end in RANGE)


# --- JSON nested too deep ---------------------------------------------------------------------

DEEP = [
    b"[" * 100_000,
    b'{"reason": ' + b"[" * 100_000,
    b'{"reason": "x", "extra": ' + b"[" * 64 + b"]" * 64 + b"}",  # 65 levels: one too many
]


@pytest.mark.parametrize("body", DEEP, ids=["open", "in-reason", "closed-65"])
@pytest.mark.parametrize("action", ["resubmit", "cancel"])
def test_a_deeply_nested_body_is_a_400_with_a_json_error(
    context: StubContext, action: str, body: bytes
) -> None:
    handler = triggers.resubmit_order if action == "resubmit" else triggers.cancel_order

    status, answered = answer(handler(post("o-1", action, body=body)))

    assert status == 400 and "reason" in answered["error"]
    assert context.admin.calls == []


def test_a_body_within_the_nesting_limit_still_gives_its_reason(context: StubContext) -> None:
    body = b'{"reason": "duplicate", "extra": ' + b"[" * 60 + b"]" * 60 + b"}"

    status, _ = answer(triggers.cancel_order(post("o-1", "cancel", body=body)))

    assert status == 200
    assert context.admin.calls == [("cancel", ("o-1", DEV_OPERATOR.name, "duplicate"))]


# --- console POSTs: the CSRF token, and bodies that are not forms -------------------------------

TOKEN = security.new_token()
COOKIE = f"{security.COOKIE}={TOKEN}"


@pytest.mark.parametrize("form_token", ["é", TOKEN[:-1] + "é", "\udce9", "٣" * 43])
def test_a_csrf_field_that_is_not_ascii_is_a_wrong_token(form_token: str) -> None:
    refused = security.forged(COOKIE, form_token, None, "same-origin", "h:1")
    assert refused is not None and "security token" in refused


def console_post(path: str, body: bytes, **route: str) -> func.HttpRequest:
    headers = {
        "host": "h:1",
        "cookie": COOKIE,
        "content-type": "application/x-www-form-urlencoded",
    }
    return func.HttpRequest(
        "POST", f"http://h:1/api/console{path}", headers=headers, route_params=route, body=body
    )


FORMS: list[tuple[str, Any]] = [
    ("/orders/o-1/resubmit", console.console_resubmit),
    ("/orders/o-1/cancel", console.console_cancel),
    ("/bulk/preview", console.console_bulk_preview),
    ("/bulk/run", console.console_bulk_run),
]


@pytest.mark.parametrize(("path", "handler"), FORMS, ids=[p for p, _ in FORMS])
@pytest.mark.parametrize(
    "body",
    [
        urlencode({"reason": "x", "action": "cancel", "csrf": "é"}).encode(),
        b"reason=x&action=cancel&csrf=%FF",  # not UTF-8: read as U+FFFD
        b"[" * 100_000,  # not a form at all
        b"csrf=" + b"%5B" * 20_000,
    ],
    ids=["non-ascii", "not-utf8", "deep-json", "long"],
)
def test_a_console_post_with_a_bad_token_or_body_is_a_403(
    context: StubContext, path: str, handler: Any, body: bytes
) -> None:
    response = handler(console_post(path, body, orderId="o-1"))

    assert response.status_code == 403
    assert "security token" in response.get_body().decode()
    assert context.admin.calls == []
