"""Counting storage operations per process, for the benchmark and the cost model.

Inert unless given a directory (``Settings.opcount_dir``, the ``ORDERS_OPCOUNT_DIR``
setting): then every storage client built with it gets a
pipeline policy that counts its requests by service and kind (a table
transaction is one request: ``table.batch``; a request to an agent's request queue or to
the reply queue is counted once more as ``agent.<send|receive|delete|update>``: the
operations that are Service Bus operations instead where ``AGENT_TRANSPORT`` is
``servicebus``), and the counts are written to
``<dir>/<pid>.json`` every second and at exit, so a benchmark can add up what
several processes did.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from azure.core.pipeline import PipelineRequest

from core.names import AGENT_REPLIES, AGENT_REQUESTS

_counts: Counter[str] = Counter()
_lock = threading.Lock()
_started = False
#: The trigger type of the invocation the calling thread runs, if the host can tell
#: (devhost sets it: through the runtime, every function runs on its shared thread pool,
#: so a thread's name no longer says a timer runs on it).
_current_trigger: Callable[[], str | None] | None = None


def set_trigger_lookup(lookup: Callable[[], str | None] | None) -> None:
    """How ``OpCounter`` learns that a request comes from a timer (``timerTrigger``)."""
    global _current_trigger  # noqa: PLW0603
    _current_trigger = lookup


def current_trigger() -> str | None:
    """The trigger type of the invocation the calling thread runs, when the host says."""
    return _current_trigger() if _current_trigger is not None else None


def _kind(service: str, method: str, path: str) -> str:
    if service == "table":
        if path.endswith("$batch"):
            return "table.batch"
        return {
            "GET": "table.query",
            "POST": "table.insert",
            "PUT": "table.update",
            "MERGE": "table.update",
            "PATCH": "table.update",
            "DELETE": "table.delete",
        }.get(method, f"table.{method.lower()}")
    if path.endswith("/messages"):
        return {"GET": "queue.receive", "POST": "queue.send"}.get(method, f"queue.{method}")
    if "/messages/" in path:
        return {"DELETE": "queue.delete", "PUT": "queue.update"}.get(method, f"queue.{method}")
    return f"queue.{method.lower()}"


def agent_queue(path: str) -> bool:
    """A request to a message of an agent's request queue or of the reply queue (the queues
    that are on Service Bus with ``AGENT_TRANSPORT=servicebus``)."""
    parts = path.rstrip("/").split("/")
    if "messages" not in parts:
        return False
    queue = parts[parts.index("messages") - 1]
    return queue.startswith((AGENT_REQUESTS, AGENT_REPLIES))


#: Requests the Functions host makes for a queue trigger, not the app (Azure bills them
#: all the same, but the app's code cannot save them).
HOST_KINDS = frozenset({"queue.receive", "queue.delete", "queue.update"})


def origin(kind: str, thread: str, trigger: str | None = None) -> str:
    """Who made a request: ``timer`` (a timer function: sweeps, whatever the order count),
    ``host`` (a trigger's receive, delete and lease renewal) or ``app`` (the functions'
    own requests for the orders they handle). ``trigger``: the trigger type of the
    invocation that made it, when known."""
    if trigger == "timerTrigger" or thread.startswith("timer-"):  # devhost/timers.py
        return "timer"
    return "host" if kind in HOST_KINDS else "app"


class OpCounter:
    """A ``raw_request_hook``: called once per HTTP request the client sends (retries too),
    counted as ``<origin>:<kind>``, e.g. ``app:table.batch``."""

    def __init__(self, service: str):
        self._service = service

    def __call__(self, request: PipelineRequest) -> None:  # type: ignore[type-arg]
        http = request.http_request
        path = http.url.split("?", 1)[0]
        kind = _kind(self._service, http.method, path)
        who = origin(kind, threading.current_thread().name, current_trigger())
        with _lock:
            _counts[f"{who}:{kind}"] += 1
            if self._service == "queue" and agent_queue(path):
                _counts[f"{who}:agent.{kind.removeprefix('queue.')}"] += 1


def _flush(directory: Path) -> None:
    with _lock:
        data = dict(_counts)
    tmp = directory / f".{os.getpid()}.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(directory / f"{os.getpid()}.json")


def _start(directory: Path) -> None:
    global _started  # noqa: PLW0603
    if _started:
        return
    _started = True
    directory.mkdir(parents=True, exist_ok=True)

    def loop() -> None:
        while True:
            threading.Event().wait(1.0)
            _flush(directory)

    threading.Thread(target=loop, name="opcount", daemon=True).start()
    atexit.register(_flush, directory)


def policies(service: str, directory: str | None) -> dict[str, Any]:
    """Client options adding the counter when there is a ``directory``; else nothing."""
    if not directory:
        return {}
    _start(Path(directory))
    # The storage SDKs ignore per_call_policies; both honour a client-level raw_request_hook.
    return {"raw_request_hook": OpCounter(service)}


def snapshot() -> Counter[str]:
    """What this process's counters hold now (a copy): what a test compares before and
    after an operation, with clients built with ``OpCounter`` as their hook."""
    with _lock:
        return Counter(_counts)


def collect(directory: Path) -> Counter[str]:
    total: Counter[str] = Counter()
    for path in directory.glob("*.json"):
        total.update(json.loads(path.read_text()))
    return total
