"""CPU benchmark: CPU milliseconds per order, and where they go.

    python -m bench.cpu [--orders 200] [--rounds 1] [--no-profile]

Runs the real stack (Azurite, the no-fault simulator, which answers at once, and one
devhost) and, for each workflow (``order``: one step; ``fulfilment``: three), after 20
warm-up orders, puts ``--orders`` orders on the ``orders`` queue at once and waits for
all of them. The CPU the processes used meanwhile (``/proc/<pid>/stat``: user + system of
every process in the group) divided by the orders is the figure: ``devhostMsPerOrder``
(the app's functions and devhost's host work), ``azuriteMsPerOrder`` (all the storage
work), ``simulatorMsPerOrder``; ``devhostSystemMsPerOrder`` is the kernel's part of
devhost's figure (system calls, thread wake-ups). The window includes what runs anyway
(the timers, idle polling): ``idle`` says how much that is per second with no orders.

Then, unless ``--no-profile``, the same burst again per workflow with the devhost under
yappi (``bench/cpuhost.py``: CPU clock, every thread; a builtin's time is its caller's).
CPU is split

- by function, from the thread that spent it: ``devhost-<function>_<n>`` is devhost's side
  of an invocation of ``<function>`` and the settling of its message; the function itself
  runs on the runtime's shared thread pool, whose CPU is split between the functions by
  the CPU each spent there (``bench/cpuhost.py``; ``run_agent_<agent>`` includes the
  reply applied in process and the next step's claim and request); ``worker`` is the
  runtime's event loop (invocation requests and responses), ``timer-<function>`` a
  timer's schedule, ``poll-*`` and ``renew-*`` devhost's polling and lease renewal;
- by kind of work, from the module of the function that spent it (self time): ``sdk``
  (azure-*, requests, urllib3, httpx, http.client, sockets, SSL), ``json+validation``
  (json, pydantic), ``logging+telemetry`` (logging, OpenTelemetry, observability/),
  ``app`` (the app's own packages), ``host`` (devhost/), ``runtime`` (the rest of the
  standard library: threading, typing, re, uuid, enum, dataclasses ...).

A profiler slows what it profiles (here about 4x), so the split is reported as shares
of the profiled run and as milliseconds scaled to the unprofiled figure.

Numbers from a shared 2-core machine are noisy: compare runs made together, not digits.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.cpuhost import PROFILE_DIR
from bench.latency import machine, send, utc_now_text, wait_finished
from demo.stack import LocalStack

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ("order", "fulfilment")
WARM_UP = 20
_TICK = os.sysconf("SC_CLK_TCK")

SDK = {
    "azure",
    "requests",
    "urllib3",
    "httpx",
    "httpcore",
    "h11",
    "idna",
    "certifi",
    "charset_normalizer",
    "isodate",
    "anyio",
    "sniffio",
    "typing_extensions",
    "msal",
}
SDK_STDLIB = {
    "http",
    "email",
    "socket",
    "ssl",
    "selectors",
    "urllib",
    "base64",
    "hmac",
    "hashlib",
    "_socket",
    "_ssl",
    "select",
    "zlib",
    "binascii",
    "_hashlib",
}
JSON = {"json", "_json", "pydantic", "pydantic_core", "annotated_types"}
LOGGING = {"logging", "opentelemetry", "observability"}
HOST = {"devhost", "hostrun", "werkzeug", "croniter", "bench"}


def group_cpu_seconds(pgid: int, *, system_only: bool = False) -> float:
    """User + system CPU (or system CPU only) of every live process in the group ``pgid``."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp, ... utime(11) stime(12)
            total += int(fields[12]) + (0 if system_only else int(fields[11]))
    return total / _TICK


