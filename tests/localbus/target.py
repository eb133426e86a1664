"""Where the Service Bus contract tests run: a real namespace when SERVICEBUS_TEST_CONNECTION
is set, else a private ``localbus`` with the same two queues, their lock duration shortened
so lock expiry takes seconds, not 30 s.

A real namespace needs the queues ``agent-requests-orders`` and ``agent-replies`` as infra/
creates them (lock 30 s, max delivery count 5, duplicate detection), and any
``more_queues`` a caller names (the transport contract suite,
tests/integration/test_transport_contract.py, names two more agents' queues, which infra/
creates too). Use a namespace for tests: the tests abandon messages of other senders they
meet (which counts a delivery against them).

Both queues dead-letter what expires, as infra/app/servicebus.bicep declares every queue
(an expired request is read from there by supervisor/expired.py and reported "not called").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from core.names import AGENT_REPLIES, Names
from localbus.process import LocalBus

#: The request queue the app sends to for its ``orders`` agent (infra/ creates one per agent).
AGENT_REQUESTS = Names().agent_queue("orders")

ENV = "SERVICEBUS_TEST_CONNECTION"
#: The SDK retries little, so a broker that never answers fails a test instead of hanging it.
SDK_OPTIONS: dict[str, Any] = {
    "retry_total": 1,
    "retry_backoff_factor": 0.5,
    "retry_backoff_max": 2,
}
LOCAL_LOCK_SECONDS = 2.0


@dataclass(frozen=True)
class Target:
    name: str  # "localbus" or "namespace"
    new_client: Callable[[], Any]  # a new azure.servicebus.ServiceBusClient
    requests: str  # an agent's request queue (infra: agent-requests-<agent>)
    replies: str  # the reply queue (infra: agent-replies)
    lock_seconds: float
    max_delivery_count: int
    #: How long a real namespace may take to move an expired message (it does so lazily).
    expiry_grace: float
    #: How long a receive that finds nothing must last to conclude nothing is coming.
    quiet: float


def _namespace_factory(value: str) -> Callable[[], Any]:
    from azure.servicebus import ServiceBusClient

    if "Endpoint=" in value:
        return lambda: ServiceBusClient.from_connection_string(value, **SDK_OPTIONS)
    namespace = value.removeprefix("sb://").rstrip("/")
    if not namespace.endswith(".servicebus.windows.net"):
        pytest.fail(
            f"{ENV} must be a connection string (Endpoint=sb://...;SharedAccessKey...) or a "
            f"namespace <name>.servicebus.windows.net; got {value[:30]!r}..."
        )
    from azure.identity import DefaultAzureCredential

    credential = DefaultAzureCredential()
    return lambda: ServiceBusClient(namespace, credential, **SDK_OPTIONS)


@contextmanager
def open_target(
    more_queues: tuple[str, ...] = (), lock_seconds: float = LOCAL_LOCK_SECONDS
) -> Iterator[Target]:
    """``more_queues``: further queues the caller sends to (declared on localbus like the
    reply queue; on a namespace they must exist). ``lock_seconds``: localbus's lock
    duration (a namespace keeps its own)."""
    value = os.environ.get(ENV, "").strip()
    if value:
        yield Target(
            "namespace",
            _namespace_factory(value),
            AGENT_REQUESTS,
            AGENT_REPLIES,
            30.0,
            5,
            90.0,
            3.0,
        )
        return
    from azure.servicebus import ServiceBusClient

    lock = f"lock-duration={lock_seconds:g}"
    with LocalBus.start(
        [f"{AGENT_REQUESTS}:{lock}", f"{AGENT_REPLIES}:{lock}"]
        + [f"{queue}:{lock}" for queue in more_queues]
    ) as bus:
        yield Target(
            "localbus",
            lambda: ServiceBusClient.from_connection_string(bus.connection_string, **SDK_OPTIONS),
            AGENT_REQUESTS,
            AGENT_REPLIES,
            lock_seconds,
            5,
            5.0,
            1.0,
        )
