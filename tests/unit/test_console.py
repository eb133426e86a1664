"""The console's pure parts: the timeline, the "why" sentence, and the CSRF checks."""

from __future__ import annotations

from datetime import timedelta

import azure.functions as func
import pytest

from console import security, views
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.states import OrderStatus
from tests.support import settings_only
from tests.unit.test_failure_semantics import fail_until_given_up, reach
from tests.unit.test_model import new_order, reply

POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=600)


def test_the_timeline_draws_every_attempt_and_the_waits_between_them() -> None:
    order = new_order()
    now = fail_until_given_up(order, [Applied.NO, Applied.NO, Applied.NO])
    assert order.status is OrderStatus.ERROR

    drawn = views.timeline(order, now)

    [row] = drawn.rows
    assert [(b.attempt, b.outcome) for b in row.bars] == [
        (1, "transient"),
        (2, "transient"),
        (3, "transient"),
    ]
    assert all("HTTP 503" in b.title for b in row.bars)
    assert len(row.gaps) == 2 and all(g.x2 > g.x1 for g in row.gaps)
    xs = [b.x for b in row.bars]
    assert xs == sorted(xs) and xs[0] >= views.LABEL_WIDTH
    assert max(b.x + b.width for b in row.bars) <= views.LABEL_WIDTH + views.AXIS_WIDTH + 3


def test_a_running_attempt_is_drawn_to_its_deadline_and_compensations_in_their_own_row() -> None:
    order = new_order("fulfilment")
    now = reach(order, "charge-payment")
    order.claim("i-1", now)
    order.apply_reply(
        reply(order, Outcome.REFUSED, step="charge-payment", error="card declined"),
        now + timedelta(seconds=1),
        POLICY,
    )
    release = order.active_step()
    assert release is not None and release.compensates == "reserve-stock"
    order.claim("i-2", now + timedelta(seconds=2))

    drawn = views.timeline(order, now + timedelta(seconds=3))

    labels = [r.label for r in drawn.rows]
    assert labels[-1] == "release-stock (undoes reserve-stock)" and drawn.rows[-1].compensation
    running = drawn.rows[-1].bars[-1]
    assert running.outcome == "running" and running.open_ended and "deadline" in running.title
    assert "Undoing step release-stock" in views.why(order)


def test_why_names_the_failed_step_its_error_and_what_the_operator_was_told() -> None:
    order = new_order()
    fail_until_given_up(order, [Applied.NO, Applied.NO, Applied.NO])
    text = views.why(order)
    assert "Step process failed for good after 3" in text and "HTTP 503" in text
    assert "safe to resubmit" in text  # the alert, recorded in the order's history
    assert views.can_resubmit(order) and views.can_cancel(order)


def test_why_for_a_waiting_step_says_when_it_runs_next() -> None:
    order = new_order()
    fail_until_given_up(order, [Applied.NO])
    assert "waiting to run (attempt 2)" in views.why(order)
    assert not views.can_resubmit(order)


TOKEN = security.new_token()
COOKIE = f"other=1; {security.COOKIE}={TOKEN}"


def test_a_same_site_post_with_the_token_passes() -> None:
    assert security.forged(COOKIE, TOKEN, "http://h:1", "same-origin", "h:1") is None
    assert security.forged(COOKIE, TOKEN, None, None, "h:1") is None  # no headers sent
    assert security.forged(COOKIE, TOKEN, "null", "same-origin", "h:1") is None


@pytest.mark.parametrize(
    ("cookie", "form", "origin", "site", "why"),
    [
        (COOKIE, None, None, None, "token"),
        (COOKIE, "", None, None, "token"),
        (None, TOKEN, None, None, "token"),
        (COOKIE, security.new_token(), None, None, "token"),
        (f"{security.COOKIE}=short", "short", None, None, "token"),
        (COOKIE, TOKEN, "http://evil.example", None, "another origin"),
        (COOKIE, TOKEN, None, "cross-site", "another site"),
        (COOKIE, TOKEN, None, "same-site", "another site"),
        ('bad"cookie', TOKEN, None, None, "token"),
    ],
)
def test_a_post_that_may_be_forged_is_refused(
    cookie: str | None, form: str | None, origin: str | None, site: str | None, why: str
) -> None:
    refused = security.forged(cookie, form, origin, site, "h:1")
    assert refused is not None and why in refused


def test_the_cookie_is_strict_and_secure_over_https() -> None:
    assert "SameSite=Strict" in security.set_cookie(TOKEN, False)
    assert "HttpOnly" in security.set_cookie(TOKEN, False)
    assert security.set_cookie(TOKEN, True).endswith("; Secure")
    assert "Secure" not in security.set_cookie(TOKEN, False)
    assert "default-src 'none'" in security.HEADERS["Content-Security-Policy"]


def test_answers_over_https_carry_strict_transport_security_and_over_http_do_not() -> None:
    """The console and the operator API (a sign-in cookie, a key, a token): a browser
    that saw the header uses https only for the host. Not over plain http (RFC 6797)."""
    from admin.triggers import list_workflows

    def request(url: str, **headers: str) -> func.HttpRequest:
        return func.HttpRequest("GET", url, headers=headers, body=b"")

    https = request("https://app.example.net/api/workflows")
    behind_front_end = request("http://10.0.0.4/api/workflows", **{"X-Forwarded-Proto": "https"})
    plain = request("http://127.0.0.1:7071/api/workflows")

    with settings_only():
        assert list_workflows(https).headers["Strict-Transport-Security"] == "max-age=31536000"
        assert "Strict-Transport-Security" in list_workflows(behind_front_end).headers
        assert "Strict-Transport-Security" not in list_workflows(plain).headers
    assert security.transport_headers(plain) == {}