def kind_of(module: str) -> str:
    """The kind of work a profiled function's module stands for (see the docstring)."""
    if "site-packages/" in module:
        top = module.split("site-packages/", 1)[1].split("/", 1)[0]
        if module.split("site-packages/", 1)[1].startswith("azure/monitor"):
            return "logging+telemetry"
    elif module.startswith(str(ROOT) + "/"):
        top = module[len(str(ROOT)) + 1 :].split("/", 1)[0]
        if top in HOST:
            return "host"
        return "logging+telemetry" if top in LOGGING else "app"
    elif "/lib/python3" in module:
        top = module.split("/lib/python3", 1)[1].split("/", 2)[1].removesuffix(".py")
    else:
        top = module
    top = top.removesuffix(".py")
    if top in SDK or top in SDK_STDLIB:
        return "sdk"
    if top in JSON:
        return "json+validation"
    if top in LOGGING:
        return "logging+telemetry"
    if top in HOST:
        return "host"
    return "runtime"


def function_of(thread: str) -> str:
    """Which function a devhost thread's CPU belongs to (see the docstring)."""
    if thread.startswith("devhost-"):
        return thread[len("devhost-") :].rsplit("_", 1)[0]
    if thread == "worker":
        # The runtime's event loop: invocation requests and responses, and the agents'
        # async functions (their HTTP calls, pacing and breakers: agents/triggers.py).
        return "runtime's event loop (dispatch, agents' calls)"
    if thread.startswith("timer-"):
        return thread[len("timer-") :]
    if thread.startswith("agent-"):
        # An agent's own threads (agents/threads.py: the claim read, the reply applied in
        # process and the next step claimed): agent-<agent>_<n>.
        return "run_agent_" + thread[len("agent-") :].rsplit("_", 1)[0].replace("-", "_")
    if thread.startswith("handler-"):  # a Python agent's handler (agents/python.py)
        return "Python agents' handlers"
    if thread.startswith(("poll-", "renew-")):
        return "host polling and leases"
    return "other threads"


def split(profile: dict[str, Any], scale_ms: float, orders: int) -> dict[str, Any]:
    """Profiled CPU by function and by kind: shares, and ms per order scaled to the
    unprofiled figure ``scale_ms``."""
    matrix: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    others: dict[str, float] = defaultdict(float)
    pool = profile.get("pool", {"functions": {}, "threads": []})
    ran = sum(pool["functions"].values())
    for thread in profile["threads"]:
        if thread["name"] in pool["threads"] and ran > 0:
            # The runtime's pool: its CPU split between the functions it ran, by the CPU
            # each spent there (bench/cpuhost.py); each gets the pool's split by kind.
            for function, seconds in pool["functions"].items():
                for module, module_seconds in thread["modules"].items():
                    matrix[function][kind_of(module)] += module_seconds * seconds / ran
            continue
        function = function_of(thread["name"])
        if function == "other threads":
            others[thread["name"].rstrip("0123456789-_")] += thread["cpu"]
        for module, seconds in thread["modules"].items():
            matrix[function][kind_of(module)] += seconds
    total = sum(sum(kinds.values()) for kinds in matrix.values()) or 1.0

    def entry(seconds: float) -> dict[str, float]:
        return {"ms": round(scale_ms * seconds / total, 2), "share": round(seconds / total, 3)}

    kinds: dict[str, float] = defaultdict(float)
    for per_kind in matrix.values():
        for kind, seconds in per_kind.items():
            kinds[kind] += seconds
    return {
        "profiledMsPerOrder": round(1000 * total / orders, 2),
        "byFunction": {
            f: entry(sum(k.values()))
            for f, k in sorted(matrix.items(), key=lambda item: -sum(item[1].values()))
        },
        "byKind": {k: entry(s) for k, s in sorted(kinds.items(), key=lambda item: -item[1])},
        "byFunctionAndKind": {
            f: {k: entry(s) for k, s in sorted(per.items(), key=lambda item: -item[1])}
            for f, per in matrix.items()
        },
        "otherThreadsSeconds": {k: round(v, 3) for k, v in others.items()},
        "topFunctions": [
            {"function": name, "ms": round(scale_ms * seconds / total, 3), "calls": calls}
            for name, (seconds, calls) in profile["top"]
        ],
    }


def burst(stack: LocalStack, workflow: str, orders: int, timeout: float) -> float:
    """``orders`` orders queued at once; seconds until the last one finished."""
    ctx = stack.context
    prefix = f"cpu-{workflow}-{uuid.uuid4().hex[:6]}"
    ids = [f"{prefix}-{n:05d}" for n in range(orders)]
    started = time.monotonic()
    for order_id in ids:
        send(ctx, order_id, workflow)
    done = wait_finished(ctx, ids, timeout)
    if len(done) < len(ids):
        raise SystemExit(f"{len(ids) - len(done)} {workflow} orders did not finish")
    return time.monotonic() - started


