"""The Storage clients' transport puts the same request on the wire as azure-core's
``RequestsTransport``, reads the same answer, raises the same errors, and keeps the
timeouts it is given (the requests transport built for a client had kept 300 s)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import azure.core
import pytest
from azure.core.exceptions import (
    IncompleteReadError,
    ServiceRequestError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.core.rest import HttpRequest

from bootstrap import clients, storage_transport
from bootstrap.storage_transport import StorageTransport
from tests.loopback import Server


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def _requests() -> RequestsTransport:
    return storage_transport._requests_transport(8, 5, 20)


def _ours() -> StorageTransport:
    return StorageTransport(8, 5, 20)


def _wire(raw: bytes) -> tuple[bytes, list[bytes], bytes]:
    """The request line, the header lines (order aside), the body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    line, *headers = head.split(b"\r\n")
    return line, sorted(headers), body


REQUESTS: list[Callable[[Server], HttpRequest]] = [
    lambda s: HttpRequest(  # a table read: quotes and escapes in the key
        "GET",
        s.url("/acct/Orders(PartitionKey='s',RowKey='order%7Co-1%7Corder')"),
        headers={"Accept": "application/json;odata=minimalmetadata", "x-ms-version": "2019"},
    ),
    lambda s: HttpRequest(  # a query: a filter, unreserved characters escaped, a space
        "GET",
        s.url("/acct/Orders()?$filter=PartitionKey%20eq%20%27a%7E%2D%27&$top=5&x=a b"),
    ),
    lambda s: HttpRequest(  # a queue send: an XML body, a query
        "POST",
        s.url("/acct/agent-orders/messages?visibilitytimeout=0"),
        headers={"Content-Type": "application/xml", "User-Agent": "azsdk-python-storage"},
        content=b"<QueueMessage><MessageText>x</MessageText></QueueMessage>",
    ),
    lambda s: HttpRequest(  # a delete: no body, so Content-Length: 0 as requests writes it
        "DELETE", s.url("/acct/q/messages/id?popreceipt=AbC%3D%3D")
    ),
    lambda s: HttpRequest(  # a merge with text and a wrong Content-Length given
        "PATCH",
        s.url("/acct/T(PartitionKey='a',RowKey='b')"),
        headers={"Content-Length": "999", "If-Match": "*", "Content-Type": "application/json"},
        content='{"A": "x"}',
    ),
    lambda s: HttpRequest("PUT", s.url("/acct/q"), content=b""),  # an empty body
    lambda s: HttpRequest(  # a header the request removes, and one it re-spells
        "HEAD", s.url("/acct/q?comp=metadata"), headers={"accept": "text/plain"}
    ),
]


@pytest.mark.parametrize("build", REQUESTS)
def test_same_request_on_the_wire_and_same_answer(server: Server, build: Any) -> None:
    answers = []
    for transport in (_requests(), _ours()):
        with transport:
            response = transport.send(build(server), stream=False)
            answers.append(
                (response.status_code, response.reason, dict(response.headers), response.read())
            )
    theirs, ours = server.requests
    assert _wire(ours) == _wire(theirs)
    assert answers[0] == answers[1]
    assert answers[1][2]["x-ms-meta"] == "a, b"  # repeated headers joined, as requests does


def test_a_removed_default_header_is_not_sent(server: Server) -> None:
    request = HttpRequest("GET", server.url("/acct/q"))
    request.headers["Accept-Encoding"] = None  # type: ignore[assignment]
    for transport in (_requests(), _ours()):
        transport.send(request, stream=False)
    theirs, ours = server.requests
    assert _wire(ours) == _wire(theirs)
    assert b"Accept-Encoding: identity" in ours  # http.client's, as under requests


def test_the_answer_reads_like_requests_and_keeps_a_stream_asked_for(server: Server) -> None:
    transport = _ours()
    response = transport.send(HttpRequest("GET", server.url("/x")), stream=True)
    assert response.status_code == 201
    assert response.content_type == "application/xml"
    assert response.headers["X-MS-REQUEST-ID"] == "r-1"
    assert b"".join(response.iter_bytes()) == b"hello"
    assert response.text() == "hello"
    assert transport.handed_over == 0


def test_several_requests_reuse_one_connection(server: Server) -> None:
    transport = _ours()
    for _ in range(3):
        assert transport.send(HttpRequest("GET", server.url("/x"))).status_code == 201
    assert len(server._open) == 1


def _error(transport: Any, url: str) -> type[BaseException]:
    with pytest.raises(Exception) as caught:
        transport.send(HttpRequest("GET", url), stream=False)
    return type(caught.value)


