"""The HTTP transport of the Table and Queue clients: azure-core's pipeline (retries,
authentication, policies) over urllib3's connection pool, without ``requests``.

azure-core's ``RequestsTransport`` hands every request to ``requests.Session.request``,
which builds a ``PreparedRequest`` (URL re-parsed and re-quoted, headers merged and
validated, body measured), picks an adapter, checks certificates, builds a
``requests.Response`` and reads its body through a generator: measured on Azurite, about
a quarter of a Storage request's CPU (0.25 ms of a 1 ms queue send), for nothing Storage
needs. ``requests`` itself sends through urllib3; this transport does that directly,
with the same request on the wire (the URL re-quoted as requests does, requests' default
headers under the request's own, the same Content-Length rule; the tests compare the
bytes a server receives from both), the same CA bundle (certifi), no redirects and no
retries of its own (azure-core's policies do both), and the same errors:
``ServiceRequestError`` when the request could not be sent, ``ServiceResponseError`` when
its answer was lost, their timeout kinds, ``IncompleteReadError`` for a short body. (One
difference: a connection broken while the body is read, other than a short body, is a
``ServiceResponseError``, as when the answer's head is lost; through requests it is a
bare ``HttpResponseError``. The Storage retry policies retry both.) A header requests
would refuse (a line break in it, say) is handed to requests, which refuses it as before.

It also gives the clients the connect and read timeouts they ask for: azure-core's
``RequestsTransport`` takes them from its own constructor only, so a transport built for a
client (as ``bootstrap.clients`` did, to size its pool) ran with azure-core's defaults,
300 s and 300 s, whatever ``connection_timeout`` and ``read_timeout`` the client was given.

Every answer is read whole, also when the client asks for a stream (a table transaction
is sent with ``stream=True`` and its parts read from the whole body): Table and Queue
answers are small (a page of entities, a batch of messages); the archive's blob client,
which streams, keeps azure-core's own transport. Anything else this transport does not
handle the same way (a multipart file upload, a body that is not bytes or ASCII text,
proxies, a client certificate, a CA bundle of one's own: any option but the timeouts) is
sent by azure-core's ``RequestsTransport``, configured alike.
The response class builds on azure-core's ``HttpResponseImpl`` (a private module) and the
error mapping on urllib3's exceptions, so the transport is used only with the azure-core
and urllib3 versions it was checked against; with others ``transport()`` returns that
``RequestsTransport``, and says so.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import azure.core
import certifi
import requests
import urllib3
from azure.core.configuration import ConnectionConfiguration
from azure.core.exceptions import (
    IncompleteReadError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.core.pipeline.transport import HttpTransport, RequestsTransport
from azure.core.rest._http_response_impl import HttpResponseImpl
from azure.core.utils import case_insensitive_dict
from requests._internal_utils import HEADER_VALIDATORS
from requests.utils import default_headers, requote_uri
from urllib3._version import __version__ as urllib3_version
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

log = logging.getLogger(__name__)

CHECKED_AZURE_CORE = "1.41.0"
CHECKED_URLLIB3 = "2.8.0"
_NO_BODY_LENGTH = frozenset({"GET", "HEAD"})  # requests: Content-Length: 0 for the rest
_OPTIONS = frozenset({"stream", "connection_timeout", "read_timeout", "connection_verify"})
_BLOCK_SIZE = 4096  # azure-core's default for a response's iter_bytes
#: requests' own rules for a header it sends (``check_header_validity``'s patterns).
_VALID_NAME: re.Pattern[str]
_VALID_VALUE: re.Pattern[str]
_VALID_NAME, _VALID_VALUE = HEADER_VALIDATORS[str]  # type: ignore[assignment]


def _requests_transport(
    pool_size: int, connection_timeout: float, read_timeout: float
) -> RequestsTransport:
    session = requests.Session()
    session.trust_env = False  # no ~/.netrc or proxy look-ups on every request
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=pool_size)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(
        session=session,
        session_owner=True,
        connection_timeout=connection_timeout,
        read_timeout=read_timeout,
    )


def transport(
    pool_size: int, connection_timeout: float, read_timeout: float
) -> HttpTransport[Any, Any]:
    """The transport for a Table or Queue client: ``StorageTransport`` on the checked
    azure-core version, else a ``RequestsTransport`` with the same pool and timeouts."""
    if (azure.core.__version__, urllib3_version) != (CHECKED_AZURE_CORE, CHECKED_URLLIB3):
        log.warning(
            "azure-core %s and urllib3 %s are not %s and %s: the Storage clients send "
            "through requests (see bootstrap/storage_transport.py)",
            azure.core.__version__,
            urllib3_version,
            CHECKED_AZURE_CORE,
            CHECKED_URLLIB3,
        )
        fallback: HttpTransport[Any, Any] = _requests_transport(
            pool_size, connection_timeout, read_timeout
        )
        return fallback
    return StorageTransport(pool_size, connection_timeout, read_timeout)


def _plain_header(name: Any, value: Any) -> bool:
    """A header requests sends unchanged: text that passes its ``check_header_validity``
    (a None value is one requests drops)."""
    if type(name) is not str or not _VALID_NAME.match(name):
        return False
    return value is None or (type(value) is str and bool(_VALID_VALUE.match(value)))


class StorageResponse(HttpResponseImpl):
    """An answer read whole: urllib3's response, its headers, its body."""

    def __init__(self, request: Any, raw: urllib3.BaseHTTPResponse, block_size: int) -> None:
        headers = case_insensitive_dict(raw.headers.itermerged())
        super().__init__(
            request=request,
            internal_response=raw,
            status_code=raw.status,
            reason=raw.reason,
            content_type=headers.get("content-type"),
            headers=headers,
            stream_download_generator=_never_streamed,
            block_size=block_size,
        )
        self._content = raw.data


