"""Steady capacity: the highest offered rate whose backlog does not grow, and what is
served at half of it.

    python -m bench.capacity [--transport storage|servicebus] [--devhosts 2] [--hold 60]
                             [--start R] [--max-minutes 14] [--seconds 45] [--burst 300]
                             [--same-stack]

A burst drains faster than a steady stream is served (the hosts meet a full queue and
batch), so "half the drain rate" can overload the app. This benchmark measures the rate
a steady stream can be served at. On the real stack (Azurite, a no-fault simulator,
``--devhosts`` devhost instances, the agent queues on ``--transport``), after a warm-up
and a burst of ``--burst`` orders (its drain rate, as ``bench.latency`` measures it):

1. **Search.** Open-loop steps (order *i* sent at ``start + i / rate`` whether or not
   earlier ones finished, as ``bench.latency.open_loop`` but from ``SENDERS`` threads,
   so that a slow send does not delay the next: ``paced``), each held ``--hold`` seconds, then
   left to drain before the next. The backlog of a step is reconstructed from the order
   records afterwards, once a second over the hold: orders sent by then minus orders
   whose terminal status is stamped by then (nothing reads the store while the rate is
   held, so measuring adds no load). **A rate is sustained** when, over the last two
   thirds of the hold (the first third lets the pipeline fill), both

   - the least-squares slope of the backlog is at most ``SLOPE_FRACTION`` (3 %) of the
     offered rate, or ``SLOPE_FLOOR`` (0.2 orders/s) if that is larger; and
   - the orders finished in that window, per second, are at least ``SERVED_FRACTION``
     (95 %) of the offered rate.

   The first step is ``--start`` or a quarter of the burst's drain rate. While steps are
   sustained the rate rises by ``FACTOR`` (1.5x); once one is not, the search bisects
   (geometric mean) between the highest sustained rate below the lowest unsustained one
   and that unsustained one, ``BISECTIONS`` times or until the two are within 10 %. If
   the first step is not sustained the rate falls by ``FACTOR`` instead (``DOWN_STEPS``
   times at most; then there is no capacity to report). The capacity is
   the highest sustained rate below the lowest unsustained one. A step that would not
   finish within ``--max-minutes`` (counted from the first step) is not started, and the
   output says the search was cut short.
2. **Latency at half the capacity** for ``--seconds``: submit-to-done p50 / p99 and the
   hops (``bench.latency.hops_ms``).
3. **Throughput against a bare replay**, in the same run: a backlog of
   ``--replay-orders`` drained (``bench.pipeline.product_run``) over the bare storage
   work of ``--replay`` orders one at a time (``bench.pipeline.bare_replay``, Storage
   queues whatever the transport: it replays the Storage deployment's operations).

**Each of phases 2 and 3 runs on a fresh stack** (a new ``LocalStack`` with the same
options, warmed up as the first one was, ``bench.latency.warm_up``), started once the
search's stack has stopped. The search leaves 6,000-11,000 orders in its table, and
Azurite answers every read by scanning the whole table (docs/benchmarks.md, "Sweeps"):
measured after it, the latency and the replay met a store slower than a deployment's
(Azure Table Storage reads a row by its keys) and slower than at the search's own first
steps. ``--same-stack`` runs them on the search's stack, as it was done before (to compare);
the JSON's ``phaseStacks`` says which.

Prints one JSON object: ``machine``, ``rule``, ``phaseStacks``, ``steps`` (each with its
offered and finished rates, backlog slope, latency and hops p50, sustained or not),
``capacity``, ``latencyAtHalf``, ``replay`` and the CPU shares of each measured phase
(``bench.cpuload``; a fresh stack's start and warm-up are not in them).
Numbers from a shared 2-core machine are noisy: compare runs, not digits.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from bench import cpuload, stack_options
from bench.latency import (
    WARM_UP,
    done_at,
    drain,
    hops_ms,
    machine,
    ms_stats,
    utc_now_text,
    wait_finished,
    warm_up,
)
from bench.pipeline import bare_replay, product_run
from bootstrap import AppContext
from core.model import Order
from core.timefmt import parse_iso
from demo.stack import LocalStack

SLOPE_FRACTION = 0.03  # of the offered rate: the backlog's growth still counted as flat
SLOPE_FLOOR = 0.2  # orders/s: below this a slope is noise whatever the rate
SERVED_FRACTION = 0.95  # finished per second over offered per second, at least
SETTLE_FRACTION = 1 / 3  # of the hold, left out of the judgement: the pipeline filling
FACTOR = 1.5  # the rate's step while every step so far was sustained (or none was)
BISECTIONS = 2  # steps between the last sustained and the first unsustained rate
DOWN_STEPS = 3  # steps down at most when even the first rate is not sustained
CLOSE_ENOUGH = 1.1  # stop bisecting once the bracket is this narrow (a ratio)
SAMPLE_SECONDS = 1.0  # the backlog's resolution
SENDERS = 4  # threads sending the open loop's orders
#: The search's own stack's settings; a fresh stack for a later phase gets the same.
SETTINGS = {"STEP_TIMEOUT_SECONDS": "30", "SUPERVISOR_SCHEDULE": "*/5 * * * * *"}
PHASE_STACKS = {
    "fresh": "latency at half and the replay each on a new stack with the search's "
    f"options, warmed up with {WARM_UP} orders (the search's table is not met)",
    "same": "latency at half and the replay on the search's stack, after it "
    "(--same-stack: its table holds every order of the search)",
}

RULE = {
    "window": "the last 2/3 of the hold",
    "slope": f"least-squares backlog slope <= max({SLOPE_FRACTION} x offered, "
    f"{SLOPE_FLOOR}) orders/s",
    "served": f"finished in the window per second >= {SERVED_FRACTION} x offered",
    "backlog": "orders sent minus orders stamped terminal, once a second, from the records",
    "search": f"x{FACTOR} while sustained (/{FACTOR} while none is), then {BISECTIONS} "
    f"geometric bisections (until within {round(100 * (CLOSE_ENOUGH - 1))} %)",
}


@dataclass(frozen=True)
class Step:
    """One held rate and whether it was sustained (what the search decides on)."""

    rate: float
    sustained: bool


def backlog_series(
    sent: list[float], done: list[float], start: float, end: float, every: float = SAMPLE_SECONDS
) -> list[tuple[float, int]]:
    """(time, orders sent by then minus orders done by then) from ``start`` to ``end``."""
    if end <= start or every <= 0:
        raise ValueError("the series needs end > start and a positive interval")
    sent, done = sorted(sent), sorted(done)
    out: list[tuple[float, int]] = []
    i = j = 0
    t = start
    while t <= end + 1e-9:
        while i < len(sent) and sent[i] <= t:
            i += 1
        while j < len(done) and done[j] <= t:
            j += 1
        out.append((t, i - j))
        t += every
    return out


def slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of ``points`` (per unit of their first coordinate)."""
    if len(points) < 2:
        raise ValueError("a slope needs at least two points")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        raise ValueError("a slope needs points at different times")
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx


