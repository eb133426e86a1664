"""devhost end to end: real ``python -m devhost`` processes against a private Azurite.

The fixture app (tests/fixtures/devhost_app) records what each invocation saw on a
Storage queue; every test gets its own queue names through settings (``%...%``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueClient, QueueServiceClient

from devhost.singleton import (
    HOST_ID_SETTING,
    LEASE_SECONDS,
    LOCK_CONTAINER,
    TRY_EVERY_SECONDS,
    lock_blob_name,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
APP = FIXTURES / "devhost_app"


@dataclass
class Devhost:
    """One running ``python -m devhost`` with its stdout lines and stderr file."""

    process: subprocess.Popen[str]
    stderr_path: Path
    lines: list[str] = field(default_factory=list)
    _new: queue.Queue[str] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._new.put(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._new.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None and self._new.empty():
                    break
                continue
            self.lines.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(f"no line starting {prefix!r}; {self.diagnostics()}")

    def diagnostics(self) -> str:
        stderr = self.stderr_path.read_text(errors="replace")[-3000:]
        return f"exit {self.process.poll()}; stdout {self.lines}; stderr tail:\n{stderr}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        self.process.send_signal(sig)
        return self.process.wait(timeout)


@dataclass
class Records:
    """Reads (and deletes) the fixture app's records as they arrive."""

    client: QueueClient
    seen: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> list[dict[str, Any]]:
        while True:
            batch = list(self.client.receive_messages(max_messages=32, visibility_timeout=60))
            for message in batch:
                self.seen.append(json.loads(message.content))
                self.client.delete_message(message)
            if not batch:
                return self.seen

    def wait(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(self.read()):
                return self.seen
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; saw {self.seen}")


@dataclass
class Setup:
    env: dict[str, str]
    service: QueueServiceClient
    records: Records
    start: Callable[..., Devhost]

    def queue(self, setting: str) -> QueueClient:
        client = self.service.get_queue_client(self.env[setting])
        with contextlib.suppress(ResourceExistsError):
            client.create_queue()
        return client


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def queue_is_empty(client: QueueClient) -> bool:
    return client.get_queue_properties().approximate_message_count == 0


@pytest.fixture
def setup(storage_connection: str, tag: str, tmp_path: Path) -> Iterator[Setup]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ServiceBusConnection", "DEVHOST_"))
    }
    env.update(
        AzureWebJobsStorage=storage_connection,
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
        DEVHOST_TEST_QUEUE=f"dh-{tag}",
        DEVHOST_TEST_FAIL_QUEUE=f"dh-fail-{tag}",
        DEVHOST_TEST_SLOW_QUEUE=f"dh-slow-{tag}",
        DEVHOST_TEST_RECORDS=f"dh-records-{tag}",
        DEVHOST_TEST_TIMER_SCHEDULE="*/1 * * * * *",
        # Each test's own timer locks (devhost/singleton.py): a devhost another test
        # killed must not hold this one's timers for the 15 s its lease lasts.
        AzureFunctionsWebHost__hostid=f"dh-{tag}",
    )
    service = QueueServiceClient.from_connection_string(
        storage_connection, connection_timeout=5, read_timeout=15, retry_total=2
    )
    records_client = service.get_queue_client(env["DEVHOST_TEST_RECORDS"])
    records_client.create_queue()
    started: list[Devhost] = []

    def start(*args: str, cwd: Path = APP, extra_env: dict[str, str] | None = None) -> Devhost:
        stderr_path = tmp_path / f"devhost-{len(started)}.err"
        with open(stderr_path, "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "devhost", *args],
                cwd=cwd,
                env={**env, **(extra_env or {})},
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        devhost = Devhost(process, stderr_path)
        started.append(devhost)
        return devhost

    try:
        yield Setup(env, service, Records(records_client), start)
    finally:
        for devhost in started:
            if devhost.process.poll() is None:
                devhost.process.kill()
            devhost.process.wait(10)
        service.close()


def timer_lease_state(setup: Setup, function: str) -> str:
    """The state Storage reports of the lease on ``function``'s timer lock blob."""
    with BlobServiceClient.from_connection_string(setup.env["AzureWebJobsStorage"]) as blobs:
        blob = blobs.get_blob_client(
            LOCK_CONTAINER, lock_blob_name(setup.env[HOST_ID_SETTING], function)
        )
        return str(blob.get_blob_properties().lease.state)


def of(records: list[dict[str, Any]], fn: str, **match: Any) -> list[dict[str, Any]]:
    return [r for r in records if r["fn"] == fn and all(r.get(k) == v for k, v in match.items())]


def test_messages_are_processed_and_deleted(setup: Setup) -> None:
    work = setup.queue("DEVHOST_TEST_QUEUE")
    host = setup.start("--only", "record_message")
    host.wait_for("DEVHOST_READY")
    bodies = {"plain", '{"json": true}', "ünïcode <and> & markup"}
    for body in bodies:
        work.send_message(body)
    seen = setup.records.wait(
        lambda rs: len(of(rs, "record_message")) >= 3, 15, "three invocations"
    )
    assert {r["body"] for r in of(seen, "record_message")} == bodies
    assert {r["dequeue_count"] for r in of(seen, "record_message")} == {1}
    wait_until(lambda: queue_is_empty(work), 10, "the queue to be empty")
    assert host.stop() == 0


def test_failures_are_retried_then_poisoned_with_the_original_text(setup: Setup) -> None:
    work = setup.queue("DEVHOST_TEST_FAIL_QUEUE")
    poison = setup.service.get_queue_client(f"{setup.env['DEVHOST_TEST_FAIL_QUEUE']}-poison")
    # A message whose earlier holders all died: dequeued 3 times (maxDequeueCount 3) already.
    work.send_message("abandoned")
    for _ in range(3):
        [held] = list(work.receive_messages(max_messages=1, visibility_timeout=30))
        work.update_message(held, pop_receipt=held.pop_receipt, visibility_timeout=0)
    original = '{"orderId": "o-1", "note": "ünïcode <x> & y"}'
    work.send_message(original)
    host = setup.start("--only", "always_fail")
    host.wait_for("DEVHOST_READY")

    def poisoned() -> list[str]:
        try:
            return sorted(m.content for m in poison.peek_messages(max_messages=32))
        except Exception:
            return []

    wait_until(lambda: len(poisoned()) == 2, 20, "two poison messages")
    assert poisoned() == sorted([original, "abandoned"])
    attempts = of(setup.records.read(), "always_fail")
    assert sorted(r["dequeue_count"] for r in attempts) == [1, 2, 3]
    assert {r["body"] for r in attempts} == {original}  # "abandoned" never ran
    wait_until(lambda: queue_is_empty(work), 10, "the failing queue to be empty")
    assert host.stop() == 0
    assert "moving it to" in host.stderr_path.read_text()


@pytest.mark.timeout(120)
def test_a_message_held_by_a_killed_devhost_is_processed_by_another(setup: Setup, tag: str) -> None:
    # A 10 s lease instead of the default 30 (the same code; DEVHOST_LEASE_SECONDS), so the
    # wait for it to lapse costs the suite a third of the time.
    lease = {"DEVHOST_LEASE_SECONDS": "10", "DEVHOST_RENEW_SECONDS": "3"}
    work = setup.queue("DEVHOST_TEST_SLOW_QUEUE")
    first = setup.start("--only", "slow", "--instance-id", f"first-{tag}", extra_env=lease)
    first.wait_for("DEVHOST_READY")
    work.send_message(json.dumps({"key": "k", "seconds": 300, "sleep_on": f"first-{tag}"}))
    setup.records.wait(lambda rs: bool(of(rs, "slow", event="start")), 15, "the first start")
    first.process.kill()  # SIGKILL: no chance to hand the message back
    first.process.wait(10)
    # The lease holds it: the queue shows no message (a peek sees only visible ones) for
    # up to 10 s after the last renewal, 3 s ago at most.
    assert list(work.peek_messages(max_messages=32)) == [], "the message was back at once"
    second = setup.start("--only", "slow", "--instance-id", f"second-{tag}", extra_env=lease)
    second.wait_for("DEVHOST_READY")
    seen = setup.records.wait(
        lambda rs: bool(of(rs, "slow", event="done")), 10 + 10, "the second devhost to finish"
    )
    # ... then lets go: the second devhost got it, as its second delivery.
    [done] = of(seen, "slow", event="done")
    assert done["instance"] == f"second-{tag}"
    assert done["dequeue_count"] == 2
    wait_until(lambda: queue_is_empty(work), 10, "the queue to be empty")


def test_two_devhosts_share_fifty_messages_each_processed_once(setup: Setup, tag: str) -> None:
    work = setup.queue("DEVHOST_TEST_SLOW_QUEUE")
    hosts = [setup.start("--only", "slow", "--instance-id", f"{name}-{tag}") for name in "ab"]
    for host in hosts:
        host.wait_for("DEVHOST_READY")
    keys = [f"k{i}" for i in range(50)]
    for key in keys:
        work.send_message(json.dumps({"key": key, "seconds": 0.2}))
    seen = setup.records.wait(
        lambda rs: len(of(rs, "slow", event="done")) >= 50, 60, "fifty messages processed"
    )
    wait_until(lambda: queue_is_empty(work), 10, "the queue to be empty")
    seen = setup.records.read()
    done = of(seen, "slow", event="done")
    assert sorted(r["key"] for r in done) == sorted(keys)  # each exactly once
    assert len(of(seen, "slow", event="start")) == 50
    by_instance = {f"{name}-{tag}": 0 for name in ("a", "b")}
    for record in done:
        by_instance[record["instance"]] += 1
    assert all(count > 0 for count in by_instance.values()), by_instance
    for host in hosts:
        assert host.stop() == 0


def test_the_lease_is_renewed_while_the_function_runs(setup: Setup) -> None:
    work = setup.queue("DEVHOST_TEST_SLOW_QUEUE")
    short_lease = {"DEVHOST_LEASE_SECONDS": "2", "DEVHOST_RENEW_SECONDS": "0.5"}
    host = setup.start("--only", "slow", "--verbose", extra_env=short_lease)
    host.wait_for("DEVHOST_READY")
    work.send_message(json.dumps({"key": "long", "seconds": 6}))  # three leases long
    seen = setup.records.wait(lambda rs: bool(of(rs, "slow", event="done")), 20, "the run")
    starts = of(seen, "slow", event="start")
    assert [r["dequeue_count"] for r in starts] == [1]  # never visible to anyone again
    wait_until(lambda: queue_is_empty(work), 10, "the queue to be empty")
    assert host.stop() == 0
    assert "renewed message" in host.stderr_path.read_text()


def fetch(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "text/plain")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def test_http_routes_call_the_functions(setup: Setup) -> None:
    host = setup.start("--only", "get_item,echo,boom", "--http-port", "0")
    base = host.wait_for("DEVHOST_HTTP=").split("=", 1)[1]
    host.wait_for("DEVHOST_READY")
    assert any("not enforced locally" in line for line in host.lines)
    status, body, headers = fetch(f"{base}/api/items/books/42?colour=red")
    assert status == 200
    assert headers["X-Devhost-Test"] == "yes"
    # The runtime moves Set-Cookie into RpcHttp.cookies and the host writes each with
    # ASP.NET Core's cookie options (hostrun/shapes.py, set_cookie): path=/ by default.
    assert headers["Set-Cookie"] == "seen=1; path=/; httponly"
    assert json.loads(body) == {
        "route": {"category": "books", "id": "42"},
        "query": {"colour": "red"},
        "method": "GET",
        "url": f"{base}/api/items/books/42?colour=red",
    }
    assert fetch(f"{base}/api/items/books")[0] == 404
    status, body, headers = fetch(f"{base}/api/items/books/42", "POST", b"x")
    assert (status, headers["Allow"]) == (405, "GET, HEAD")
    assert "not allowed" in json.loads(body)["error"]
    assert fetch(f"{base}/api/echo", "POST", b"hello")[:2] == (201, b"hello")
    status, body, _ = fetch(f"{base}/api/boom")
    assert status == 500
    assert "boom on purpose" in json.loads(body)["error"]
    assert host.stop(signal.SIGINT) == 0


def test_timer_fires_every_second_and_service_bus_is_skipped(setup: Setup) -> None:
    host = setup.start("--only", "tick,bus_message")
    host.wait_for("DEVHOST_READY")
    assert any("bus_message" in line and "SKIPPED" in line for line in host.lines)
    seen = setup.records.wait(lambda rs: len(of(rs, "tick")) >= 3, 10, "three ticks")
    seconds = sorted(int(r["at"]) for r in of(seen, "tick"))
    assert len(set(seconds)) == len(seconds)  # one invocation per tick
    assert host.stop(signal.SIGINT) == 0


def test_two_devhosts_fire_each_tick_once_and_a_killed_holders_timer_moves_on(
    setup: Setup,
) -> None:
    """As in Azure, a timer fires on one instance at a time (the host's blob lease); when
    that instance dies, another takes the timer once the lease lapses."""
    first = setup.start("--only", "tick", "--instance-id", "dh-a")
    first.wait_for("DEVHOST_READY")
    second = setup.start("--only", "tick", "--instance-id", "dh-b")
    second.wait_for("DEVHOST_READY")
    assert any("one instance at a time" in line for line in second.lines)
    seen = setup.records.wait(lambda rs: len(of(rs, "tick")) >= 4, 15, "four ticks")
    ticks = of(seen, "tick")
    assert {r["instance"] for r in ticks} == {"dh-a"}, ticks
    seconds = [int(r["at"]) for r in ticks]
    assert len(set(seconds)) == len(seconds)  # each tick once
    first.stop(signal.SIGKILL)  # no chance to release: the lease lapses
    before_the_kill = of(setup.records.read(), "tick", instance="dh-a")
    # The lease lapses 15 s after dh-a last took it; dh-b tries every 5 s.
    seen = setup.records.wait(
        lambda rs: bool(of(rs, "tick", instance="dh-b")),
        3 * (LEASE_SECONDS + TRY_EVERY_SECONDS),
        "a tick on the other instance once the killed holder's lease lapsed",
    )
    assert of(seen, "tick", instance="dh-a") == before_the_kill  # none after the kill
    assert second.stop(signal.SIGINT) == 0


def test_a_stopping_holder_hands_its_timers_over_and_every_fires_everywhere(
    setup: Setup,
) -> None:
    first = setup.start("--only", "tick", "--instance-id", "dh-a")
    first.wait_for("DEVHOST_READY")
    second = setup.start("--only", "tick", "--instance-id", "dh-b")
    second.wait_for("DEVHOST_READY")
    setup.records.wait(lambda rs: bool(of(rs, "tick", instance="dh-a")), 10, "a tick on dh-a")
    assert first.stop(signal.SIGINT) == 0
    # It released its lease on the way out (Storage's own word: a lease left to lapse
    # would read "leased" for 15 s more), so dh-b takes it at its next round.
    assert timer_lease_state(setup, "tick") == "available"
    setup.records.wait(
        lambda rs: bool(of(rs, "tick", instance="dh-b")), 20, "a tick on the other instance"
    )
    # --timers every: the devhost of before, every timer in every process.
    third = setup.start("--only", "tick", "--instance-id", "dh-c", "--timers", "every")
    third.wait_for("DEVHOST_READY")
    assert any("every devhost process" in line for line in third.lines)
    setup.records.wait(lambda rs: bool(of(rs, "tick", instance="dh-c")), 10, "a tick on dh-c")
    assert second.stop(signal.SIGINT) == 0 and third.stop(signal.SIGINT) == 0


def test_shutdown_waits_for_running_invocations(setup: Setup) -> None:
    work = setup.queue("DEVHOST_TEST_SLOW_QUEUE")
    host = setup.start("--only", "slow")
    host.wait_for("DEVHOST_READY")
    work.send_message(json.dumps({"key": "finishing", "seconds": 2}))
    setup.records.wait(lambda rs: bool(of(rs, "slow", event="start")), 15, "the start")
    assert host.stop(signal.SIGTERM) == 0  # within stop's 15 s wait for the process
    assert of(setup.records.read(), "slow", event="done")  # it was allowed to finish
    wait_until(lambda: queue_is_empty(work), 10, "the queue to be empty")


def test_an_unsupported_binding_is_refused_by_name(setup: Setup) -> None:
    bad = setup.start(cwd=FIXTURES / "devhost_bad_app")
    assert bad.process.wait(20) == 2
    error = bad.stderr_path.read_text()
    assert "'with_blob'" in error
    assert "'doc'" in error
    assert "--exclude with_blob" in error
    fine = setup.start(
        "--exclude", "with_blob", "--http-port", "0", cwd=FIXTURES / "devhost_bad_app"
    )
    base = fine.wait_for("DEVHOST_HTTP=").split("=", 1)[1]
    fine.wait_for("DEVHOST_READY")
    assert fetch(f"{base}/api/fine")[:2] == (200, b"fine")
    assert fine.stop() == 0
