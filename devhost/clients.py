"""SDK clients for the connections that bindings name, built once per process and reused.

A binding's ``connection`` names a setting, as in Azure: either a connection string
(``<conn>``, or ``AzureWebJobs<conn>``), or an identity-based collection
(``<conn>__queueServiceUri`` / ``<conn>__accountName`` for Storage,
``<conn>__fullyQualifiedNamespace`` for Service Bus) used with ``DefaultAzureCredential``.
Every client has connect/read timeouts and a bounded number of retries, so a slow or dead
endpoint shows up as an error in the log, never as a hang.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.queue import QueueServiceClient
from urllib3.util.retry import Retry

from devhost.settings import ConfigError
from runtime import opcount

CONNECT_TIMEOUT = 5
READ_TIMEOUT = 20
RETRIES = 3
#: Enough pooled connections for the threads that share one client (the default is 10).
POOL_SIZE = 64


@dataclass(frozen=True)
class Connection:
    """Where a connection setting points: a connection string, or an endpoint + identity."""

    setting: str
    connection_string: str | None = None
    endpoint: str | None = None
    client_id: str | None = None

    def describe(self) -> str:
        return self.setting if self.connection_string else f"{self.setting} (identity)"


def _lookup(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    for candidate in (name, f"AzureWebJobs{name}"):
        value = environ.get(candidate, "").strip()
        if value:
            return candidate, value
    return None


def _client_id(environ: Mapping[str, str], name: str) -> str | None:
    if environ.get(f"{name}__credential", "").lower() == "managedidentity":
        return environ.get(f"{name}__clientId") or None
    return None


def storage_connection(environ: Mapping[str, str], name: str) -> Connection:
    found = _lookup(environ, name)
    if found:
        return Connection(setting=found[0], connection_string=found[1])
    uri = environ.get(f"{name}__queueServiceUri") or environ.get(f"{name}__serviceUri")
    account = environ.get(f"{name}__accountName")
    if not uri and account:
        uri = f"https://{account}.queue.core.windows.net"
    if uri:
        return Connection(setting=name, endpoint=uri, client_id=_client_id(environ, name))
    raise ConfigError(
        f"Storage connection {name!r} is not configured: set {name} to a connection string, "
        f"or {name}__accountName / {name}__queueServiceUri for an identity-based connection"
    )


def service_bus_connection(environ: Mapping[str, str], name: str) -> Connection | None:
    """The Service Bus connection, or None when it is not configured (the trigger is skipped)."""
    found = _lookup(environ, name)
    if found:
        return Connection(setting=found[0], connection_string=found[1])
    namespace = environ.get(f"{name}__fullyQualifiedNamespace")
    if namespace:
        return Connection(setting=name, endpoint=namespace, client_id=_client_id(environ, name))
    return None


def _credential(connection: Connection) -> Any:
    from azure.identity import DefaultAzureCredential  # only identity-based setups pay for it

    if connection.client_id:
        return DefaultAzureCredential(managed_identity_client_id=connection.client_id)
    return DefaultAzureCredential()


def _transport() -> RequestsTransport:
    session = requests.Session()
    # No ~/.netrc or proxy lookups on every request (profiled: a fifth of a worker's CPU).
    session.trust_env = False
    # azure-core retries itself (bounded below); requests/urllib3 must not retry on top.
    adapter = requests.adapters.HTTPAdapter(
        pool_connections=4,
        pool_maxsize=POOL_SIZE,
        max_retries=Retry(total=False, redirect=False, raise_on_status=False),
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(
        session=session,
        session_owner=True,
        connection_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
    )


class Clients:
    """One client per connection setting for the whole process (thread-safe)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        self._lock = threading.Lock()
        self._queue_services: dict[str, QueueServiceClient] = {}

    def queue_service(self, connection_name: str) -> QueueServiceClient:
        with self._lock:
            client = self._queue_services.get(connection_name)
            if client is None:
                connection = storage_connection(self._environ, connection_name)
                client = self._build_queue_service(connection)
                self._queue_services[connection_name] = client
            return client

    @staticmethod
    def _build_queue_service(connection: Connection) -> QueueServiceClient:
        options: dict[str, Any] = {
            "transport": _transport(),
            "retry_total": RETRIES,
            "connection_timeout": CONNECT_TIMEOUT,
            "read_timeout": READ_TIMEOUT,
            **opcount.policies("queue"),  # inert unless ORDERS_OPCOUNT_DIR is set (bench/)
        }
        # No message encode/decode policy: the bytes go through as stored, and devhost
        # decodes base64 itself (the SDK's TextBase64DecodePolicy fails after dequeuing).
        if connection.connection_string:
            try:
                return QueueServiceClient.from_connection_string(
                    connection.connection_string, **options
                )
            except ValueError as error:
                raise ConfigError(
                    f"setting {connection.setting}: not a usable Storage connection string "
                    f"({error})"
                ) from error
        assert connection.endpoint is not None
        credential = _credential(connection)
        return QueueServiceClient(connection.endpoint, credential=credential, **options)

    def close(self) -> None:
        with self._lock:
            for client in self._queue_services.values():
                client.close()
            self._queue_services.clear()


def service_bus_client(connection: Connection) -> Any:
    """A ServiceBusClient with bounded retries (built by the caller's receiver loop)."""
    from azure.servicebus import ServiceBusClient

    options: dict[str, Any] = {"retry_total": RETRIES, "retry_backoff_max": 10}
    if connection.connection_string:
        try:
            return ServiceBusClient.from_connection_string(connection.connection_string, **options)
        except ValueError as error:
            raise ConfigError(
                f"setting {connection.setting}: not a usable Service Bus connection string "
                f"({error})"
            ) from error
    return ServiceBusClient(str(connection.endpoint), credential=_credential(connection), **options)
