"""Shared fixtures. Azurite starts once per test session, only if a test asks for it."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from localrun.azurite import Azurite


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
