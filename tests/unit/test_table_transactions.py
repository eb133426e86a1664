"""Table transactions written directly (``stores/table_transactions.py``) put the same
bytes on the wire as azure-data-tables, return the same results and raise the same
errors; what they do not write goes to the SDK."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError
from azure.data.tables import EdmType, TableClient, TableTransactionError, UpdateMode
from azure.data.tables import _base_client as tables_base

from bootstrap import clients
from core.settings import Connection
from stores import sdk_patches, table_transactions
from tests.loopback import Server

KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
ETAG = "W/\"datetime'2026-11-24T10%3A14%3A00.0825169Z'\""


def _answer(parts: list[bytes]) -> bytes:
    """A 202 batch answer with these changeset parts (each an HTTP response)."""
    body = (
        b"--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_1\r\n\r\n"
    )
    for part in parts:
        body += (
            b"--changesetresponse_1\r\nContent-Type: application/http\r\n"
            b"Content-Transfer-Encoding: binary\r\n\r\n" + part + b"\r\n"
        )
    body += b"--changesetresponse_1--\r\n--batchresponse_1--\r\n"
    return (
        b"HTTP/1.1 202 Accepted\r\n"
        b"Content-Type: multipart/mixed; boundary=batchresponse_1\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _succeeded(request: bytes) -> bytes:
    count = request.count(b"Content-ID: ")
    return _answer(
        [
            f"HTTP/1.1 204 No Content\r\nCache-Control: no-cache\r\n"
            f"ETag: W/\"datetime'2026-11-24T10%3A14%3A0{i}Z'\"\r\n\r\n".encode()
            for i in range(count)
        ]
    )


def _refused(status: str, code: str, message: str) -> Callable[[bytes], bytes]:
    error = json.dumps(
        {"odata.error": {"code": code, "message": {"lang": "en-US", "value": message}}}
    ).encode()
    part = (
        f"HTTP/1.1 {status}\r\n"
        "Content-Type: application/json;odata=minimalmetadata;streaming=true;charset=utf-8\r\n"
        f"x-ms-error-code: {code}\r\n\r\n"
    ).encode() + error
    return lambda _: _answer([part])


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server(_succeeded)
    yield s
    s.close()


@pytest.fixture
def table(server: Server, monkeypatch: pytest.MonkeyPatch) -> TableClient:
    assert sdk_patches.apply()
    # One boundary and one date for both writers, so their bytes can be compared.
    fixed = uuid.UUID("12345678-1234-5678-1234-567812345678")
    monkeypatch.setattr(uuid, "uuid4", lambda: fixed)
    monkeypatch.setattr(tables_base, "uuid4", lambda: fixed)
    monkeypatch.setattr(time, "time", lambda: 1_795_000_000.0)
    connection = Connection(
        name="Storage",
        connection_string=(
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
            f"TableEndpoint={server.url('/devstoreaccount1')}"
        ),
    )
    return clients.table_service(connection).get_table_client("Orders")


def _sdk(table: TableClient, operations: list[Any]) -> Any:
    return table_transactions._original(table, operations)


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except Exception as exc:
        return (
            type(exc),
            str(exc).split("\nRequestId")[0],
            getattr(exc, "status_code", None),
            getattr(exc, "error_code", None),
            getattr(exc, "index", None),
        )


def _both(server: Server, table: TableClient, operations: list[Any]) -> tuple[Any, Any]:
    theirs = _outcome(lambda: _sdk(table, operations))
    ours = _outcome(lambda: table.submit_transaction(operations))
    return theirs, ours


def _request(raw: bytes) -> tuple[list[bytes], bytes]:
    """The headers that describe the body (signing and ids aside), and the body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    keep: tuple[bytes, ...] = (b"content-type", b"content-length", b"x-ms-version")
    keep = (*keep, b"dataserviceversion", b"maxdataserviceversion", b"accept:", b"post ")
    return sorted(line for line in head.split(b"\r\n") if line.lower().startswith(keep)), body


def _entity(row: str, **values: Any) -> dict[str, Any]:
    return {"PartitionKey": "s'01", "RowKey": row, **values}