def judge(
    rate: float, sent: list[float], done: list[float], start: float, end: float
) -> dict[str, Any]:
    """The sustained rule (module docstring) for one step held from ``start`` to ``end``:
    ``sent`` the orders' submit times, ``done`` the times they reached a terminal status
    (any order, so unfinished ones are simply absent)."""
    window_start = start + SETTLE_FRACTION * (end - start)
    points = backlog_series(sent, done, window_start, end)
    growth = slope(points)
    finished = sum(1 for t in done if window_start < t <= end)
    sent_rate = sum(1 for t in sent if window_start < t <= end) / (end - window_start)
    finished_rate = finished / (end - window_start)
    bound = max(SLOPE_FRACTION * rate, SLOPE_FLOOR)
    served = finished_rate / rate
    return {
        "backlogSlopePerSecond": round(growth, 3),
        "slopeBound": round(bound, 3),
        "backlogAtEnd": points[-1][1],
        "backlogMax": max(b for _, b in backlog_series(sent, done, start, end)),
        "sentPerSecond": round(sent_rate, 2),
        "senderBehind": sent_rate < SERVED_FRACTION * rate,  # the rate was not offered
        "finishedPerSecond": round(finished_rate, 2),
        "servedFraction": round(served, 3),
        "sustained": growth <= bound and served >= SERVED_FRACTION,
    }


def bracket(steps: list[Step]) -> tuple[float | None, float | None]:
    """(highest sustained rate below the lowest unsustained one, that unsustained rate)."""
    failed = [s.rate for s in steps if not s.sustained]
    high = min(failed) if failed else None
    held = [s.rate for s in steps if s.sustained and (high is None or s.rate < high)]
    return (max(held) if held else None), high


