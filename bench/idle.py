"""Idle latency: one order after the app has had nothing to do, and where its time goes.

    python -m bench.idle [--orders 20] [--gap 5] [--workflow order] [--devhosts 2]
                         [--transport storage|servicebus]

On the real stack (Azurite, a no-fault simulator, ``--devhosts`` devhost instances with
host.json as deployed), after a warm-up: ``--orders`` times, the app is left idle for
``--gap`` seconds (every queue trigger backs off towards ``maxPollingInterval``), then
one order is sent and waited for. Prints one JSON object:

- ``latencyMs``: submit (client clock, after the send returned) to done, p50 / p90 /
  p99 / max / mean;
- ``hopsMs``: the same split as ``bench.latency`` (``submit->accepted+claimed`` is the
  ``orders`` queue's poll and the acceptance; ``claimed->remoteCall`` the agent request
  queue's trip; ``remoteCall->replyApplied`` the call and its reply applied), p50 / p99
  / mean.

A lone order after a pause is what a user meets most on an app that is not busy: each
hop through a Storage queue waits for that trigger's next poll (the host wakes a
listener at once only for messages its own output bindings add), a Service Bus trigger
is pushed its message. Numbers from a shared 2-core machine are noisy: compare runs,
not digits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from bench import stack_options
from bench.latency import (
    call_times,
    done_at,
    hops_ms,
    machine,
    ms_stats,
    send,
    utc_now_text,
    wait_finished,
    warm_up,
)
from demo.stack import LocalStack

WARM_UP = 10


def run(
    orders: int, gap: float, devhosts: int, workflow: str, timeout: float, transport: str
) -> dict[str, Any]:
    stack = LocalStack(
        devhosts=devhosts, transport=transport, settings={"STEP_TIMEOUT_SECONDS": "30"}
    )
    submitted: dict[str, float] = {}
    finished: dict[str, Any] = {}
    with stack:
        ctx = stack.context
        prefix = f"idle-{uuid.uuid4().hex[:6]}"
        warm_up(ctx, prefix, workflow, timeout, WARM_UP)
        for n in range(orders):
            time.sleep(gap)  # nothing to do: the triggers back off
            order_id = f"{prefix}-{n:02d}"
            submitted[order_id] = send(ctx, order_id, workflow)
            finished.update(wait_finished(ctx, [order_id], timeout))
        calls = call_times(stack)
    completed = {k: o for k, o in finished.items() if str(o.status) == "completed"}
    if not completed:
        raise SystemExit("no order completed")
    return {
        "benchmark": "idle",
        "date": utc_now_text(),
        "machine": machine(),
        "workflow": workflow,
        "transport": transport,
        "devhosts": devhosts,
        "gapSeconds": gap,
        "orders": orders,
        "completed": len(completed),
        "latencyMs": ms_stats([done_at(o) - submitted[k] for k, o in completed.items()]),
        "hopsMs": hops_ms(completed, submitted, calls),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.idle")
    parser.add_argument("--orders", type=int, default=20)
    parser.add_argument("--gap", type=float, default=5.0, help="idle seconds before each order")
    parser.add_argument("--workflow", default="order", choices=["order", "fulfilment"])
    stack_options(parser, timeout=120)
    args = parser.parse_args(argv)
    if args.orders < 1 or args.gap < 0:
        parser.error("--orders is at least 1, --gap 0 or more")
    result = run(args.orders, args.gap, args.devhosts, args.workflow, args.timeout, args.transport)
    print(json.dumps(result, indent=2))
    return 0 if result["completed"] == args.orders else 1


if __name__ == "__main__":
    sys.exit(main())
