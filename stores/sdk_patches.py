"""Workarounds for azure-core's table transactions: no thread pool per transaction, and
no ``email`` package to write and read their multipart bodies.

azure-core 1.41.0 runs the per-operation policies of a multipart (batch)
request, and of its response, through a fresh ``ThreadPoolExecutor`` each
time (``Pipeline._prepare_multipart_mixed_request`` and ``_parts_helper``):
every table transaction starts and joins two or three pools of threads. The
benchmark's profile showed that as about half of a scheduler's CPU. These
replacements do the same work in a loop, in the calling thread (the policies
are CPU-only header and serialization steps: nothing is gained by threads).

Writing the ``multipart/mixed`` body of a transaction through ``email.message`` and
reading the answer with ``email.message_from_bytes`` cost more CPU than all the rest
of the request (``bench.cpu``'s profile: about half of a transaction). The
replacements below write the same bytes and read the same parts directly; whatever
they are not sure to handle as ``email`` would (a line ending other than CRLF in a part,
a body they cannot split) goes to azure-core's own code.

Each operation of a transaction is written as an HTTP request (``application/http``)
through ``http.client``'s ``HTTPConnection`` with a fake socket; the replacement writes
the same bytes directly (a sixth of a transaction's CPU). And azure-data-tables deep-copies
the whole batch request, every sub-request with it, before it sends it
(``AzureTable.send_request``), although ``_batch_send`` builds that request for this one
call and never reads it again (a tenth of a transaction's CPU): the replacement sends it
as it is.

With azure-data-tables 12.7.0, ``TableClient.submit_transaction`` itself is replaced by
``stores/table_transactions.py`` (the whole body written and its answer read directly);
the patches above still serve whatever it hands back to the SDK.

Applied only to the pinned azure-core (and, for the copy and the transactions,
azure-data-tables) version;
with any other version it does nothing and says so, so an upgrade can never run a stale
copy.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import azure.core
from azure.core.pipeline import PipelineContext, PipelineRequest, PipelineResponse
from azure.core.pipeline import _base as pipeline_base
from azure.core.pipeline._tools import await_result
from azure.core.pipeline.transport import _base as transport_base
from azure.core.rest import _helpers as rest_helpers
from azure.core.rest import _http_response_impl as rest_response
from azure.core.utils import _pipeline_transport_rest_shared as shared
from azure.data.tables import _version as tables_version
from azure.data.tables._generated import _client as tables_client

log = logging.getLogger(__name__)

PATCHED_VERSION = "1.41.0"
PATCHED_TABLES_VERSION = "12.7.0"
_applied = False
_CRLF = b"\r\n"
_original_prepare_body = shared._prepare_multipart_body_helper
_original_raw_parts = shared._get_raw_parts_helper
_original_serialize = shared._serialize_request
_BODY_METHODS = frozenset({"PATCH", "POST", "PUT"})  # http.client's: Content-Length: 0
_SKIPPED = frozenset({"Host", "Accept-Encoding"})  # azure-core's serializer drops these


def _serialize_request(http_request: Any) -> bytes:
    """azure-core's ``_serialize_request`` (an ``HTTPConnection`` writing to a buffer)
    written directly, for plain requests: an ASCII URL and headers, a bytes, ASCII text
    or no body. Anything else goes to azure-core's own code."""
    method, url, body = http_request.method, http_request.url, http_request.body
    headers = list(http_request.headers.items())
    if isinstance(body, str) and body.isascii():
        body = body.encode("ascii")
    texts = [method, url, *(text for header in headers for text in header)]
    if not (body is None or isinstance(body, bytes)) or not all(type(t) is str for t in texts):
        return _original_serialize(http_request)
    names = "".join(name for name, _ in headers)
    every = "".join(texts)
    if " " in method or " " in url or ":" in names or " " in names:
        return _original_serialize(http_request)
    if not (every.isascii() and every.isprintable()):
        return _original_serialize(http_request)
    lowered = {name.lower() for name, _ in headers}
    lines = [f"{method} {url} HTTP/1.1"]
    if "content-length" not in lowered and "transfer-encoding" not in lowered:
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        elif method.upper() in _BODY_METHODS:
            lines.append("Content-Length: 0")
    lines.extend(f"{name}: {value}" for name, value in headers if name not in _SKIPPED)
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head + body if body else head


