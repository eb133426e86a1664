"""Workflow benchmark: what contract 3.13's kinds cost in time, and what waiting orders
cost a supervisor tick (docs/benchmarks.md, "Workflows").

    python -m bench.workflows [--phases delays,events,parallel,index] [--devhosts 2]
                              [--transport storage|servicebus]
                              [--seconds 30] [--burst 100] [--widths 2,3,4,5]
                              [--events 150] [--event-rate 5] [--idle-delays 12]
                              [--busy-delays 30]
                              [--waiting 10000] [--expired 20]

Runs the real stack (Azurite, the simulator, ``--devhosts`` devhost instances) with the
declarations of ``bench/flows.py`` and the supervisor on the deployed schedule (every
10 s), and prints one JSON object with a section per phase and ``targets``, each
figure's target, what was measured and whether it holds:

- ``delays`` (``dl``: ``Delay(seconds=5)``; ``dl-until``: ``Delay(until=<the order's
  wakeAt>)``, with a fraction of a second; then one remote step), on an otherwise idle
  stack, in two series: ``idle``, wakes 6-8 s apart (each finds the ``order-dispatch``
  trigger backed off to its slowest poll: a lone delay), and ``busy``, wakes 0.15-0.65 s
  apart (the trigger polls every 100 ms after a message). ``fireLagMs``: the delay's end
  (its ``succeeded`` event) minus its time (``decided.until``); ``requestLagMs``: the next
  step's call arriving at the simulator minus the delay's time. How the wake-up is made
  (``messaging/dispatch.py``): on Storage queues the order is queued on ``order-dispatch``
  with a visibility delay of ``ceil(until - now)`` seconds (a Storage queue counts whole
  seconds); the ``visibilityRoundUpMs`` figure is that rounding, and ``pickupMs`` the
  rest: the time from the message becoming visible to the delay's end (the trigger's
  poll back-off, up to ``maxPollingInterval`` when the queue was idle, then the claim).
  With ``--transport servicebus`` the wake-up is a Service Bus scheduled message for the
  delay's time to the millisecond on ``order-wakeups``, pushed to ``wake_order``: no
  rounding (``visibilityRoundUpMs`` 0), and ``pickupMs`` is the broker's enqueue, the
  push and the claim.
- ``events`` (``ev``: ``Event("go")``, then one remote step): ``--events`` orders wait,
  then their events are POSTed open-loop at ``--event-rate`` per second to the devhosts
  (alternating). ``eventToRequestMs``: the next step's call arriving at the simulator
  minus the event's 2xx arriving at the client; ``postToRequestMs`` from the POST's
  start; ``eventRoundTripMs`` the POST itself.
- ``parallel`` (``par-N``: a ``Parallel`` of N remote steps through N agents, each call
  1 s at the simulator): per width, a warm-up, a burst of ``--burst`` orders (the drain
  rate), then an open-loop load at half of it for ``--seconds``. ``groupMs``: from the
  group's claim (its steps are claimed in one save) to the last of its steps' replies
  applied (``succeeded``); ``overheadMs`` is that minus the 1 s.
- ``index``: ``--waiting`` orders waiting on events or delays (half each, deadlines an
  hour ahead) stored as the app stores them, and the storage requests of one supervisor
  tick (``Supervisor.run``) and one scheduler sweep counted with
  ``observability/opcount.py``: on an empty table, with the waiting orders, and with
  ``--expired`` more whose deadlines have passed (bench/waitindex.py).

The agent queues: ``--transport servicebus`` puts them on localbus (the Service Bus
double) as deployed, where the agents' triggers are pushed their messages. On the
default Storage transport devhost wakes a queue's trigger when its own process sends to
that queue (docs/local-development.md, "devhost"), which the Functions host does only
for output bindings, not for the SDK sends this app makes; so there, a hand-off to an
agent (the event's next step, a group's calls) is quicker locally than on Storage queues
in Azure.

Every process shares one 2-core machine with whatever else runs on it: each phase carries
the load averages at its start and end (``machineLoad``) and whose CPU it had (``cpu``:
the machine busy, the benchmark's processes, the others': bench/cpuload.py). Compare
runs, not digits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import httpx

from bench import stack_options
from bench.cpuload import sample, share
from bench.flows import DELAY_SECONDS, parallel_steps
from bench.latency import call_times, done_at, machine, ms_stats, utc_now_text, wait_finished
from bootstrap import AppContext
from config.settings import DECLARATIONS, DEFAULT_SUPERVISOR_SCHEDULE
from core import workflows
from core.model import Order
from core.timefmt import parse_iso
from demo.stack import LocalStack

DECLARATIONS_MODULE: Final = "bench.flows"
REMOTE_SECONDS: Final = 1.0  # each parallel step's latency at the simulator
WARM_UP: Final = 5
PHASES: Final = ("delays", "events", "parallel", "index")
#: The issue's targets (docs/benchmarks.md, "Workflows").
GROUP_TARGET_S: Final = 1.3
EVENT_TARGET_P50_MS: Final = 100
DELAY_TARGET_S: Final = 1.0
#: Seconds between delayed orders (low, high). Idle: longer than a trigger takes to back
#: off to ``maxPollingInterval`` (0.5 s; 2 s before 2026-11-29), so each wake finds the
#: ``order-dispatch`` trigger at its slowest poll. Busy: many delays at once.
IDLE_GAPS: Final = (6.0, 8.0)
BUSY_GAPS: Final = (0.15, 0.65)


# --- pure helpers (tests/unit/test_bench_workflows.py) ----------------------------------


def event_times(history: Iterable[dict[str, Any]], name: str) -> list[float]:
    """When each ``name`` event of a step's history happened (epoch seconds), in order."""
    return [parse_iso(h["at"]).timestamp() for h in history if h.get("event") == name]


