"""devhost under yappi, for ``bench.cpu``: ``python -m bench.cpuhost <devhost arguments>``.

Runs ``python -m devhost`` unchanged in this process. SIGUSR1 starts profiling (CPU
clock, every thread; stats cleared; builtins are not profiled, so their time counts as
their caller's); SIGUSR2 stops it and writes
``$BENCH_CPU_PROFILE_DIR/<pid>.json``: for every thread, its name, its CPU seconds and
the self CPU seconds of every function it ran, by the function's module (a file path,
or a builtin's module name). ``bench.cpu`` groups them. yappi is a dev requirement.

The runtime (azure-functions-runtime) runs every sync function on its own shared thread
pool, so a pool thread's name says nothing of the function it ran. The runtime's
``run_sync_func`` is wrapped to add up, per function, the CPU time (``time.thread_time``)
its pool thread spent running it; the dump carries these as ``pool`` and ``bench.cpu``
splits the pool threads' CPU between the functions by them. (yappi's own tags and context
callbacks misattribute here: measured, a tag sticks to a function's first caller.)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yappi
from azure_functions_runtime import handle_event

from devhost.__main__ import _exit
from devhost.__main__ import main as devhost_main

PROFILE_DIR = "BENCH_CPU_PROFILE_DIR"
TOP = 40  # functions by self CPU, whatever their thread
_pool_cpu: dict[str, float] = defaultdict(float)  # function -> CPU seconds on the pool
_pool_threads: set[str] = set()  # the names of the runtime's pool threads seen running one
_pool_lock = threading.Lock()


def _measured(run_sync_func: Any) -> Any:
    """The runtime's ``run_sync_func``, adding up the CPU each function spends in it."""

    def run(invocation_id: Any, context: Any, func: Any, params: Any) -> Any:
        started = time.thread_time()
        try:
            return run_sync_func(invocation_id, context, func, params)
        finally:
            spent = time.thread_time() - started
            with _pool_lock:
                _pool_cpu[getattr(func, "__name__", "function")] += spent
                _pool_threads.add(threading.current_thread().name)

    return run


def _start(signum: int, frame: Any) -> None:
    yappi.stop()
    yappi.clear_stats()
    yappi.set_clock_type("cpu")
    yappi.set_context_name_callback(lambda: threading.current_thread().name)
    with _pool_lock:
        _pool_cpu.clear()
        _pool_threads.clear()
    yappi.start(builtins=False, profile_threads=True)  # a builtin's time is its caller's


def _dump(signum: int, frame: Any) -> None:
    yappi.stop()
    threads: list[dict[str, Any]] = []
    top: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for thread in yappi.get_thread_stats():
        by_module: dict[str, float] = defaultdict(float)
        for stat in yappi.get_func_stats(filter={"ctx_id": thread.id}):
            by_module[stat.module] += stat.tsub
            entry = top[f"{stat.full_name}"]
            entry[0] += stat.tsub
            entry[1] += stat.ncall
        threads.append({"name": thread.name, "cpu": thread.ttot, "modules": by_module})
    out = Path(os.environ[PROFILE_DIR], f"{os.getpid()}.json")
    tmp = out.with_suffix(".tmp")
    yappi.get_func_stats().save(str(out.with_suffix(".pstat")), type="pstat")  # for pstats
    functions = sorted(top.items(), key=lambda item: -item[1][0])[:TOP]
    with _pool_lock:
        pool = {"functions": dict(_pool_cpu), "threads": sorted(_pool_threads)}
    tmp.write_text(json.dumps({"threads": threads, "top": functions, "pool": pool}))
    tmp.replace(out)
    yappi.clear_stats()


if __name__ == "__main__":
    handle_event.run_sync_func = _measured(handle_event.run_sync_func)
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _dump)
    _exit(devhost_main(sys.argv[1:]))
