"""Isolation benchmark: does a slow remote service slow the other agents' orders, as a user
meets it?

    python -m bench.isolation [--devhosts 2] [--transport storage|servicebus] [--pool N]
                              [--slow 120] [--slow-seconds 20] [--orders 30] [--rate 4]
                              [--idle-gap 6] [--runs 1]

Each run starts its own stack as the README says (``make start``: Azurite, the simulator,
``--devhosts`` devhost instances, the agent queues on Storage queues or, with
``--transport servicebus``, on localbus), with the README's settings (``README``: the
app's own defaults but for the supervisor's schedule) and **no**
``PYTHON_THREADPOOL_THREAD_COUNT``: devhost applies the deployed value
(``infra/platform-settings.json``), as it does for anyone who starts it. ``--pool N``
sets it, as a user may (8, say). Then, on that stack:

1. **warm-up**: 20 orders of every workflow (every agent's function and clients),
   waited for;
2. **alone**: nothing is sent to the ``orders`` queue for ``--idle-gap`` seconds, so that
   devhost's listeners back off as an idle queue's do, then ``--orders`` ``order`` orders
   (one step, on the ``orders`` agent) are sent at ``--rate`` a second, open loop;
3. **beside**: ``--slow`` ``fulfilment`` orders are queued at once; their ``ship`` call
   (the ``carrier`` agent) answers after ``--slow-seconds`` (the simulator's
   ``latencyMs``: a slow carrier, not a failing one; the agent cuts a try at 10 s, so
   with 20 s every try is cut, and with 8 s every call succeeds, slowly). The window
   opens ``--idle-gap`` seconds after the last of them was queued (the same idle gap on
   the ``orders`` queue as in 2) and once every one of them has reached its ship step
   (their first two steps done: else the window measures that burst of ordinary work;
   waited for up to 90 s, ``slowOrdersNotAtShipWhenOpened`` says how many had not),
   while their ship calls are in flight (a run where none is fails), and the same load
   runs again.

The figure is ``ratio``: the ``order`` orders' p50 beside / alone, in one run (the
target: at most 2). ``whereTheTimeWent`` compares the hops of their path, p50 alone and
beside (``bench.latency.hops``: the ``orders`` queue and ``submit_order``; the agent's
queue and ``run_agent_orders`` up to its remote call; the call and the reply applied),
and each window reports the ship calls in flight at its start, its least and most and
at its end (the simulator's calls begun less those ended), the ship calls that ended in it
(answered, or dropped by the simulator after the agent cut them), the ship steps' history
events in it (``claimed``: a dispatch and an agent invocation; ``deferred``: one that found
the breaker open) and any of the slow orders' earlier steps' (``slowOrdersEarlierSteps``),
the CPU each process group used (cores), and devhost's threads at most.

Numbers from a shared 2-core machine are noisy: compare runs, not digits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import stack_options
from bench.cpu import group_cpu_seconds
from bench.latency import (
    call_times,
    done_at,
    hops,
    machine,
    ms_stats,
    open_loop,
    percentile,
    send,
    utc_now_text,
    wait_finished,
)
from core.history import Happened
from core.model import Order
from core.timefmt import parse_iso
from demo.stack import LocalStack

#: What the devhost command of docs/local-development.md sets ("devhost"): the app's own
#: defaults for the rest (STEP_TIMEOUT_SECONDS 30, MAX_FAILURE_COUNT 5; the local stack
#: sets others).
README = {
    "STEP_TIMEOUT_SECONDS": "30",
    "MAX_FAILURE_COUNT": "5",
    "SUPERVISOR_SCHEDULE": "*/10 * * * * *",
}
POOL = "PYTHON_THREADPOOL_THREAD_COUNT"
WARM_UP = 20
SAMPLE_SECONDS = 0.5


def slow_ship(seconds: float) -> dict[str, Any]:
    """The simulator's directive: the ship call answers after ``seconds``."""
    return {"ship": {"latencyMs": round(1000 * seconds)}}


