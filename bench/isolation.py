"""Isolation benchmark: does a hanging agent slow the others?

    python -m bench.isolation [--hanging 120] [--rate 4] [--seconds 20] [--devhosts 1]

Runs the real stack (Azurite, the simulator, ``--devhosts`` devhost instances; Storage
queues) and measures the latency of ``order`` orders (one step, on the ``orders``
agent), submit to completed, under the same open-loop load twice:

1. ``alone``: after a warm-up, ``--rate`` orders a second for ``--seconds``.
2. ``beside``: ``--hanging`` ``fulfilment`` orders whose ``ship`` step (the ``carrier``
   agent) hangs on every call (the simulator's ``{"fail": "hang"}``: no answer, ever;
   each call holds its thread until the agent gives up at the try's bound and the
   step's deadline) are queued first; once their first two steps are done and the
   carrier is busy with their hanging calls, the same load runs again.

The figure is ``ratio``: p50 beside / p50 alone (issue 23: at most 2). Also reported,
per window: the CPU seconds each process group used (devhost, Azurite, simulator),
which is what the shared machine itself forces on the ``order`` orders, and how many
``ship`` steps were being called (``Processing``) when the window started and ended.

Numbers from a shared 2-core machine are noisy: compare runs, not digits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from bench.cpu import group_cpu_seconds
from bench.latency import done_at, machine, ms_stats, open_loop, send, utc_now_text, wait_finished
from core.states import StepState
from demo.stack import LocalStack

SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "20",
    "MAX_FAILURE_COUNT": "3",
    "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
}
#: Every call hangs (and applies first): the agent gives up on it at its try's bound.
HANG = {"fail": "hang", "times": 100000, "seconds": 3600}
WARM_UP = 20


def cpu(stack: LocalStack) -> dict[str, float]:
    assert stack.azurite is not None and stack.simulator is not None
    groups = {
        "devhost": [h.process.pid for h in stack.hosts if h.process is not None],
        "azurite": [stack.azurite.process.pid],
        "simulator": [stack.simulator.pid],
    }
    return {name: sum(group_cpu_seconds(p) for p in pids) for name, pids in groups.items()}


def hangs(stack: LocalStack) -> int:
    """Calls the simulator has begun to hang so far (``GET /_stats``)."""
    import httpx

    stats = httpx.get(f"{stack.simulator_url}/_stats", timeout=10).json()
    return int(stats.get("byFault", {}).get("hang", 0))


def shipping(stack: LocalStack, ids: list[str]) -> dict[str, int]:
    """Of the hanging orders: how many are past their first two steps, how many have their
    ship step claimed (``Processing``: its request queued or being called), and how many
    calls the simulator has begun to hang so far."""
    store = stack.context.store
    past = calling = 0
    for order_id in ids:
        order = store.load(order_id)
        if order is None:
            continue
        steps = sorted(order.steps, key=lambda s: s.seq)
        if all(s.process_state is StepState.PROCESSED for s in steps[:2]):
            past += 1
        if steps[-1].process_state is StepState.PROCESSING:
            calling += 1
    return {"pastFirstSteps": past, "shipProcessing": calling, "hangsBegun": hangs(stack)}


def window(
    stack: LocalStack, prefix: str, rate: float, seconds: float, timeout: float
) -> dict[str, Any]:
    """The open-loop load of ``order`` orders: their latencies and the CPU it took."""
    ctx = stack.context
    before = cpu(stack)
    started = time.monotonic()
    submitted, lag = open_loop(ctx, prefix, rate, seconds, "order")
    finished = wait_finished(ctx, list(submitted), timeout)
    elapsed = time.monotonic() - started
    after = cpu(stack)
    completed = {k: o for k, o in finished.items() if str(o.status) == "completed"}
    if not completed:
        raise SystemExit(f"{prefix}: no order completed")
    latencies = [done_at(o) - submitted[k] for k, o in completed.items()]
    return {
        "orders": len(submitted),
        "completed": len(completed),
        "unfinished": len(submitted) - len(finished),
        "maxSendLagMs": round(1000 * lag),
        "latencyMs": ms_stats(latencies),
        "latencies": latencies,
        "cpuSecondsPerSecond": {
            name: round((after[name] - before[name]) / elapsed, 2) for name in before
        },
    }


def run(
    hanging: int,
    rate: float,
    seconds: float,
    devhosts: int = 1,
    timeout: float = 120,
    settings: dict[str, str] | None = None,
    hang_seconds: float = 3600,
) -> dict[str, Any]:
    """``hang_seconds``: how long each ship call hangs before it answers (3600: past any
    deadline; below the agent's try bound of 10 s: a slow carrier, whose calls succeed,
    so its breaker never opens and every call holds its thread that long)."""
    hang = {**HANG, "seconds": hang_seconds}
    stack = LocalStack(devhosts=devhosts, settings={**SETTINGS, **(settings or {})})
    with stack:
        ctx = stack.context
        prefix = f"iso-{uuid.uuid4().hex[:6]}"
        time.sleep(1)  # let the hosts finish starting
        warm = [f"{prefix}-warm-{n:02d}" for n in range(WARM_UP)]
        for n, order_id in enumerate(warm):  # every agent's function and client warmed up
            send(ctx, order_id, "fulfilment" if n % 4 == 0 else "order")
        wait_finished(ctx, warm, timeout)
        alone = window(stack, f"{prefix}-alone", rate, seconds, timeout)

        hung = [f"{prefix}-hang-{n:04d}" for n in range(hanging)]
        for order_id in hung:
            body = {"orderId": order_id, "workflow": "fulfilment", "simulate": {"ship": hang}}
            ctx.queues.client(ctx.names.orders).send_message(json.dumps(body))
        deadline = time.monotonic() + timeout
        state = shipping(stack, hung)
        while time.monotonic() < deadline and state["pastFirstSteps"] < hanging:
            time.sleep(0.5)
            state = shipping(stack, hung)
        if state["pastFirstSteps"] < hanging:
            raise SystemExit(f"the hanging orders never reached their ship step: {state}")
        beside = window(stack, f"{prefix}-beside", rate, seconds, timeout)
        beside["hangingAtEnd"] = shipping(stack, hung)
        beside["hangingAtStart"] = state
        for host in stack.hosts:  # nothing to wait for: their calls hang for good
            host.kill()
    p50 = {name: w["latencyMs"]["p50"] for name, w in (("alone", alone), ("beside", beside))}
    return {
        "benchmark": "isolation",
        "date": utc_now_text(),
        "machine": machine(),
        "devhosts": devhosts,
        "settings": {**SETTINGS, **(settings or {})},
        "load": {"workflow": "order", "ordersPerSecond": rate, "seconds": seconds},
        "hanging": {"orders": hanging, "step": "ship", "agent": "carrier", "fault": hang},
        "alone": {k: v for k, v in alone.items() if k != "latencies"},
        "beside": {k: v for k, v in beside.items() if k != "latencies"},
        "ratio": round(p50["beside"] / max(p50["alone"], 1), 2),
        "ratioP90": round(
            beside["latencyMs"]["p90"] / max(alone["latencyMs"]["p90"], 1),
            2,
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.isolation")
    parser.add_argument("--hanging", type=int, default=120, help="hanging ship orders")
    parser.add_argument("--rate", type=float, default=4.0, help="order orders a second")
    parser.add_argument("--seconds", type=float, default=20, help="how long each load runs")
    parser.add_argument("--devhosts", type=int, default=1)
    parser.add_argument(
        "--hang-seconds", type=float, default=3600, help="how long each ship call hangs"
    )
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.hanging < 1:
        parser.error("--rate and --hanging must be positive")
    result = run(
        args.hanging,
        args.rate,
        args.seconds,
        args.devhosts,
        args.timeout,
        hang_seconds=args.hang_seconds,
    )
    print(json.dumps(result, indent=2))
    return 0 if result["alone"]["unfinished"] == 0 and result["beside"]["unfinished"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
