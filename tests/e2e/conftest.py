"""End-to-end tests: real processes (Azurite, simulator, devhost instances), killed on purpose.

``stack`` is a ``LocalStack`` with the ``FAST`` settings (plus what an indirect parameter
gives: ``settings`` on top of ``FAST``, and any other ``LocalStack`` field). Its agent
queues are Storage queues, unless the test parametrises ``transport``:
``["storage", "servicebus"]`` runs one body on both transports (Storage queues on Azurite,
Service Bus on localbus through the real SDK; ``test_processes.TRANSPORTS``),
``["servicebus"]`` on Service Bus only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from demo.stack import LocalStack

FAST = {
    "STEP_TIMEOUT_SECONDS": "6",
    "MAX_FAILURE_COUNT": "4",
    "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
}


@pytest.fixture
def transport() -> str:
    """``AGENT_TRANSPORT`` of the stack: Storage queues unless a test parametrises it."""
    return "storage"


@pytest.fixture
def stack(request: pytest.FixtureRequest, transport: str) -> Iterator[LocalStack]:
    options: dict[str, Any] = dict(getattr(request, "param", {}))
    settings = {**FAST, **options.pop("settings", {})}
    with LocalStack(settings=settings, transport=transport, **options) as s:
        assert (s.bus is not None) == (transport == "servicebus")  # localbus runs, or not
        yield s
