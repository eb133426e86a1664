"""Timer triggers fire on one instance at a time, through the host's own singleton lock:
a lease on the blob ``azure-webjobs-hosts/locks/<host id>/Host.Functions.<function>.Listener``
of ``AzureWebJobsStorage`` (the WebJobs SDK's ``SingletonListener``), which devhost takes as
the host does, so devhosts sharing a storage account fire each timer once per tick. Where it
differs (a 15 s lease taken again every 5 s, released at stop, no firing 2 s before it could
lapse by either clock, quick requests, ``runOnStartup`` only when it first holds the lock):
docs/local-development.md, "Timers on one instance at a time". The lease id is the process's
own, so "take it again" and "take it" are one request.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError

log = logging.getLogger("devhost.singleton")

LOCK_CONTAINER = "azure-webjobs-hosts"  # WebJobs' HostContainerNames.Hosts
LOCK_FOLDER = "locks"  # and HostDirectoryNames.SingletonLocks
HOST_ID_SETTING = "AzureFunctionsWebHost__hostid"  # what overrides the host id, as in Azure
LEASE_SECONDS = 15  # Azure Storage's shortest lease
TRY_EVERY_SECONDS = 5.0  # holders take it again, the others try to take it
SAFETY_SECONDS = 2.0  # the holder stops firing this long before its lease could end
RELEASE_WAIT_SECONDS = 5.0  # how long a stop waits for a round under way


def lock_client_options() -> dict[str, Any]:
    """One quick retry, short timeouts: a lock request is tried again next round anyway."""
    from azure.storage.blob import LinearRetry

    # backoff is annotated int but used as a float (random.uniform in get_backoff_time)
    retry = LinearRetry(backoff=0.5, retry_total=1, random_jitter_range=0)  # type: ignore[arg-type]
    return {"retry_policy": retry, "connection_timeout": 3, "read_timeout": 4}


def host_id(environ: Mapping[str, str], app_dir: str) -> str:
    """The host id the locks are named by: ``AzureFunctionsWebHost__hostid``, else the
    machine's name and a hash of the app's folder; in the host's alphabet, at most 32."""
    given = environ.get(HOST_ID_SETTING, "").strip()
    if not given:
        digest = hashlib.sha256(app_dir.encode("utf-8")).hexdigest()[:10]
        given = f"{socket.gethostname()[:20]}-{digest}"
    cleaned = re.sub(r"[^a-z0-9-]+", "-", given.lower())[:32].strip("-")
    return cleaned or "devhost"


def lock_blob_name(host: str, function: str) -> str:
    """The blob the host leases for a timer function's listener."""
    return f"{LOCK_FOLDER}/{host}/Host.Functions.{function}.Listener"


class Leases(Protocol):
    """Leases on named blobs (``BlobLeases``; tests pass ``tests.support.MemoryLeases``):
    ``acquire`` takes (with the holder's id: takes again) the lease on ``name`` for
    ``seconds``, True if this id holds it now; ``release`` gives it up if this id holds it."""

    def acquire(self, name: str, lease_id: str, seconds: int) -> bool: ...

    def release(self, name: str, lease_id: str) -> None: ...


class BlobLeases:
    """:class:`Leases` on Azure Storage blobs (Azurite too), as the host's
    ``BlobLeaseDistributedLockManager`` takes them: a missing blob (or container) is
    created empty, then leased."""

    def __init__(self, container: Any) -> None:
        self._container = container  # azure.storage.blob.ContainerClient

    def acquire(self, name: str, lease_id: str, seconds: int) -> bool:
        blob = self._container.get_blob_client(name)
        try:
            return self._acquire(blob, lease_id, seconds)
        except ResourceNotFoundError:  # no blob yet: create it, then ask once more
            self._create(blob)
        return self._acquire(blob, lease_id, seconds)

    @staticmethod
    def _acquire(blob: Any, lease_id: str, seconds: int) -> bool:
        try:
            blob.acquire_lease(lease_duration=seconds, lease_id=lease_id)
        except HttpResponseError as error:
            if error.status_code != 409:  # 409: leased by another
                raise
            return False
        return True

    def _create(self, blob: Any) -> None:
        with contextlib.suppress(ResourceExistsError):  # created (or leased: 412) meanwhile
            try:
                blob.upload_blob(b"", overwrite=False)
            except ResourceNotFoundError:  # no container yet
                with contextlib.suppress(ResourceExistsError):
                    self._container.create_container()
                blob.upload_blob(b"", overwrite=False)

    def release(self, name: str, lease_id: str) -> None:
        from azure.storage.blob import BlobLeaseClient

        blob = self._container.get_blob_client(name)
        try:
            BlobLeaseClient(blob, lease_id=lease_id).release()
        except HttpResponseError as error:
            if error.status_code not in (404, 409):  # no blob, or another's: nothing of ours
                raise


