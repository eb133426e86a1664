"""Queue messages sent directly (``messaging/queue_send.py``) put the same request on the
wire as azure-storage-queue, return the same ``QueueMessage`` and raise the same
errors; what they do not send the same way goes to the SDK."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from azure.storage.queue import BinaryBase64EncodePolicy, QueueClient

from bootstrap import clients
from core.settings import Connection
from messaging import queue_send
from tests.loopback import Server

KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
SENT = (
    b'<?xml version="1.0" encoding="utf-8"?><QueueMessagesList><QueueMessage>'
    b"<MessageId>m-1</MessageId><InsertionTime>Tue, 24 Nov 2026 10:14:00 GMT</InsertionTime>"
    b"<ExpirationTime>Tue, 01 Dec 2026 10:14:00 GMT</ExpirationTime><PopReceipt>AgAAAA==</PopReceipt>"
    b"<TimeNextVisible>Tue, 24 Nov 2026 10:14:05 GMT</TimeNextVisible></QueueMessage></QueueMessagesList>"
)


def _http(status: str, body: bytes, *headers: str) -> Callable[[bytes], bytes]:
    head = "".join(f"{h}\r\n" for h in headers)
    answer = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\n{head}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    return lambda _: answer


def _error(status: str, code: str, message: str) -> Callable[[bytes], bytes]:
    body = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
        f"<Message>{message}\nRequestId:r-1\nTime:2026-11-24T10:14:00Z</Message></Error>"
    ).encode()
    return _http(status, body, f"x-ms-error-code: {code}")


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server(_http("201 Created", SENT))
    yield s
    s.close()


@pytest.fixture
def queue(server: Server, monkeypatch: pytest.MonkeyPatch) -> QueueClient:
    monkeypatch.setitem(clients.STORAGE_OPTIONS, "retry_total", 0)
    connection = Connection(
        name="Storage",
        connection_string=(
            f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
            f"QueueEndpoint={server.url('/devstoreaccount1')}"
        ),
    )
    service = clients.queue_service(connection)
    assert queue_send.install()
    client: QueueClient = service.get_queue_client("agent-orders")
    return client


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", vars(call()))
    except Exception as exc:
        return (
            type(exc),
            str(exc),
            getattr(exc, "status_code", None),
            getattr(exc, "error_code", None),
        )


def _wire(raw: bytes) -> tuple[bytes, list[bytes], bytes]:
    """The request line, the headers that are not per request (date, id, signature), the body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    line, *headers = head.split(b"\r\n")
    varying = (b"x-ms-date", b"x-ms-client-request-id", b"authorization", b"host")
    return line, sorted(h for h in headers if not h.lower().startswith(varying)), body


def _both(server: Server, queue: QueueClient, content: Any, **options: Any) -> tuple[Any, Any]:
    theirs = _outcome(lambda: queue_send._original(queue, content, **options))
    ours = _outcome(lambda: queue.send_message(content, **options))
    return theirs, ours


CONTENTS = {
    "a request": '{"orderId":"o-1","step":1,"idempotencyKey":"o-1:1:1"}',
    "markup and quotes": "a<b>&c'd\"e ]]> &amp;",
    "non-ASCII": "café ☃ 😀",
    "line endings": "one\r\ntwo\nthree\r",
    "a lone surrogate": "half a pair: \ud800 ok",
}
OPTIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "a delay and a time to live": {"visibility_timeout": 5, "time_to_live": 3600},
    "a server timeout": {"timeout": 7, "time_to_live": -1},
}


@pytest.mark.parametrize("content", CONTENTS)
@pytest.mark.parametrize("options", OPTIONS)
def test_the_same_request_and_message_as_the_sdk(
    server: Server, queue: QueueClient, content: str, options: str
) -> None:
    theirs, ours = _both(server, queue, CONTENTS[content], **OPTIONS[options])
    assert theirs[0] == "ok", theirs
    assert ours == theirs
    assert ours[1]["id"] == "m-1" and ours[1]["content"] == CONTENTS[content]
    sdk_request, our_request = server.requests
    assert _wire(our_request) == _wire(sdk_request)


ERRORS = {
    "no such queue": ("404 The specified queue does not exist.", "QueueNotFound", "The specified queue does not exist."),
    "too large": ("413 Request Entity Too Large", "RequestBodyTooLarge", "The request body is too large."),
    "bad XML": ("400 Bad Request", "InvalidXmlDocument", "XML specified is not syntactically valid."),
    "being deleted": ("409 Conflict", "QueueBeingDeleted", "The specified queue is being deleted."),
    "refused credentials": ("403 Forbidden", "AuthenticationFailed", "Server failed to authenticate the request."),
    "a server error": ("500 Internal Server Error", "InternalError", "The server encountered an internal error."),
}  # fmt: skip


