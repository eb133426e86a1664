"""``bench.trace``'s probe: on the ``PYTHONPATH`` of a devhost process (and only there),
with ``BENCH_TRACE_DIR`` set, it records when a few of the app's and devhost's calls start
and end, one JSON line per call to ``<dir>/<pid>.jsonl``. Inert without the setting.

A ``sitecustomize`` runs before the process imports anything else, so the probe can wrap
each target (``TARGETS``) right after its module is executed, before anyone holds a
reference to the unwrapped function. It imports only the standard library: importing the
app here would load the targets' modules before the hook is in place. Nothing here is part
of the app; it exists for the benchmark, and costs one line written per traced call.
"""

from __future__ import annotations

import base64
import functools
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: module -> (class, method, event): the calls traced. ``bench.trace`` names the segments
#: between them; a unit test checks that each still exists.
TARGETS: dict[str, list[tuple[str, str, str]]] = {
    "devhost.queues": [("StorageQueue", "receive", "receive")],
    "devhost.invoke": [("Invoker", "call", "invoke")],
    "scheduler.service": [
        ("Scheduler", "submit", "submit"),
        ("Scheduler", "_send_request", "send_request"),
    ],
    "stores.tables": [("TableStateStore", "create", "create")],
    "agents.agent": [("AgentWorker", "handle", "agent")],
}


def order_ids(event: str, args: Sequence[Any], result: Any) -> list[str]:
    """The orders a call was about (for ``receive``: each message's), [] if none is known."""
    if event == "submit":
        return [json.loads(args[1])["orderId"]]
    if event in ("create", "send_request", "agent"):
        return [args[1].order_id]
    if event == "receive":
        return [order for m in result or () if (order := _message_order(m.content))]
    return []


def _message_order(content: str) -> str:
    """The message's ``orderId``, or "" if it is no JSON object with one: one unreadable
    message (a poison, a hostile body) must not hide its batch's other orders."""
    try:
        text = content if content.lstrip().startswith("{") else base64.b64decode(content).decode()
        found = json.loads(text)
    except (ValueError, TypeError):
        return ""
    return str(found.get("orderId", "")) if isinstance(found, dict) else ""


class Recorder:
    """Appends one JSON line per call to ``<directory>/<pid>.jsonl``."""

    def __init__(self, directory: str) -> None:
        self._file = open(  # noqa: SIM115 - open for the process's life
            os.path.join(directory, f"{os.getpid()}.jsonl"), "a", buffering=1
        )
        self._lock = threading.Lock()

    def __call__(self, event: str, started: float, ended: float, **detail: Any) -> None:
        line = json.dumps({"event": event, "start": started, "end": ended, **detail})
        with self._lock:
            self._file.write(line + "\n")


def traced(function: Callable[..., Any], event: str, record: Recorder) -> Callable[..., Any]:
    """``function``, recording each call's start, end and orders (``order_ids``)."""

    def note(args: Sequence[Any], result: Any, started: float) -> None:
        ended = time.time()
        try:
            orders = order_ids(event, args, result)
            detail = {"name": args[1].name} if event == "invoke" else {}
        except Exception as error:  # noqa: BLE001 - a probe must never break the call
            orders, detail = [], {"error": f"{type(error).__name__}: {error}"[:120]}
        record(event, started, ended, orders=orders, **detail)

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def wrapper_async(*args: Any, **kwargs: Any) -> Any:
            started, result = time.time(), None
            try:
                result = await function(*args, **kwargs)
                return result
            finally:
                note(args, result, started)

        return wrapper_async

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started, result = time.time(), None
        try:
            result = function(*args, **kwargs)
            return result
        finally:
            note(args, result, started)

    return wrapper


class _Hook(importlib.abc.MetaPathFinder):
    """Finds each target module as the other finders would, and wraps its targets once the
    module has run."""

    def __init__(self, record: Recorder) -> None:
        self._record = record

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            for cls, method, event in TARGETS[fullname]:
                owner = getattr(module, cls)
                setattr(owner, method, traced(getattr(owner, method), event, self._record))

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install(directory: str) -> None:
    sys.meta_path.insert(0, _Hook(Recorder(directory)))


if os.environ.get("BENCH_TRACE_DIR"):
    install(os.environ["BENCH_TRACE_DIR"])