@dataclass
class _Lock:
    function: str
    blob: str
    held_until: float = 0.0  # monotonic; 0: not held
    held_until_wall: float = 0.0  # the same moment by the wall clock
    warned: bool = False


@dataclass
class TimerLocks:
    """The singleton locks of this process's timer functions, kept by one thread."""

    leases: Leases
    host: str
    instance: str
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    lease_seconds: int = LEASE_SECONDS
    try_every: float = TRY_EVERY_SECONDS
    _locks: dict[str, _Lock] = field(default_factory=dict)
    _round: threading.Lock = field(default_factory=threading.Lock)  # one round at a time
    _closed: bool = False  # released for good: no more rounds
    #: This process's lease id: two processes given the same instance id still differ.
    lease_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def add(self, functions: Iterable[str]) -> None:
        self._locks |= {f: _Lock(f, lock_blob_name(self.host, f)) for f in functions}

    def holds(self, function: str) -> bool:
        """Whether this process may fire ``function`` now (always, without a lock here)."""
        if (lock := self._locks.get(function)) is None:
            return True
        return self.clock() < lock.held_until and self.wall() < lock.held_until_wall

    def try_all(self) -> None:
        """One round: take every lock (again); a lock another holds is left to it."""
        with self._round:
            for lock in [] if self._closed else self._locks.values():
                self._try(lock)

    def _try(self, lock: _Lock) -> None:
        asked, asked_wall = self.clock(), self.wall()
        try:
            got = self.leases.acquire(lock.blob, self.lease_id, self.lease_seconds)
        except Exception as error:  # noqa: BLE001 - storage trouble: try again next round
            if not lock.warned:
                what = "cannot take its singleton lock (%s): it does not fire here until then"
                log.warning(f"timer %s: {what}", lock.function, error)
                lock.warned = True
            return  # held_until stands: a lease taken earlier lasts its time, not more
        lock.warned = False
        if self._closed:  # released meanwhile: release_all gives this one up too
            return
        was_held = self.holds(lock.function)
        lasts = self.lease_seconds - SAFETY_SECONDS
        lock.held_until = asked + lasts if got else 0.0
        lock.held_until_wall = asked_wall + lasts if got else 0.0
        if got and not was_held:
            log.info("timer %s: %s runs it (singleton lock taken)", lock.function, self.instance)
        elif was_held and not got:
            log.info("timer %s: another instance than %s runs it now", lock.function, self.instance)

    def run(self, stop: threading.Event) -> None:
        """Rounds every ``try_every`` seconds until ``stop`` (the caller releases)."""
        while not stop.wait(self.try_every):
            self.try_all()

    def release_all(self) -> None:
        """Give up the locks this process holds, for good (the process stops), so another
        instance takes them at its next round rather than when the lease lapses."""
        self._closed = True  # a round that starts from now takes nothing
        for lock in self._locks.values():  # and none fires from now on
            lock.held_until = lock.held_until_wall = 0.0
        # A round under way may still take a lock: wait for it (briefly: storage may be down).
        waited = self._round.acquire(timeout=RELEASE_WAIT_SECONDS)
        try:
            for lock in self._locks.values():
                try:
                    self.leases.release(lock.blob, self.lease_id)
                except Exception as error:  # noqa: BLE001 - the lease lapses by itself
                    log.warning("timer %s: cannot release its lock: %s", lock.function, error)
                    break  # storage is not answering: the others would wait as long
        finally:
            if waited:
                self._round.release()
