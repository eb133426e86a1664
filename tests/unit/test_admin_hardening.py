"""The operator API's edges: continuation tokens, who the caller is, and honest errors.

The HTTP functions are called directly with ``azure.functions.HttpRequest`` on a
stub context (no storage): a bad token is refused before any I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import azure.functions as func
import pytest

from admin import __main__ as cli
from admin import triggers
from admin.service import OrderAdmin
from bootstrap import reset_app_context
from config.principals import OPERATOR, READER, SignIn
from core.errors import (
    ConcurrencyConflict,
    CorruptOrder,
    InvalidContinuationToken,
    OrderNotFound,
    StorageUnavailable,
    TransitionRefused,
)
from core.names import Names
from messaging.outbox import NoticeSender
from stores import layout
from stores.listing import format_token, parse_token
from stores.tables import TableStateStore
from tests.support import SIGNED_IN, client_principal, settings_from

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)

BAD_TOKENS = [
    "-17:-",  # a negative shard (used to re-read shards, or IndexError: a 500)
    "-1:-",
    "16:-",  # past the last shard
    "99:-",
    "1000:-",
    "03:-",  # not the canonical number
    "+3:-",
    " 3:-",
    "3 :-",
    "٣:-",  # a digit, but not an ASCII one
    "3",
    "3:",
    ":-",
    "-",
    "abc",
    "3:--",
    "3:- ",
    "3:{",
    "3:null",
    "3:[]",
    "3:1",
    '3:"x"',
    "3:{}",
    '3:{"PartitionKey": "a"}',
    '3:{"PartitionKey": "a", "RowKey": "b", "Extra": 1}',
    '3:{"PartitionKey": 1, "RowKey": "b"}',  # a non-string value
    '3:{"PartitionKey": "a", "RowKey": ["b"]}',
    '3:{"PartitionKey": null, "RowKey": null}',
    '3:{"PartitionKey": "a", "RowKey": ""}',
    '3:{"PartitionKey": "a b", "RowKey": "c"}',  # not printable ASCII without spaces
    '3:{"PartitionKey": "a", "RowKey": "caf\\u00e9"}',
    '3:{"PartitionKey": "a", "RowKey": "\\ud800"}',  # a lone surrogate
    '3:{"PartitionKey": "a", "RowKey": "b\\u0000"}',
    '3:{"PartitionKey": "a", "PartitionKey": "a", "RowKey": "b"}',  # a repeated key
    '3:{"PartitionKey": "a", "RowKey": "' + "x" * 1025 + '"}',
    "3:" + "[" * 5000,  # deep nesting
    "3:" + "[" * 1000 + "]" * 1000,
    "3:" + "x" * 5000,  # too long
    "3:NaN",
    # the newest-first key part: 13 digits, a bar, an order id (or ~ and an order id)
    "123|o-1",
    "00000000000001|o-1",
    "0000000000000|",
    "0000000000000|o 1",
    "0000000000000|o-1|x",
    "0000000000000|" + "x" * 65,
    "٣" * 13 + "|o-1",
    "~",
    "~o 1",
    "~o-1\n",
    "o-1",
    "status|error|0000000000000|o-1",
]


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_the_parser_refuses_every_bad_token(token: str) -> None:
    with pytest.raises(InvalidContinuationToken, match="continuationToken is not one"):
        parse_token(token)


@pytest.mark.parametrize(
    ("key_part", "token"),
    [
        (f"{layout.newest_first(T0)}|o-9", f"{layout.newest_first(T0)}|o-9"),
        ("0000000000000|A_z-0", "0000000000000|A_z-0"),
        ("o-1", "~o-1"),  # a row from before the time part
        ("123", "~123"),
    ],
)
def test_the_parser_accepts_what_the_store_hands_out(key_part: str, token: str) -> None:
    assert format_token(key_part) == token
    assert parse_token(token) == key_part


def test_newest_first_keys_sort_later_times_first() -> None:
    times = [T0 + timedelta(milliseconds=n) for n in (0, 1, 999, 86_400_000)]
    keys = [layout.newest_first(t) for t in times]
    assert keys == sorted(keys, reverse=True) and len(set(map(len, keys))) == 1


# --- through the HTTP function ------------------------------------------------------------


class StubAdmin:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def _do(self, name: str, *args: Any) -> dict[str, Any]:
        self.calls.append((name, args))
        if self.error is not None:
            raise self.error
        return {"orderId": args[0], "status": "processing"}

    def show(self, order_id: str) -> dict[str, Any]:
        return self._do("show", order_id)

    def resubmit(
        self,
        order_id: str,
        by: str,
        reason: str = "",
        patch: Any = None,
        if_version: int | None = None,
    ) -> dict[str, Any]:
        return self._do("resubmit", order_id, by)

    def cancel(
        self,
        order_id: str,
        by: str,
        reason: str = "",
        not_applied: str | None = None,
        if_version: int | None = None,
    ) -> dict[str, Any]:
        if not_applied is not None:
            return self._do("cancel", order_id, by, reason, not_applied)
        return self._do("cancel", order_id, by, reason)


class StubContext:
    def __init__(self, admin: Any) -> None:
        self.admin = admin
        self.settings: Any = SimpleNamespace(sign_in=SignIn())  # no sign-in, read once
        self.archived: dict[str, dict[str, str]] = {}
        self.retainer = SimpleNamespace(where=self.archived.get)


class NoTable:
    """A table that must never be reached: a bad token is refused first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the table was used ({name}) for a request that is refused")


