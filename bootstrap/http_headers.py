"""HTTP response headers read without the ``email`` package: the same message, less CPU.

``http.client`` reads every response's header block through ``email.parser`` (a
``FeedParser`` per response: regular expressions line by line, and for a
``multipart/mixed`` answer, such as a table transaction's, a regular expression
compiled for its boundary every time). ``bench.cpu``'s profile put it at about an eighth
of the app's CPU per order: every storage response, and every part of a transaction's
answer (azure-core reads each part with ``http.client`` too).

``parse_headers`` here builds the same ``HTTPMessage`` (the same headers in the same
order, the same payload, defects and epilogue as the ``email`` parser leaves) directly,
for the header blocks storage services send: one ``Name: value`` per CRLF-terminated line.
Anything else (a folded line, a bare CR or LF, a line without a name, a ``message/*``
or boundary-less ``multipart/*`` type, a block that ends without its blank line) goes
to the standard library's own parser, unchanged.

``apply()`` installs it only on the Python versions whose ``http.client`` it was checked
against, and only after it gave, on a set of header blocks (``SAMPLES``), exactly what the
standard library gives; otherwise it does nothing and says so. ``tests/unit/
test_http_headers.py`` compares the two on those samples, on real responses and on
generated ones.
"""

from __future__ import annotations

import email.errors
import email.parser
import http.client
import logging
import re
import sys
from collections.abc import Callable
from typing import Any, Final

log = logging.getLogger(__name__)

#: ``http.client`` as in these versions (3.13 reads the lines the same way, then parses
#: them in ``_parse_header_lines``).
CHECKED_VERSIONS: Final = ((3, 11), (3, 12), (3, 13))
_stdlib_parse_headers: Callable[..., Any] = http.client.parse_headers
_applied = False

#: A header line the ``email`` parser takes as ``Name: value`` and nothing else: a name of
#: printable ASCII without ``:`` (not starting a fold), then anything but CR or LF, CRLF.
_LINE = re.compile(r"[!-9;-~]+:[^\r\n]*\r\n\Z")
_PLAIN_BOUNDARY = re.compile(r"[A-Za-z0-9_\-.=+]{1,70}")


def parse_headers(fp: Any, _class: Any = http.client.HTTPMessage) -> Any:
    """``http.client.parse_headers``: read the header block from ``fp``; the message."""
    lines = http.client._read_headers(fp)  # type: ignore[attr-defined]
    message = parse_lines(lines, _class)
    if message is None:
        hstring = b"".join(lines).decode("iso-8859-1")
        return email.parser.Parser(_class=_class).parsestr(hstring)
    return message


def parse_lines(lines: list[bytes], _class: Any = http.client.HTTPMessage) -> Any | None:
    """The message the ``email`` parser would make of ``lines``, or None if not sure."""
    if not lines or lines[-1] != b"\r\n":
        return None
    headers: list[tuple[str, str]] = []
    for raw in lines[:-1]:
        line = raw.decode("iso-8859-1")
        if _LINE.match(line) is None:
            return None
        name, value = line.split(":", 1)
        headers.append((name, value.lstrip(" \t")[:-2]))
    message = _class()
    message._headers = headers
    message._payload = ""
    kind = message.get_content_maintype()
    if kind == "message":
        return None
    if kind == "multipart":
        # No body follows the headers: the parser notes that the boundary never came.
        if not _plain_boundary(message) or "content-transfer-encoding" in message:
            return None
        message.epilogue = ""
        message.defects.append(email.errors.StartBoundaryNotFoundDefect())
        message.defects.append(email.errors.MultipartInvariantViolationDefect())
    return message


def _plain_boundary(message: Any) -> bool:
    """A boundary parameter of plain characters (what storage sends), nothing to decode."""
    boundary = message.get_boundary()
    return (
        isinstance(boundary, str) and re.fullmatch(r"[A-Za-z0-9_\-.=+]{1,70}", boundary) is not None
    )


#: Header blocks ``apply`` checks before it installs anything (the tests use them too).
SAMPLES: Final = (
    b"Content-Type: application/json;odata=nometadata\r\nContent-Length: 12\r\n\r\n",
    b"Server: Azurite-Table/3.35.0\r\nETag: W/\"datetime'2026-11-24T06%3A05%3A28.1Z'\"\r\n"
    b"x-ms-request-id: 5f3e\r\nDate: Tue, 24 Nov 2026 06:05:28 GMT\r\n\r\n",
    b"Content-Type: multipart/mixed; boundary=batchresponse_1b2c-3d\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",
    b'Content-Type: multipart/mixed; boundary="quoted_1"\r\n\r\n',
    b"X-Empty:\r\nX-Tabs:\t\tv \t\r\nX-Colon: a: b\r\n\r\n",
    b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n",
    b"Content-Type: text/plain; charset=latin-1\r\nX-Latin: caf\xe9\r\n\r\n",
    b"\r\n",
)


def _same(a: Any, b: Any) -> bool:
    def state(m: Any) -> dict[str, Any]:
        out = {k: v for k, v in vars(m).items() if k not in ("defects", "policy")}
        out["defects"] = [type(d) for d in m.defects]
        out["policy"] = repr(m.policy)
        out["type"] = type(m)
        return out

    return state(a) == state(b)


def stdlib_message(block: bytes) -> Any:
    """What the standard library makes of a header block (for checks and tests)."""
    return email.parser.Parser(_class=http.client.HTTPMessage).parsestr(block.decode("iso-8859-1"))


def apply() -> bool:
    """Install ``parse_headers`` in ``http.client`` (once); False where it was not checked."""
    global _applied  # noqa: PLW0603
    if _applied:
        return True
    if sys.version_info[:2] not in CHECKED_VERSIONS:
        log.warning("Python %s: HTTP headers are read by the email package", sys.version)
        return False
    if http.client.parse_headers is not _stdlib_parse_headers:
        log.warning("http.client.parse_headers is already replaced; leaving it")
        return False
    for block in SAMPLES:
        lines = [line + b"\n" for line in block.split(b"\n")[:-1]]
        fast = parse_lines(lines)
        if fast is not None and not _same(fast, stdlib_message(block)):
            log.warning("HTTP headers: the fast reader differs from http.client's; not used")
            return False
    http.client.parse_headers = parse_headers
    _applied = True
    return True
