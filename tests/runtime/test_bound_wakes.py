"""What devhost wakes is what the host would: the app's sends through output bindings
(messaging/bound.py), driven through azure-functions-runtime as the host drives it.

The Functions host wakes a queue's listener at once when a function of the same instance
adds a message to that queue through an output binding (the queue extension's
``SharedQueueWatcher``), and for nothing the app sends with the SDK. Here the probe app's
functions (tests/fixtures/runtime_probe_app, built with ``messaging.bound.bind`` as the
app's triggers are) run in the real runtime; what the runtime hands back as output
bindings is delivered by devhost (``DevHost.deliver``, as ``python -m devhost`` wires it),
and the listeners devhost registered for each queue count their wakes. Python 3.13 only
(``make runtime-check``); elsewhere they skip, but under ``RUNTIME_CHECK_REQUIRED=1`` a
missing runtime fails.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if not os.environ.get("RUNTIME_CHECK_REQUIRED"):
    pytest.importorskip(
        "azure_functions_runtime",
        reason="needs azure-functions-runtime (Python 3.13): run `make runtime-check`",
    )

from devhost.app_loader import build_spec, find_app
from devhost.host import DevHost
from devhost.invoke import Invoker
from hostrun.shapes import QueueMessage
from hostrun.worker import FunctionFailed, WorkerRuntime
from tests.unit.test_devhost_queues import FakeService, Woken

APP = Path(__file__).resolve().parents[1] / "fixtures" / "runtime_probe_app"
QUEUES = ("probe-hop", "probe-other", "not-bound", "probe-hop-in")


@pytest.fixture(scope="module")
def runtime() -> Iterator[WorkerRuntime]:
    worker = WorkerRuntime(APP).start()
    yield worker
    worker.stop()


class Host:
    """devhost over the runtime, one listener per queue registered with its watcher."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime
        self.devhost = DevHost(Invoker(runtime.call), {})
        self.service = FakeService()
        self.devhost.queue_services["AzureWebJobsStorage"] = self.service
        runtime.deliver = self.devhost.deliver
        self.listeners = {queue: Woken("acct", queue) for queue in QUEUES}
        for listener in self.listeners.values():
            self.devhost.enqueued.register(listener)  # type: ignore[arg-type]
        app = find_app(self.probe_app())
        self.specs = {str(f.get_function_name()): build_spec(f, {}) for f in app.get_functions()}

    @staticmethod
    def probe_app() -> Any:
        module = sys.modules["function_app"]  # the runtime imported the probe app here
        assert hasattr(module, "HOPS"), "function_app is not the probe app"
        return module

    def run(self, name: str, body: str) -> Any:
        trigger = QueueMessage(id="m-1", body=body.encode(), dequeue_count=1, pop_receipt="p")
        return self.runtime.call(self.specs[name], trigger)

    def wakes(self) -> dict[str, int]:
        return {queue: listener.wakes for queue, listener in self.listeners.items()}


def test_a_send_through_an_output_binding_wakes_that_queues_listener(
    runtime: WorkerRuntime,
) -> None:
    host = Host(runtime)
    assert set(host.specs["probe_hop"].outputs) == {"to_probe_hop", "to_probe_other"}
    host.run("probe_hop", "a,b")
    assert host.service.sent == {"probe-hop": ["a", "b"]}  # sent by the host, after it ran
    # One wake per message, as the host's watcher is told per message added; the queue the
    # function was refused (no binding: the app would send it with the SDK) wakes no one,
    # nor does the trigger's own queue.
    assert host.wakes() == {"probe-hop": 2, "probe-other": 0, "not-bound": 0, "probe-hop-in": 0}


def test_an_async_function_gives_its_sends_back_the_same_way(runtime: WorkerRuntime) -> None:
    host = Host(runtime)
    host.run("probe_hop_async", "c")
    assert host.service.sent == {"probe-other": ["c"]}
    assert host.wakes()["probe-other"] == 1


def test_a_function_that_fails_gives_back_nothing_and_its_sends_go_at_once(
    runtime: WorkerRuntime,
) -> None:
    """The host flushes no output binding of a failed invocation; what the function held
    went out with the SDK when it failed, which wakes nobody."""
    host = Host(runtime)
    held = host.probe_app().HELD_BY_FAILURES
    held.clear()
    with pytest.raises(FunctionFailed, match="failed after a send"):
        host.run("probe_hop_fail", "x")
    assert host.service.sent == {}
    assert all(wakes == 0 for wakes in host.wakes().values())
    assert held == [("probe-hop", "held")]
