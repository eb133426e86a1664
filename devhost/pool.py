"""How many threads the runtime's pool needs, so that no function can starve another.

azure-functions-runtime runs every synchronous function on one ``ThreadPoolExecutor``
whose size is the app setting ``PYTHON_THREADPOOL_THREAD_COUNT``; unset, Python's default,
``min(32, CPUs + 4)``: 5 or 6 threads on a small instance
(``azure_functions_runtime/utils/threadpool.py``, ``start_threadpool_executor``). The host
hands one instance up to ``batchSize + newBatchThreshold`` messages of each Storage queue
function and ``maxConcurrentCalls`` of each Service Bus function at once (host.json). With
a pool smaller than their sum, the calls of one function that block hold every thread
and all the other functions wait behind them: the runtime's pool, not host.json, would
then decide what runs. Sized to the sum, each function is bounded by its own host.json
limits only, and a thread is only started when an invocation needs it.

``async def`` functions (the agents, ``run_agent_<agent>``, and the poison and dead-letter
alert triggers) take no pool thread: the runtime awaits them on its event loop, so they are
not counted. What they run on threads of their own (storage work, Python handlers) is
bounded per agent (``agents.threads``) and for the alerts together.

:func:`needed` is that sum for an app's functions; devhost warns at start when the setting
is below it, and a unit test holds the deployed setting (``infra/platform-settings.json``,
which devhost applies when unset: ``devhost.deployed``) to it.
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
#: The HTTP routes together (the operator API and console: a person's clicks): what one
#: instance serves at once, counted as one group, as Flex Consumption scales them.
HTTP_CONCURRENCY = 16


def needed(specs: Iterable[FunctionSpec], host_json: Mapping[str, Any]) -> int:
    """Threads for every synchronous function's host.json maximum at once, on one
    instance."""
    # An async function runs on the runtime's event loop: it holds no pool thread.
    specs = [spec for spec in specs if not inspect.iscoroutinefunction(spec.func)]
    kinds = {spec.trigger_type for spec in specs}
    per_kind = {loader.TIMER: 1}  # a timer does not start a run while its last one runs
    if loader.QUEUE in kinds:  # host.json's queue options are read only when they apply
        queues = QueueOptions.from_host_json(host_json)
        per_kind[loader.QUEUE] = queues.batch_size + queues.new_batch_threshold
    if loader.SERVICE_BUS in kinds:
        per_kind[loader.SERVICE_BUS] = ServiceBusOptions.from_host_json(
            host_json
        ).max_concurrent_calls
    total = sum(per_kind.get(spec.trigger_type, 0) for spec in specs)
    if any(spec.trigger_type == loader.HTTP for spec in specs):
        total += HTTP_CONCURRENCY
    return total


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
        f"the runtime's thread pool has {have} threads ({source}) but these functions may "
        f"run {need} invocations at once (host.json batchSize + newBatchThreshold per queue "
        f"function, maxConcurrentCalls per Service Bus function): a function whose calls "
        f"block can hold every thread. Set {SETTING}={need} or more"
    )
