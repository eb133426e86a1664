"""The timer singleton's leases (``devhost/singleton.py``): one contract, run on both
adapters: ``BlobLeases`` on Azurite (as the host leases its lock blobs) and its in-memory
twin ``MemoryLeases``, which devhost's unit tests use."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from azure.storage.blob import BlobServiceClient

from devhost.singleton import LEASE_SECONDS, BlobLeases, Leases
from tests.support import MemoryLeases


@dataclass
class Subject:
    leases: Leases
    pass_time: Callable[[float], None]


@pytest.fixture(params=["blob", "memory"])
def subject(request: pytest.FixtureRequest, tag: str) -> Iterator[Subject]:
    if request.param == "memory":
        now = [0.0]

        def advance(seconds: float) -> None:
            now[0] += seconds

        yield Subject(MemoryLeases(lambda: now[0]), advance)
        return
    connection = request.getfixturevalue("storage_connection")
    service = BlobServiceClient.from_connection_string(connection)
    container = service.get_container_client(f"locks-{tag}")  # not there yet: created
    try:
        yield Subject(BlobLeases(container), time.sleep)
    finally:
        if container.exists():  # leased blobs do not stop a container's deletion
            container.delete_container()
        service.close()


NAME = "locks/app/Host.Functions.supervise.Listener"


def test_one_holder_at_a_time_and_the_holder_may_take_it_again(subject: Subject) -> None:
    leases = subject.leases
    assert leases.acquire(NAME, "00000000-0000-0000-0000-00000000000a", LEASE_SECONDS)
    assert not leases.acquire(NAME, "00000000-0000-0000-0000-00000000000b", LEASE_SECONDS)
    assert leases.acquire(NAME, "00000000-0000-0000-0000-00000000000a", LEASE_SECONDS)
    assert not leases.acquire(NAME, "00000000-0000-0000-0000-00000000000b", LEASE_SECONDS)


def test_only_the_holders_release_frees_it(subject: Subject) -> None:
    leases = subject.leases
    a, b = "00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"
    assert leases.acquire(NAME, a, LEASE_SECONDS)
    leases.release(NAME, b)  # not b's to give up: nothing happens
    assert not leases.acquire(NAME, b, LEASE_SECONDS)
    leases.release(NAME, a)
    assert leases.acquire(NAME, b, LEASE_SECONDS)
    leases.release("locks/app/never-taken", a)  # no blob: nothing to release, no error


def test_taking_it_again_restarts_the_lease_and_one_not_taken_again_lapses(
    subject: Subject,
) -> None:
    leases = subject.leases
    a, b = "00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"
    kept, left = NAME, "locks/app/Host.Functions.sweep.Listener"
    assert LEASE_SECONDS == 15
    assert leases.acquire(kept, a, LEASE_SECONDS)
    assert leases.acquire(left, a, LEASE_SECONDS)
    subject.pass_time(8)
    assert leases.acquire(kept, a, LEASE_SECONDS)  # the holder again: 15 s from now
    subject.pass_time(9)  # 17 s after both were first taken
    assert not leases.acquire(kept, b, LEASE_SECONDS)  # taken again at 8 s: still a's
    assert leases.acquire(left, b, LEASE_SECONDS)  # not taken again: lapsed at 15 s
    assert not leases.acquire(left, a, LEASE_SECONDS)