def test_a_refused_connection_is_a_request_error_as_under_requests() -> None:
    port = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.getsockname()[1]}/x"
    port.close()
    assert _error(_ours(), url) is _error(_requests(), url)
    assert issubclass(_error(_ours(), url), ServiceRequestError)


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (b"", ServiceResponseError),  # connection closed, no answer
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", IncompleteReadError),
    ],
)
def test_a_lost_answer_is_the_same_error_as_under_requests(answer: bytes, kind: type) -> None:
    server = Server(lambda _: answer, close_after=True)
    try:
        theirs = _error(_requests(), server.url("/x"))
        ours = _error(_ours(), server.url("/x"))
        assert ours is theirs
        assert issubclass(ours, kind)
    finally:
        server.close()


def _self_signed(tmp_path: Any) -> ssl.SSLContext:
    """A server context with a certificate for 127.0.0.1 that no CA signed."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context


def test_a_certificate_no_ca_signed_is_refused_as_under_requests(tmp_path: Any) -> None:
    """Certificates are verified (certifi's CAs, as requests): a server with a self-signed
    one gets no request from either transport."""
    server = Server(tls=_self_signed(tmp_path))
    try:
        theirs = _error(_requests(), server.url("/x"))
        ours = _error(_ours(), server.url("/x"))
        assert ours is theirs
        assert issubclass(ours, ServiceRequestError)
        assert server.requests == []
    finally:
        server.close()


def test_the_read_timeout_given_is_kept() -> None:
    server = Server(lambda _: None)  # reads the request, never answers
    try:
        started = time.monotonic()
        with pytest.raises(ServiceResponseTimeoutError):
            StorageTransport(8, 5, 0.5).send(HttpRequest("GET", server.url("/x")))
        assert time.monotonic() - started < 5
        started = time.monotonic()
        with pytest.raises(ServiceResponseTimeoutError):
            _ours().send(HttpRequest("GET", server.url("/x")), read_timeout=0.3)
        assert time.monotonic() - started < 5
    finally:
        server.close()


def test_a_client_built_here_times_out_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug this transport fixed: a table client's read of a server that never answers
    must fail within the configured read timeout, not hang for azure-core's 300 s."""
    from azure.data.tables import TableClient

    from core.settings import Connection

    monkeypatch.setitem(clients.STORAGE_OPTIONS, "read_timeout", 0.5)
    monkeypatch.setitem(clients.STORAGE_OPTIONS, "retry_total", 0)
    server = Server(lambda _: None)
    try:
        account = "devstoreaccount1"
        key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
        connection = Connection(
            name="Storage",
            connection_string=(
                f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
                f"TableEndpoint={server.url('/' + account)}"
            ),
        )
        table: TableClient = clients.table_service(connection).get_table_client("T")
        outcome: list[BaseException | None] = []

        def read() -> None:
            try:
                table.get_entity("a", "b")
                outcome.append(None)
            except BaseException as err:
                outcome.append(err)

        thread = threading.Thread(target=read, daemon=True)
        started = time.monotonic()
        thread.start()
        thread.join(15)
        assert outcome, "the read still hangs after 15 s: the timeout did not reach the socket"
        assert time.monotonic() - started < 15
        assert isinstance(outcome[0], ServiceResponseError)
        assert server.requests  # it was sent, and its answer never came
    finally:
        server.close()


def test_what_it_does_not_handle_goes_to_requests(server: Server) -> None:
    transport = _ours()
    request = HttpRequest("POST", server.url("/x"), content="café")
    assert transport.send(request).status_code == 201  # non-ASCII text body
    response = transport.send(HttpRequest("GET", server.url("/x")), connection_verify="/ca.pem")
    assert response.status_code == 201
    assert transport.handed_over == 2
    assert isinstance(transport._fallback, RequestsTransport)
    assert transport._fallback.connection_config.read_timeout == 20


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-ms-meta", "a\r\nInjected: yes"), ("x-ms-meta", " leading"), ("x-ms-meta", 5), ("bad:name", "v")],
    ids=["a line break", "leading space", "not text", "a colon in the name"],
)  # fmt: skip
def test_a_header_requests_refuses_is_refused_as_requests_does(
    server: Server, name: str, value: Any
) -> None:
    def request() -> HttpRequest:
        built = HttpRequest("GET", server.url("/x"))
        built.headers[name] = value
        return built

    with pytest.raises(Exception) as caught_theirs:
        _requests().send(request(), stream=False)
    ours = _ours()
    with pytest.raises(Exception) as caught_ours:
        ours.send(request(), stream=False)
    assert type(caught_ours.value) is type(caught_theirs.value)
    assert ours.handed_over == 1
    assert server.requests == []  # nothing was sent


def test_another_azure_core_gets_requests_with_the_timeouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(azure.core, "__version__", "0.0.0")
    chosen = storage_transport.transport(8, 5, 20)
    assert isinstance(chosen, RequestsTransport)
    assert (chosen.connection_config.timeout, chosen.connection_config.read_timeout) == (5, 20)
    monkeypatch.undo()
    assert isinstance(storage_transport.transport(8, 5, 20), StorageTransport)
