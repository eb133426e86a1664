"""Fixtures shared by the integration tests: a simulator per module, a settable clock, and
the pipeline's context on both (modules that need another ``ctx`` define their own); and
the app on the default table and queue names, as the CLI uses them (``default_ctx``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bootstrap import AppContext, bootstrap
from simulator import SimulatorServer
from tests.support import FakeClock, make_context, settings_from


@pytest.fixture(scope="module")
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer() as sim:
        yield sim


@pytest.fixture
def inline_replies() -> bool:
    """These tests move each message by hand, hop by hop, so they take the path of an
    instance that does not run the reply handler: the agent sends its reply to the reply
    queue (tests/integration/test_inline_replies.py takes the default path, in process)."""
    return False


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ctx(
    storage_connection: str,
    tag: str,
    simulator: SimulatorServer,
    clock: FakeClock,
    inline_replies: bool,
) -> AppContext:
    return make_context(
        storage_connection,
        tag,
        remote_url=simulator.url,
        clock=clock,
        max_failures=3,
        timeout=30,
        inline_replies=inline_replies,
    )


@pytest.fixture
def default_ctx(storage_connection: str) -> AppContext:
    """The app on the default table and queue names (those ``python -m admin`` uses), its
    tables and queues created; no remote service answers."""
    context = bootstrap(
        settings_from(
            {
                "AzureWebJobsStorage": storage_connection,
                "AGENT_TRANSPORT": "storage",
                "REMOTE_SERVICE_URL": "http://127.0.0.1:9",
            }
        )
    )
    context.provision()
    return context
