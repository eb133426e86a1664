"""The console's pages and actions through its HTTP functions, on real Azurite (the
browser tests in tests/browser drive the same pages in Chromium)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import azure.functions as func
import pytest

from bootstrap import AppContext, reset_app_context
from console import security
from console import triggers as console
from core.messages import AgentRequest, alert_message
from core.states import OrderStatus
from messaging.wire import decode_request
from tests.integration.orders import accept
from tests.integration.test_listing import T0, fail
from tests.support import DEV_OPERATOR, declarations, drain_requests, installed

BASE = "http://h:7071/api/console"
HOSTILE = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>"


@pytest.fixture
def ctx(storage_connection: str, tag: str) -> Iterator[AppContext]:
    yield from installed(storage_connection, tag)


def read_only(ctx: AppContext) -> None:
    settings = dataclasses.replace(ctx.settings, console_read_only=True)
    reset_app_context(dataclasses.replace(ctx, settings=settings))


def get(path: str, params: dict[str, str] | None = None, **route: str) -> func.HttpResponse:
    return _call("GET", path, params or {}, b"", route, {})


def _call(
    method: str,
    path: str,
    params: dict[str, str],
    body: bytes,
    route: dict[str, str],
    headers: dict[str, str],
) -> func.HttpResponse:
    request = func.HttpRequest(
        method, f"{BASE}{path}", params=params, route_params=route, body=body, headers=headers
    )
    handler = {
        ("GET", ""): console.console_list,
        ("GET", "/lookup"): console.console_lookup,
        ("GET", "/inbox"): console.console_inbox,
        ("GET", "/alerts"): console.console_alerts,
        ("GET", "/retention"): console.console_retention,
        ("GET", "/orders"): console.console_order,
        ("GET", "/confirm"): console.console_confirm,
        ("POST", "/resubmit"): console.console_resubmit,
        ("POST", "/cancel"): console.console_cancel,
        ("POST", "/preview"): console.console_fix_preview,
        ("POST", "/fix"): console.console_fix,
        ("POST", "/bulk/preview"): console.console_bulk_preview,
        ("POST", "/bulk/run"): console.console_bulk_run,
    }
    key = path if not path.startswith("/orders/") else "/" + path.rsplit("/", 1)[-1]
    if path.startswith("/orders/") and path.count("/") == 2:
        key = "/orders"
    return handler[(method, key)](request)  # type: ignore[no-any-return]


def post(path: str, form: dict[str, str], token: str | None, **route: str) -> func.HttpResponse:
    headers = {"host": "h:7071", "content-type": "application/x-www-form-urlencoded"}
    if token:
        headers["cookie"] = f"{security.COOKIE}={token}"
    return _call("POST", path, {}, urlencode(form).encode(), route, headers)


def html(response: func.HttpResponse) -> str:
    assert response.mimetype == "text/html", response.get_body()[:300]
    return response.get_body().decode()


def ids_listed(page: str) -> list[str]:
    return re.findall(r'class="order-row" data-order-id="([^"]+)"', page)


def seed(ctx: AppContext, n: int, failing: int, **extra: Any) -> list[str]:
    ids = []
    for i in range(n):
        order = accept(f"p-{i}", T0 + timedelta(seconds=i))
        order.body.update(extra)
        ctx.store.create(order)
        ids.append(order.order_id)
    for order_id in ids[:failing]:
        fail(ctx, order_id)
    return ids


def test_the_list_shows_the_status_in_its_url_newest_first_with_counts(ctx: AppContext) -> None:
    seed(ctx, 5, failing=3)
    response = get("")  # no status: the orders that need an operator
    page = html(response)
    assert response.status_code == 200
    assert ids_listed(page) == ["p-2", "p-1", "p-0"]
    assert re.search(r'data-status="error"[^>]*>error <span>3</span>', page)
    assert re.search(r'data-status="pending"[^>]*>pending <span>2</span>', page)
    assert 'href="/api/console/orders/p-2"' in page
    assert ids_listed(html(get("", {"status": "pending"}))) == ["p-4", "p-3"]
    assert ids_listed(html(get("", {"status": "error", "workflow": "fulfilment"}))) == []
    assert "Set-Cookie" in response.headers and "SameSite=Strict" in response.headers["Set-Cookie"]
    assert "default-src 'none'" in response.headers["Content-Security-Policy"]


def test_console_pages_over_https_carry_strict_transport_security(ctx: AppContext) -> None:
    seed(ctx, 1, failing=1)
    over_https = func.HttpRequest("GET", "https://h/api/console", params={}, body=b"")
    page = console.console_list(over_https)
    assert page.status_code == 200
    assert page.headers["Strict-Transport-Security"] == "max-age=31536000"
    assert "Strict-Transport-Security" not in get("").headers  # plain http: never


def test_paging_follows_the_token_and_keeps_the_filter_never_a_key(ctx: AppContext) -> None:
    seed(ctx, 3, failing=3)
    first = html(get("", {"status": "error", "pageSize": "2"}))
    assert ids_listed(first) == ["p-2", "p-1"]
    link = re.search(r'id="next-page" href="([^"]+)"', first)
    assert link is not None
    query = {k: v[0] for k, v in parse_qs(urlsplit(link[1].replace("&amp;", "&")).query).items()}
    assert query["status"] == "error" and query["pageSize"] == "2" and "code" not in query
    assert ids_listed(html(get("", query))) == ["p-0"]
    assert get("", {"page": "not-a-token"}).status_code == 400
    assert get("", {"status": "nope"}).status_code == 400
    assert get("", {"from": "yesterday"}).status_code == 400


def test_the_detail_escapes_what_the_order_carries(ctx: AppContext) -> None:
    seed(ctx, 1, failing=1, note=HOSTILE)
    page = html(get("/orders/p-0", orderId="p-0"))
    assert "<script>window" not in page and "<img src=x" not in page
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
    assert 'id="resubmit-form"' in page and 'id="cancel-form"' in page
    assert re.search(r'<rect class="attempt refused', page)
    assert "Step process failed for good" in page
    assert get("/orders/nope", orderId="nope").status_code == 404
    assert get("/orders/a b", orderId="a b").status_code == 400


def test_resubmit_needs_a_confirmation_a_reason_and_the_token(ctx: AppContext) -> None:
    seed(ctx, 1, failing=1)
    token = security.new_token()
    confirm = get("/orders/p-0/confirm", {"action": "resubmit", "reason": "fixed"}, orderId="p-0")
    assert 'id="confirm-form"' in html(confirm)
    assert ctx.store.load("p-0").status is OrderStatus.ERROR  # type: ignore[union-attr]

    forged = post("/orders/p-0/resubmit", {"reason": "x", "csrf": token}, None, orderId="p-0")
    assert forged.status_code == 403
    other = post(
        "/orders/p-0/resubmit", {"reason": "x", "csrf": token}, security.new_token(), orderId="p-0"
    )
    assert other.status_code == 403
    no_reason = post("/orders/p-0/resubmit", {"csrf": token}, token, orderId="p-0")
    assert no_reason.status_code == 303 and "reason" in no_reason.headers["Location"]
    assert ctx.store.load("p-0").status is OrderStatus.ERROR  # type: ignore[union-attr]

    done = post(
        "/orders/p-0/resubmit", {"reason": "remote fixed", "csrf": token}, token, orderId="p-0"
    )
    assert done.status_code == 303
    assert done.headers["Location"].startswith("/api/console/orders/p-0?message=Resubmitted")
    order = ctx.store.load("p-0")
    assert order is not None and order.status is OrderStatus.PROCESSING
    [event] = [h for h in order.history if h["event"] == "resubmitted"]
    assert event["reason"] == "remote fixed" and event["by"] == DEV_OPERATOR.name

    again = post("/orders/p-0/resubmit", {"reason": "again", "csrf": token}, token, orderId="p-0")
    assert again.status_code == 409 and "only an order in error" in html(again)


def test_fix_previews_each_change_then_resubmits_with_the_patch_and_the_version(
    ctx: AppContext,
) -> None:
    seed(ctx, 2, failing=2, sku="A-1", note="x")
    token = security.new_token()
    detail = html(get("/orders/p-0", orderId="p-0"))
    assert 'id="fix-form"' in detail and "&#34;sku&#34;: &#34;A-1&#34;" in detail
    version = re.search(r'name="version" value="(\d+)"', detail)
    assert version is not None
    edited = json.dumps({"orderId": "p-0", "workflow": "order", "sku": "B-2"})
    form = {"csrf": token, "data": edited, "version": version[1], "reason": "wrong sku"}

    no_reason = post("/orders/p-0/fix/preview", {**form, "reason": ""}, token, orderId="p-0")
    assert no_reason.status_code == 400 and "Give a reason" in html(no_reason)
    assert "B-2" in html(no_reason)  # the operator's edit is shown again, not lost
    bad = post("/orders/p-0/fix/preview", {**form, "data": "{"}, token, orderId="p-0")
    assert bad.status_code == 400 and "not JSON" in html(bad)
    fixed_field = json.dumps({"orderId": "p-9", "workflow": "order"})
    refused = post("/orders/p-0/fix/preview", {**form, "data": fixed_field}, token, orderId="p-0")
    assert refused.status_code == 400 and "orderId" in html(refused)
    forged = post("/orders/p-0/fix/preview", form, None, orderId="p-0")
    assert forged.status_code == 403

    preview = html(post("/orders/p-0/fix/preview", form, token, orderId="p-0"))
    rows = re.findall(r'<tr class="change" data-field="([^"]+)">', preview)
    assert sorted(rows) == ["note", "sku"]
    assert ctx.store.load("p-0").body["sku"] == "A-1"  # type: ignore[union-attr]
    patch = re.search(r'name="patch" value="([^"]+)"', preview)
    assert patch is not None
    sent = json.loads(patch[1].replace("&#34;", '"'))
    assert sent == {"sku": "B-2", "note": None}

    confirm = {"csrf": token, "patch": json.dumps(sent), "reason": "wrong sku"}
    stale = post("/orders/p-0/fix", {**confirm, "version": "1"}, token, orderId="p-0")
    assert stale.status_code == 412 and "Nothing was changed" in html(stale)
    done = post("/orders/p-0/fix", {**confirm, "version": version[1]}, token, orderId="p-0")
    assert done.status_code == 303 and "Fixed+and+resubmitted" in done.headers["Location"]
    order = ctx.store.load("p-0")
    assert order is not None and order.status is OrderStatus.PROCESSING
    assert order.body["sku"] == "B-2" and "note" not in order.body
    [patched] = [h for h in order.history if h["event"] == "patched"]
    assert patched["by"] == DEV_OPERATOR.name and patched["reason"] == "wrong sku"
    assert not re.search(r'id="fix-form"', html(get("/orders/p-0", orderId="p-0")))

    read_only(ctx)
    assert 'id="fix-form"' not in html(get("/orders/p-1", orderId="p-1"))
    closed = post("/orders/p-1/fix/preview", {**form, "version": ""}, token, orderId="p-1")
    assert closed.status_code == 403


def test_bulk_preview_changes_nothing_and_the_run_does_what_it_showed(ctx: AppContext) -> None:
    seed(ctx, 4, failing=3)
    token = security.new_token()
    form = {"status": "error", "action": "cancel", "reason": "customer gone", "csrf": token}
    preview = html(post("/bulk/preview", form, token))
    assert re.search(r'id="bulk-count">3<', preview)
    assert ctx.admin.counts()["error"] == 3
    ids = re.search(r'name="ids" value="([^"]+)"', preview)
    assert ids is not None and ids[1] == "p-2,p-1,p-0"

    result = html(post("/bulk/run", {**form, "ids": ids[1]}, token))
    assert re.search(r'id="bulk-done">3<', result) and re.search(r'id="bulk-refused">0<', result)
    for order_id in ("p-0", "p-1", "p-2"):
        order = ctx.store.load(order_id)
        assert order is not None and order.status is OrderStatus.CANCELLED
        assert any(h.get("reason") == "customer gone" for h in order.history)
    assert post("/bulk/run", {**form, "ids": "p-3"}, None).status_code == 403


def test_read_only_hides_every_action_and_refuses_every_post(ctx: AppContext) -> None:
    seed(ctx, 1, failing=1)
    read_only(ctx)
    token = security.new_token()
    listing = html(get(""))
    detail = html(get("/orders/p-0", orderId="p-0"))
    assert 'id="read-only"' in listing and 'id="bulk"' not in listing
    assert 'id="resubmit-form"' not in detail and 'id="cancel-form"' not in detail
    refused = post("/orders/p-0/resubmit", {"reason": "x", "csrf": token}, token, orderId="p-0")
    assert refused.status_code == 403
    form = {"status": "error", "action": "cancel", "reason": "x", "csrf": token, "ids": "p-0"}
    assert post("/bulk/run", form, token).status_code == 403
    assert ctx.store.load("p-0").status is OrderStatus.ERROR  # type: ignore[union-attr]


def test_lookup_opens_an_order_or_says_there_is_none(ctx: AppContext) -> None:
    seed(ctx, 1, failing=0)
    found = get("/lookup", {"orderId": "p-0"})
    assert found.status_code == 303 and found.headers["Location"] == "/api/console/orders/p-0"
    missing = get("/lookup", {"orderId": "nope"})
    assert "no+order+with+id" in missing.headers["Location"]


def test_the_alerts_page_shows_waiting_alerts_and_rejected_messages(ctx: AppContext) -> None:
    seed(ctx, 1, failing=1)
    alerts = ctx.queues.client(ctx.names.operator_alerts)
    alerts.send_message(alert_message("p-0", "process", f"it failed {HOSTILE}", 1, T0))
    rejected = ctx.queues.client(ctx.names.orders_rejected)
    rejected.send_message(json.dumps({"reason": "orderId is missing", "message": "{}"}))

    page = html(get("/alerts"))

    assert re.search(r'class="alert-row" data-order-id="p-0"', page)
    assert "it failed &lt;script&gt;" in page and "<script>window" not in page
    assert re.search(r'class="rejected-row">\s*<td class="queue">[^<]*orders-rejected', page)
    assert "orderId is missing" in page
    assert re.search(r'id="attention"', page) and 'data-order-id="p-0"' in page
    # peeked, not taken
    assert alerts.get_queue_properties().approximate_message_count == 1


def doubtful_ship(ctx: AppContext, order_id: str) -> None:
    """A fulfilment order in error: ship got no answer three times (it may have shipped)."""
    from core.policy import RetryPolicy

    policy = RetryPolicy(max_failure_count=3)
    order = accept(order_id, T0, "fulfilment")
    now = T0
    while (step := order.active_step()) is not None and step.step != "ship":
        claimed = order.claim("i", now)
        request = AgentRequest(
            order_id,
            claimed.step,
            claimed.attempt,
            claimed.complete_by,
            claimed.path,
            {},
            token=claimed.token_for(claimed.attempt),
        )
        order.apply_reply(request.succeeded({}), now, policy)
    for _ in range(3):
        step = order.active_step()
        assert step is not None
        now = max(now, step.complete_by)
        claimed = order.claim("i", now)
        now = claimed.complete_by + timedelta(seconds=1)
        order.expire(now, policy)
    assert order.status is OrderStatus.ERROR
    ctx.store.create(order)


def test_the_cancel_confirmation_says_what_is_undone_and_asks_about_the_doubt(
    ctx: AppContext,
) -> None:
    doubtful_ship(ctx, "d-0")
    token = security.new_token()
    page = html(get("/orders/d-0/confirm", {"action": "cancel", "reason": "gone"}, orderId="d-0"))
    undo = re.search(r'id="cancel-undo">(.*?)</li>', page, re.S)
    assert undo is not None
    assert re.search(r"charge-payment</b> \(by refund-payment\).*reserve-stock</b> \(by", undo[1])
    doubt = re.search(r'id="cancel-doubtful">(.*?)</li>', page, re.S)
    assert doubt is not None and "ship" in doubt[1] and "1, 2, 3" in doubt[1]
    assert 'name="not_applied.ship" value="ship"' in page and "d-0:ship" in page
    # Without the statement: refused, nothing undone.
    refused = post("/orders/d-0/cancel", {"reason": "gone", "csrf": token}, token, orderId="d-0")
    assert refused.status_code == 409 and "may have been applied" in html(refused)
    assert ctx.store.load("d-0").status is OrderStatus.ERROR  # type: ignore[union-attr]
    # With it: the cancel goes on, and the history says who stated it.
    stated = {"reason": "carrier: not shipped", "csrf": token, "not_applied": "ship"}
    done = post("/orders/d-0/cancel", stated, token, orderId="d-0")
    assert done.status_code == 303, html(done)
    order = ctx.store.load("d-0")
    assert order is not None and order.status is OrderStatus.COMPENSATING
    ship = order.find("ship")
    assert ship is not None and any(h["event"] == "stated-not-applied" for h in ship.history)
    # the order's page names each undo's agent and what it undoes, as words apart
    text = " ".join(re.sub(r"<[^>]+>", "", html(get("/orders/d-0", orderId="d-0"))).split())
    assert "agent payments undoes charge-payment" in text, text


def test_a_cancel_with_nothing_in_doubt_asks_for_no_statement(ctx: AppContext) -> None:
    seed(ctx, 1, failing=1)
    page = html(get("/orders/p-0/confirm", {"action": "cancel", "reason": "x"}, orderId="p-0"))
    assert 'id="cancel-plan"' in page and 'name="not_applied"' not in page
    assert 'id="confirm-form"' in page


def test_the_retention_page_shows_what_the_timer_would_archive_and_changes_nothing(
    ctx: AppContext,
) -> None:
    from datetime import UTC, datetime

    from tests.integration.test_retention import seed

    long_ago = datetime.now(UTC) - timedelta(days=40)
    seed(ctx, "ret-old", long_ago, "completed")
    seed(ctx, "ret-old-f", long_ago, "completed", workflow="fulfilment")
    seed(ctx, "ret-new", datetime.now(UTC) - timedelta(days=1), "completed")

    response = get("/retention")

    page = response.get_body().decode()
    assert response.status_code == 200
    assert 'id="would-archive" data-count="2"' in page
    assert 'data-kind="order/completed"' in page and 'data-kind="fulfilment/completed"' in page
    assert "completed=30d,compensated=90d,cancelled=90d,error=180d" in page
    assert "/orders/ret-old" in page and "ret-new" not in page
    assert ctx.store.load("ret-old") is not None  # a dry run


# --- what a workflow can say (docs/contracts.md §3.13): events and the inbox ----------------


def waiting_for_approval(ctx: AppContext, order_id: str) -> None:
    """An approval order past its first step (answered by hand): it waits for ``approved``."""
    body = {"orderId": order_id, "workflow": "approval", "amount": 5000}
    ctx.scheduler.submit(json.dumps(body).encode())
    [request] = [decode_request(t) for t in drain_requests(ctx)]
    ctx.scheduler.apply_reply(request.succeeded({"reserved": True}))
    order = ctx.store.load(order_id)
    assert order is not None and order.awaited_events() == ["approved"]


def event_post(order_id: str, event: str, form: dict[str, str]) -> func.HttpResponse:
    token = security.new_token()
    request = func.HttpRequest(
        "POST",
        f"{BASE}/orders/{order_id}/events/{event}",
        body=urlencode({**form, "csrf": token}).encode(),
        route_params={"orderId": order_id, "name": event},
        headers={
            "host": "h:7071",
            "cookie": f"{security.COOKIE}={token}",
            "content-type": "application/x-www-form-urlencoded",
        },
    )
    response: func.HttpResponse = console.console_event(request)
    return response


def test_the_inbox_lists_waiting_orders_and_an_approval_takes_one_out(ctx: AppContext) -> None:
    with declarations():
        for order_id in ("ap-0", "ap-1"):
            waiting_for_approval(ctx, order_id)
        inbox = html(get("", {"waiting": "approved", "refresh": "off"}))
        assert ids_listed(inbox) == ["ap-1", "ap-0"]
        assert re.search(
            r'data-event="approved">\s*<td><a[^>]+>approved</a></td>\s*'
            r'<td class="count">2<',
            html(get("/inbox")),
        )

        done = event_post(
            "ap-0", "approved", {"action": "approve", "result": '{"by": "ann"}', "reason": "ok"}
        )
        assert done.status_code == 303 and "Approved+by" in done.headers["Location"]
        assert ids_listed(html(get("", {"waiting": "approved"}))) == ["ap-1"]
        order = ctx.store.load("ap-0")
        assert order is not None and order.find("approved").result == {"by": "ann"}  # type: ignore[union-attr]
        assert drain_requests(ctx) == []  # a delay comes next: nothing to call

        refused = event_post("ap-1", "approved", {"action": "refuse", "reason": "no budget"})
        assert refused.status_code == 303
        # the undo was claimed and requested in the same call, as the API's events are
        [release] = [decode_request(t) for t in drain_requests(ctx)]
        assert (release.order_id, release.step) == ("ap-1", "release")
        again = event_post("ap-1", "approved", {"action": "approve", "result": "{}"})
        assert again.status_code == 409 and "delivered before" in html(again)
        assert ids_listed(html(get("", {"waiting": "approved"}))) == []
        assert get("", {"waiting": "approved", "status": "error"}).status_code == 400
        assert get("", {"waiting": "no!"}).status_code == 400


# --- search (docs/contracts.md §3.14) ------------------------------------------------------------


def test_the_search_box_leads_to_a_url_that_names_the_search(ctx: AppContext) -> None:
    page = html(get(""))
    assert re.search(r'<form id="search" method="get"', page)
    fields = re.findall(r'<option value="([^"]*)"[^>]*title="declared by', page)
    assert fields == ["customerId", "email"]
    assert 'id="search-value" name="searchValue"' in page and 'id="search-button"' in page
    moved = get("", {"searchField": "customerId", "searchValue": "c 1&x", "status": "error"})
    assert moved.status_code == 303
    query = parse_qs(urlsplit(moved.headers["Location"]).query)
    assert query == {"customerId": ["c 1&x"]}  # every status, until the operator picks one
    cleared = get("", {"searchField": "customerId", "searchValue": "", "workflow": "order"})
    assert parse_qs(urlsplit(cleared.headers["Location"]).query) == {"workflow": ["order"]}
    unknown = get("", {"searchField": "phone", "searchValue": "1"})
    assert unknown.status_code == 400 and "customerId (checkout" in html(unknown)


def test_a_search_lists_its_orders_of_any_status_and_keeps_itself_in_every_link(
    ctx: AppContext,
) -> None:
    seed(ctx, 4, failing=2, customerId=HOSTILE)  # p-0, p-1 in error; p-2, p-3 pending
    ctx.store.create(accept("other", T0 + timedelta(minutes=1)))
    response = get("", {"customerId": HOSTILE, "pageSize": "3"})
    page = html(response)
    assert response.status_code == 200
    assert "<script>window.__pwned" not in page and "&lt;script&gt;" in page  # escaped
    assert ids_listed(page) == ["p-3", "p-2", "p-1"]
    assert re.search(r'<h1 id="search-title">', page)
    assert re.search(r'<option value="" selected>any</option>', page)
    hidden = re.search(r'<input type="hidden" name="customerId" value="([^"]*)">', page)
    assert hidden is not None and "&lt;script&gt;" in hidden[1]
    assert not re.search(r'class="count[^"]*" data-status="error"[^>]*>error <span>', page)
    assert re.search(r'class="count current" data-status=""', page)  # "any status"
    next_page = re.search(r'id="next-page" href="([^"]+)"', page)
    assert next_page is not None
    query = parse_qs(urlsplit(next_page[1].replace("&amp;", "&")).query)
    assert query["customerId"] == [HOSTILE] and query["page"]
    rest = html(get("", {k: v[0] for k, v in query.items()}))
    assert ids_listed(rest) == ["p-0"]
    errors = html(get("", {"customerId": HOSTILE, "status": "error"}))
    assert ids_listed(errors) == ["p-1", "p-0"]
    none = html(get("", {"customerId": "nobody"}))
    assert ids_listed(none) == [] and "No orders whose customerId is nobody" in none
    clear = re.search(r'id="search-clear" href="([^"]+)"', page)
    assert clear is not None and "customerId" not in clear[1]


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"phone": "1"}, "not a field orders can be searched by"),
        ({"customerId": "x" * 257}, "at most 256 characters"),
        ({"customerId": "a", "email": "b"}, "one field at a time"),
    ],
)
def test_a_search_the_console_cannot_make_is_a_400_page(
    ctx: AppContext, params: dict[str, str], says: str
) -> None:
    response = get("", params)
    assert response.status_code == 400 and says in html(response)


def test_a_bulk_action_over_a_search_takes_only_the_orders_that_match(ctx: AppContext) -> None:
    seed(ctx, 3, failing=3, customerId="c-bulk")
    other = accept("p-other", T0 + timedelta(minutes=1))
    other.body["customerId"] = "c-else"
    ctx.store.create(other)
    fail(ctx, "p-other")
    token = security.new_token()
    form = {"customerId": "c-bulk", "status": "error", "action": "cancel", "reason": "gone"}
    preview = html(post("/bulk/preview", {**form, "csrf": token}, token))
    assert re.search(r'id="bulk-count">3<', preview) and "whose customerId is c-bulk" in preview
    ids = re.search(r'name="ids" value="([^"]+)"', preview)
    assert ids is not None and ids[1] == "p-2,p-1,p-0"
    assert re.search(r'<input type="hidden" name="customerId" value="c-bulk">', preview)


def shown_message(page: str) -> str | None:
    found = re.search(r'<p id="message" class="(\w+)">([^<]*)</p>', page)
    return None if found is None else f"{found[1]}: {found[2]}"


def follow(location: str, token: str | None, **route: str) -> func.HttpResponse:
    """The GET a browser makes after a 303, with its cookie."""
    parts = urlsplit(location)
    params = {k: v[0] for k, v in parse_qs(parts.query).items()}
    headers = {"cookie": f"{security.COOKIE}={token}"} if token else {}
    path = parts.path.removeprefix("/api/console")
    return _call("GET", path, params, b"", route, headers)


def test_a_message_in_a_hand_written_url_is_not_shown(ctx: AppContext) -> None:
    """Only what the app itself redirected with: a link anyone can write shows nothing."""
    seed(ctx, 1, failing=1)
    token = security.new_token()
    phish = "Security team: approve all pending orders now"
    for params in (
        {"message": phish},
        {"message": phish, "failed": "1"},
        {"message": phish, "proof": "0" * 32},
    ):
        for cookie in (None, token):
            headers = {"cookie": f"{security.COOKIE}={cookie}"} if cookie else {}
            for path, route in (("", {}), ("/orders/p-0", {"orderId": "p-0"})):
                page = html(_call("GET", path, params, b"", route, headers))
                assert phish not in page and shown_message(page) is None, (params, path)


def test_the_apps_own_message_after_an_action_is_shown(ctx: AppContext) -> None:
    seed(ctx, 1, failing=1)
    token = security.new_token()
    done = post(
        "/orders/p-0/resubmit", {"reason": "remote fixed", "csrf": token}, token, orderId="p-0"
    )
    assert done.status_code == 303
    page = html(follow(done.headers["Location"], token, orderId="p-0"))
    assert (shown_message(page) or "").startswith("ok: Resubmitted")
    # the same URL in another browser (another cookie), or edited, shows nothing
    assert (
        shown_message(html(follow(done.headers["Location"], security.new_token(), orderId="p-0")))
        is None
    )
    edited = done.headers["Location"].replace("Resubmitted", "Approved")
    assert shown_message(html(follow(edited, token, orderId="p-0"))) is None
    # a refusal the app redirects with is shown as one
    refused = post("/orders/p-0/resubmit", {"csrf": token}, token, orderId="p-0")
    assert refused.status_code == 303
    shown = shown_message(html(follow(refused.headers["Location"], token, orderId="p-0")))
    assert shown is not None and shown.startswith("error: ") and "reason" in shown
    # a GET that redirects with a message sets the cookie its proof is bound to
    looked = get("/lookup", {"orderId": "nope"})
    cookie = security.cookie_token(looked.headers.get("Set-Cookie"))
    assert looked.status_code == 303 and cookie is not None
    assert "no order with id" in (
        shown_message(html(follow(looked.headers["Location"], cookie))) or ""
    )