def real_admin() -> OrderAdmin:
    store = TableStateStore(NoTable())  # type: ignore[arg-type]
    return OrderAdmin(store, NoticeSender(store, None, Names()), lambda _: None, lambda: T0)  # type: ignore[arg-type]


@pytest.fixture
def context() -> Iterator[StubContext]:
    stub = StubContext(StubAdmin())
    reset_app_context(stub)  # type: ignore[arg-type]
    try:
        yield stub
    finally:
        reset_app_context(None)


def get(url: str, params: dict[str, str]) -> func.HttpRequest:
    return func.HttpRequest("GET", url, params=params, body=b"")


def post(
    order_id: str, action: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> func.HttpRequest:
    return func.HttpRequest(
        "POST",
        f"/api/orders/{order_id}/{action}",
        headers=headers or {},
        route_params={"orderId": order_id},
        body=body,
    )


def answer(response: func.HttpResponse) -> tuple[int, dict[str, Any]]:
    assert response.mimetype == "application/json"
    return response.status_code, json.loads(response.get_body())


@pytest.mark.parametrize("token", BAD_TOKENS)
def test_every_bad_token_is_a_400_with_a_json_error(context: StubContext, token: str) -> None:
    context.admin = real_admin()

    status, body = answer(
        triggers.list_orders(get("/api/orders", {"status": "error", "continuationToken": token}))
    )

    assert status == 400
    assert "continuationToken" in body["error"]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"status": "nope"}, "status"),
        ({}, "status"),
        ({"status": "error", "pageSize": "ten"}, "pageSize"),
        ({"status": "error", "pageSize": "9" * 5000}, "pageSize"),
    ],
)
def test_bad_query_strings_are_400s(
    context: StubContext, params: dict[str, str], fragment: str
) -> None:
    context.admin = real_admin()

    status, body = answer(triggers.list_orders(get("/api/orders", params)))

    assert status == 400 and fragment in body["error"]


# --- who did it ---------------------------------------------------------------------------


ALICE = client_principal("alice@contoso.com", OPERATOR)
FORGED = client_principal("mallory@contoso.com", OPERATOR)
NO_AUTH: dict[str, str] = {}
PLATFORM_ONLY = {"WEBSITE_AUTH_ENABLED": "True"}  # no SIGN_IN_CLIENT_ID: not believed
CONFIGURED_OFF = {"SIGN_IN_CLIENT_ID": SIGNED_IN["SIGN_IN_CLIENT_ID"]}  # module off