def group_span(histories: Iterable[list[dict[str, Any]]]) -> tuple[float, float] | None:
    """(start, end) of a parallel group from its steps' histories: its first claim, and
    the last of its steps' first successes; None unless every step was claimed and
    succeeded."""
    starts, ends = [], []
    for history in histories:
        claimed, succeeded = event_times(history, "claimed"), event_times(history, "succeeded")
        if not claimed or not succeeded:
            return None
        starts.append(claimed[0])
        ends.append(succeeded[0])
    if not starts:
        return None
    return min(starts), max(ends)


def share_within(values: list[float], limit: float) -> float:
    """The fraction of ``values`` at most ``limit`` (1.0 for none)."""
    return round(sum(1 for v in values if v <= limit) / len(values), 3) if values else 1.0


def visibility_round_up(sent: float, until: float) -> float:
    """How long after ``until`` a message sent at ``sent`` with the visibility delay the
    app asks for (``ceil(until - sent)`` whole seconds) becomes visible."""
    return sent + max(0, math.ceil(until - sent)) - until


def irregular_gaps(count: int, low: float, high: float) -> list[float]:
    """``count`` gaps between ``low`` and ``high`` seconds spread evenly by the golden ratio
    (deterministic), so that the times they make fall at every phase of a second and of
    a poll interval."""
    phi = (math.sqrt(5) - 1) / 2
    return [low + ((n * phi) % 1.0) * (high - low) for n in range(count)]


