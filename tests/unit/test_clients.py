"""The Storage clients' transport: azure-core's own ``RequestsTransport``, with the timeouts
the clients are given (azure-core's defaults are 300 s and 300 s), one pool shared by an
instance's threads, and no environment look-ups per request."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError
from azure.core.pipeline.transport import RequestsTransport

from bootstrap import clients
from config.settings import Connection
from tests.loopback import Server

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _connection(server: Server, endpoint: str) -> Connection:
    return Connection(
        name="Storage",
        connection_string=(
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"{endpoint}={server.url('/' + ACCOUNT)}"
        ),
    )


def test_the_transport_is_azure_cores_with_the_clients_timeouts() -> None:
    transport = clients.storage_transport()
    assert isinstance(transport, RequestsTransport)
    config = transport.connection_config
    assert (config.timeout, config.read_timeout) == (5, 20)


def _read_table(server: Server) -> None:
    table = clients.table_service(_connection(server, "TableEndpoint")).get_table_client("T")
    table.get_entity("a", "b")


def _read_queue(server: Server) -> None:
    queue = clients.queue_service(_connection(server, "QueueEndpoint")).get_queue_client("q")
    queue.receive_message()


@pytest.mark.parametrize("read", [_read_table, _read_queue], ids=["table", "queue"])
def test_a_client_built_here_times_out_when_told(
    monkeypatch: pytest.MonkeyPatch, read: Callable[[Server], None]
) -> None:
    """A read of a server that never answers fails within the configured read timeout,
    not after azure-core's default of 300 s."""
    monkeypatch.setitem(clients.STORAGE_OPTIONS, "read_timeout", 0.5)
    monkeypatch.setitem(clients.STORAGE_OPTIONS, "retry_total", 0)
    monkeypatch.setattr(clients, "retry_options", lambda _: dict(clients.STORAGE_OPTIONS))
    server = Server(lambda _: None)  # reads the request, never answers
    try:
        outcome: list[BaseException | None] = []

        def run() -> None:
            try:
                read(server)
                outcome.append(None)
            except BaseException as err:
                outcome.append(err)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(15)
        assert outcome, "the read still hangs after 15 s: the timeout did not reach the socket"
        assert isinstance(outcome[0], ServiceResponseError)
        assert server.requests  # it was sent, and its answer never came
    finally:
        server.close()


def test_requests_does_not_read_the_environment_per_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """``trust_env = False``: a proxy in the environment is not used (nor ``~/.netrc``
    read), so a request goes straight to the server."""
    server = Server()
    try:
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        monkeypatch.setenv("NO_PROXY", "")
        monkeypatch.setenv("HOME", str(tmp_path))
        transport = clients.storage_transport()
        from azure.core.rest import HttpRequest

        with transport:
            response = transport.send(HttpRequest("GET", server.url("/x")))
        assert response.status_code == 201
        assert server.requests
    finally:
        server.close()
