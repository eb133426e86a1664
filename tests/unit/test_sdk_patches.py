"""The azure-core workarounds are active for the pinned version, and only for it, and
write and read table transactions as azure-core's own code does."""

from __future__ import annotations

import base64
import email
from datetime import UTC, datetime
from typing import Any

import azure.core
import pytest
from azure.core.pipeline import _base as pipeline_base
from azure.core.pipeline.transport import HttpTransport
from azure.data.tables import TableClient, UpdateMode

from stores import sdk_patches, table_transactions


def test_the_patch_is_applied_to_the_pinned_azure_core() -> None:
    # If this fails after an upgrade, re-check azure-core's multipart code and the patch.
    assert azure.core.__version__ == sdk_patches.PATCHED_VERSION
    assert sdk_patches.apply()
    assert pipeline_base.Pipeline._prepare_multipart_mixed_request is (
        sdk_patches._prepare_multipart_mixed_request
    )


def test_another_version_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk_patches, "_applied", False)
    monkeypatch.setattr(azure.core, "__version__", "9.9.9")
    assert sdk_patches.apply() is False


class _Capture(HttpTransport):  # type: ignore[type-arg]
    """Keeps the request the pipeline prepared; answers nothing."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.requests.append(request)
        raise _Sent

    def open(self) -> None: ...
    def close(self) -> None: ...
    def __exit__(self, *args: Any) -> None: ...


class _Sent(Exception):
    pass


def _transaction_request(body: dict[str, Any]) -> Any:
    transport = _Capture()
    table = TableClient.from_connection_string(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
        + base64.b64encode(b"k" * 32).decode()
        + ";TableEndpoint=http://127.0.0.1:1/devstoreaccount1;",
        "Orders",
        transport=transport,
    )
    operations: list[Any] = [
        ("create", {"PartitionKey": "p", "RowKey": "a", **body}),
        ("update", {"PartitionKey": "p", "RowKey": "b", **body}, {"mode": UpdateMode.REPLACE}),
        ("delete", {"PartitionKey": "p", "RowKey": "c"}),
    ]
    with pytest.raises(_Sent):  # the SDK's own writer (stores/table_transactions.py aside)
        table_transactions._original(table, operations)
    return transport.requests[-1]


@pytest.mark.parametrize(
    "body",
    [
        {"Body": '{"orderId": "o-1", "amount": 10}', "N": 3},
        {"Body": "caf\u00e9 \u2603 \U0001f600", "When": datetime(2026, 1, 2, tzinfo=UTC)},
        {"Body": "a bare\nnewline and a bare\rreturn"},  # azure-core's own code writes it
        {"Body": "From the start\r\n--batch_lookalike\r\n"},
    ],
)
def test_the_transaction_body_is_byte_for_byte_azure_cores(body: dict[str, Any]) -> None:
    assert sdk_patches.apply()
    request = _transaction_request(body)
    sdk_patches._original_prepare_body(request)
    theirs = (request.content, request.headers["Content-Type"])
    sdk_patches._prepare_multipart_body_helper(request)
    assert (request.content, request.headers["Content-Type"]) == theirs


def _as_email(parts: list[Any]) -> list[Any]:
    return [
        (p.get_content_type(), _as_email(p.get_payload()))
        if p.is_multipart()
        else (p.get_content_type(), p.get_payload(decode=True))
        for p in parts
    ]


def _as_fast(parts: list[Any]) -> list[Any]:
    return [
        (p.get_content_type(), _as_fast(p.payload) if isinstance(p.payload, list) else p.payload)
        for p in parts
    ]


def test_the_transaction_answer_splits_as_email_splits_it() -> None:
    part = (
        "--changesetresponse_c\r\nContent-Type: application/http\r\n"
        "Content-Transfer-Encoding: binary\r\n\r\n"
        "HTTP/1.1 {status}\r\nContent-Type: application/json;odata=minimalmetadata\r\n"
        "ETag: W/\"datetime'2026-11-24T04%3A00%3A00.1Z'\"\r\n\r\n{body}\r\n"
    )
    changeset = "".join(
        part.format(status=s, body=b)
        for s, b in [("204 No Content", ""), ("412 Precondition Failed", '{"odata.error": 1}')]
    )
    body = (
        "--batchresponse_b\r\nContent-Type: multipart/mixed; boundary=changesetresponse_c\r\n\r\n"
        f"{changeset}--changesetresponse_c--\r\n--batchresponse_b--\r\n"
    ).encode()
    fast = sdk_patches._split(body, "batchresponse_b")
    assert fast is not None
    parsed = email.message_from_bytes(
        b"Content-Type: multipart/mixed; boundary=batchresponse_b\r\n\r\n" + body
    )
    assert _as_fast(fast) == _as_email(list(parsed.get_payload()))
    assert sdk_patches._split(body.replace(b"\r\n", b"\n"), "batchresponse_b") is None


@pytest.mark.parametrize(
    "body",
    [
        {"Body": '{"orderId": "o-1", "amount": 10}', "N": 3},
        {"Body": "caf\u00e9 \u2603 \U0001f600", "When": datetime(2026, 1, 2, tzinfo=UTC)},
        {"Body": "a bare\nnewline and a bare\rreturn"},
    ],
)
def test_each_operation_is_written_as_azure_core_writes_it(body: dict[str, Any]) -> None:
    request = _transaction_request(body)
    operations = request.multipart_mixed_info[0][0].multipart_mixed_info[0]
    assert len(operations) == 3
    for operation in operations:
        assert sdk_patches._serialize_request(operation) == sdk_patches._original_serialize(
            operation
        )


@pytest.mark.parametrize(
    ("method", "url", "headers", "body"),
    [
        ("GET", "http://h/t(PartitionKey='p')", {"Accept": "application/json"}, None),
        ("POST", "http://h/t", {"Host": "x", "Accept-Encoding": "gzip", "X-A": "1"}, None),
        ("POST", "http://h/t", {"host": "x", "accept-encoding": "gzip"}, b""),
        ("PUT", "http://h/t", {"Content-Length": "3"}, b"abc"),
        ("PUT", "http://h/t", {"X-Content": "1", "-Length-Of-It": "2"}, b"abc"),
        ("PUT", "http://h/t", {"X-Bad Name": "1"}, b"abc"),
        ("PUT", "http://h/t", {"X-Tab": "a\tb"}, b"abc"),
        ("PATCH", "http://h/t", {"Transfer-Encoding": "chunked"}, b"abc"),
        ("DELETE", "http://h/t", {}, None),
        ("MERGE", "http://h/t", {"If-Match": "*"}, '{"a": 1}'),
        ("PUT", "http://h/caf\u00e9", {}, b"x"),  # not ASCII: azure-core's own code
        ("PUT", "http://h/t", {"X-Name": "caf\u00e9"}, b"x"),
        ("PUT", "http://h/t", {}, "caf\u00e9"),
    ],
)
def test_a_request_is_written_as_http_client_writes_it(
    method: str, url: str, headers: dict[str, str], body: Any
) -> None:
    from azure.core.rest import HttpRequest

    request = HttpRequest(method, url, headers=headers)
    request._data = body  # the raw body, as the table builders leave it
    try:
        theirs: Any = sdk_patches._original_serialize(request)
    except Exception as exc:
        with pytest.raises(type(exc)):
            sdk_patches._serialize_request(request)
    else:
        assert sdk_patches._serialize_request(request) == theirs


def test_the_batch_request_is_sent_as_built() -> None:
    from azure.data.tables._generated import _client as tables_client

    assert sdk_patches.apply()
    assert tables_client.AzureTable.send_request is sdk_patches._send_request_as_built
    request = _transaction_request({"Body": "x"})
    assert request.url.endswith("/$batch")
