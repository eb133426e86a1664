"""Per-key concurrency benchmark: customers' orders taking turns, on the real stack.

    python -m bench.turns [--customers 20] [--per-customer 10] [--call-ms 300]
                          [--arrival grouped|interleaved]
                          [--devhosts 2] [--transport storage|servicebus]

``bench.turns_flows`` declares one-step orders twice: ``keyed`` (``limit=1`` per
``customer``, docs/contracts.md §3.16) and ``plain`` (no limit). On Azurite, a simulator
and ``--devhosts`` devhost instances, after a warm-up, it runs:

- **baseline**: each customer's orders of ``plain`` one after another, the client
  sending the next when it sees the one before it ended (all customers side by side,
  the store read round robin): what a limit costs at best, with no limit machinery;
- **keyed**: every order of ``keyed`` sent at once, in one burst; the slots alone keep
  them apart. ``--arrival grouped`` (the default) sends each customer's orders one after
  the other (the last customer's first order behind every other customer's orders on
  the ``orders`` queue); ``interleaved`` sends every customer's first, then every
  second, and so on. A burst is sent by ``SENDERS`` client threads (one thread alone
  took 2-2.6 s to send 200 here, time the baseline never spends: the client's, not the
  limit's); ``sendMs`` says how long the keyed burst's sends took.

Each order's step takes ``--call-ms`` at the remote (``simulate``: ``latencyMs``).
Prints one JSON object:

- ``totalMs``: first send to the last order's end (its terminal ``status`` event), for
  ``baseline`` and ``keyed``, and ``ratio`` keyed / baseline (the target: ≤ 1.3);
- ``overlaps``: pairs of one customer's orders that ran at once, from their histories
  (an order runs from its ``turn-taken`` event, or its first step's creation if it
  started at once, to its end): must be 0;
- ``handoffMs``: for each order but a customer's first, its ``turn-taken`` less the
  end of the customer's order before it, p50 / p90 / max (the target: p50 ≤ 200 ms on Service Bus);
- ``gapMs`` of ``baseline``: the same gap there (the client's poll and send);
- where the time goes, for both: ``runMs`` (an order's start to its end, p50 / p90) and
  ``firstStartMs`` (the first send to each customer's first order's start, p50 / max);
- ``statuses`` of both runs.

Numbers from a shared 2-core machine are noisy: compare runs, not digits.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import stack_options
from bench.latency import done_at, machine, percentile, utc_now_text
from config.settings import DECLARATIONS
from core import workflows
from core.history import Happened
from core.model import Order
from core.timefmt import parse_iso
from demo.stack import LocalStack

FLOWS = "bench.turns_flows"
#: Client threads that send a burst of orders.
SENDERS = 8


def send_all(stack: LocalStack, orders: list[dict[str, Any]]) -> None:
    """Put ``orders`` on the ``orders`` queue at once (``SENDERS`` threads, in order)."""
    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(stack.submit, orders))


POLL_SECONDS = 0.02


def order_of(order_id: str, workflow: str, customer: str, call_ms: int) -> dict[str, Any]:
    return {
        "orderId": order_id,
        "workflow": workflow,
        "customer": customer,
        "simulate": {"work": {"latencyMs": call_ms}},
    }


def began_at(order: Order) -> float:
    """When the order began to run: its ``turn-taken`` event (it waited), else the
    creation of its first step (it started at once)."""
    for event in order.history:
        if event.get("event") == Happened.TURN_TAKEN:
            return parse_iso(event["at"]).timestamp()
    starts = [parse_iso(r.history[0]["at"]).timestamp() for r in order.steps if r.history]
    if not starts:
        raise SystemExit(f"order {order.order_id} has no turn-taken event and no step")
    return min(starts)


def runs_of(orders: list[Order]) -> list[tuple[float, float, Order]]:
    """(began, ended, order) of one customer's orders, in the order they began."""
    return sorted(((began_at(o), done_at(o), o) for o in orders), key=lambda r: r[:2])


def overlaps(runs: list[tuple[float, float, Order]], limit: int = 1) -> int:
    """Moments more than ``limit`` of them ran at once (an end before a start at the
    same moment)."""
    moments = sorted([(b, 1) for b, _, _ in runs] + [(e, -1) for _, e, _ in runs])
    running = over = 0
    for _, change in moments:
        running += change
        over += running > limit
    return over


def gaps(runs: list[tuple[float, float, Order]]) -> list[float]:
    """Each order's start less the end of the one before it (ms): with ``limit=1``, the
    customer's next order waited for exactly that end."""
    return [1000 * (after[0] - before[1]) for before, after in itertools.pairwise(runs)]


def wait_all(stack: LocalStack, ids: list[str], timeout: float) -> list[Order]:
    deadline = time.monotonic() + timeout
    pending, done = list(ids), []
    while pending and time.monotonic() < deadline:
        order = stack.context.store.load(pending[0])
        if order is not None and order.status.terminal:
            done.append(order)
            pending.pop(0)
        else:
            time.sleep(0.1)
    if pending:
        raise SystemExit(f"{len(pending)} orders did not end within {timeout:.0f} s")
    return done