def bisections_done(steps: list[Step]) -> int:
    """Steps held since the search first had both a sustained and an unsustained rate."""
    seen: set[bool] = set()
    for index, step in enumerate(steps):
        seen.add(step.sustained)
        if len(seen) == 2:
            return len(steps) - index - 1
    return 0


def next_rate(steps: list[Step], start: float) -> float | None:
    """The next rate to hold, or None when the search is over (module docstring)."""
    if not steps:
        return start
    low, high = bracket(steps)
    if high is None:  # every step sustained: go higher
        return max(s.rate for s in steps) * FACTOR
    if low is None:  # none sustained: go lower, a few times at most
        return min(s.rate for s in steps) / FACTOR if len(steps) <= DOWN_STEPS else None
    if high / low <= CLOSE_ENOUGH or bisections_done(steps) >= BISECTIONS:
        return None
    return math.sqrt(low * high)


def capacity(steps: list[Step]) -> float | None:
    """The steady capacity: the highest sustained rate below the lowest unsustained one."""
    return bracket(steps)[0]


def calls_since(stack: LocalStack, since: float) -> dict[str, list[float]]:
    """``bench.latency.call_times`` for the calls received from ``since`` (epoch s) on."""
    text = datetime.fromtimestamp(since, UTC).isoformat()
    out: dict[str, list[float]] = defaultdict(list)
    for call in stack.remote_calls(since=text):
        if call.get("idempotencyKey"):
            out[call["idempotencyKey"]].append(parse_iso(call["at"]).timestamp())
    for times in out.values():
        times.sort()
    return out


def paced(
    ctx: AppContext, prefix: str, rate: float, seconds: float, workflow: str
) -> tuple[dict[str, float], dict[str, Any]]:
    """``bench.latency.open_loop`` with the sends on ``SENDERS`` threads: order *i* is
    handed over at ``start + i / rate``, so one slow send (Azurite busy) does not hold
    back the ones after it and the rate is offered as asked. (Submit times in order;
    how the sending went: the most a send started behind its time, all the threads
    busy, and how long each send took, p50 / p99 / max ms.)"""
    count = max(1, round(rate * seconds))
    queue = ctx.queues.client(ctx.names.orders)
    submitted: dict[str, float] = {}

    def one(order_id: str, due: float) -> tuple[float, float]:
        began = time.monotonic()
        body = {"orderId": order_id, "workflow": workflow, "amount": 10}
        queue.send_message(json.dumps(body))
        submitted[order_id] = time.time()
        return began - due, time.monotonic() - began

    start = time.monotonic() + 0.5
    with ThreadPoolExecutor(SENDERS) as pool:
        futures = []
        for n in range(count):
            due = start + n / rate
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            futures.append(pool.submit(one, f"{prefix}-load-{n:06d}", due))
        results = [f.result() for f in futures]
    took = ms_stats([t for _, t in results])
    return dict(sorted(submitted.items())), {
        "maxLagMs": round(1000 * max([0.0, *(lag for lag, _ in results)])),
        "sendMs": {k: took[k] for k in ("p50", "p99", "max")},
    }


def served(
    stack: LocalStack, prefix: str, rate: float, seconds: float, workflow: str, timeout: float
) -> tuple[dict[str, float], dict[str, Any], dict[str, Order], dict[str, list[float]]]:
    """An open-loop load and its end: (submit times, how the sending went, the orders
    that finished within ``timeout`` of the last send, the simulator's calls meanwhile)."""
    since = time.time()
    submitted, sending = paced(stack.context, prefix, rate, seconds, workflow)
    finished = wait_finished(stack.context, list(submitted), timeout)
    return submitted, sending, finished, calls_since(stack, since)


def latency_summary(
    submitted: dict[str, float], finished: dict[str, Order], calls: dict[str, list[float]]
) -> dict[str, Any]:
    """Counts, submit-to-done latency and hops of a load's completed orders."""
    completed = {k: o for k, o in finished.items() if str(o.status) == "completed"}
    out: dict[str, Any] = {
        "orders": len(submitted),
        "completed": len(completed),
        "unfinished": len(submitted) - len(finished),
        "otherTerminal": len(finished) - len(completed),
    }
    if completed:
        out["latencyMs"] = ms_stats([done_at(o) - submitted[k] for k, o in completed.items()])
        out["hopsMs"] = hops_ms(completed, submitted, calls)
    return out


