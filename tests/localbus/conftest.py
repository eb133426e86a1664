"""One Service Bus target per module: a real namespace (SERVICEBUS_TEST_CONNECTION) or a
private localbus (see ``target.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.localbus.target import Target, open_target


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    with open_target() as found:
        yield found


@pytest.fixture
def client(target: Target) -> Iterator[Any]:
    sb = target.new_client()
    try:
        yield sb
    finally:
        sb.close()