OPERATIONS: dict[str, list[Any]] = {
    "every kind the store writes": [
        ("create", _entity("order|o-1|order", Status="Running", Version=3, Seq=1)),
        (
            "update",
            _entity("order|o-1|step|001", State="Done", At=datetime(2026, 1, 2, tzinfo=UTC)),
            {
                "mode": UpdateMode.REPLACE,
                "etag": ETAG,
                "match_condition": MatchConditions.IfNotModified,
            },
        ),
        (
            "update",
            _entity("order|o-1|step|002", Attempt=2),
            {
                "mode": UpdateMode.MERGE,
                "etag": ETAG,
                "match_condition": MatchConditions.IfNotModified,
            },
        ),
        ("upsert", _entity("idx|Running|o-1", Order="o-1"), {"mode": UpdateMode.REPLACE}),
        ("upsert", _entity("idx|x", Order="o-1")),  # merge, the SDK's default
        ("delete", _entity("idx|Pending|o-1")),
        (
            "delete",
            _entity("order|o-1|out|1"),
            {"etag": ETAG, "match_condition": MatchConditions.IfNotModified},
        ),
    ],
    "keys and values that need quoting or escaping": [
        (
            "create",
            _entity(
                "a'b c/d?e#f%g|é", Text='café ✓\n"q"', Big=(2**40, EdmType.INT64), F=1.5, B=True
            ),
        ),
        ("upsert", _entity("x'y", N=None, Bytes=b"\x00\xff"), {"mode": UpdateMode.REPLACE}),
        ("delete", _entity("ü'")),
    ],
    "upper-case kinds": [("CREATE", _entity("a")), ("Delete", _entity("b"))],
}


@pytest.mark.parametrize("name", OPERATIONS)
def test_the_same_bytes_and_results_as_the_sdk(
    server: Server, table: TableClient, name: str
) -> None:
    theirs, ours = _both(server, table, OPERATIONS[name])
    assert theirs[0] == "ok", theirs
    assert ours == theirs
    assert len(ours[1]) == len(OPERATIONS[name])
    assert ours[1][0]["etag"].startswith('W/"datetime')
    sdk_request, our_request = server.requests
    assert _request(our_request) == _request(sdk_request)


REFUSALS = {
    "a missing index row": ("404 Not Found", "ResourceNotFound", "2:The specified resource does not exist."),
    "a changed record": ("412 Precondition Failed", "UpdateConditionNotSatisfied", "1:The update condition specified in the request was not satisfied."),
    "an existing order": ("409 Conflict", "EntityAlreadyExists", "0:The specified entity already exists."),
    "too large": ("413 Request Entity Too Large", "RequestBodyTooLarge", "The request body is too large."),
}  # fmt: skip


@pytest.mark.parametrize("name", REFUSALS)
def test_a_refused_operation_raises_what_the_sdk_raises(
    server: Server, table: TableClient, name: str
) -> None:
    server.answer = _refused(*REFUSALS[name])
    theirs, ours = _both(server, table, OPERATIONS["every kind the store writes"])
    assert theirs[0] is not None and theirs[0] != "ok"
    assert ours == theirs
    if name != "too large":
        assert ours[0] is TableTransactionError


def test_an_answer_other_than_202_raises_what_the_sdk_raises(
    server: Server, table: TableClient
) -> None:
    error = json.dumps(
        {"odata.error": {"code": "InvalidInput", "message": {"lang": "en-US", "value": "Bad."}}}
    ).encode()
    server.answer = lambda _: (
        b"HTTP/1.1 400 Bad Request\r\nx-ms-error-code: InvalidInput\r\n"
        b"Content-Type: application/json;odata=minimalmetadata\r\n"
        + f"Content-Length: {len(error)}\r\n\r\n".encode()
        + error
    )
    theirs, ours = _both(server, table, OPERATIONS["upper-case kinds"])
    assert theirs[0] is not None and issubclass(theirs[0], HttpResponseError)
    assert ours == theirs


