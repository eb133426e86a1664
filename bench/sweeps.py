"""Sweep benchmark: do the supervisor's and the scheduler's sweeps cost grow with history?

    python -m bench.sweeps [--finished 20000] [--runs 15] [--threads 4]

The sweeps read index ranges (``processing|``, ``pending|``, ``outbox|`` up to now,
shard by shard: ``stores/sweeps.py``), so their cost should follow the work in
flight, not the number of orders ever stored. This measures it on Azurite:

1. Start Azurite and the simulator (no devhost: nothing else touches the table) and
   time ``ctx.supervisor.run()`` and ``ctx.scheduler.sweep()`` in this process, each
   as the median of ``--runs`` runs, with the table empty of orders.
2. Insert completed ``order`` workflow orders as the app stores them (order record,
   its step record and its ``status|`` index row, built by the model and written by
   ``stores.entities.order_entity`` / ``step_entity`` and ``stores.layout.index_rows``),
   in partition transactions of up to 99 operations, from ``--threads`` threads.
   The first 5,000 (or ``--finished``, if fewer) measure the insert rate.
3. Time both sweeps again with 5,000 and with ``--finished`` orders in the table.

It prints one JSON object: the sweep times (ms, each level), their ratio at
``--finished`` to the empty table (the issue's target: <= 1.2), and the insert rate.

Read the ratio knowing what Azurite does: it answers every query by running its
filter over every entity of the table, all partitions, then sorting what matched
(``queryTableEntities`` in ``node_modules/azurite/dist/src/table/persistence/
LokiTableMetadataStore.js``: ``collection.chain().where(filter)``). Each of a sweep's
range queries (16 for the supervisor, 32 for the scheduler, none returning a row
here) so costs time in proportion to the whole table, which the app's key layout
cannot change; Azure Table storage serves a ``PartitionKey eq and RowKey`` range from
its index. ``azuriteNsPerStoredRowPerQuery`` is that cost, and
``linearEstimateMsAt100k`` what it implies at 100,000 orders (an extrapolation, not a
measurement).

The default ``--finished`` (20,000) is what fits a ``make bench`` run on a 2-core
machine; 100,000, the issue's size, takes about 5 minutes of inserts there
(``insert.estimatedSecondsFor100k``): ``--finished 100000`` runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from azure.core.exceptions import ServiceResponseError
from azure.data.tables import TableClient, TableTransactionError

from bench.latency import machine, utc_now_text
from bootstrap import AppContext, clients
from core.messages import AgentReply
from core.model import Order
from core.order_message import decode_order
from core.outcome import Outcome
from core.workflows import WORKFLOWS, Plan
from demo.stack import LocalStack
from stores import entities, layout

RATE_SAMPLE = 5_000
BATCH_OPS = 99  # a partition transaction takes at most 100 operations
WARM_UP_RUNS = 3
ROWS_PER_ORDER = 3  # order record, step record, status index row
#: Range queries per sweep (``stores/sweeps.py``): one per shard and index read.
QUERIES_PER_SWEEP: Final = {"supervisor": layout.SHARDS, "scheduler": 2 * layout.SHARDS}


def completed_order(order_id: str, created: datetime, plan: Plan) -> Order:
    """An ``order`` workflow order that ran its step and completed, by the model's own
    transitions (its histories, times and index rows are those of a real one)."""
    raw = json.dumps({"orderId": order_id, "workflow": plan.workflow, "amount": 10})
    order = Order.accept(decode_order(raw), plan, created)
    step = order.claim("bench-host-1234", created + timedelta(milliseconds=40))
    reply = AgentReply(
        order_id,
        step.step,
        step.attempt,
        step.complete_by,
        Outcome.SUCCEEDED,
        result={"status": "ok", "reference": f"ref-{order_id}"},
        token=step.token_for(step.attempt),
    )
    order.apply_reply(reply, created + timedelta(milliseconds=180))
    order.outbox = []  # delivered long ago: the outbox rows are gone
    order.version = 3  # accepted, claimed, completed
    return order


def order_rows(order: Order) -> list[dict[str, Any]]:
    partition = layout.shard_of(order.order_id)
    rows = [entities.order_entity(order, "bench"), *map(entities.step_entity, order.steps)]
    rows += [
        {"PartitionKey": partition, "RowKey": row, **extra}
        for row, extra in layout.index_rows(order).items()
    ]
    return rows


def batches(ids: Iterable[str], now: datetime, plan: Plan) -> Iterator[list[dict[str, Any]]]:
    """The rows of the orders ``ids``, in transactions of one partition each, yielded as
    each fills (so the inserts start while the rest are built)."""
    by_shard: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for n, order_id in enumerate(ids):
        # Spread over the past days, newest first, as a history would be.
        created = now - timedelta(hours=1, seconds=n * 6)
        rows = order_rows(completed_order(order_id, created, plan))
        shard = by_shard[rows[0]["PartitionKey"]]
        if len(shard) + len(rows) > BATCH_OPS:
            yield list(shard)
            shard.clear()
        shard.extend(rows)
    yield from (rows for rows in by_shard.values() if rows)


#: Tries per insert transaction (Azurite resets connections now and then under this load).
INSERT_ATTEMPTS = 5


def insert(
    make_client: Callable[[], TableClient], work: Iterable[list[dict[str, Any]]], threads: int
) -> None:
    local = threading.local()

    def submit(rows: list[dict[str, Any]]) -> None:
        if not hasattr(local, "table"):
            local.table = make_client()
        for attempt in range(INSERT_ATTEMPTS):
            try:
                local.table.submit_transaction([("create", row) for row in rows])
                return
            except TableTransactionError as error:
                if error.status_code == 409:  # an earlier try applied, its answer was lost
                    return
                raise
            except ServiceResponseError:  # the emulator dropped the connection: try again
                if attempt + 1 == INSERT_ATTEMPTS:
                    raise
                time.sleep(2.0 * (attempt + 1))

    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(submit, work):
            pass


def time_sweeps(ctx: AppContext, runs: int) -> dict[str, float]:
    """Median milliseconds of ``runs`` runs of each sweep (after warm-up runs). Every
    order stored here is finished: a sweep that finds work is an error."""

    def scheduler() -> int:
        report = ctx.scheduler.sweep()
        return report.dispatched + report.notices + len(report.errors)

    out: dict[str, float] = {}
    sweeps: dict[str, Callable[[], int]] = {
        "supervisor": lambda: ctx.supervisor.run().examined,
        "scheduler": scheduler,
    }
    for name, sweep in sweeps.items():
        found = sum(sweep() for _ in range(WARM_UP_RUNS))
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            found += sweep()
            times.append(1000 * (time.perf_counter() - started))
        if found:
            raise SystemExit(f"the {name} sweep found work in a table of finished orders")
        out[name] = round(statistics.median(times), 1)
    return out


def ratio(with_orders: dict[str, float], empty: dict[str, float]) -> dict[str, float]:
    return {name: round(with_orders[name] / empty[name], 2) for name in empty}


def per_row_ns(
    levels: dict[str, dict[str, float]],
) -> tuple[dict[str, float], dict[str, float]]:
    """Azurite's extra cost per stored row and query (ns: the least-squares slope of the
    sweep times over the levels measured), and the sweep times it implies at 100,000
    orders (linear, from the empty table's time)."""
    cost: dict[str, float] = {}
    at_100k: dict[str, float] = {}
    rows = [int(level) * ROWS_PER_ORDER for level in levels]
    mean_rows = statistics.mean(rows)
    spread = sum((r - mean_rows) ** 2 for r in rows)
    for name, queries in QUERIES_PER_SWEEP.items():
        times = [levels[level][name] for level in levels]
        mean_ms = statistics.mean(times)
        slope = sum((r - mean_rows) * (t - mean_ms) for r, t in zip(rows, times, strict=True))
        per_row_ms = slope / spread if spread else 0.0
        cost[name] = round(1e6 * per_row_ms / queries, 1)
        at_100k[name] = round(levels["0"][name] + per_row_ms * 100_000 * ROWS_PER_ORDER)
    return cost, at_100k


def run(finished: int, runs: int, threads: int) -> dict[str, Any]:
    plan = Plan.of(WORKFLOWS["order"], 30)
    now = datetime.now(UTC)
    stack = LocalStack(devhosts=0)
    with stack:
        ctx = stack.context
        settings = ctx.settings

        def make_client() -> TableClient:
            service = clients.table_service(settings.storage)
            return service.get_table_client(ctx.names.state_table)

        empty = time_sweeps(ctx, runs)
        sample = min(RATE_SAMPLE, finished)
        ids = [f"done-{n:07d}" for n in range(finished)]
        started = time.perf_counter()
        insert(make_client, batches(ids[:sample], now, plan), threads)
        sample_seconds = time.perf_counter() - started
        levels: dict[str, dict[str, float]] = {"0": empty, str(sample): time_sweeps(ctx, runs)}
        rest_seconds = 0.0
        if finished > sample:
            started = time.perf_counter()
            insert(make_client, batches(ids[sample:], now, plan), threads)
            rest_seconds = time.perf_counter() - started
            levels[str(finished)] = time_sweeps(ctx, runs)
        checked = sum(1 for _ in ctx.store.table.query_entities("Kind eq 'order'", select="RowKey"))
    if checked != finished:
        raise SystemExit(f"inserted {finished} orders but the table holds {checked}")
    top = levels[str(finished)]
    cost, at_100k = per_row_ns(levels)
    return {
        "benchmark": "sweeps",
        "date": utc_now_text(),
        "machine": machine(),
        "finishedOrders": finished,
        "tableRows": finished * ROWS_PER_ORDER,
        "runsPerMedian": runs,
        "sweepMs": levels,
        "ratio": ratio(top, empty),
        "target": 1.2,
        "withinTarget": all(v <= 1.2 for v in ratio(top, empty).values()),
        "queriesPerSweep": QUERIES_PER_SWEEP,
        "azuriteNsPerStoredRowPerQuery": cost,
        "linearEstimateMsAt100k": at_100k,
        "insert": {
            "threads": threads,
            "sampleOrders": sample,
            "sampleSeconds": round(sample_seconds, 1),
            "ordersPerSecond": round(sample / sample_seconds),
            "totalSeconds": round(sample_seconds + rest_seconds, 1),
            "estimatedSecondsFor100k": round(100_000 * sample_seconds / sample),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sweeps")
    parser.add_argument("--finished", type=int, default=20_000, help="completed orders stored")
    parser.add_argument("--runs", type=int, default=15, help="runs per median")
    parser.add_argument("--threads", type=int, default=4, help="insert threads")
    args = parser.parse_args(argv)
    if args.finished < 1 or args.runs < 1 or args.threads < 1:
        parser.error("--finished, --runs and --threads must be positive")
    print(json.dumps(run(args.finished, args.runs, args.threads), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
