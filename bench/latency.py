"""Latency benchmark: submit-to-done under an open-loop load, and where the time goes.

    python -m bench.latency [--rate R] [--seconds 45] [--burst 200] [--devhosts 2]
                            [--transport storage|servicebus]

Runs the real stack (Azurite, a no-fault simulator, N devhost instances), like
``bench.pipeline``, in two phases, and prints one JSON object:

1. ``drain``: after 20 warm-up orders, a burst of ``--burst`` orders queued at once;
   the drain rate is finished / (last completion - first submit), as
   ``bench.pipeline`` measures it.
2. ``load``: an open-loop load at a fixed rate (``--rate``; default half the drain
   rate just measured) for ``--seconds``: order *i* is sent at ``start + i / rate``
   whether or not earlier ones have finished (a closed loop would hide queueing).

For every order of the load that completed, ``latencyMs`` is submit (client clock,
after the send returned) to done (the order record's completion event), and
``hopsMs`` splits that time by the timestamps the app records (``core/model.py``):

- ``submit->accepted``: the order record's ``CreatedAt`` minus the client's submit time
  (the ``orders`` queue and ``submit_order``)
- ``accepted->claimed``: the step history's ``claimed`` (the in-process dispatch); the
  first step is claimed in the submit's own write, so its hop is ``submit->accepted+claimed``
- ``claimed->remoteCall``: when the simulator received the agent's call (its call log,
  ``GET /_calls``: the agent request queue and ``run_agent_*``)
- ``remoteCall->replyApplied``: the step history's ``succeeded`` (the remote call, and
  the reply applied in the agent's process, or through the reply queue and
  ``handle_agent_reply``: messaging/inline.py)
- ``replyApplied->done``: the order's terminal ``status`` event (0 for a one-step
  workflow: the same transaction)

A workflow of several steps gets one set per step, suffixed ``[step]``, and
``replyApplied->claimed[next]`` between steps. Each hop is reported as p50 / p99 /
mean in ms; the means add up to the mean latency. Every process runs on one machine,
so the clocks agree; history times have millisecond resolution.

Numbers from a shared 2-core machine are noisy: compare runs, not digits.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from bench import stack_options
from bootstrap import AppContext
from core.history import Happened
from core.model import Order
from core.timefmt import parse_iso
from demo.stack import LocalStack

WARM_UP = 20  # orders run before the burst, so that it measures warm hosts


def machine() -> dict[str, Any]:
    """Where and when a benchmark ran: every benchmark's JSON carries it."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def utc_now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def ms_stats(values: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max / mean of seconds, in whole milliseconds."""
    return {
        "p50": round(1000 * percentile(values, 0.5)),
        "p90": round(1000 * percentile(values, 0.9)),
        "p99": round(1000 * percentile(values, 0.99)),
        "max": round(1000 * max(values)),
        "mean": round(1000 * statistics.mean(values)),
    }


def send(ctx: AppContext, order_id: str, workflow: str) -> float:
    """Queue one order; the client's submit time (after the send returned)."""
    body = {"orderId": order_id, "workflow": workflow, "amount": 10}
    ctx.queues.client(ctx.names.orders).send_message(json.dumps(body))
    return time.time()


def wait_finished(ctx: AppContext, ids: list[str], timeout: float) -> dict[str, Order]:
    """The orders among ``ids`` that reached a terminal status within ``timeout``.

    Light on the store on purpose (it is what is measured): it reads one order at a
    time, in submission order, and sleeps while the oldest unfinished one runs. The
    times measured come from the records, not from when this loop saw them."""
    finished: dict[str, Order] = {}
    deadline = time.monotonic() + timeout
    index = 0
    while index < len(ids) and time.monotonic() < deadline:
        order = ctx.store.load(ids[index])
        if order is not None and order.status.terminal:
            finished[ids[index]] = order
            index += 1
        else:
            time.sleep(0.25)
    return finished


