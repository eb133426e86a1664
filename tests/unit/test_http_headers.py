"""bootstrap/http_headers.py: the same HTTPMessage as http.client's email-based reader,
for the header blocks it takes on, and the standard library's own for every other."""

from __future__ import annotations

import http.client
import io
import random
from typing import Any

import pytest

from bootstrap import http_headers


def state(message: Any) -> dict[str, Any]:
    out = {k: v for k, v in vars(message).items() if k not in ("defects", "policy")}
    out["defects"] = [type(d) for d in message.defects]
    out["policy"] = repr(message.policy)
    out["type"] = type(message)
    out["items"] = message.items()
    if isinstance(message._payload, list):  # a message/* type: the message inside
        out["_payload"] = [state(part) for part in message._payload]
    return out


def lines_of(block: bytes) -> list[bytes]:
    return io.BytesIO(block).readlines()


@pytest.mark.parametrize("block", http_headers.SAMPLES)
def test_the_samples_read_as_the_standard_library_reads_them(block: bytes) -> None:
    fast = http_headers.parse_lines(lines_of(block))
    assert fast is not None  # all of them are taken on, multipart included
    assert state(fast) == state(http_headers.stdlib_message(block))


@pytest.mark.parametrize(
    "block",
    [
        b"X-Folded: a\r\n b\r\n\r\n",  # a folded line
        b"X-Bare: a\rb\r\n\r\n",  # a bare CR inside a value
        b"NoColon\r\n\r\n",
        b": no name\r\n\r\n",
        b"From someone\r\n\r\n",
        b"X-Lf: a\n\r\n",  # LF-terminated line
        b"Content-Type: message/http\r\n\r\n",
        b"Content-Type: multipart/mixed\r\n\r\n",  # no boundary
        b"Content-Type: multipart/mixed; boundary=a\r\nContent-Transfer-Encoding: x\r\n\r\n",
        b'Content-Type: multipart/mixed; boundary="with space"\r\n\r\n',
        b"X-A: b\r\n",  # the block ended without its blank line
        b"",
    ],
)
def test_anything_else_is_left_to_the_standard_library(block: bytes) -> None:
    assert http_headers.parse_lines(lines_of(block)) is None
    # and through parse_headers it is exactly the standard library's message
    fast = http_headers.parse_headers(io.BytesIO(block))
    assert state(fast) == state(http_headers.stdlib_message(block))


def _random_block(rng: random.Random) -> bytes:
    names = ["Content-Type", "ETag", "x-ms-request-id", "Date", "Set-Cookie", "X", "a-b_c"]
    values = [
        "application/json",
        "multipart/mixed; boundary=batchresponse_66925647-d0cb-4109-b6d3-28efe3e1e5ed",
        'multipart/mixed; boundary="changesetresponse_1"',
        "multipart/alternative; boundary=b; charset=utf-8",
        "message/rfc822",
        "text/plain; charset=latin-1",
        "W/\"datetime'2026-11-24T06%3A05%3A28.1Z'\"",
        "",
        " \t lead",
        "trail \t",
        "a: b: c",
        "caf\xe9",
    ]
    lines = []
    for _ in range(rng.randint(0, 8)):
        name, value = rng.choice(names), rng.choice(values)
        sep = rng.choice([":", ": ", ":\t", ":  "])
        line = f"{name}{sep}{value}"
        if rng.random() < 0.08:
            line = rng.choice([" folded", "\tfolded", "no colon", "bad\rcr", "From x"])
        lines.append(line.encode("latin-1") + rng.choice([b"\r\n"] * 12 + [b"\n"]))
    if rng.random() < 0.1 and lines:
        name = "Content-Transfer-Encoding"
        lines.append(f"{name}: {rng.choice(['binary', 'base64'])}\r\n".encode())
    end = b"\r\n" if rng.random() < 0.95 else b"\n"
    return b"".join(lines) + end


def test_generated_header_blocks_read_the_same_either_way() -> None:
    rng = random.Random(20261124)
    taken = 0
    for _ in range(3000):
        block = _random_block(rng)
        fast = http_headers.parse_lines(lines_of(block))
        expected = state(http_headers.stdlib_message(block))
        if fast is not None:
            taken += 1
            assert state(fast) == expected, block
        assert state(http_headers.parse_headers(io.BytesIO(block))) == expected, block
    assert taken > 1000  # most of them are well formed, and those are taken on


def test_parse_headers_reads_the_block_and_leaves_the_body() -> None:
    stream = io.BytesIO(b"Content-Length: 4\r\nX-A: 1\r\n\r\nbody")
    message = http_headers.parse_headers(stream)
    assert message["content-length"] == "4" and message.get_all("x-a") == ["1"]
    assert stream.read() == b"body"


def test_a_response_reads_the_same_with_it_installed() -> None:
    raw = (
        b"HTTP/1.1 202 Accepted\r\n"
        b"Content-Type: multipart/mixed; boundary=batchresponse_1\r\n"
        b"Content-Length: 5\r\nx-ms-version: 2019-02-02\r\n\r\nhello"
    )

    class Sock:
        def makefile(self, mode: str) -> io.BytesIO:
            return io.BytesIO(raw)

    assert http_headers.apply()
    assert http.client.parse_headers is http_headers.parse_headers
    response = http.client.HTTPResponse(Sock())  # type: ignore[arg-type]
    response.begin()
    assert response.status == 202 and response.read() == b"hello"
    head = raw.split(b"\r\n", 1)[1].split(b"\r\n\r\n")[0] + b"\r\n\r\n"
    assert state(response.msg) == state(http_headers.stdlib_message(head))