def thirds(values: list[float]) -> list[int]:
    """The median of each third of ``values`` (in their order: the order sent), in ms: a
    load the stack keeps up with gives three alike, one it does not a rising series."""
    size = len(values) // 3
    if size == 0:
        return []
    parts = [values[:size], values[size : 2 * size], values[2 * size :]]
    return [round(1000 * sorted(p)[len(p) // 2]) for p in parts]


def stats(values: list[float]) -> dict[str, Any]:
    """``ms_stats`` of seconds, with the count (empty: just the count)."""
    return {"n": len(values), **(ms_stats(values) if values else {})}


def verdicts(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each target of the issue, what this run measured for it, and whether it holds."""
    out: dict[str, dict[str, Any]] = {}
    if "parallel" in result:
        widths = result["parallel"]["widths"]
        worst = max((w["groupMs"].get("p50", 0) for w in widths.values()), default=0)
        out["parallelGroup"] = {
            "target": f"group done within {GROUP_TARGET_S} s of its start (1 s remote calls), "
            "at half load, every width 2-5",
            "measured": {
                n: {k: w["groupMs"].get(k) for k in ("p50", "p90", "p99", "max")}
                | {"within": w["withinTarget"]}
                for n, w in widths.items()
            },
            "holdsAtP50": worst <= 1000 * GROUP_TARGET_S,
            "holdsAtP99": all(
                w["groupMs"].get("p99", math.inf) <= 1000 * GROUP_TARGET_S for w in widths.values()
            ),
        }
    if "events" in result:
        p50 = result["events"]["eventToRequestMs"].get("p50", math.inf)
        out["eventToRequest"] = {
            "target": f"event 2xx -> next step's request p50 <= {EVENT_TARGET_P50_MS} ms",
            "measured": p50,
            "holds": p50 <= EVENT_TARGET_P50_MS,
        }
    if "delays" in result:
        measured = {}
        for series in ("idle", "busy"):
            figures = result["delays"][series]["all"]
            lag = figures.get("fireLagMs", {})
            measured[series] = {k: lag.get(k) for k in ("p50", "p90", "max")}
            measured[series]["within"] = figures["withinTarget"]
        out["delayFires"] = {
            "target": f"a delay fires within {DELAY_TARGET_S} s of its time",
            "measured": measured,
            "holds": all(
                m["max"] is not None and m["max"] <= 1000 * DELAY_TARGET_S
                for m in measured.values()
            ),
        }
    if "index" in result:
        index = result["index"]
        out["waitingAddNothing"] = {
            "target": "orders waiting on events or delays add nothing to a supervisor tick "
            "but the rows whose deadlines have passed",
            "measured": {
                "requestsPerTick": index["supervisor"]["requestsPerTick"],
                "expiredRowsExamined": index["supervisor"]["expiredTick"]["examined"],
            },
            "holds": index["holds"],
        }
    return out


# --- the live phases --------------------------------------------------------------------


def submit(ctx: AppContext, body: dict[str, Any]) -> float:
    """Queue one order; the client's time after the send returned."""
    ctx.queues.client(ctx.names.orders).send_message(json.dumps(body))
    return time.time()


def load_now() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def step_of(order: Order, name: str) -> Any:
    return next(s for s in order.steps if s.step == name)


def first_call(calls: dict[str, list[float]], key: str, after: float = 0.0) -> float | None:
    return next((t for t in calls.get(key, []) if t >= after), None)


def open_loop(
    count: int, rate: float, action: Callable[[int], Any], workers: int = 4
) -> tuple[list[Any], float]:
    """Run ``action(n)`` for n < ``count`` at ``rate`` per second on a few threads (an open
    loop: a slow one does not hold back the next); the results, and the largest lag of a
    start behind its schedule."""
    lag = 0.0
    futures: list[Future[Any]] = []
    with ThreadPoolExecutor(workers) as pool:
        start = time.monotonic() + 0.2
        for n in range(count):
            wait = start + n / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                lag = max(lag, -wait)
            futures.append(pool.submit(action, n))
        return [f.result() for f in futures], lag


def delay_series(
    stack: LocalStack, count: int, gaps: tuple[float, float], timeout: float
) -> dict[str, Any]:
    """``count`` delayed orders, half ``dl`` (seconds), half ``dl-until`` (a time), sent
    ``gaps`` seconds apart (low, high; spread evenly between them). On Service Bus the
    wake-up is scheduled to the millisecond: no round-up."""
    rounded = stack.transport != "servicebus"
    ctx = stack.context
    prefix = f"dl-{uuid.uuid4().hex[:6]}"
    sent: dict[str, str] = {}
    loads, cpu = [load_now()], sample()
    for n, gap in enumerate(irregular_gaps(count, *gaps)):
        time.sleep(gap)
        order_id = f"{prefix}-{n:04d}"
        if n % 2:
            wake = datetime.now(UTC) + timedelta(seconds=DELAY_SECONDS + (n * 0.377) % 1.0)
            body = {"orderId": order_id, "workflow": "dl-until", "wakeAt": wake.isoformat()}
            sent[order_id] = "until"
        else:
            body = {"orderId": order_id, "workflow": "dl"}
            sent[order_id] = "seconds"
        submit(ctx, body)
    finished = wait_finished(ctx, list(sent), timeout)
    loads.append(load_now())
    cpu_share = share(cpu, sample())
    calls = call_times(stack)
    by_form: dict[str, dict[str, list[float]]] = {}
    for order_id, order in finished.items():
        if str(order.status) != "completed":
            continue
        pause = step_of(order, "pause")
        until = parse_iso(str(pause.decided["until"])).timestamp()
        ended = event_times(pause.history, "succeeded")[0]
        figures = by_form.setdefault(sent[order_id], {})
        figures.setdefault("fireLag", []).append(ended - until)
        round_up = visibility_round_up(order.created_at.timestamp(), until) if rounded else 0.0
        figures.setdefault("visibilityRoundUp", []).append(round_up)
        figures.setdefault("pickup", []).append(ended - until - round_up)
        remote = first_call(calls, f"{order_id}:after")
        if remote is not None:
            figures.setdefault("requestLag", []).append(remote - until)
    out: dict[str, Any] = {
        "orders": count,
        "gapSeconds": list(gaps),
        "completed": sum(len(f.get("fireLag", [])) for f in by_form.values()),
        "machineLoad": loads,
        "cpu": cpu_share,
    }
    merged: dict[str, list[float]] = {}
    for form, figures in sorted(by_form.items()):
        out[form] = {f"{k}Ms": stats(v) for k, v in figures.items()}
        out[form]["withinTarget"] = share_within(figures.get("fireLag", []), DELAY_TARGET_S)
        for k, v in figures.items():
            merged.setdefault(k, []).extend(v)
    out["all"] = {f"{k}Ms": stats(v) for k, v in merged.items()}
    out["all"]["withinTarget"] = share_within(merged.get("fireLag", []), DELAY_TARGET_S)
    return out


def delays(stack: LocalStack, idle: int, busy: int, timeout: float) -> dict[str, Any]:
    """Two series: ``idle``, wakes 6-8 s apart (``IDLE_GAPS``: the ``order-dispatch``
    trigger has backed off to its slowest poll when each comes: a lone delay); ``busy``,
    wakes 0.15-0.65 s apart (the trigger polls every 100 ms for ``maxPollingInterval``
    after a message: many delays ending together)."""
    return {
        "method": "Delay(seconds=5) and Delay(until=wakeAt) orders, then one remote step, "
        "on an otherwise idle stack; fireLag = the delay's succeeded event - decided.until; "
        "requestLag = the next step's call at the simulator - decided.until; "
        "visibilityRoundUp = ceil(until - accepted) - (until - accepted): the whole-second "
        "rounding of the order-dispatch message's visibility delay (0 on Service Bus: a "
        "scheduled message on order-wakeups, to the millisecond); pickup = fireLag - "
        "visibilityRoundUp: the trigger's poll (Storage) or the push (Service Bus), then "
        "the claim",
        "idle": delay_series(stack, idle, IDLE_GAPS, timeout),
        "busy": delay_series(stack, busy, BUSY_GAPS, timeout),
    }


def wait_waiting(ctx: AppContext, ids: list[str], timeout: float) -> None:
    """Until every order of ``ids`` exists and waits for its event."""
    deadline = time.monotonic() + timeout
    for order_id in ids:
        while True:
            order = ctx.store.load(order_id)
            if order is not None and order.awaited_events():
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"order {order_id} did not start waiting for its event")
            time.sleep(0.1)


def events(stack: LocalStack, count: int, rate: float, timeout: float) -> dict[str, Any]:
    ctx = stack.context
    prefix = f"ev-{uuid.uuid4().hex[:6]}"
    ids = [f"{prefix}-{n:04d}" for n in range(count)]
    for order_id in ids:
        submit(ctx, {"orderId": order_id, "workflow": "ev"})
    wait_waiting(ctx, ids, timeout)
    time.sleep(2)  # the queues go quiet: the agent queue's poll backs off
    urls = [h.http_url for h in stack.hosts if h.http_url and h.alive]
    loads, cpu = [load_now()], sample()
    with httpx.Client(timeout=30) as http:

        def post(n: int) -> tuple[float, float, int]:
            url = f"{urls[n % len(urls)]}/api/orders/{ids[n]}/events/go"
            started = time.time()
            answer = http.post(url, json={"result": {"approved": True, "n": n}})
            return started, time.time(), answer.status_code

        posted, lag = open_loop(count, rate, post)
    finished = wait_finished(ctx, ids, timeout)
    loads.append(load_now())
    cpu_share = share(cpu, sample())
    calls = call_times(stack)
    to_request, from_post, round_trip, taken_to_claimed = [], [], [], []
    statuses: dict[str, int] = {}
    for order_id, (started, answered, status) in zip(ids, posted, strict=True):
        statuses[str(status)] = statuses.get(str(status), 0) + 1
        round_trip.append(answered - started)
        remote = first_call(calls, f"{order_id}:after")
        if remote is not None:
            to_request.append(remote - answered)
            from_post.append(remote - started)
        order = finished.get(order_id)
        if order is not None:
            taken = event_times(step_of(order, "go").history, "succeeded")
            claimed = event_times(step_of(order, "after").history, "claimed")
            if taken and claimed:
                taken_to_claimed.append(claimed[0] - taken[0])
    return {
        "method": f"{count} ev orders waiting; POST /api/orders/<id>/events/go open-loop at "
        f"{rate}/s alternating over {len(urls)} devhosts (4 client threads); "
        "eventToRequest = next step's call at the simulator - the 2xx at the client",
        "events": count,
        "ratePerSecond": rate,
        "maxSendLagMs": round(1000 * lag),
        "answers": statuses,
        "completed": sum(1 for o in finished.values() if str(o.status) == "completed"),
        "eventToRequestMs": stats(to_request),
        "postToRequestMs": stats(from_post),
        "eventRoundTripMs": stats(round_trip),
        "takenToClaimedMs": stats(taken_to_claimed),
        "machineLoad": loads,
        "cpu": cpu_share,
    }


def parallel_width(
    stack: LocalStack, width: int, burst: int, seconds: float, timeout: float
) -> dict[str, Any]:
    ctx = stack.context
    steps = parallel_steps(width)
    prefix = f"par{width}-{uuid.uuid4().hex[:6]}"

    def body(order_id: str) -> dict[str, Any]:
        latency = {"latencyMs": round(1000 * REMOTE_SECONDS)}
        simulate = dict.fromkeys(steps, latency)
        return {"orderId": order_id, "workflow": f"par-{width}", "simulate": simulate}

    warm = [f"{prefix}-warm-{n}" for n in range(WARM_UP)]
    for order_id in warm:
        submit(ctx, body(order_id))
    wait_finished(ctx, warm, timeout)
    ids = [f"{prefix}-burst-{n:04d}" for n in range(burst)]
    first = time.time()
    for order_id in ids:
        submit(ctx, body(order_id))
    drained = wait_finished(ctx, ids, timeout)
    if len(drained) < burst:
        raise SystemExit(f"par-{width}: {len(drained)} of {burst} burst orders finished")
    drain_rate = burst / (max(done_at(o) for o in drained.values()) - first)
    rate = drain_rate / 2
    time.sleep(2)
    loads, cpu = [load_now()], sample()
    count = max(1, round(rate * seconds))
    load_ids = [f"{prefix}-load-{n:05d}" for n in range(count)]
    submitted, lag = open_loop(count, rate, lambda n: submit(ctx, body(load_ids[n])), workers=2)
    finished = wait_finished(ctx, load_ids, timeout)
    loads.append(load_now())
    cpu_share = share(cpu, sample())
    calls = call_times(stack)
    group, overhead, latest_call, submit_to_done = [], [], [], []
    for order_id, sent in zip(load_ids, submitted, strict=True):
        order = finished.get(order_id)
        if order is None or str(order.status) != "completed":
            continue
        records = [step_of(order, s) for s in steps]
        span = group_span(r.history for r in records)
        if span is None:
            continue
        group.append(span[1] - span[0])
        overhead.append(span[1] - span[0] - REMOTE_SECONDS)
        arrivals = [first_call(calls, f"{order_id}:{s}", span[0]) for s in steps]
        if all(a is not None for a in arrivals):
            latest_call.append(max(a for a in arrivals if a is not None) - span[0])
        submit_to_done.append(done_at(order) - sent)
    return {
        "drainOrdersPerSecond": round(drain_rate, 2),
        "loadOrdersPerSecond": round(rate, 2),
        "loadSeconds": seconds,
        "orders": count,
        "completed": len(group),
        "unfinished": count - len(finished),
        "maxSendLagMs": round(1000 * lag),
        "groupMs": stats(group),
        "groupMsMedianByThird": thirds(group),
        "overheadMs": stats(overhead),
        "claimToLastCallMs": stats(latest_call),
        "submitToDoneMs": stats(submit_to_done),
        "withinTarget": share_within(group, GROUP_TARGET_S),
        "machineLoad": loads,
        "cpu": cpu_share,
    }


def parallel(
    stack: LocalStack, widths: list[int], burst: int, seconds: float, timeout: float
) -> dict[str, Any]:
    return {
        "method": "par-N: Parallel of N remote steps through N agents, 1 s each at the "
        f"simulator; per width {WARM_UP} warm-up orders, a burst of {burst} (drain rate), "
        f"then open-loop at half the drain rate for {seconds} s; group = last step's "
        "succeeded event - the group's claim",
        "remoteSeconds": REMOTE_SECONDS,
        "widths": {
            str(w): parallel_width(stack, w, burst, seconds, timeout) for w in sorted(widths)
        },
    }


def live_stack(devhosts: int, transport: str = "storage") -> LocalStack:
    # This process's registry too: the stack creates localbus's queues from the agents
    # declared here (Names.agent_queues), before its own context reads the setting.
    workflows.use(DECLARATIONS_MODULE)
    return LocalStack(
        devhosts=devhosts,
        transport=transport,
        settings={
            DECLARATIONS: DECLARATIONS_MODULE,
            "STEP_TIMEOUT_SECONDS": "30",
            # As deployed (infra/main.bicep): the supervisor is not what wakes a delay.
            "SUPERVISOR_SCHEDULE": DEFAULT_SUPERVISOR_SCHEDULE,
        },
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    phases = [p for p in PHASES if p in args.phases]
    result: dict[str, Any] = {
        "benchmark": "workflows",
        "date": utc_now_text(),
        "machine": machine() | {"loadAtStart": load_now()},
        "devhosts": args.devhosts,
        "transport": args.transport,
        "supervisorSchedule": DEFAULT_SUPERVISOR_SCHEDULE,
    }
    live = [p for p in phases if p != "index"]
    if live:
        with live_stack(args.devhosts, args.transport) as stack:
            time.sleep(2)  # let the hosts finish starting
            if "delays" in live:
                result["delays"] = delays(stack, args.idle_delays, args.busy_delays, args.timeout)
            if "events" in live:
                result["events"] = events(stack, args.events, args.event_rate, args.timeout)
            if "parallel" in live:
                result["parallel"] = parallel(
                    stack, args.widths, args.burst, args.seconds, args.timeout
                )
    if "index" in phases:
        from bench.waitindex import run as run_index

        result["index"] = run_index(args.waiting, args.expired, args.runs, args.threads)
    result["machine"]["loadAtEnd"] = load_now()
    result["targets"] = verdicts(result)
    return result


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workflows")
    parser.add_argument("--phases", type=_list, default=list(PHASES), help=",".join(PHASES))
    stack_options(parser, timeout=300)
    parser.add_argument("--idle-delays", type=int, default=12, help="delays 6-8 s apart")
    parser.add_argument("--busy-delays", type=int, default=30, help="delays 0.15-0.65 s apart")
    parser.add_argument("--events", type=int, default=150, help="events delivered")
    parser.add_argument("--event-rate", type=float, default=5.0, help="events/s")
    parser.add_argument("--widths", type=lambda t: [int(x) for x in _list(t)], default=[2, 3, 4, 5])
    parser.add_argument("--burst", type=int, default=100, help="orders of each drain burst")
    parser.add_argument("--seconds", type=float, default=30, help="each width's load")
    parser.add_argument("--waiting", type=int, default=10_000, help="orders waiting (index)")
    parser.add_argument("--expired", type=int, default=20, help="of them past their deadline")
    parser.add_argument("--runs", type=int, default=5, help="ticks per level (index)")
    parser.add_argument("--threads", type=int, default=4, help="insert threads (index)")
    args = parser.parse_args(argv)
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    if any(w not in range(2, 6) for w in args.widths):
        parser.error("--widths are 2-5 (bench/flows.py declares par-2 ... par-5)")
    result = run(args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
