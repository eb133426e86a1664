"""Shared fixtures. Azurite starts once per test session, only if a test asks for it.

The declarations every test runs on are the suite's own, ``tests/fixtures/shop.py``, never
``declarations/``: that package belongs to the team that deploys the app, and the suite
must pass whatever it holds. ``ORDERS_DECLARATIONS`` names the fixture for this process
and every process a test starts; a test that reads ``declarations/`` (the deployment's
tests: ``infra/agents.json``, the deploy check) is marked ``deployment``, and any other
test that imports it fails, naming itself.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator

import pytest

from config.settings import DECLARATIONS
from core import workflows
from core.limits import DEFAULT_DECLARATIONS
from localrun.azurite import Azurite
from tests import SUITE_DECLARATIONS

os.environ[DECLARATIONS] = SUITE_DECLARATIONS
workflows.use(SUITE_DECLARATIONS)
# The trigger modules read AGENT_TRANSPORT once, when the first is imported
# (bootstrap.index_time): the tests that call them in this process run on Storage queues,
# whichever test imports one first; a test of the Service Bus triggers starts a process
# of its own with AGENT_TRANSPORT=servicebus.
os.environ.setdefault("AGENT_TRANSPORT", "storage")


@pytest.fixture(autouse=True)
def _suite_declarations(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts on the suite's declarations, and may not read ``declarations/``
    unless it is a deployment test."""
    yield
    workflows.use(SUITE_DECLARATIONS)
    read = [m for m in sys.modules if m.partition(".")[0] == DEFAULT_DECLARATIONS]
    for module in read:  # so that the next test that reads it is caught too
        del sys.modules[module]
    if read and request.node.get_closest_marker("deployment") is None:
        pytest.fail(
            f"{request.node.nodeid} read {DEFAULT_DECLARATIONS}/, the deployment's own "
            f"declarations: run it on {SUITE_DECLARATIONS} (pass {DECLARATIONS}, or use "
            "tests.support.declarations), or mark it deployment",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    emulator = Azurite.start()
    try:
        yield emulator
    finally:
        emulator.stop()
        shutil.rmtree(emulator.location, ignore_errors=True)


@pytest.fixture
def storage_connection(azurite: Azurite) -> str:
    return azurite.connection_string


@pytest.fixture
def tag() -> str:
    """A short unique suffix for table and queue names (letters and digits only)."""
    return "t" + uuid.uuid4().hex[:10]
