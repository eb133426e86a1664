"""How many threads the runtime's pool needs, so that no function can starve another.

azure-functions-runtime runs every synchronous function (not ``async def`` ones) on one pool
of ``PYTHON_THREADPOOL_THREAD_COUNT`` threads (unset: ``min(32, CPUs + 4)``); the host hands
an instance up to ``batchSize + newBatchThreshold`` messages per queue function and
``maxConcurrentCalls`` per Service Bus function at once. Below their sum (:func:`needed`),
one function's blocked calls hold every thread: devhost warns at start.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from typing import Any

from devhost import app_loader as loader
from devhost.app_loader import FunctionSpec
from devhost.settings import QueueOptions, ServiceBusOptions

SETTING = "PYTHON_THREADPOOL_THREAD_COUNT"
#: The HTTP routes together (the API and console: a person's clicks), as one group.
HTTP_CONCURRENCY = 16


def needed(specs: Iterable[FunctionSpec], host_json: Mapping[str, Any]) -> int:
    """Threads for every synchronous function's host.json maximum at once, on one
    instance (a timer does not start a run while its last one runs)."""
    specs = [spec for spec in specs if not inspect.iscoroutinefunction(spec.func)]
    kinds = {spec.trigger_type for spec in specs}
    per_kind = {loader.TIMER: 1, loader.HTTP: 0}  # the HTTP routes count once, together
    if loader.QUEUE in kinds:  # host.json's options are read only when they apply
        per_kind[loader.QUEUE] = QueueOptions.from_host_json(host_json).max_concurrency
    if loader.SERVICE_BUS in kinds:
        bus = ServiceBusOptions.from_host_json(host_json)
        per_kind[loader.SERVICE_BUS] = bus.max_concurrent_calls
    http = HTTP_CONCURRENCY if loader.HTTP in kinds else 0
    return http + sum(per_kind.get(spec.trigger_type, 0) for spec in specs)


def configured(environ: Mapping[str, str]) -> int:
    """The pool size the runtime will use (Python's default when the setting is unset)."""
    value = environ.get(SETTING, "").strip()
    return int(value) if value.isdigit() else min(32, (os.cpu_count() or 1) + 4)


def shortfall(
    specs: Iterable[FunctionSpec], host_json: Mapping[str, Any], environ: Mapping[str, str]
) -> str | None:
    """A warning when the pool is smaller than :func:`needed`, else None."""
    need, have = needed(specs, host_json), configured(environ)
    if have >= need:
        return None
    source = f"{SETTING}={environ[SETTING]}" if SETTING in environ else f"{SETTING} unset"
    return (
        f"the runtime's thread pool has {have} threads ({source}) but these functions may run "
        f"{need} invocations at once (host.json): one whose calls block can hold every thread. "
        f"Set {SETTING}={need} or more"
    )