def _never_streamed(**_: Any) -> Iterator[bytes]:
    raise TypeError("StorageTransport reads every answer whole: there is no raw stream")


class StorageTransport(HttpTransport[Any, Any]):
    """azure-core's ``HttpTransport`` over a urllib3 ``PoolManager`` (thread-safe: one per
    client, shared by every invocation's thread)."""

    def __init__(self, pool_size: int, connection_timeout: float, read_timeout: float) -> None:
        self._pool_size = pool_size
        self._connection_timeout = connection_timeout
        self._read_timeout = read_timeout
        self._timeout = urllib3.Timeout(connect=connection_timeout, read=read_timeout)
        # What azure-core's retry policy reads of a transport (to fit a call's timeout).
        self.connection_config = ConnectionConfiguration(
            connection_timeout=connection_timeout, read_timeout=read_timeout
        )
        self._pool = urllib3.PoolManager(
            num_pools=4, maxsize=pool_size, cert_reqs="CERT_REQUIRED", ca_certs=certifi.where()
        )
        self._fallback: RequestsTransport | None = None
        self._defaults = list(default_headers().items())
        self.handed_over = 0  # requests sent through requests (tests check it stays 0)

    def __enter__(self) -> StorageTransport:
        return self

    def __exit__(self, *args: Any) -> None:
        self.close()

    def open(self) -> None:
        """Nothing to open: connections are made on first use."""

    def close(self) -> None:
        """Close every pooled connection (the pool stays usable: it reconnects)."""
        self._pool.clear()
        if self._fallback is not None:
            self._fallback.close()

    def _hand_over(self, request: Any, kwargs: dict[str, Any]) -> Any:
        """Send ``request`` through azure-core's ``RequestsTransport``, configured alike."""
        if self._fallback is None:
            self._fallback = _requests_transport(
                self._pool_size, self._connection_timeout, self._read_timeout
            )
        self.handed_over += 1
        return self._fallback.send(request, **kwargs)

    def send(self, request: Any, **kwargs: Any) -> Any:
        body = request.data
        if isinstance(body, str) and body.isascii():
            body = body.encode("ascii")
        if (
            kwargs.keys() - _OPTIONS
            or kwargs.get("connection_verify", True) is not True
            or request.files
            or not (body is None or isinstance(body, bytes))
        ):
            return self._hand_over(request, kwargs)
        timeout = self._timeout
        if "connection_timeout" in kwargs or "read_timeout" in kwargs:
            timeout = urllib3.Timeout(
                connect=kwargs.get("connection_timeout", self._connection_timeout),
                read=kwargs.get("read_timeout", self._read_timeout),
            )
        method = request.method.upper()
        headers = self._headers(request.headers, method, body)
        if headers is None:  # a header requests would refuse: it raises its own error
            return self._hand_over(request, kwargs)
        try:
            raw = self._pool.urlopen(
                method,
                requote_uri(request.url),
                body=body,
                headers=headers,
                redirect=False,
                retries=False,
                timeout=timeout,
                preload_content=True,
                decode_content=True,
            )
        except NewConnectionError as err:  # before ConnectTimeoutError: it is one
            raise ServiceRequestError(err, error=err) from err
        except ConnectTimeoutError as err:
            raise ServiceRequestTimeoutError(err, error=err) from err
        except ReadTimeoutError as err:
            raise ServiceResponseTimeoutError(err, error=err) from err
        except SSLError as err:
            raise ServiceRequestError(err, error=err) from err
        except ProtocolError as err:
            if "IncompleteRead" in str(err):
                raise IncompleteReadError(err, error=err) from err
            raise ServiceResponseError(err, error=err) from err
        except HTTPError as err:
            raise ServiceResponseError(err, error=err) from err
        return StorageResponse(request, raw, _BLOCK_SIZE)

    def _headers(self, given: Any, method: str, body: bytes | None) -> dict[str, str] | None:
        """requests' default headers under the request's own (a None value removes one),
        and Content-Length as requests writes it; None for a header requests would not
        send as it is (``_plain_header``)."""
        headers: dict[str, str] = {}
        spelled: dict[str, str] = {}
        for name, value in (*self._defaults, *given.items()):
            if not _plain_header(name, value):
                return None
            lowered = name.lower()
            headers.pop(spelled.pop(lowered, lowered), None)
            if value is not None:
                headers[name] = value
                spelled[lowered] = name
        if body:
            headers.pop(spelled.pop("content-length", "content-length"), None)
            headers["Content-Length"] = str(len(body))
        elif method not in _NO_BODY_LENGTH and "content-length" not in spelled:
            headers["Content-Length"] = "0"
        return headers