@pytest.mark.parametrize(
    ("env", "headers", "expected"),
    [
        (NO_AUTH, {}, "function-key"),
        (NO_AUTH, {"x-operator": "alice"}, "function-key (claims: alice)"),
        (NO_AUTH, {"x-ms-client-principal-name": "mallory"}, "function-key (claims: mallory)"),
        # a principal header no platform wrote is the client's own: a claim at most
        (NO_AUTH, FORGED, "function-key (claims: mallory@contoso.com)"),
        (PLATFORM_ONLY, FORGED, "function-key (claims: mallory@contoso.com)"),
        (SIGNED_IN, ALICE, "alice@contoso.com"),
        (SIGNED_IN, {**ALICE, "x-operator": "bob"}, "alice@contoso.com"),
        (NO_AUTH, {"x-operator": "  \u2028 eve\n\x00  "}, "function-key (claims: eve)"),
        (NO_AUTH, {"x-operator": "x" * 500}, f"function-key (claims: {'x' * 64})"),
        (NO_AUTH, {"x-operator": "\n\t"}, "function-key"),
        # sign-in configured: a change needs a person with the operator role
        (SIGNED_IN, {"x-operator": "bob"}, None),
        (SIGNED_IN, client_principal("rita@contoso.com", READER), None),
        (CONFIGURED_OFF, FORGED, None),
    ],
)
def test_the_caller_is_whoever_the_platform_vouches_for(
    context: StubContext, env: dict[str, str], headers: dict[str, str], expected: str | None
) -> None:
    context.settings = settings_from(
        {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "AGENT_TRANSPORT": "storage"} | env
    )

    answers = [
        triggers.resubmit_order(post("o-1", "resubmit", headers)),
        triggers.cancel_order(post("o-1", "cancel", headers, b'{"reason": "duplicate"}')),
    ]

    if expected is None:
        assert [a.status_code for a in answers] == [403, 403]
        assert all(json.loads(a.get_body())["role"] == OPERATOR for a in answers)
        assert context.admin.calls == []
        return
    assert context.admin.calls == [
        ("resubmit", ("o-1", expected)),
        ("cancel", ("o-1", expected, "duplicate")),
    ]


# --- honest errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (OrderNotFound("no order with id 'o-1'", order_id="o-1"), 404),
        (TransitionRefused("not-in-error", "order o-1 is not in error"), 409),
        (
            StorageUnavailable(
                "the outcome of the write to order o-1 is unknown: ... retry if it did not change"
            ),
            503,
        ),
        (ConcurrencyConflict("order o-1 kept changing; try again"), 503),
        (CorruptOrder("order o-1's stored records cannot be read", order_id="o-1"), 500),
    ],
)
def test_domain_errors_have_their_status_and_a_json_error(
    context: StubContext, error: Exception, status: int
) -> None:
    context.admin = StubAdmin(error)

    for request, handler in (
        (post("o-1", "resubmit"), triggers.resubmit_order),
        (post("o-1", "cancel"), triggers.cancel_order),
        (post("o-1", "show"), triggers.get_order),
    ):
        code, body = answer(handler(request))
        assert (code, body["error"], body["orderId"]) == (status, str(error), "o-1")


def test_an_archived_order_is_a_404_that_says_where_it_went(context: StubContext) -> None:
    context.admin = StubAdmin(OrderNotFound("no order with id 'o-1'", order_id="o-1"))
    context.archived["o-1"] = {
        "archivedAt": "2026-11-24T12:00:00.000Z",
        "blob": "orders-archive/order/2026/09/01/run-000.jsonl.gz",
    }

    code, body = answer(triggers.get_order(post("o-1", "show")))

    assert code == 404 and body["orderId"] == "o-1"
    assert (
        "archived on 2026-11-24T12:00:00.000Z to orders-archive/order/2026/09/01/"
        in (body["error"])
    )
    assert "python -m admin restore o-1" in body["error"]


def test_an_unknown_outcome_is_503_with_retry_after(context: StubContext) -> None:
    context.admin = StubAdmin(StorageUnavailable("the outcome of the write is unknown"))

    response = triggers.resubmit_order(post("o-1", "resubmit"))

    assert response.status_code == 503
    assert response.headers["Retry-After"].isdigit()
    assert json.loads(response.get_body())["retryable"] is True


# --- the command line ------------------------------------------------------------------------