def _send_request_as_built(self: Any, request: Any, **kwargs: Any) -> Any:
    """``AzureTable.send_request`` without its deep copy of the request (only
    ``_batch_send`` calls it, with a request it built for this call alone)."""
    path_format_arguments = {
        "url": self._serialize.url("self._config.url", self._config.url, "str", skip_quote=True),
    }
    request.url = self._client.format_url(request.url, **path_format_arguments)
    return self._client.send_request(request, **kwargs)


def _crlf_only(data: bytes) -> bool:
    """Every line ending in ``data`` is CRLF (what ``email`` writes unchanged)."""
    crlf = data.count(_CRLF)
    return data.count(b"\n") == crlf and data.count(b"\r") == crlf


def _prepare_multipart_body_helper(http_request: Any, content_index: int = 0) -> int:
    """azure-core's helper without ``email.message``: the same body, byte for byte
    (``tests/unit/test_sdk_patches.py`` compares them)."""
    info = http_request.multipart_mixed_info
    if not info:
        return 0
    start = content_index
    requests, boundary = info[0], info[2] or f"==============={uuid.uuid4().int:019d}=="
    parts: list[bytes] = []
    for req in requests:
        if req.multipart_mixed_info:
            content_index = req.prepare_multipart_body(content_index=content_index)
            head = f"Content-Type: {req.headers['Content-Type']}\r\n"
            payload = req.serialize()
            payload = payload[payload.index(b"--") :]
        else:
            head = (
                "Content-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
                f"Content-ID: {content_index}\r\n"
            )
            payload = req.serialize()
            content_index += 1
        if not _crlf_only(payload) or not head.isascii():
            return _original_prepare_body(http_request, start)
        parts.append(f"--{boundary}\r\n{head}\r\n".encode() + payload + _CRLF)
    http_request.set_bytes_body(b"".join(parts) + f"--{boundary}--\r\n".encode())
    http_request.headers["Content-Type"] = "multipart/mixed; boundary=" + boundary
    return content_index


class _Part:
    """The little of ``email.message.Message`` that azure-core's ``_decode_parts`` reads."""

    def __init__(self, content_type: str, payload: bytes | list[_Part]) -> None:
        self.content_type, self.payload = content_type, payload

    def get_content_type(self) -> str:
        return self.content_type

    def get_payload(self, decode: bool = False) -> bytes | list[_Part]:
        return self.payload


def _content_type(value: str) -> tuple[str, str | None]:
    """``multipart/mixed; boundary=x`` -> (``multipart/mixed``, ``x``)."""
    kind, _, params = value.partition(";")
    boundary = None
    for param in params.split(";"):
        name, _, text = param.strip().partition("=")
        if name.lower() == "boundary":
            boundary = text.strip().strip('"')
    return kind.strip().lower(), boundary


def _split(body: bytes, boundary: str) -> list[_Part] | None:
    """The parts of a CRLF multipart body, nested multiparts too; None when unsure."""
    delimiter = b"--" + boundary.encode("ascii")
    if not body.startswith(delimiter + _CRLF):
        return None
    parts: list[_Part] = []
    at = len(delimiter) + 2
    while True:
        end = body.find(_CRLF + delimiter, at)
        if end < 0:
            return None
        head, blank, payload = body[at:end].partition(_CRLF + _CRLF)
        if not blank:
            return None
        kind = "text/plain"
        inner: str | None = None
        for line in head.decode("latin-1").split("\r\n"):
            name, colon, value = line.partition(":")
            if not colon:
                return None
            if name.strip().lower() == "content-type":
                kind, inner = _content_type(value)
        if kind.startswith("multipart/"):
            nested = _split(payload, inner) if inner else None
            if nested is None:
                return None
            parts.append(_Part(kind, nested))
        else:
            parts.append(_Part(kind, payload))
        at = end + 2 + len(delimiter)
        if body.startswith(b"--", at):
            return parts
        if not body.startswith(_CRLF, at):
            return None
        at += 2