def hold_step(
    stack: LocalStack, prefix: str, rate: float, hold: float, workflow: str, timeout: float
) -> dict[str, Any]:
    """One step of the search: ``rate`` held ``hold`` seconds, left to drain, judged."""
    submitted, sending, finished, calls = served(stack, prefix, rate, hold, workflow, timeout)
    start = min(submitted.values())
    end = start + len(submitted) / rate
    verdict = judge(
        rate, list(submitted.values()), [done_at(o) for o in finished.values()], start, end
    )
    summary = latency_summary(submitted, finished, calls)
    hops = {k: v["p50"] for k, v in summary.pop("hopsMs", {}).items()}
    return {
        "offeredPerSecond": round(rate, 2),
        **verdict,
        **summary,
        "hopsP50Ms": hops,
        "sending": sending,
    }


def search(
    stack: LocalStack,
    prefix: str,
    first: float,
    hold: float,
    max_minutes: float,
    workflow: str,
    timeout: float,
) -> dict[str, Any]:
    """The capacity search (module docstring): its steps, the capacity, and whether it
    was cut short (out of time, or a step's orders did not all finish)."""
    steps: list[Step] = []
    records: list[dict[str, Any]] = []
    began = time.monotonic()
    cut = None
    while (rate := next_rate(steps, first)) is not None:
        # A held step, its drain and the pause: about 1.5 holds when it is sustained.
        if time.monotonic() - began + 1.5 * hold + 10 > 60 * max_minutes:
            cut = f"--max-minutes {max_minutes}: the step at {rate:.2f} orders/s was not run"
            break
        record = hold_step(stack, f"{prefix}-s{len(steps)}", rate, hold, workflow, timeout)
        records.append(record)
        steps.append(Step(rate, record["sustained"]))
        if record["unfinished"]:
            cut = f"{record['unfinished']} orders of the step at {rate:.2f}/s did not finish"
            break
        time.sleep(2)  # the last replies and notices settle
    low, high = bracket(steps)
    return {
        "steps": records,
        "capacityPerSecond": None if low is None else round(low, 2),
        "lowestUnsustainedPerSecond": None if high is None else round(high, 2),
        "cutShort": cut,
        "minutes": round((time.monotonic() - began) / 60, 1),
    }


def replay_ratio(
    ctx: AppContext, prefix: str, orders: int, replay: int, workflow: str, timeout: float
) -> dict[str, Any]:
    """A backlog's drain rate over the bare replay's (``bench.pipeline``), one run."""
    product = product_run(ctx, f"{prefix}-backlog", orders, workflow, timeout)
    time.sleep(1.5)
    bare = bare_replay(ctx, f"{prefix}-replay", replay)
    return {
        "orders": orders,
        "finished": product["finished"],
        "ordersPerSecond": round(product["ordersPerSecond"], 1),
        "replayOrders": replay,
        "replayOrdersPerSecond": round(bare["ordersPerSecond"], 1),
        "vsReplay": round(product["ordersPerSecond"] / bare["ordersPerSecond"], 2),
        "target": 1.2,
    }


def new_stack(args: argparse.Namespace) -> LocalStack:
    """A stack (not started) with the run's options: the search's, and each fresh phase's."""
    return LocalStack(devhosts=args.devhosts, transport=args.transport, settings=dict(SETTINGS))


def on_stack[T](
    shared: LocalStack | None,
    fresh: Callable[[], AbstractContextManager[LocalStack]],
    warm: Callable[[LocalStack], None],
    measure: Callable[[LocalStack], T],
) -> T:
    """``measure`` on ``shared`` (``--same-stack``), or on a ``fresh`` stack once ``warm``
    has run on it, stopped afterwards: what one measured phase runs on (module docstring)."""
    if shared is not None:
        return measure(shared)
    with fresh() as stack:
        warm(stack)
        return measure(stack)


def at_half_capacity(
    stack: LocalStack, prefix: str, rate: float, args: argparse.Namespace
) -> dict[str, Any]:
    """Phase 2: an open-loop load at ``rate`` for ``--seconds``, its latency and hops."""
    time.sleep(2)
    submitted, sending, finished, calls = served(
        stack, f"{prefix}-half", rate, args.seconds, args.workflow, args.timeout
    )
    return {
        "offeredPerSecond": round(rate, 2),
        "seconds": args.seconds,
        **latency_summary(submitted, finished, calls),
        "sending": sending,
        "target": {"p50": 60, "p99": 250, "on": "servicebus"},
    }


