"""Azure SDK clients from connection settings: connection strings or managed identity.

Built on first use and reused (never at import: that slows cold start and
breaks tests). Every client gets explicit timeouts and a bounded retry, so a
slow or absent service shows up as an error, not a hang.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from config.settings import Connection, SettingsError

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.pipeline.transport import RequestsTransport
    from azure.data.tables import TableServiceClient
    from azure.storage.blob import BlobServiceClient
    from azure.storage.queue import QueueServiceClient

_lock = threading.Lock()
_credentials: dict[tuple[str | None, str | None], Any] = {}

#: Storage: a few quick retries; the callers decide what an error means.
STORAGE_OPTIONS: dict[str, Any] = {
    "retry_total": 3,
    "retry_backoff_factor": 0.4,
    "retry_backoff_max": 4,
    "connection_timeout": 5,
    "read_timeout": 20,
}
#: Pooled connections per client: the worker runs many invocations on threads
#: that share one client (requests' default pool of 10 would churn connections).
POOL_SIZE = 64


def retry_options(service: str) -> dict[str, Any]:
    """Bounded, quick retries. The queue SDK ignores ``retry_backoff_factor`` and waits
    15 s, 18 s, 24 s by default: far too long for a step with a 30 s deadline."""
    if service == "queue":
        from azure.storage.queue import LinearRetry

        return {
            **STORAGE_OPTIONS,
            "retry_policy": LinearRetry(backoff=1, retry_total=3, random_jitter_range=1),
        }
    return dict(STORAGE_OPTIONS)


def storage_transport() -> RequestsTransport:
    """azure-core's own ``RequestsTransport`` for a Table or Queue client, configured only
    through public parameters:

    - the timeouts: azure-core takes them from the transport's constructor, not from the
      client's options, when a transport is given (without these, 300 s and 300 s);
    - a pool of ``POOL_SIZE`` connections (``HTTPAdapter(pool_maxsize=...)``), since one
      client serves every invocation thread of the instance;
    - ``trust_env = False``: ``requests`` would read ``~/.netrc`` and the proxy variables on
      every request (docs/contracts.md#fact-trust-env).
    """
    import requests
    from azure.core.pipeline.transport import RequestsTransport
    from requests.adapters import HTTPAdapter

    session = requests.Session()
    session.trust_env = False
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(
        session=session,
        session_owner=True,
        connection_timeout=STORAGE_OPTIONS["connection_timeout"],
        read_timeout=STORAGE_OPTIONS["read_timeout"],
    )


def _options(service: str, opcount_dir: str | None) -> dict[str, Any]:
    from observability import opcount

    return {
        **retry_options(service),
        "transport": storage_transport(),
        **opcount.policies(service, opcount_dir),
    }


def credential(connection: Connection) -> TokenCredential:
    """The identity for ``connection``: the user-assigned managed identity named by
    ``<Name>__clientId`` when ``<Name>__credential`` is ``managedidentity``, else
    DefaultAzureCredential (which also finds a developer's az login)."""
    key = (connection.credential, connection.client_id)
    with _lock:
        if key not in _credentials:
            from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

            if (connection.credential or "").lower() == "managedidentity":
                _credentials[key] = ManagedIdentityCredential(client_id=connection.client_id)
            elif connection.client_id:
                _credentials[key] = DefaultAzureCredential(
                    managed_identity_client_id=connection.client_id
                )
            else:
                # Not managed_identity_client_id=None: an explicit None turns off
                # DefaultAzureCredential's own AZURE_CLIENT_ID fallback (azure-identity 1.27).
                _credentials[key] = DefaultAzureCredential()
        return _credentials[key]  # type: ignore[no-any-return]


def _endpoint(connection: Connection, service: str) -> str:
    explicit = {
        "blob": connection.blob_service_uri,
        "queue": connection.queue_service_uri,
        "table": connection.table_service_uri,
    }[service]
    if explicit:
        return explicit
    if connection.account_name:
        return f"https://{connection.account_name}.{service}.core.windows.net"
    raise SettingsError(
        f"{connection.name}: give a connection string, {connection.name}__accountName or "
        f"{connection.name}__{service}ServiceUri"
    )


def table_service(connection: Connection, opcount_dir: str | None = None) -> TableServiceClient:
    """``opcount_dir``: count this client's requests there (``observability.opcount``)."""
    from azure.data.tables import TableServiceClient

    options = _options("table", opcount_dir)
    if connection.connection_string:
        return TableServiceClient.from_connection_string(connection.connection_string, **options)
    return TableServiceClient(
        _endpoint(connection, "table"), credential=credential(connection), **options
    )


def queue_service(connection: Connection, opcount_dir: str | None = None) -> QueueServiceClient:
    """``opcount_dir``: count this client's requests there (``observability.opcount``)."""
    from azure.storage.queue import QueueServiceClient

    options = _options("queue", opcount_dir)
    if connection.connection_string:
        return QueueServiceClient.from_connection_string(connection.connection_string, **options)
    return QueueServiceClient(
        _endpoint(connection, "queue"), credential=credential(connection), **options
    )


def blob_service(connection: Connection, **overrides: Any) -> BlobServiceClient:
    """For the archive (retention runs and restores; never on an order's path), and
    devhost's timer locks (``overrides``: their own quicker retry and timeouts)."""
    from azure.storage.blob import BlobServiceClient

    options = {**retry_options("blob"), **overrides}
    if connection.connection_string:
        return BlobServiceClient.from_connection_string(connection.connection_string, **options)
    return BlobServiceClient(
        _endpoint(connection, "blob"), credential=credential(connection), **options
    )