def _get_raw_parts_helper(response: Any, http_response_type: Any) -> Any:
    """azure-core's helper without ``email.message_from_bytes``, same parts."""
    kind, boundary = _content_type(response.content_type)
    body = response.body()
    parts = _split(body, boundary) if boundary and kind == "multipart/mixed" else None
    if parts is None:
        return _original_raw_parts(response, http_response_type)
    requests = response.request.multipart_mixed_info[0]
    return response._decode_parts(_Part(kind, parts), http_response_type, requests)


def _prepare_multipart_mixed_request(request: Any) -> None:
    info = request.multipart_mixed_info
    if not info:
        return
    requests, policies, options = info[0], info[1], info[3]
    for sub in requests:
        if sub.multipart_mixed_info:
            _prepare_multipart_mixed_request(sub)
        pipeline_request = PipelineRequest(sub, PipelineContext(None, **options))
        for policy in policies:
            await_result(policy.on_request, pipeline_request)


def _parts_helper(response: Any) -> Iterator[Any]:
    if not response.content_type or not response.content_type.startswith("multipart/mixed"):
        raise ValueError("You can't get parts if the response is not multipart/mixed")
    responses = response._get_raw_parts()
    if response.request.multipart_mixed_info:
        policies = response.request.multipart_mixed_info[1]
        for part in responses:
            http_request = part.request
            context = PipelineContext(None)
            pipeline_request = PipelineRequest(http_request, context)
            pipeline_response = PipelineResponse(http_request, part, context=context)
            for policy in policies:
                await_result(policy.on_response, pipeline_request, pipeline_response)
    return responses  # type: ignore[no-any-return]


def apply() -> bool:
    """Install the sequential versions (once); False if the azure-core version differs."""
    global _applied  # noqa: PLW0603
    if _applied:
        return True
    if azure.core.__version__ != PATCHED_VERSION:
        log.warning(
            "azure-core %s is not %s: table transactions keep azure-core's thread "
            "pools (see stores/sdk_patches.py)",
            azure.core.__version__,
            PATCHED_VERSION,
        )
        return False
    pipeline_base.Pipeline._prepare_multipart_mixed_request = staticmethod(  # type: ignore[method-assign]
        _prepare_multipart_mixed_request
    )
    shared._parts_helper = _parts_helper
    rest_response._parts_helper = _parts_helper  # type: ignore[attr-defined]
    transport_base._parts_helper = _parts_helper  # type: ignore[attr-defined]
    for module in (shared, rest_helpers, transport_base):
        module._prepare_multipart_body_helper = _prepare_multipart_body_helper  # type: ignore[attr-defined]
    for module in (shared, rest_response, transport_base):
        module._get_raw_parts_helper = _get_raw_parts_helper  # type: ignore[attr-defined]
    for module in (shared, rest_helpers, transport_base):
        module._serialize_request = _serialize_request  # type: ignore[attr-defined]
    if tables_version.VERSION == PATCHED_TABLES_VERSION:
        from stores import table_transactions

        tables_client.AzureTable.send_request = _send_request_as_built  # type: ignore[method-assign]
        table_transactions.install()
    else:
        log.warning(
            "azure-data-tables %s is not %s: table transactions keep their deep copy and "
            "are written by the SDK "
            "(see stores/sdk_patches.py)",
            tables_version.VERSION,
            PATCHED_TABLES_VERSION,
        )
    _applied = True
    return True