def done_at(order: Order) -> float:
    """When the order reached its terminal status (its last ``status`` event)."""
    for event in reversed(order.history):
        if event.get("event") == Happened.STATUS and event.get("status") == str(order.status):
            return parse_iso(event["at"]).timestamp()
    return order.updated_at.timestamp()


def event_at(history: list[dict[str, Any]], name: str, last: bool = False) -> float | None:
    found = [h for h in history if h.get("event") == name]
    if not found:
        return None
    return parse_iso(found[-1 if last else 0]["at"]).timestamp()


def hops(order: Order, submitted: float, calls: dict[str, list[float]]) -> list[tuple[str, float]]:
    """(hop, seconds) from submit to done, from the records' timestamps (see the module
    docstring); a hop whose timestamps are missing is left out."""
    out = [("submit->accepted", order.created_at.timestamp() - submitted)]
    previous = ("accepted", order.created_at.timestamp())
    steps = sorted(order.steps, key=lambda s: s.seq)
    for step in steps:
        suffix = f"[{step.step}]" if len(steps) > 1 else ""
        claimed = event_at(step.history, "claimed")
        succeeded = event_at(step.history, "succeeded", last=True)
        if claimed is None or succeeded is None:
            return out  # not a plain success: no further hops
        if previous[0] == "accepted" and claimed - previous[1] < 0.002:
            # Accepted and claimed in one write (scheduler.submit): one point in time,
            # whose two stamps differ only by the history's millisecond rounding.
            claimed = previous[1]
            out[0] = ("submit->accepted+claimed", out[0][1])
        else:
            out.append((f"{previous[0]}->claimed{suffix}", claimed - previous[1]))
        at = [c for c in calls.get(f"{order.order_id}:{step.step}", []) if c <= succeeded]
        if at:
            out.append((f"claimed->remoteCall{suffix}", at[-1] - claimed))
            out.append((f"remoteCall->replyApplied{suffix}", succeeded - at[-1]))
        else:
            out.append((f"claimed->replyApplied{suffix}", succeeded - claimed))
        previous = ("replyApplied", succeeded)
    out.append((f"{previous[0]}->done", done_at(order) - previous[1]))
    return out


def hops_ms(
    completed: dict[str, Order], submitted: dict[str, float], calls: dict[str, list[float]]
) -> dict[str, dict[str, float]]:
    """Each hop (``hops``) over the ``completed`` orders: p50 / p99 / mean in ms."""
    by_hop: dict[str, list[float]] = defaultdict(list)
    for order_id, order in completed.items():
        for name, value in hops(order, submitted[order_id], calls):
            by_hop[name].append(value)
    return {
        name: {k: v for k, v in ms_stats(values).items() if k in ("p50", "p99", "mean")}
        for name, values in by_hop.items()
    }


def warm_up(ctx: AppContext, prefix: str, workflow: str, timeout: float, orders: int) -> None:
    """Once the hosts have started: ``orders`` orders run to their end, so that what is
    measured next meets warm hosts."""
    time.sleep(2)  # let the hosts finish starting
    warm = [f"{prefix}-warm-{n:02d}" for n in range(orders)]
    for order_id in warm:
        send(ctx, order_id, workflow)
    wait_finished(ctx, warm, timeout)


def call_times(stack: LocalStack) -> dict[str, list[float]]:
    """Idempotency key -> when the simulator received each call for it (oldest first)."""
    out: dict[str, list[float]] = defaultdict(list)
    for call in stack.remote_calls():
        if call.get("idempotencyKey"):
            out[call["idempotencyKey"]].append(parse_iso(call["at"]).timestamp())
    for times in out.values():
        times.sort()
    return out