def against_replay(stack: LocalStack, prefix: str, args: argparse.Namespace) -> dict[str, Any]:
    """Phase 3: ``--replay-orders`` drained against a bare replay of ``--replay`` orders."""
    time.sleep(2)
    return replay_ratio(
        stack.context, prefix, args.replay_orders, args.replay, args.workflow, args.timeout
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    cpu: dict[str, dict[str, float]] = {}
    prefix = f"cap-{uuid.uuid4().hex[:6]}"

    def warm(stack: LocalStack) -> None:
        warm_up(stack.context, prefix, args.workflow, args.timeout, WARM_UP)

    def measured[T](name: str, phase: Callable[[LocalStack], T]) -> Callable[[LocalStack], T]:
        def go(stack: LocalStack) -> T:
            mark = cpuload.sample()
            out = phase(stack)
            cpu[name] = cpuload.share(mark, cpuload.sample())
            return out

        return go

    with ExitStack() as held:
        stack = held.enter_context(new_stack(args))
        warm(stack)
        burst_rate = drain(stack.context, prefix, args.burst, args.workflow, args.timeout)
        time.sleep(2)
        first = args.start if args.start is not None else burst_rate / 4
        found = measured(
            "search",
            lambda s: search(
                s, prefix, first, args.hold, args.max_minutes, args.workflow, args.timeout
            ),
        )(stack)
        shared = stack if args.same_stack else None
        if shared is None:
            held.close()  # the search's stack stops before a fresh one starts
        at_half: dict[str, Any] = {"skipped": "no rate was sustained"}
        if found["capacityPerSecond"] is not None:
            rate = found["capacityPerSecond"] / 2
            at_half = on_stack(
                shared,
                lambda: new_stack(args),
                warm,
                measured("latencyAtHalf", lambda s: at_half_capacity(s, prefix, rate, args)),
            )
        replay = on_stack(
            shared,
            lambda: new_stack(args),
            warm,
            measured("replay", lambda s: against_replay(s, prefix, args)),
        )
    return {
        "benchmark": "capacity",
        "date": utc_now_text(),
        "machine": machine(),
        "workflow": args.workflow,
        "transport": args.transport,
        "devhosts": args.devhosts,
        "holdSeconds": args.hold,
        "rule": RULE,
        "phaseStacks": PHASE_STACKS["same" if args.same_stack else "fresh"],
        "burst": {"orders": args.burst, "ordersPerSecond": round(burst_rate, 1)},
        "firstRatePerSecond": round(first, 2),
        **found,
        "latencyAtHalf": at_half,
        "replay": replay,
        "cpu": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity")
    parser.add_argument("--hold", type=float, default=60, help="seconds each rate is held")
    parser.add_argument("--start", type=float, default=None, help="first rate (default: burst/4)")
    parser.add_argument("--max-minutes", type=float, default=14, help="bound on the search")
    parser.add_argument("--seconds", type=float, default=45, help="the load at half capacity")
    parser.add_argument("--burst", type=int, default=300, help="orders of the drain burst")
    parser.add_argument("--replay-orders", type=int, default=400, help="the drained backlog")
    parser.add_argument("--replay", type=int, default=150, help="orders of the bare replay")
    parser.add_argument("--workflow", default="order", choices=["order", "fulfilment"])
    parser.add_argument(
        "--same-stack",
        action="store_true",
        help="latency at half and the replay on the search's stack (default: each on a "
        "fresh one, so that neither meets the search's table)",
    )
    stack_options(parser, timeout=300)
    args = parser.parse_args(argv)
    if args.hold < 10:
        parser.error("--hold must be at least 10 seconds (the backlog is judged once a second)")
    if args.start is not None and args.start <= 0:
        parser.error("--start must be a positive rate (orders/s)")
    if min(args.max_minutes, args.seconds, args.burst, args.replay_orders, args.replay) <= 0:
        parser.error("--max-minutes, --seconds, --burst, --replay-orders, --replay: positive")
    result = run(args)
    print(json.dumps(result, indent=2))
    stuck = result["cutShort"] is not None and "did not finish" in result["cutShort"]
    half = result["latencyAtHalf"]
    return 1 if stuck or half.get("unfinished") or half.get("otherTerminal") else 0


if __name__ == "__main__":
    sys.exit(main())
