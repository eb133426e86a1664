"""Pipeline benchmark: throughput against a bare replay, and storage requests per order.

    python -m bench.pipeline [--orders 400] [--runs 3] [--replay 150] [--devhosts 2]
                             [--transport storage|servicebus]

Runs the real stack (Azurite, a no-fault simulator, N devhost instances, the agent
queues on ``--transport``: Storage queues by default, or localbus, the local Service Bus,
as deployed) and, ``--runs`` times on it: queues ``--orders`` orders as one backlog and
waits for all of them to finish (the product's drain rate); then replays, one order at a
time, the bare storage work of ``--replay`` orders (the replay's rate). It prints one JSON object:

- ``runs``: per run, ``ordersPerSecond`` (the drain rate: finished / (last completion -
  first order accepted)), ``replayOrdersPerSecond`` and their ratio ``vsReplay`` (above
  1.0, batching and concurrency beat doing the same storage work one order at a time);
  ``ordersPerSecondFromVisible`` (the same, counted from when the backlog became
  visible: it adds the hosts' first poll, up to ``maxPollingInterval`` after a quiet
  spell), ``sendingSeconds`` and the latency p50 / p99 / max from the backlog becoming
  visible to each order's completion (the record's ``UpdatedAt``);
- ``vsReplay``: min / median / max of the runs' ratios;
- ``requestsPerOrder``: every storage request the app's processes made during the runs
  (``observability/opcount.py``), divided by the orders, by who made it: ``app`` (the functions'
  own requests for the orders: table transactions and reads, queue sends), ``host`` (the
  triggers' receives, deletes and lease renewals, as the Functions host makes them in
  Azure) and ``timer`` (the sweeps, which cost per minute, not per order:
  ``timerRequestsPerMinute``); ``agent.<op>`` repeats the part of the queue requests
  made on the agents' request queues and the reply queue, which are Service Bus
  operations instead where ``AGENT_TRANSPORT=servicebus`` (the default in Azure);
- ``azurite``: the raw rate of conditional entity updates (If-Match, one process, one
  thread) in the same run, to read the rates against what the emulator can do here.

**The backlog.** The benchmark's client puts the orders on the queue from eight threads,
each message invisible until one moment a few seconds ahead (the send's visibility
timeout), so the hosts meet the whole burst at once and the client's own sending is not
part of what is measured. (Until 2026-11-26 one thread sent them while the hosts were
already draining: in runs where the hosts kept pace with it, the client's sending, 5-8 s
for 400 orders on a loaded machine, was the rate measured.) The store is read lightly
while the orders run (the last one queued, four times a second), and every order once
they are done.

The replay (``bare_replay``) is what one order needs from storage, made as plainly as
possible through the same clients and the same table: the ``orders`` message sent,
received and deleted; the order accepted and its first step claimed (one transaction);
the agent request sent, received and deleted; the order read and the reply applied (one
transaction). Everything the replay would decide is prepared before it starts; only
the reply's transition runs in the loop (microseconds). It is the same storage work
whatever ``--transport`` says (Storage queues, on Azurite): the yardstick stays one, and
the transport changes only what the product does.

Numbers from a shared 2-core machine are noisy: compare runs, not digits.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import TableClient, UpdateMode

from bench import stack_options
from bench.latency import machine, percentile, utc_now_text
from bootstrap import AppContext
from config.settings import OPCOUNT_DIR
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.order_message import decode_order
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.workflows import WORKFLOWS, Plan
from demo.stack import LocalStack
from observability import opcount

REPLAY_QUEUES = ("bench-replay-orders", "bench-replay-requests")
#: Threads putting a burst's orders on the queue, and how long before the burst becomes
#: visible they start (plus a second per 400 orders): sending must be over by then.
SENDERS = 8
BACKLOG_LEAD_SECONDS = 2.0


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


def _receive_one(queue: Any) -> Any:
    while True:
        for message in queue.receive_messages(messages_per_page=1, max_messages=1):
            return message


def bare_replay(ctx: AppContext, prefix: str, count: int) -> dict[str, float]:
    """The storage requests of ``count`` single-step orders, one order at a time (see the
    module docstring); orders/s."""
    orders_queue, requests_queue = (ctx.queues.client(name) for name in REPLAY_QUEUES)
    ctx.queues.ensure(*REPLAY_QUEUES)
    plan = Plan.of(WORKFLOWS["order"], 30)
    now = datetime.now(UTC)
    prepared = []
    for n in range(count):
        text = json.dumps({"orderId": f"{prefix}-{n:05d}", "workflow": "order", "amount": 10})
        order = Order.accept(decode_order(text), plan, now)
        step = order.claim("bench-replay", now)
        token = step.token_for(step.attempt)
        request = AgentRequest(
            order.order_id,
            step.step,
            step.attempt,
            step.complete_by,
            step.path,
            order.body,
            token=token,
        )
        reply = AgentReply(
            order.order_id,
            step.step,
            step.attempt,
            step.complete_by,
            Outcome.SUCCEEDED,
            result={},
            token=token,
        )
        prepared.append((text, order, request.encode(), reply))
    policy = RetryPolicy()
    started = time.perf_counter()
    for text, order, request_text, reply in prepared:
        orders_queue.send_message(text)
        orders_queue.delete_message(_receive_one(orders_queue))
        ctx.store.create(order)
        requests_queue.send_message(request_text)
        requests_queue.delete_message(_receive_one(requests_queue))
        loaded = ctx.store.load(order.order_id)
        assert loaded is not None
        loaded.apply_reply(reply, now, policy)
        ctx.store.save(loaded)
    elapsed = time.perf_counter() - started
    return {"orders": count, "seconds": round(elapsed, 2), "ordersPerSecond": count / elapsed}


def _queue_backlog(
    ctx: AppContext, ids: list[str], workflow: str, lead: float
) -> tuple[float, float]:
    """Put the orders on the ``orders`` queue invisible until one moment, ``lead`` seconds
    from now (each send's ``visibility_timeout``, whole seconds), so that the whole burst
    is there when the hosts first see it; several threads send. (The time, on the
    client's clock, the backlog becomes visible; the seconds sending took.)"""
    queue = ctx.queues.client(ctx.names.orders)
    visible_at = time.time() + lead
    started = time.monotonic()

    def put(order_id: str) -> None:
        body = json.dumps({"orderId": order_id, "workflow": workflow, "amount": 10})
        delay = max(0, math.ceil(visible_at - time.time()))
        queue.send_message(body, visibility_timeout=delay)

    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(put, ids))
    return visible_at, time.monotonic() - started


def _wait_finished(ctx: AppContext, ids: list[str], timeout: float) -> dict[str, Order]:
    """The orders among ``ids`` that reached a terminal status within ``timeout``, read
    lightly while they run (the store is what is measured): the last one queued, every
    quarter of a second, until it is done; then each of them, again for those not yet done.
    The times measured come from the records, not from when this loop saw them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = ctx.store.load(ids[-1])
        if last is not None and last.status.terminal:
            break
        time.sleep(0.25)
    finished: dict[str, Order] = {}
    left = list(ids)
    while left and time.monotonic() < deadline:
        for order_id in left:
            order = ctx.store.load(order_id)
            if order is not None and order.status.terminal:
                finished[order_id] = order
        left = [order_id for order_id in left if order_id not in finished]
        if left:
            time.sleep(0.25)
    return finished


def product_run(
    ctx: AppContext, prefix: str, orders: int, workflow: str, timeout: float
) -> dict[str, Any]:
    """``orders`` orders queued as one backlog; the rate it drains at, and latency."""
    ids = [f"{prefix}-{n:05d}" for n in range(orders)]
    lead = BACKLOG_LEAD_SECONDS + orders / 400
    visible_at, sending = _queue_backlog(ctx, ids, workflow, lead)
    done = _wait_finished(ctx, ids, timeout)
    if not done:
        raise SystemExit("no order finished")
    finished = {order_id: order.updated_at.timestamp() for order_id, order in done.items()}
    accepted = min(order.created_at.timestamp() for order in done.values())
    latencies = [(t - visible_at) * 1000 for t in finished.values()]
    last = max(finished.values())
    return {
        "finished": len(finished),
        "unfinished": len(ids) - len(finished),
        "seconds": round(last - accepted, 2),
        "ordersPerSecond": len(finished) / (last - accepted),
        # From the moment the backlog became visible: with the hosts' first poll of it
        # (up to maxPollingInterval after a quiet spell, as in Azure).
        "ordersPerSecondFromVisible": round(len(finished) / (last - visible_at), 1),
        "firstAcceptedAfterMs": round((accepted - visible_at) * 1000),
        "sendingSeconds": round(sending, 2),
        "sendingOverran": sending > lead,
        "latencyMs": {  # from the backlog becoming visible to each order's completion
            "p50": round(percentile(latencies, 0.5)),
            "p99": round(percentile(latencies, 0.99)),
            "max": round(max(latencies)),
        },
    }


def per_order(counts: Counter[str], orders: int, minutes: float) -> dict[str, Any]:
    """``<origin>:<kind>`` counts as requests per order (per minute for the timers)."""
    out: dict[str, Any] = {}
    for who in ("app", "host"):
        kinds = {
            k.split(":", 1)[1]: round(v / orders, 2)
            for k, v in sorted(counts.items())
            if k.startswith(f"{who}:") and v > 0
        }
        tables = sum(v for k, v in kinds.items() if k.startswith("table."))
        queues = sum(v for k, v in kinds.items() if k.startswith("queue."))
        out[who] = {**kinds, "table": round(tables, 2), "queue": round(queues, 2)}
    timers = {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("timer:")}
    out["timerRequestsPerMinute"] = {
        k: round(v / minutes, 1) for k, v in sorted(timers.items()) if v > 0
    }
    return out


def new_stack(devhosts: int, transport: str, counts_dir: Path) -> LocalStack:
    """The stack the runs drain on (not started): ``devhosts`` instances, the agent
    queues on ``transport``, every process counting its storage requests in
    ``counts_dir``."""
    return LocalStack(
        devhosts=devhosts,
        transport=transport,
        settings={
            OPCOUNT_DIR: str(counts_dir),
            "STEP_TIMEOUT_SECONDS": "30",
            "SUPERVISOR_SCHEDULE": "*/5 * * * * *",
        },
    )


def run(
    orders: int,
    runs: int,
    replay: int,
    devhosts: int,
    workflow: str,
    timeout: float,
    transport: str = "storage",
) -> dict[str, Any]:
    counts_dir = Path(tempfile.mkdtemp(prefix="opcount-"))
    stack = new_stack(devhosts, transport, counts_dir)
    results: list[dict[str, Any]] = []
    with stack:
        raw = conditional_update_rate(stack.connection_string)
        ctx = stack.context
        tag = uuid.uuid4().hex[:6]
        time.sleep(2)  # let the hosts finish starting
        counted = Counter[str]()
        counted_minutes = 0.0
        for n in range(runs):
            baseline = opcount.collect(counts_dir)
            started = time.monotonic()
            product = product_run(ctx, f"bench-{tag}-{n}", orders, workflow, timeout)
            time.sleep(1.5)  # let the processes flush their counts
            counts = opcount.collect(counts_dir)
            counts.subtract(baseline)
            counted.update(counts)
            counted_minutes += (time.monotonic() - started) / 60
            bare = bare_replay(ctx, f"replay-{tag}-{n}", replay)
            results.append(
                {
                    **product,
                    "ordersPerSecond": round(product["ordersPerSecond"], 1),
                    "replayOrdersPerSecond": round(bare["ordersPerSecond"], 1),
                    "vsReplay": round(product["ordersPerSecond"] / bare["ordersPerSecond"], 2),
                }
            )
    ratios = [r["vsReplay"] for r in results]
    total_orders = sum(r["finished"] for r in results)
    return {
        "benchmark": "pipeline",
        "date": utc_now_text(),
        "machine": machine(),
        "workflow": workflow,
        "transport": transport,
        "orders": orders,
        "replayOrders": replay,
        "devhosts": devhosts,
        "runs": results,
        "unfinished": sum(r["unfinished"] for r in results),
        "vsReplay": {
            "min": min(ratios),
            "median": statistics.median(ratios),
            "max": max(ratios),
            "target": 1.2,  # in one run, on each transport
            "floor": 1.0,
        },
        "requestsPerOrder": per_order(counted, total_orders, counted_minutes),
        "azurite": raw,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline")
    parser.add_argument("--orders", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--replay", type=int, default=150, help="orders in each bare replay")
    parser.add_argument("--workflow", default="order", choices=["order", "fulfilment"])
    stack_options(parser, timeout=600)
    args = parser.parse_args(argv)
    result = run(
        args.orders,
        args.runs,
        args.replay,
        args.devhosts,
        args.workflow,
        args.timeout,
        args.transport,
    )
    print(json.dumps(result, indent=2))
    return 0 if result["unfinished"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