def drain(ctx: AppContext, prefix: str, orders: int, workflow: str, timeout: float) -> float:
    """Orders per second for a burst of ``orders`` queued at once."""
    ids = [f"{prefix}-burst-{n:05d}" for n in range(orders)]
    first = time.time()
    for order_id in ids:
        send(ctx, order_id, workflow)
    finished = wait_finished(ctx, ids, timeout)
    if len(finished) < orders:
        raise SystemExit(f"the burst did not drain: {len(finished)} of {orders} finished")
    return orders / (max(done_at(o) for o in finished.values()) - first)


def open_loop(
    ctx: AppContext, prefix: str, rate: float, seconds: float, workflow: str
) -> tuple[dict[str, float], float]:
    """Send ``rate * seconds`` orders at fixed times; their submit times, and the
    largest lag of a send behind its schedule (the sender itself keeping up)."""
    count = max(1, round(rate * seconds))
    submitted: dict[str, float] = {}
    lag = 0.0
    start = time.monotonic() + 0.5
    for n in range(count):
        due = start + n / rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        else:
            lag = max(lag, -wait)
        order_id = f"{prefix}-load-{n:06d}"
        submitted[order_id] = send(ctx, order_id, workflow)
    return submitted, lag


def run(
    rate: float | None,
    seconds: float,
    burst: int,
    devhosts: int,
    workflow: str,
    timeout: float,
    transport: str = "storage",
) -> dict[str, Any]:
    stack = LocalStack(
        devhosts=devhosts,
        transport=transport,
        settings={"STEP_TIMEOUT_SECONDS": "30", "SUPERVISOR_SCHEDULE": "*/5 * * * * *"},
    )
    with stack:
        ctx = stack.context
        prefix = f"lat-{uuid.uuid4().hex[:6]}"
        warm_up(ctx, prefix, workflow, timeout, WARM_UP)
        drain_rate = drain(ctx, prefix, burst, workflow, timeout)
        load_rate = rate if rate is not None else drain_rate / 2
        time.sleep(2)  # let the burst's last replies and notices settle
        submitted, lag = open_loop(ctx, prefix, load_rate, seconds, workflow)
        finished = wait_finished(ctx, list(submitted), timeout)
        calls = call_times(stack)
    completed = {k: o for k, o in finished.items() if str(o.status) == "completed"}
    if not completed:
        raise SystemExit("no order of the load completed")
    latencies = [done_at(o) - submitted[k] for k, o in completed.items()]
    span = max(done_at(o) for o in completed.values()) - min(submitted.values())
    return {
        "benchmark": "latency",
        "date": utc_now_text(),
        "machine": machine(),
        "workflow": workflow,
        "transport": transport,
        "devhosts": devhosts,
        "drain": {"orders": burst, "ordersPerSecond": round(drain_rate, 1)},
        "load": {
            "ordersPerSecond": round(load_rate, 2),
            "fractionOfDrainRate": round(load_rate / drain_rate, 2),
            "seconds": seconds,
            "orders": len(submitted),
            "completed": len(completed),
            "unfinished": len(submitted) - len(finished),
            "otherTerminal": len(finished) - len(completed),
            "achievedOrdersPerSecond": round(len(completed) / span, 2),
            "maxSendLagMs": round(1000 * lag),
        },
        "latencyMs": ms_stats(latencies),
        "hopsMs": hops_ms(completed, submitted, calls),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency")
    parser.add_argument("--rate", type=float, default=None, help="orders/s (default: drain/2)")
    parser.add_argument("--seconds", type=float, default=45, help="how long the load runs")
    parser.add_argument("--burst", type=int, default=200, help="orders of the drain burst")
    parser.add_argument("--workflow", default="order", choices=["order", "fulfilment"])
    stack_options(parser, timeout=300)
    args = parser.parse_args(argv)
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be positive")
    result = run(
        args.rate,
        args.seconds,
        args.burst,
        args.devhosts,
        args.workflow,
        args.timeout,
        args.transport,
    )
    print(json.dumps(result, indent=2))
    load = result["load"]
    return 0 if load["unfinished"] == 0 and load["otherTerminal"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