@pytest.mark.parametrize("name", ERRORS)
def test_an_error_is_the_sdks_error(server: Server, queue: QueueClient, name: str) -> None:
    server.answer = _error(*ERRORS[name])
    theirs = _outcome(lambda: queue_send._original(queue, CONTENTS["a request"]))
    tries = len(server.requests)
    ours = _outcome(lambda: queue.send_message(CONTENTS["a request"]))
    assert theirs[0] != "ok"
    assert ours == theirs
    assert len(server.requests) == 2 * tries  # the same retries (the queue's policy's, for a 500)


@pytest.mark.parametrize("status", ["404 Not Found", "409 Conflict", "401 Unauthorized"])
def test_an_error_without_a_code_is_the_sdks_error(
    server: Server, queue: QueueClient, status: str
) -> None:
    server.answer = _http(status, b"")  # a proxy's answer, say: no error code, no body
    theirs, ours = _both(server, queue, CONTENTS["a request"])
    assert theirs[0] != "ok"
    assert ours == theirs


def test_an_answer_of_another_shape_is_read_by_the_sdk(server: Server, queue: QueueClient) -> None:
    reordered = SENT.replace(b"<MessageId>m-1</MessageId>", b"").replace(
        b"</QueueMessage>", b"<MessageId>m-1</MessageId><Extra/></QueueMessage>"
    )
    server.answer = _http("201 Created", reordered)
    theirs, ours = _both(server, queue, CONTENTS["a request"])
    assert theirs[0] == "ok" and ours == theirs
    server.answer = _http("201 Created", SENT.replace(b"<PopReceipt>AgAAAA==</PopReceipt>", b""))
    theirs, ours = _both(server, queue, CONTENTS["a request"])
    assert ours == theirs and ours[1]["pop_receipt"] is None


@pytest.mark.parametrize(
    ("content", "options"),
    [(b"bytes", {}), ("", {}), (None, {}), ("x", {"headers": {"x-extra": "1"}}), ("x", {"visibility_timeout": 1.5})],
    ids=["bytes", "empty", "None", "an option it does not know", "a float delay"],
)  # fmt: skip
def test_what_it_does_not_send_is_the_sdks_to_send_or_refuse(
    server: Server,
    queue: QueueClient,
    content: Any,
    options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[Any] = []
    original = queue_send._original

    def sdk(self: QueueClient, sent: Any, **kwargs: Any) -> Any:
        handed.append(sent)
        return original(self, sent, **kwargs)

    theirs = _outcome(lambda: original(queue, content, **options))
    monkeypatch.setattr(queue_send, "_original", sdk)
    ours = _outcome(lambda: queue.send_message(content, **options))
    assert handed == [content]
    assert ours == theirs


def test_another_encoding_is_the_sdks(server: Server, queue: QueueClient) -> None:
    queue._message_encode_policy = BinaryBase64EncodePolicy()
    theirs, ours = _both(server, queue, b"\x00\xff")
    assert theirs[0] == "ok" and ours == theirs
    assert b"AP8=" in server.requests[-1]


def _devhost_watcher() -> Any:
    """devhost's enqueue watcher, installed over whatever ``send_message`` is now."""
    from types import SimpleNamespace

    from devhost.queues import EnqueueWatcher

    watcher = EnqueueWatcher()
    listener = SimpleNamespace(queue=SimpleNamespace(address=("acct", "q")), wake=lambda: None)
    watcher.register(listener)  # type: ignore[arg-type]
    watcher.install()
    return QueueClient.__dict__["send_message"]


def test_installed_under_devhosts_watcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(QueueClient, "send_message", queue_send._sdk_traced)  # as shipped
    assert queue_send.install()
    wrapper = _devhost_watcher()  # installed after ours: it wraps ours
    assert queue_send.install()
    assert QueueClient.__dict__["send_message"] is wrapper


def test_never_over_devhosts_watcher_whatever_the_import_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    monkeypatch.setattr(QueueClient, "send_message", queue_send._sdk_traced)  # as shipped
    wrapper = _devhost_watcher()  # installed before ours
    assert not queue_send.install()
    assert QueueClient.__dict__["send_message"] is wrapper
    # This module imported only now, with the watcher already in place: it still finds
    # the SDK's own method under the watcher, and still leaves the watcher alone.
    spec = importlib.util.spec_from_file_location("queue_send_late", queue_send.__file__)
    assert spec is not None and spec.loader is not None
    late = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(late)
    assert late._original is queue_send._original
    assert late._sdk_traced is queue_send._sdk_traced
    assert not late.install()
    assert QueueClient.__dict__["send_message"] is wrapper