class Watch:
    """Samples, while a window runs, the calls the simulator has in flight and the
    threads of each devhost (``/proc/<pid>/status``)."""

    def __init__(self, stack: LocalStack):
        self.stack = stack
        self.in_flight: list[int] = []
        self.threads: list[int] = []
        #: how long the storage took to answer a plain request (a peek), seconds
        self.storage: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def __enter__(self) -> Watch:
        self.in_flight.append(in_flight(self.stack))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.in_flight.append(in_flight(self.stack))

    def _run(self) -> None:
        ctx = self.stack.context
        probe = ctx.queues.client(ctx.names.orders_rejected)
        while not self._stop.wait(SAMPLE_SECONDS):
            self.in_flight.append(in_flight(self.stack))
            self.threads.append(max(devhost_threads(self.stack), default=0))
            started = time.perf_counter()
            probe.peek_messages(max_messages=1)
            self.storage.append(time.perf_counter() - started)

    def summary(self) -> dict[str, int]:
        return {
            "atStart": self.in_flight[0],
            "least": min(self.in_flight),
            "most": max(self.in_flight),
            "atEnd": self.in_flight[-1],
        }


def in_flight(stack: LocalStack) -> int:
    """Calls the simulator has begun and not yet ended (answered or dropped)."""
    stats = httpx.get(f"{stack.simulator_url}/_stats", timeout=10).json()
    ended = sum(int(n) for n in stats.get("byStatus", {}).values()) + int(stats["noResponse"])
    return int(stats["calls"]) - ended


def devhost_threads(stack: LocalStack) -> list[int]:
    out = []
    for host in stack.hosts:
        if host.process is None:
            continue
        try:
            status = Path(f"/proc/{host.process.pid}/status").read_text()
        except OSError:
            continue
        out += [int(line.split()[1]) for line in status.splitlines() if line.startswith("Threads:")]
    return out


def cpu(stack: LocalStack) -> dict[str, float]:
    assert stack.azurite is not None and stack.simulator is not None
    groups = {
        "devhost": [h.process.pid for h in stack.hosts if h.process is not None],
        "azurite": [stack.azurite.process.pid],
        "simulator": [stack.simulator.pid],
    }
    if stack.bus is not None:
        groups["localbus"] = [stack.bus.process.pid]
    return {name: sum(group_cpu_seconds(p) for p in pids) for name, pids in groups.items()}


#: Slow calls in flight before the window opens (more than a low pool's threads).
IN_FLIGHT_AT_START = 10
#: How long the slow orders may take to reach their ship step before the window opens
#: anyway (the JSON says how many had not: ``slowOrdersNotAtShipWhenOpened``).
SHIP_WAIT_SECONDS = 90


def wait_in_flight(stack: LocalStack, calls: int, timeout: float) -> None:
    """Until ``calls`` remote calls are in flight, or ``timeout`` seconds have passed (the
    run then fails on its own check, saying how many were)."""
    deadline = time.monotonic() + timeout
    while in_flight(stack) < calls and time.monotonic() < deadline:
        time.sleep(0.2)


