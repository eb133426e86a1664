"""``bench.workflows``' index phase: what orders waiting on events or delays cost a
supervisor tick, in storage requests.

A step waiting for an event or a delay is ``Processing`` with its deadline (the event's
timeout, the delay's end) in the deadline-ordered ``processing|`` index
(``stores/layout.py``), and the supervisor reads that index only up to now, shard by
shard (``stores/sweeps.py``). So waiting orders should add no request to a tick until
their deadlines pass, and then only the work on those rows. Measured on Azurite, with no
devhost (nothing else touches the table), in this process:

1. ``empty``: ``--runs`` supervisor ticks (``Supervisor.run``) and scheduler sweeps on a
   table with no order; the storage requests of each, counted by the clients' pipeline
   hook (``observability/opcount.py``), and their time.
2. ``waiting``: the same after storing ``waiting`` orders as the app stores them (order
   record, step records, ``processing|``, ``waiting|`` and ``status|`` index rows, built
   by the model and ``stores.layout.index_rows``): half ``ev`` orders waiting for their
   event, half ``dl-until`` orders in a delay, every deadline about an hour ahead.
3. ``expired``: ``expired`` more such orders whose deadlines passed (accepted two hours
   ago), then one tick: its requests beyond the empty table's, per expired row; then
   ``--runs`` ticks again, back to the empty table's count.

Times grow with the table on Azurite, which scans every row for each query (see
``bench/sweeps.py``); requests are what Azure bills and what its index serves.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from azure.data.tables import TableClient

from bench.flows import EVENT_TIMEOUT_SECONDS
from bench.sweeps import BATCH_OPS, insert, order_rows
from bootstrap import bootstrap, clients
from config.settings import DECLARATIONS, OPCOUNT_DIR, Settings
from core.model import Order
from core.order_message import decode_order
from core.workflows import WORKFLOWS, Plan
from demo.stack import LocalStack
from observability import opcount

#: How far ahead the waiting orders' deadlines are, and how long ago the expired ones began.
AHEAD: Final = timedelta(seconds=EVENT_TIMEOUT_SECONDS)
EXPIRED_AGO: Final = timedelta(hours=2)


def waiting_order(order_id: str, n: int, accepted: datetime) -> Order:
    """An order accepted at ``accepted`` that waits: even ``n`` for its event ``go`` (an
    hour's timeout), odd ``n`` in a delay until an hour later (``dl-until``)."""
    if n % 2 == 0:
        body: dict[str, Any] = {"orderId": order_id, "workflow": "ev"}
    else:
        wake = accepted + AHEAD
        body = {"orderId": order_id, "workflow": "dl-until", "wakeAt": wake.isoformat()}
    plan = Plan.of(WORKFLOWS[body["workflow"]], 30)
    order = Order.accept(decode_order(json.dumps(body)), plan, accepted)
    order.outbox = []  # its "received" notice went long ago
    order.version = 1
    return order


def batches(orders: Iterable[Order]) -> Iterator[list[dict[str, Any]]]:
    """The orders' rows, in transactions of one partition each, yielded as each fills."""
    by_shard: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for order in orders:
        rows = order_rows(order)
        shard = by_shard[rows[0]["PartitionKey"]]
        if len(shard) + len(rows) > BATCH_OPS:
            yield list(shard)
            shard.clear()
        shard.extend(rows)
    yield from (rows for rows in by_shard.values() if rows)


def counted(action: Callable[[], Any]) -> tuple[Any, Counter[str], float]:
    """``action()``'s result, the storage requests this process made meanwhile (by
    ``<origin>:<kind>``), and its milliseconds."""
    before = snapshot()
    started = time.perf_counter()
    result = action()
    ms = 1000 * (time.perf_counter() - started)
    return result, snapshot() - before, ms


def snapshot() -> Counter[str]:
    # opcount keeps this process's counts in memory and writes them to its directory
    # every second; the tick is measured in this thread, so read them directly.
    with opcount._lock:
        return Counter(opcount._counts)


def requests_summary(counts: list[Counter[str]]) -> dict[str, Any]:
    """Requests per run: the total, by kind (when every run made the same ones), or the
    spread when they differ."""
    totals = [sum(c.values()) for c in counts]
    kinds = {k.split(":", 1)[1]: v for k, v in counts[0].items()} if counts else {}
    same = all(c == counts[0] for c in counts)
    out: dict[str, Any] = {"total": totals[0] if same else {"min": min(totals), "max": max(totals)}}
    out["byKind" if same else "firstRunByKind"] = dict(sorted(kinds.items()))
    return out


def level(sweeps: dict[str, Callable[[], Any]], runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, sweep in sweeps.items():
        sweep()  # warm: connections open
        found, counts, times = [], [], []
        for _ in range(runs):
            report, requests, ms = counted(sweep)
            found.append(report)
            counts.append(requests)
            times.append(ms)
        out[name] = {
            "requests": requests_summary(counts),
            "ms": round(statistics.median(times), 1),
            "found": found[-1],
        }
    return out


def run(waiting: int, expired: int, runs: int, threads: int) -> dict[str, Any]:
    stack = LocalStack(devhosts=0, settings={DECLARATIONS: "bench.flows"})
    counts_dir = Path(tempfile.mkdtemp(prefix="opcount-"))
    with stack:
        ctx = bootstrap(Settings.from_env({**stack.env, OPCOUNT_DIR: str(counts_dir)}))
        settings = ctx.settings

        def make_client() -> TableClient:
            return clients.table_service(settings.storage).get_table_client(ctx.names.state_table)

        sweeps: dict[str, Callable[[], Any]] = {
            "supervisor": lambda: ctx.supervisor.run().examined,
            "scheduler": lambda: ctx.scheduler.sweep().dispatched,
        }
        empty = level(sweeps, runs)
        now = datetime.now(UTC)
        fresh = (
            waiting_order(f"wait-{n:06d}", n, now - timedelta(seconds=n % 600))
            for n in range(waiting)
        )
        started = time.perf_counter()
        insert(make_client, batches(fresh), threads)
        insert_seconds = time.perf_counter() - started
        with_waiting = level(sweeps, runs)
        past = now - EXPIRED_AGO
        stale = [waiting_order(f"late-{n:04d}", n, past) for n in range(expired)]
        insert(make_client, batches(stale), 1)
        report, tick, tick_ms = counted(ctx.supervisor.run)
        after = level(sweeps, runs)
        stored = sum(
            1
            for _ in ctx.store.table.query_entities(
                "RowKey ge 'processing|' and RowKey lt 'processing}'", select="RowKey"
            )
        )
    base = empty["supervisor"]["requests"]["total"]
    extra = sum(tick.values()) - base if isinstance(base, int) else None
    per_row = {
        k.split(":", 1)[1]: round(v / expired, 2) for k, v in sorted(tick.items()) if expired
    }
    holds = (
        isinstance(base, int)
        and with_waiting["supervisor"]["requests"]["total"] == base
        and after["supervisor"]["requests"]["total"] == base
        and report.examined == expired
    )
    return {
        "method": "Supervisor.run and Scheduler.sweep in-process on Azurite (no devhost), "
        "requests counted by the clients' pipeline hook (observability/opcount.py)",
        "waitingOrders": waiting,
        "expiredOrders": expired,
        "processingIndexRows": stored,
        "insertSeconds": round(insert_seconds, 1),
        "supervisor": {
            "requestsPerTick": {
                "empty": base,
                f"{waiting} waiting": with_waiting["supervisor"]["requests"]["total"],
                f"{expired} expired": sum(tick.values()),
                "after": after["supervisor"]["requests"]["total"],
            },
            "empty": empty["supervisor"],
            "waiting": with_waiting["supervisor"],
            "expiredTick": {
                "examined": report.examined,
                "retried": report.retried,
                "failed": report.failed,
                "errors": report.errors[:3],
                "requests": dict(sorted(tick.items())),
                "extraRequests": extra,
                "requestsPerExpiredRowByKind": per_row,
                "ms": round(tick_ms, 1),
            },
            "after": after["supervisor"],
        },
        "scheduler": {
            "empty": empty["scheduler"],
            "waiting": with_waiting["scheduler"],
            "after": after["scheduler"],
        },
        "holds": holds,
    }
