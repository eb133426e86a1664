"""The Storage clients' session sends what ``requests.Session`` sends, with the same
options, for every call azure-core's transport makes; anything else takes requests' path."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter

from bootstrap.storage_session import StorageSession


class _Capture(BaseAdapter):
    """Keeps what it was asked to send, and answers 200 with a small body."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[requests.PreparedRequest, dict[str, Any]]] = []

    def send(self, request: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        self.sent.append((request, kwargs))
        response = requests.Response()
        response.status_code, response._content, response.request = 200, b"ok", request
        return response

    def close(self) -> None: ...


def _sent(session: requests.Session, **call: Any) -> tuple[Any, ...]:
    session.trust_env = False
    adapter = _Capture()
    session.mount("http://", adapter)
    response = session.request(**call)
    assert response.content == b"ok"
    request, options = adapter.sent[-1]
    return (
        request.method,
        request.url,
        dict(request.headers),
        request.body,
        options,
    )


CALLS: list[dict[str, Any]] = [
    {  # what azure-core's RequestsTransport passes: a table read
        "method": "GET",
        "url": "http://127.0.0.1:1/acct/Orders(PartitionKey='s',RowKey='order%7Co-1%7Corder')",
        "headers": {
            "Accept": "application/json;odata=minimalmetadata",
            "x-ms-version": "2019-02-02",
        },
        "data": None,
        "files": None,
        "verify": True,
        "timeout": (5, 20),
        "cert": None,
        "allow_redirects": False,
        "proxies": None,
        "stream": False,
    },
    {  # a queue send: a body, a query
        "method": "post",
        "url": "http://127.0.0.1:1/acct/agent-orders/messages?visibilitytimeout=0",
        "headers": {"Content-Type": "application/xml", "User-Agent": "azsdk-python"},
        "data": b"<QueueMessage><MessageText>x</MessageText></QueueMessage>",
        "files": None,
        "verify": True,
        "timeout": 20,
        "cert": None,
        "allow_redirects": False,
        "proxies": None,
        "stream": True,
    },
    {  # a delete: no body (Content-Length as requests writes it)
        "method": "DELETE",
        "url": "http://127.0.0.1:1/acct/q/messages/id?popreceipt=AbC%3D%3D",
        "headers": {"Accept-Encoding": None},
        "data": None,
        "files": None,
        "verify": False,
        "timeout": None,
        "cert": None,
        "allow_redirects": False,
        "proxies": None,
    },
]


@pytest.mark.parametrize("call", CALLS)
def test_the_same_request_goes_to_the_same_adapter(call: dict[str, Any]) -> None:
    assert _sent(StorageSession(), **call) == _sent(requests.Session(), **call)


@pytest.mark.parametrize(
    "extra",
    [
        {"allow_redirects": True},
        {"params": {"a": "1"}},
        {"cookies": {"c": "1"}},
        {"proxies": {"http": "http://proxy:3128"}},
        {"auth": ("user", "password")},
    ],
)
def test_anything_else_takes_requests_own_path(extra: dict[str, Any]) -> None:
    call = {**CALLS[0], **extra}
    assert _sent(StorageSession(), **call) == _sent(requests.Session(), **call)


def test_a_session_with_cookies_takes_requests_own_path() -> None:
    ours, theirs = StorageSession(), requests.Session()
    for session in (ours, theirs):
        session.cookies.set("affinity", "x")
    assert _sent(ours, **CALLS[0]) == _sent(theirs, **CALLS[0])
