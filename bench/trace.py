"""Where an order's time goes, call by call: ``bench.latency``'s first hop split open.

    python -m bench.trace [--rate 10] [--seconds 30] [--devhosts 2]
                          [--transport storage|servicebus]

``bench.latency`` splits submit-to-done by the timestamps the records keep; its first hop,
``submit->accepted+claimed``, holds the ``orders`` queue's poll, the hand-over to
``submit_order`` and the accepting transaction at once, and ``claimed->remoteCall`` holds
the create's commit, the send, the transport and the agent's binding. This benchmark runs
the same open-loop load (after a warm-up) with a probe in every devhost process
(``bench/tracehook/sitecustomize.py``: it records when a few calls start and end) and
splits the time of every single-step order that completed into:

- ``submit->received``: the client's send returned, to the ``orders`` receive that
  returned the message (the listener's poll back-off, then the receive's round trip);
- ``received->submitter``: the host hands the message to ``submit_order``;
- ``submitter->create``: decoding, the plan, the claim, in memory;
- ``create``: the accepting Table transaction (the order, its step claimed, its rows);
- ``create->requestSent``: after the commit until the agent request's send returned
  (on Storage queues the send is held for the output binding: near 0 here, and the
  host's send falls in the next segment);
- ``requestSent->agent``: the transport, until ``AgentWorker.handle`` starts;
- ``agent->remoteCall``: the request's binding (its claim, read unless at hand) or take;
- ``remoteCall->replyApplied``, ``replyApplied->done``: as ``bench.latency``.

The probe is not the app: it wraps methods by name (a unit test checks they still exist)
and writes one line per call. Compare runs, not digits: the machine is shared.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import stack_options
from bench.latency import (
    call_times,
    done_at,
    event_at,
    machine,
    ms_stats,
    open_loop,
    utc_now_text,
    wait_finished,
    warm_up,
)
from demo.stack import LocalStack

ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT / "bench" / "tracehook"
SEGMENTS = (
    "submit->received",
    "received->submitter",
    "submitter->create",
    "create",
    "create->requestSent",
    "requestSent->agent",
    "agent->remoteCall",
    "remoteCall->replyApplied",
    "replyApplied->done",
)

#: (order id, event) -> (start, end) of the call's first record; for ``receive``, of the
#: first receive that returned the order's message.
Calls = dict[tuple[str, str], tuple[float, float]]


def read_calls(directory: str) -> Calls:
    """Every probe's records under ``directory``, first call per order and event."""
    calls: Calls = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                record = json.loads(line)
                for order_id in record.get("orders", ()):
                    key = (order_id, record["event"])
                    if key not in calls or record["start"] < calls[key][0]:
                        calls[key] = (record["start"], record["end"])
    return calls


def split(
    order_id: str, submitted: float, calls: Calls, remote_call: float, succeeded: float, done: float
) -> dict[str, float] | None:
    """One order's ``SEGMENTS`` in seconds; None if a traced call of it is missing."""
    try:
        received = calls[(order_id, "receive")][1]
        submitter = calls[(order_id, "submit")][0]
        create = calls[(order_id, "create")]
        sent = calls[(order_id, "send_request")][1]
        agent = calls[(order_id, "agent")][0]
    except KeyError:
        return None
    points = [submitted, received, submitter, *create, sent, agent, remote_call, succeeded, done]
    return {name: b - a for name, a, b in zip(SEGMENTS, points[:-1], points[1:], strict=True)}


def summarise(per_order: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each segment's p50 / p90 / p99 / max / mean in ms over the orders split."""
    by_segment: dict[str, list[float]] = defaultdict(list)
    for segments in per_order:
        for name, seconds in segments.items():
            by_segment[name].append(seconds)
    return {name: ms_stats(by_segment[name]) for name in SEGMENTS if by_segment[name]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as directory:
        path = os.pathsep.join([str(HOOK), str(ROOT), os.environ.get("PYTHONPATH", "")])
        probe = {"PYTHONPATH": path.rstrip(os.pathsep), "BENCH_TRACE_DIR": directory}
        stack = LocalStack(
            devhosts=args.devhosts,
            transport=args.transport,
            settings={"STEP_TIMEOUT_SECONDS": "30", "SUPERVISOR_SCHEDULE": "*/5 * * * * *"},
            devhost_env=[probe] * args.devhosts,
        )
        with stack:
            ctx = stack.context
            prefix = f"trace-{uuid.uuid4().hex[:6]}"
            warm_up(ctx, prefix, "order", args.timeout, 20)
            time.sleep(2)
            submitted, lag = open_loop(ctx, prefix, args.rate, args.seconds, "order")
            finished = wait_finished(ctx, list(submitted), args.timeout)
            remote = call_times(stack)
        calls = read_calls(directory)
    per_order, totals = [], []
    for order_id, order in finished.items():
        step = order.steps[0]
        succeeded = event_at(step.history, "succeeded", last=True)
        at = remote.get(f"{order_id}:{step.step}")
        if str(order.status) != "completed" or succeeded is None or not at:
            continue
        done = done_at(order)
        segments = split(order_id, submitted[order_id], calls, at[-1], succeeded, done)
        if segments is not None:
            per_order.append(segments)
            totals.append(done - submitted[order_id])
    if not per_order:
        raise SystemExit("no order of the load completed with every call traced")
    return {
        "benchmark": "trace",
        "date": utc_now_text(),
        "machine": machine(),
        "transport": args.transport,
        "devhosts": args.devhosts,
        "load": {
            "ordersPerSecond": args.rate,
            "seconds": args.seconds,
            "orders": len(submitted),
            "split": len(per_order),
            "maxSendLagMs": round(1000 * lag),
        },
        "latencyMs": ms_stats(totals),
        "segmentsMs": summarise(per_order),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trace")
    parser.add_argument("--rate", type=float, default=10, help="orders/s, open loop")
    parser.add_argument("--seconds", type=float, default=30, help="how long the load runs")
    stack_options(parser, timeout=300)
    print(json.dumps(run(parser.parse_args(argv)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