@pytest.fixture
def cli_admin(monkeypatch: pytest.MonkeyPatch) -> StubAdmin:
    admin = StubAdmin()
    monkeypatch.setattr(cli, "_context", lambda connection: StubContext(admin))
    return admin


def test_the_cli_records_the_os_user_or_as(
    cli_admin: StubAdmin, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("getpass.getuser", lambda: "carol")

    assert cli.main(["resubmit", "o-1"]) == 0
    assert cli.main(["resubmit", "o-1", "--as", "dave"]) == 0
    assert cli.main(["cancel", "o-1", "--by", "erin", "--reason", "dup"]) == 0

    assert cli_admin.calls == [
        ("resubmit", ("o-1", "carol")),
        ("resubmit", ("o-1", "dave")),
        ("cancel", ("o-1", "erin", "dup")),
    ]


def test_the_cli_survives_a_user_without_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def nameless() -> str:
        raise KeyError("getpwuid(): uid not found: 1234")

    monkeypatch.setattr("getpass.getuser", nameless)

    assert cli.os_user().startswith(("uid-", "unknown-user"))


def test_the_cli_exits_non_zero_with_the_sentence_when_the_outcome_is_unknown(
    cli_admin: StubAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    sentence = "the outcome of the write to order o-1 is unknown: read the order, then retry"
    cli_admin.error = StorageUnavailable(sentence)

    code = cli.main(["resubmit", "o-1", "--as", "dave"])

    out, err = capsys.readouterr()
    assert code == 3
    assert json.loads(out)["error"] == sentence
    assert sentence in err


def test_the_cli_refuses_a_bad_token_as_bad_usage(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_context", lambda connection: StubContext(real_admin()))

    code = cli.main(["list", "--status", "error", "--token=-17:-"])

    assert code == 2
    assert "continuationToken" in json.loads(capsys.readouterr().out)["error"]


# --- one alert per bad order per process --------------------------------------------------------


class Queues:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []
        self.fail = fail

    def send(self, queue: str, body: str, delay_seconds: float = 0) -> None:
        if self.fail:
            raise StorageUnavailable("queue down")
        self.sent.append((queue, body))


def test_alert_once_alerts_once_and_forgets_the_oldest(monkeypatch: pytest.MonkeyPatch) -> None:
    from messaging import outbox as notices

    monkeypatch.setattr(notices, "ALERTED_MEMORY", 3)
    queues = Queues()
    sender = NoticeSender(None, queues, Names())  # type: ignore[arg-type]

    sent = [sender.alert_once(f"o-{n}", "process", "corrupt", T0) for n in (1, 1, 2, 3, 4, 1)]

    assert sent == [True, False, True, True, True, True]  # o-1 was forgotten after o-4
    assert [json.loads(body)["orderId"] for _, body in queues.sent] == [
        "o-1",
        "o-2",
        "o-3",
        "o-4",
        "o-1",
    ]
    queue, body = queues.sent[0]
    assert queue == "operator-alerts"
    assert json.loads(body) == {
        "kind": "order",
        "orderId": "o-1",
        "step": "process",
        "reason": "corrupt",
        "failureCount": 0,
        "at": "2026-11-22T10:00:00.000Z",
    }


def test_an_alert_that_did_not_go_out_is_tried_again() -> None:
    queues = Queues(fail=True)
    sender = NoticeSender(None, queues, Names())  # type: ignore[arg-type]

    with pytest.raises(StorageUnavailable):
        sender.alert_once("o-1", "process", "corrupt", T0)
    queues.fail = False

    assert sender.alert_once("o-1", "process", "corrupt", T0) is True
    assert len(queues.sent) == 1


def test_alert_now_logs_the_operator_alert_record(caplog: pytest.LogCaptureFixture) -> None:
    sender = NoticeSender(None, Queues(), Names())  # type: ignore[arg-type]

    with caplog.at_level("ERROR"):
        sender.alert_now("o-1", "process", "cannot be read", T0)

    [record] = [r for r in caplog.records if "OPERATOR ALERT" in r.getMessage()]
    assert record.getMessage().startswith(
        "OPERATOR ALERT order=o-1 step=process failureCount=0: cannot be read"
    )
    assert record.levelname == "ERROR"