def wait_at_ship(
    stack: LocalStack,
    ids: list[str],
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Until every slow order has reached its ship step (the step exists), or
    ``timeout`` seconds have passed; how many had not. Until then their first two steps
    still run, and a window opened meanwhile measures the order orders beside that burst
    of ordinary work, not beside the slow calls."""
    deadline, left = clock() + timeout, list(ids)
    while True:
        left = [order_id for order_id in left if not at_ship(stack, order_id)]
        if not left or clock() >= deadline:
            return len(left)
        sleep(1)


def at_ship(stack: LocalStack, order_id: str) -> bool:
    order = stack.context.store.load(order_id)
    return order is not None and any(step.step == "ship" for step in order.steps)


def wait_idle(since: float, gap: float) -> None:
    """Until ``gap`` seconds have passed since ``since`` (monotonic)."""
    left = since + gap - time.monotonic()
    if left > 0:
        time.sleep(left)


def window(
    stack: LocalStack, prefix: str, orders: int, rate: float, timeout: float
) -> dict[str, Any]:
    """The open-loop load of ``order`` orders: their latencies, hops, and what ran beside."""
    ctx = stack.context
    before, started, wall = cpu(stack), time.monotonic(), time.time()
    ship_calls_before = ship_calls(stack)
    with Watch(stack) as watch:
        submitted, lag = open_loop(ctx, prefix, rate, orders / rate, "order")
        finished = wait_finished(ctx, list(submitted), timeout)
    elapsed = time.monotonic() - started
    after = cpu(stack)
    completed = {k: o for k, o in finished.items() if str(o.status) == "completed"}
    if not completed:
        raise SystemExit(f"{prefix}: no order completed")
    latencies = [done_at(o) - submitted[k] for k, o in completed.items()]
    calls = call_times(stack)
    by_hop: dict[str, list[float]] = defaultdict(list)
    by_route: dict[str, list[float]] = defaultdict(list)
    for order_id, order in completed.items():
        for hop, seconds in hops(order, submitted[order_id], calls):
            by_hop[hop].append(seconds)
        by_route[route(order)].append(done_at(order) - submitted[order_id])
    return {
        "orders": len(submitted),
        "completed": len(completed),
        "unfinished": len(submitted) - len(finished),
        # a failure counted, or a second attempt, on any of the window's orders
        "failuresCounted": sum(s.failure_count for o in finished.values() for s in o.steps),
        "retried": sum(1 for o in finished.values() for s in o.steps if s.attempt > 1),
        "maxSendLagMs": round(1000 * lag),
        "latencyMs": ms_stats(latencies),
        "hopsP50Ms": {hop: round(1000 * percentile(v, 0.5)) for hop, v in by_hop.items()},
        "byRoute": {
            name: {"orders": len(v), "p50Ms": round(1000 * percentile(v, 0.5))}
            for name, v in sorted(by_route.items())
        },
        "shipCallsInFlight": watch.summary(),
        "shipCallsEnded": ship_calls(stack) - ship_calls_before,
        "devhostThreadsMost": max(watch.threads, default=0),
        "storagePeekMs": ms_stats(watch.storage) if watch.storage else None,
        "cpuCores": {name: round((after[name] - before[name]) / elapsed, 2) for name in before},
        "seconds": round(elapsed, 1),
        "between": (wall, wall + elapsed),
    }


def route(order: Order) -> str:
    """Which instances took the order: ``<submit's>-><agent's>`` (devhost's index), from
    the instance its claim and its success name."""
    step = order.steps[0]
    claimed = next((h for h in step.history if h.get("event") == Happened.CLAIMED), {})
    succeeded = next((h for h in step.history if h.get("event") == Happened.SUCCEEDED), {})

    def index(event: dict[str, Any]) -> str:
        instance = str(event.get("instance", "?"))  # devhost-<index>-<start>-<pid>
        parts = instance.split("-")
        return parts[1] if len(parts) > 1 else "?"

    return f"{index(claimed)}->{index(succeeded)}"


def slow_steps(
    stack: LocalStack, ids: list[str], between: tuple[float, float]
) -> dict[str, Counter[str]]:
    """What the slow orders' steps did in the window, by step and history event. Their
    ship step's (each ``claimed`` is a dispatch and an agent invocation; ``deferred``, one
    that found the carrier's breaker open, or its time run out) are the slow remote's cost;
    any of their earlier steps' are ordinary work that had not ended when the window
    opened."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for order_id in ids:
        order = stack.context.store.load(order_id)
        if order is None:
            continue
        for step in order.steps:
            for event in step.history:
                at = parse_iso(event["at"]).timestamp() if "at" in event else None
                if at is not None and between[0] <= at <= between[1]:
                    counts[step.step][str(event.get("event"))] += 1
    return counts


def ship_calls(stack: LocalStack) -> int:
    return sum(1 for call in stack.remote_calls() if call.get("step") == "ship")


def run(
    *,
    devhosts: int = 2,
    transport: str = "storage",
    pool: int | None = None,
    slow: int = 120,
    slow_seconds: float = 20,
    orders: int = 30,
    rate: float = 4,
    idle_gap: float = 6,
    timeout: float = 180,
) -> dict[str, Any]:
    """One run on a fresh stack: the ``order`` orders alone, then beside the slow ships."""
    settings = dict(README)
    if pool is not None:
        settings[POOL] = str(pool)
    stack = LocalStack(devhosts=devhosts, settings=settings, transport=transport)
    with stack:
        ctx = stack.context
        prefix = f"iso-{uuid.uuid4().hex[:6]}"
        warm = [f"{prefix}-warm-{n:02d}" for n in range(WARM_UP)]
        for n, order_id in enumerate(warm):  # every agent's function and client warmed up
            send(ctx, order_id, "fulfilment" if n % 4 == 0 else "order")
        last_sent = time.monotonic()
        if len(wait_finished(ctx, warm, timeout)) < WARM_UP:
            raise SystemExit("the warm-up orders did not finish")
        wait_idle(last_sent, idle_gap)
        alone = window(stack, f"{prefix}-alone", orders, rate, timeout)

        slowed = [f"{prefix}-slow-{n:04d}" for n in range(slow)]
        directive = slow_ship(slow_seconds)
        client = ctx.queues.client(ctx.names.orders)
        for order_id in slowed:
            body = {"orderId": order_id, "workflow": "fulfilment", "simulate": directive}
            client.send_message(json.dumps(body))
        wait_idle(time.monotonic(), idle_gap)
        # The window opens while the slow calls are in flight: on a busy machine the slow
        # orders may take longer than the gap to reach their ship step (two steps before
        # it). A longer gap changes nothing on the orders queue: its poll is at its
        # slowest (maxPollingInterval, 0.5 s) after the gap already.
        # ... and once all of them have reached it: until then their first two steps (240
        # of them) still run, and the window would measure that burst of ordinary work.
        not_at_ship = wait_at_ship(stack, slowed, timeout=SHIP_WAIT_SECONDS)
        wait_in_flight(stack, min(IN_FLIGHT_AT_START, slow), timeout=60)
        beside = window(stack, f"{prefix}-beside", orders, rate, timeout)
        steps = slow_steps(stack, slowed, beside["between"])
        beside["shipSteps"] = dict(steps.pop("ship", Counter()))
        beside["slowOrdersNotAtShipWhenOpened"] = not_at_ship
        beside["slowOrdersEarlierSteps"] = {k: dict(v) for k, v in sorted(steps.items())}
        if beside["shipCallsInFlight"]["atStart"] == 0:
            raise SystemExit(f"no ship call was in flight when the window opened: {beside}")
        for host in stack.hosts:  # nothing to wait for: their calls are slow on purpose
            host.kill()
    p50 = {"alone": alone["latencyMs"]["p50"], "beside": beside["latencyMs"]["p50"]}
    went = {
        hop: {"alone": alone["hopsP50Ms"].get(hop), "beside": ms}
        for hop, ms in beside["hopsP50Ms"].items()
    }
    return {
        "benchmark": "isolation",
        "date": utc_now_text(),
        "machine": machine(),
        "devhosts": devhosts,
        "transport": transport,
        "pool": str(pool) if pool is not None else "unset (devhost applies the deployed value)",
        "settings": settings,
        "load": {"workflow": "order", "orders": orders, "ordersPerSecond": rate},
        "idleGapSeconds": idle_gap,
        "slow": {
            "orders": slow,
            "workflow": "fulfilment",
            "step": "ship",
            "agent": "carrier",
            "answersAfterSeconds": slow_seconds,
        },
        "alone": {k: v for k, v in alone.items() if k != "between"},
        "beside": {k: v for k, v in beside.items() if k != "between"},
        "ratio": round(p50["beside"] / max(p50["alone"], 1), 2),
        "ratioP90": round(beside["latencyMs"]["p90"] / max(alone["latencyMs"]["p90"], 1), 2),
        "whereTheTimeWent": went,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.isolation")
    stack_options(parser, timeout=180)
    parser.add_argument("--pool", type=int, default=None, help=f"set {POOL} (default: unset)")
    parser.add_argument("--slow", type=int, default=120, help="fulfilment orders, ship slow")
    parser.add_argument("--slow-seconds", type=float, default=20, help="the ship call's answer")
    parser.add_argument("--orders", type=int, default=30, help="order orders a window")
    parser.add_argument("--rate", type=float, default=4.0, help="order orders a second")
    parser.add_argument("--idle-gap", type=float, default=6, help="the orders queue idle before")
    parser.add_argument("--runs", type=int, default=1, help="runs, each on a fresh stack")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.slow < 1 or args.orders < 1 or args.runs < 1:
        parser.error("--rate, --slow, --orders and --runs must be positive")
    results = [
        run(
            devhosts=args.devhosts,
            transport=args.transport,
            pool=args.pool,
            slow=args.slow,
            slow_seconds=args.slow_seconds,
            orders=args.orders,
            rate=args.rate,
            idle_gap=args.idle_gap,
            timeout=args.timeout,
        )
        for _ in range(args.runs)
    ]
    ratios = [r["ratio"] for r in results]
    out = (
        results[0]
        if len(results) == 1
        else {
            "benchmark": "isolation",
            "ratios": ratios,
            "medianRatio": statistics.median(ratios),
            "runs": results,
        }
    )
    print(json.dumps(out, indent=2))
    unfinished = any(r[w]["unfinished"] for r in results for w in ("alone", "beside"))
    return 1 if unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