def baseline(
    stack: LocalStack, tag: str, customers: int, each: int, call_ms: int, timeout: float
) -> tuple[float, dict[str, list[Order]]]:
    """Each customer's ``plain`` orders one after another, sent by the client as the one
    before it ends; the customers side by side. (first send, orders by customer)."""
    queues = {
        f"c{c:02d}": [f"base-{tag}-c{c:02d}-{n}" for n in range(each)] for c in range(customers)
    }
    ended: dict[str, list[Order]] = {c: [] for c in queues}
    current: dict[str, str] = {}
    started = time.time()
    for customer, ids in queues.items():
        current[customer] = ids.pop(0)
    send_all(stack, [order_of(o, "plain", c, call_ms) for c, o in current.items()])
    deadline = time.monotonic() + timeout
    while current:
        if time.monotonic() > deadline:
            raise SystemExit(f"the baseline did not end within {timeout:.0f} s")
        for customer, order_id in list(current.items()):
            order = stack.context.store.load(order_id)
            if order is None or not order.status.terminal:
                continue
            ended[customer].append(order)
            if queues[customer]:
                current[customer] = queues[customer].pop(0)
                stack.submit(order_of(current[customer], "plain", customer, call_ms))
            else:
                del current[customer]
        time.sleep(POLL_SECONDS)
    return started, ended


def keyed(
    stack: LocalStack,
    tag: str,
    customers: int,
    each: int,
    call_ms: int,
    timeout: float,
    arrival: str = "grouped",
) -> tuple[float, dict[str, list[Order]], float]:
    """Every ``keyed`` order sent at once: each customer's together (``grouped``), or the
    customers' n-th orders together (``interleaved``). (first send, orders by customer,
    when the last send returned)."""
    ids = {f"c{c:02d}": [f"key-{tag}-c{c:02d}-{n}" for n in range(each)] for c in range(customers)}
    if arrival == "grouped":
        sending = [(c, o) for c, orders in ids.items() for o in orders]
    else:
        sending = [(c, orders[n]) for n in range(each) for c, orders in ids.items()]
    started = time.time()
    send_all(stack, [order_of(order_id, "keyed", c, call_ms) for c, order_id in sending])
    sent = time.time()
    flat = [i for orders in ids.values() for i in orders]
    by_id = {o.order_id: o for o in wait_all(stack, flat, timeout)}
    return started, {c: [by_id[i] for i in orders] for c, orders in ids.items()}, sent


def summary(started: float, by_customer: dict[str, list[Order]]) -> dict[str, Any]:
    every = [o for orders in by_customer.values() for o in orders]
    runs = {c: runs_of(orders) for c, orders in by_customer.items()}
    gap = [g for r in runs.values() for g in gaps(r)]
    took = [1000 * (e - b) for r in runs.values() for b, e, _ in r]
    first = [1000 * (r[0][0] - started) for r in runs.values()]
    return {
        "totalMs": round(1000 * (max(done_at(o) for o in every) - started)),
        "runMs": {"p50": round(percentile(took, 0.5)), "p90": round(percentile(took, 0.9))},
        "firstStartMs": {"p50": round(percentile(first, 0.5)), "max": round(max(first))},
        "statuses": dict(Counter(str(o.status) for o in every)),
        "overlaps": sum(overlaps(r) for r in runs.values()),
        "gapMs": {
            "p50": round(percentile(gap, 0.5)),
            "p90": round(percentile(gap, 0.9)),
            "max": round(max(gap)),
            "count": len(gap),
        }
        if gap
        else None,
    }


def run(
    customers: int,
    each: int,
    call_ms: int,
    devhosts: int,
    timeout: float,
    transport: str,
    arrival: str = "grouped",
) -> dict[str, Any]:
    workflows.use(FLOWS)
    stack = LocalStack(
        devhosts=devhosts,
        transport=transport,
        settings={DECLARATIONS: FLOWS, "STEP_TIMEOUT_SECONDS": "30"},
    )
    tag = uuid.uuid4().hex[:6]
    with stack:
        time.sleep(2)  # let the hosts finish starting
        warm = [f"warm-{tag}-{n}" for n in range(4)]
        for n, order_id in enumerate(warm):
            stack.submit(order_of(order_id, "keyed", f"w{n % 2}", call_ms))
        wait_all(stack, warm, timeout)
        base = summary(*baseline(stack, tag, customers, each, call_ms, timeout))
        time.sleep(2)
        started, by_customer, sent = keyed(stack, tag, customers, each, call_ms, timeout, arrival)
        limited = {**summary(started, by_customer), "sendMs": round(1000 * (sent - started))}
    return {
        "benchmark": "turns",
        "date": utc_now_text(),
        "machine": machine(),
        "transport": transport,
        "devhosts": devhosts,
        "customers": customers,
        "perCustomer": each,
        "callMs": call_ms,
        "arrival": arrival,
        "baseline": base,
        "keyed": limited,
        "ratio": round(limited["totalMs"] / base["totalMs"], 2),
        "handoffMs": limited["gapMs"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.turns")
    parser.add_argument("--customers", type=int, default=20)
    parser.add_argument("--per-customer", type=int, default=10)
    parser.add_argument("--call-ms", type=int, default=300, help="each remote call's latency")
    parser.add_argument("--arrival", choices=["grouped", "interleaved"], default="grouped")
    stack_options(parser, timeout=600)
    args = parser.parse_args(argv)
    if args.customers < 1 or args.per_customer < 2 or args.call_ms < 0:
        parser.error("--customers at least 1, --per-customer at least 2, --call-ms 0 or more")
    result = run(
        args.customers,
        args.per_customer,
        args.call_ms,
        args.devhosts,
        args.timeout,
        args.transport,
        args.arrival,
    )
    print(json.dumps(result, indent=2))
    every = args.customers * args.per_customer
    ok = {"completed": every}
    good = result["baseline"]["statuses"] == ok and result["keyed"]["statuses"] == ok
    return 0 if good and result["keyed"]["overlaps"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
