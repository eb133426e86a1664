"""devhost under yappi, for ``bench.cpu``: ``python -m bench.cpuhost <devhost arguments>``.

Runs ``python -m devhost`` unchanged in this process. SIGUSR1 starts profiling (CPU
clock, every thread; stats cleared; builtins are not profiled, so their time counts as
their caller's); SIGUSR2 stops it and writes
``$BENCH_CPU_PROFILE_DIR/<pid>.json``: for every thread, its name, its CPU seconds and
the self CPU seconds of every function it ran, by the function's module (a file path,
or a builtin's module name). ``bench.cpu`` groups them. yappi is a dev requirement.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import yappi

from devhost.__main__ import _exit
from devhost.__main__ import main as devhost_main

PROFILE_DIR = "BENCH_CPU_PROFILE_DIR"
TOP = 40  # functions by self CPU, whatever their thread


def _start(signum: int, frame: Any) -> None:
    yappi.stop()
    yappi.clear_stats()
    yappi.set_clock_type("cpu")
    yappi.set_context_name_callback(lambda: threading.current_thread().name)
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
    tmp.write_text(json.dumps({"threads": threads, "top": functions}))
    tmp.replace(out)
    yappi.clear_stats()


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _dump)
    _exit(devhost_main(sys.argv[1:]))