def run(
    orders: int, rounds: int, profile: bool, timeout: float, keep: Path | None = None
) -> dict[str, Any]:
    profile_dir = Path(tempfile.mkdtemp(prefix="cpu-profile-"))
    stack = LocalStack(
        devhosts=1,
        devhost_module="bench.cpuhost",
        settings={
            PROFILE_DIR: str(profile_dir),
            "STEP_TIMEOUT_SECONDS": "30",
            "SUPERVISOR_SCHEDULE": "*/10 * * * * *",
        },
    )
    out: dict[str, Any] = {"benchmark": "cpu", "date": utc_now_text(), "machine": machine()}
    with stack:
        assert stack.azurite is not None and stack.simulator is not None
        host = stack.hosts[0].process
        assert host is not None
        groups = {
            "devhost": host.pid,
            "azurite": stack.azurite.process.pid,
            "simulator": stack.simulator.pid,
        }

        def cpu() -> dict[str, float]:
            spent = {name: group_cpu_seconds(pgid) for name, pgid in groups.items()}
            # the kernel's part of devhost's (system calls, thread switches): in the total
            spent["devhostSystem"] = group_cpu_seconds(host.pid, system_only=True)
            return spent

        figures = [*groups, "devhostSystem"]  # what cpu() measures

        for workflow in WORKFLOWS:
            burst(stack, workflow, WARM_UP, timeout)
        time.sleep(2)
        before, idle_started = cpu(), time.monotonic()
        time.sleep(10)
        after, idle_seconds = cpu(), time.monotonic() - idle_started
        out["idle"] = {
            f"{name}MsPerSecond": round(1000 * (after[name] - before[name]) / idle_seconds, 1)
            for name in figures
        }
        results: dict[str, Any] = {}
        for workflow in WORKFLOWS:
            samples: list[dict[str, float]] = []
            for _ in range(rounds):
                before = cpu()
                seconds = burst(stack, workflow, orders, timeout)
                after = cpu()
                samples.append(
                    {
                        "seconds": round(seconds, 2),
                        **{
                            f"{name}MsPerOrder": round(
                                1000 * (after[name] - before[name]) / orders, 2
                            )
                            for name in figures
                        },
                    }
                )
            results[workflow] = {"orders": orders, "rounds": samples}
            for name in figures:
                values = sorted(s[f"{name}MsPerOrder"] for s in samples)
                results[workflow][f"{name}MsPerOrder"] = values[len(values) // 2]
        if profile:
            for workflow in WORKFLOWS:
                dump = profile_dir / f"{host.pid}.json"
                dump.unlink(missing_ok=True)
                os.kill(host.pid, signal.SIGUSR1)
                time.sleep(0.5)
                burst(stack, workflow, orders, timeout)
                os.kill(host.pid, signal.SIGUSR2)
                deadline = time.monotonic() + 60
                while not dump.exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
                data = json.loads(dump.read_text())
                scale = results[workflow]["devhostMsPerOrder"]
                results[workflow]["profile"] = split(data, scale, orders)
                if keep:  # the whole profile, for pstats (callers, callees)
                    keep.mkdir(parents=True, exist_ok=True)
                    dump.with_suffix(".pstat").replace(keep / f"cpu-{workflow}.pstat")
    out["workflows"] = results
    out["settings"] = {"devhosts": 1, "transport": "storage", "SUPERVISOR_SCHEDULE": "*/10"}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu")
    parser.add_argument("--orders", type=int, default=200, help="orders per workflow and burst")
    parser.add_argument("--rounds", type=int, default=1, help="unprofiled bursts per workflow")
    parser.add_argument("--no-profile", action="store_true", help="the figures only")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keep-profile", type=Path, help="folder for cpu-<workflow>.pstat")
    args = parser.parse_args(argv)
    result = run(args.orders, args.rounds, not args.no_profile, args.timeout, args.keep_profile)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