@pytest.mark.parametrize(
    "operations",
    [
        [("create", {"PartitionKey": "a", "RowKey": "1"}), ("create", {"PartitionKey": "b", "RowKey": "2"})],
        [("create", {"PartitionKey": "a"})],
        [("merge", {"PartitionKey": "a", "RowKey": "1"})],
        [["create", {"PartitionKey": "a", "RowKey": "1"}]],
        [("create", {"PartitionKey": "a", "RowKey": 1})],
        [("delete", {"PartitionKey": "a", "RowKey": "1"}, {"etag": ETAG})],
        [("update", {"PartitionKey": "a", "RowKey": "1"}, {"mode": "other"})],
        [("create", {"PartitionKey": "a", "RowKey": "1", "X": object()})],
    ],
    ids=["two partitions", "no row key", "unknown kind", "a list", "an int key", "etag without condition", "unknown mode", "an unserialisable value"],
)  # fmt: skip
def test_what_it_does_not_write_is_the_sdks_to_write_or_refuse(
    server: Server, table: TableClient, operations: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[Any] = []
    original = table_transactions._original

    def sdk(self: TableClient, ops: list[Any], **kwargs: Any) -> Any:
        handed.append(ops)
        return original(self, ops, **kwargs)

    theirs = _outcome(lambda: original(table, operations))
    monkeypatch.setattr(table_transactions, "_original", sdk)
    ours = _outcome(lambda: table.submit_transaction(operations))
    assert handed == [operations]
    assert ours == theirs


def test_the_parts_are_read_by_status_not_position(server: Server, table: TableClient) -> None:
    """A part that is not a success anywhere in the answer refuses the whole transaction."""
    ok = b'HTTP/1.1 204 No Content\r\nETag: W/"1"\r\n\r\n'
    bad = (
        b"HTTP/1.1 404 Not Found\r\nx-ms-error-code: ResourceNotFound\r\n"
        b"Content-Type: application/json\r\n\r\n"
        b'{"odata.error":{"code":"ResourceNotFound","message":{"value":"1:Gone."}}}'
    )
    server.answer = lambda _: _answer([ok, bad])
    theirs, ours = _both(server, table, OPERATIONS["upper-case kinds"])
    assert ours == theirs
    assert ours[0] is TableTransactionError and ours[4] == 1


def test_a_refusal_outside_the_changeset_raises_what_the_sdk_raises(
    server: Server, table: TableClient
) -> None:
    """A batch-level refusal is a bare part of the batch, not of a changeset."""
    error = b'{"odata.error":{"code":"InvalidInput","message":{"value":"99:One of the request inputs is not valid."}}}'
    body = (
        b"--batchresponse_1\r\nContent-Type: application/http\r\n"
        b"Content-Transfer-Encoding: binary\r\n\r\n"
        b"HTTP/1.1 400 Bad Request\r\nx-ms-error-code: InvalidInput\r\n"
        b"Content-Type: application/json;odata=minimalmetadata\r\n\r\n"
        + error
        + b"\r\n--batchresponse_1--\r\n"
    )
    server.answer = lambda _: (
        b"HTTP/1.1 202 Accepted\r\nContent-Type: multipart/mixed; boundary=batchresponse_1\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    theirs, ours = _both(server, table, OPERATIONS["upper-case kinds"])
    assert theirs[0] is TableTransactionError and theirs[3] == "InvalidInput"
    assert ours == theirs


def test_an_answer_it_cannot_split_is_read_as_azure_core_reads_it(
    server: Server, table: TableClient
) -> None:
    """Parts with bare LF line endings: not what the direct reader splits; ``email`` does."""
    succeeded = _succeeded(b"Content-ID: 0 Content-ID: 1")
    head, _, body = succeeded.partition(b"\r\n\r\n")
    body = body.replace(b"\r\n", b"\n")
    head = head.replace(
        f"Content-Length: {len(succeeded) - len(head) - 4}".encode(),
        f"Content-Length: {len(body)}".encode(),
    )
    server.answer = lambda _: head + b"\r\n\r\n" + body
    theirs, ours = _both(server, table, OPERATIONS["upper-case kinds"])
    assert theirs[0] == "ok" and len(theirs[1]) == 2
    assert ours == theirs


def test_it_is_what_a_table_client_runs(table: TableClient) -> None:
    assert TableClient.submit_transaction.__wrapped__ is table_transactions.submit_transaction  # type: ignore[attr-defined]
    assert re.match(r"^\w+$", table_transactions._original.__name__)
