"""Pipeline benchmark: orders/s, submit-to-done latency, storage operations per order.

    python -m bench.pipeline [--orders 300] [--devhosts 2] [--workflow order]

Runs the real stack (Azurite, a no-fault simulator, N devhost instances),
puts N orders on the ``orders`` queue at once, and waits for all of them to
finish. It prints one JSON object:

- ``ordersPerSecond``: N / (last completion - first submit)
- ``latencyMs``: p50 / p99 / max from an order's submit (client clock) to its
  completion (the order record's ``UpdatedAt``; same machine, same clock)
- ``tableOpsPerOrder`` / ``queueOpsPerOrder``: every storage request the app
  processes made during the run (``runtime/opcount.py``), by kind, divided by
  N; queue receives include the host's polling, as they would in Azure
- ``azurite``: the raw rate of conditional entity updates (If-Match, one
  process, one thread) measured in the same run, so ``ordersPerSecond`` can be
  read against what the emulator itself can do on this machine.

Numbers from a shared 2-core machine are noisy: compare runs, not digits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import TableClient, UpdateMode

from demo.stack import LocalStack
from runtime import opcount


def conditional_update_rate(connection: str, seconds: float = 5.0) -> dict[str, float]:
    table = TableClient.from_connection_string(connection, "Bench" + uuid.uuid4().hex[:8])
    table.create_table()
    entity = {"PartitionKey": "p", "RowKey": "r", "Counter": 0}
    meta = table.create_entity(entity)
    etag = meta["etag"]
    count = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        entity["Counter"] = count
        meta = table.update_entity(
            entity,
            mode=UpdateMode.REPLACE,
            etag=etag,
            match_condition=MatchConditions.IfNotModified,
        )
        etag = meta["etag"]
        count += 1
    elapsed = time.perf_counter() - started
    table.delete_table()
    return {
        "conditionalUpdatesPerSecond": round(count / elapsed, 1),
        "measuredSeconds": round(elapsed, 1),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def run(orders: int, devhosts: int, workflow: str, timeout: float) -> dict[str, Any]:
    counts_dir = Path(tempfile.mkdtemp(prefix="opcount-"))
    stack = LocalStack(
        devhosts=devhosts,
        settings={
            opcount.ENV: str(counts_dir),
            "STEP_TIMEOUT_SECONDS": "30",
            "SUPERVISOR_SCHEDULE": "*/5 * * * * *",
        },
    )
    with stack:
        raw = conditional_update_rate(stack.connection_string)
        ctx = stack.context
        queue = ctx.queues.client(ctx.names.orders)
        prefix = f"bench-{uuid.uuid4().hex[:6]}"
        ids = [f"{prefix}-{n:05d}" for n in range(orders)]
        # Let the hosts finish starting and zero the counters' baseline.
        time.sleep(2)
        baseline = opcount.collect(counts_dir)
        submitted: dict[str, float] = {}
        first_submit = time.time()
        for order_id in ids:
            queue.send_message(
                json.dumps({"orderId": order_id, "workflow": workflow, "amount": 10})
            )
            submitted[order_id] = time.time()
        finished: dict[str, float] = {}
        pending = set(ids)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for order_id in list(pending):
                order = ctx.store.load(order_id)
                if order is not None and order.status.terminal:
                    finished[order_id] = order.updated_at.timestamp()
                    pending.discard(order_id)
            if pending:
                time.sleep(0.5)
        time.sleep(1.5)  # let the processes flush their final counts
        counts = opcount.collect(counts_dir)
        counts.subtract(baseline)
    if not finished:
        raise SystemExit("no order finished")
    latencies = [(finished[o] - submitted[o]) * 1000 for o in finished]
    span = max(finished.values()) - first_submit
    per_order = {k: round(v / len(finished), 2) for k, v in sorted(counts.items()) if v > 0}
    table_ops = {k: v for k, v in per_order.items() if k.startswith("table.")}
    queue_ops = {k: v for k, v in per_order.items() if k.startswith("queue.")}
    rate = len(finished) / span
    return {
        "benchmark": "pipeline",
        "workflow": workflow,
        "orders": orders,
        "finished": len(finished),
        "unfinished": len(pending),
        "devhosts": devhosts,
        "seconds": round(span, 2),
        "ordersPerSecond": round(rate, 1),
        "latencyMs": {
            "p50": round(percentile(latencies, 0.5)),
            "p99": round(percentile(latencies, 0.99)),
            "max": round(max(latencies)),
        },
        "tableOpsPerOrder": {**table_ops, "total": round(sum(table_ops.values()), 2)},
        "queueOpsPerOrder": {**queue_ops, "total": round(sum(queue_ops.values()), 2)},
        "azurite": raw,
        "ordersPerSecondPerThousandRawUpdates": round(
            1000 * rate / raw["conditionalUpdatesPerSecond"], 1
        ),
        "latencyMeanMs": round(statistics.mean(latencies)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline")
    parser.add_argument("--orders", type=int, default=300)
    parser.add_argument("--devhosts", type=int, default=2)
    parser.add_argument("--workflow", default="order", choices=["order", "fulfilment"])
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    result = run(args.orders, args.devhosts, args.workflow, args.timeout)
    print(json.dumps(result, indent=2))
    return 0 if result["unfinished"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
