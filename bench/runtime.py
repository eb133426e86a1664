"""What running the app through azure-functions-runtime costs (devhost's one path).

    python -m bench.runtime [--calls 2000]

Prints one JSON object:

- ``invocationUs``: per invocation, devhost's ``Invoker.call`` of a queue function that
  does nothing and of an HTTP function (tests/fixtures/runtime_probe_app), ``direct``
  (the function called with a ``func`` object made beforehand: the floor, what devhost
  did before it ran everything through the runtime) and ``worker`` (devhost's trigger
  turned into the host's ``InvocationRequest``, through the runtime's
  ``invocation_request`` on its event loop and thread pool, and the response decoded):
  p50 / p99 / mean in µs, and ``overheadUs``, the difference of the means.
- ``coldStartMs``: a fresh process (median of 3) that loads function_app.py (the real app,
  ``AGENT_TRANSPORT=storage``) ``direct`` (import, ``get_functions()``, as devhost's loader)
  and ``worker`` (the compiled protos, worker init, functions metadata, function loads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "tests" / "fixtures" / "runtime_probe_app"
COLD = {
    "direct": "import function_app; function_app.app.get_functions()",
    "worker": "from hostrun.worker import start; start('.')",
}


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50": round(ordered[len(ordered) // 2], 1),
        "p99": round(ordered[int(len(ordered) * 0.99)], 1),
        "mean": round(statistics.fmean(ordered), 1),
    }


def timed(call: Callable[[], Any], calls: int) -> list[float]:
    for _ in range(min(200, calls)):  # warm-up
        call()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


def invocations(calls: int) -> dict[str, Any]:
    import azure.functions as func
    from azure.functions.queue import QueueMessage

    from devhost.app_loader import FunctionSpec
    from hostrun import shapes
    from hostrun.worker import WorkerRuntime

    runtime = WorkerRuntime(PROBE).start()
    module = sys.modules["function_app"]  # the runtime imported it from PROBE
    body, url = b'{"orderId": "o-1"}', "http://127.0.0.1/api/probe/1"
    headers, route = {"a": "b"}, {"item": "1"}
    build: Any = QueueMessage
    cases = {
        "queue": (
            FunctionSpec("probe_echo", "queueTrigger", {"name": "msg"}, module.probe_echo),
            shapes.QueueMessage(id="m", body=body, dequeue_count=1, pop_receipt="p"),
            build(id="m", body=body, dequeue_count=1, pop_receipt="p"),
        ),
        "http": (
            FunctionSpec("probe_http", "httpTrigger", {"name": "req"}, module.probe_http),
            shapes.HttpRequest("POST", url, headers, {}, route, b"{}"),
            func.HttpRequest("POST", url, headers=headers, route_params=route, body=b"{}"),
        ),
    }
    results = {name: compare(runtime, *case, calls) for name, case in cases.items()}
    runtime.stop()
    return results


def compare(runtime: Any, spec: Any, trigger: Any, value: Any, calls: int) -> dict[str, Any]:
    """The invocation through the runtime, and the function called with ``value``."""
    from devhost.invoke import Invoker

    def call_directly(spec: Any, _: Any) -> Any:
        return spec.func(**{spec.trigger_arg: value})

    direct, worker = Invoker(call_directly), Invoker(runtime.call)
    row: dict[str, Any] = {
        "direct": summary(timed(lambda: direct.call(spec, trigger), calls)),
        "worker": summary(timed(lambda: worker.call(spec, trigger), calls)),
    }
    row["overheadUs"] = round(row["worker"]["mean"] - row["direct"]["mean"], 1)
    return row


def cold_start() -> dict[str, float]:
    env = {**os.environ, "AGENT_TRANSPORT": "storage", "PYTHONPATH": str(REPO)}
    out: dict[str, float] = {}
    for name, code in COLD.items():
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-c", code], cwd=REPO, env=env, check=True, capture_output=True
            )
            runs.append((time.perf_counter() - started) * 1000)
        out[name] = round(statistics.median(runs))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    result = {
        "python": sys.version.split()[0],
        "calls": args.calls,
        "invocationUs": invocations(args.calls),
        "coldStartMs": cold_start(),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
