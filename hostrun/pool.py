"""How many threads the runtime's pool needs, so that no function can starve another.

azure-functions-runtime runs every synchronous function on one ``ThreadPoolExecutor``
whose size is the app setting ``PYTHON_THREADPOOL_THREAD_COUNT``; unset, Python's default,
``min(32, CPUs + 4)``: 5 or 6 threads on a small instance
(``azure_functions_runtime/utils/threadpool.py``, ``start_threadpool_executor``). The host
hands one instance up to ``batchSize + newBatchThreshold`` messages of each Storage queue
function and ``maxConcurrentCalls`` of each Service Bus function at once (host.json). With
a pool smaller than their sum, the calls of one function whose remote hangs hold every
thread and all the other functions wait behind them: the runtime's pool, not host.json,
would then decide what runs. Sized to the sum, each function is bounded by its own
host.json limits only, and a thread is only started when an invocation needs it.

:func:`needed` is that sum for an app's functions; devhost warns at start when the setting
is below it, and a unit test holds the Bicep app setting and the local stack's to it.
"""

from __future__ import annotations

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
#: What the Function App (infra/app/function-app.bicep), local.settings.example.json and the
#: local stack (demo/stack.py) set: at least :func:`needed` for either agent transport
#: (tests/unit/test_thread_pool.py).
DEPLOYED_THREADS = "400"


def needed(specs: Iterable[FunctionSpec], host_json: Mapping[str, Any]) -> int:
    """Threads for every function's host.json maximum at once, on one instance."""
    specs = list(specs)
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
        f"hang can hold every thread. Set {SETTING}={need} or more"
    )
