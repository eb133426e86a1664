"""ForEach benchmark: an order over its lines, ten at a time, on the real stack.

    python -m bench.foreach [--items 50] [--call-ms 1000] [--runs 5] [--devhosts 2]
                            [--transport storage|servicebus]

One order of ``workflow: each`` (``bench.foreach_flows``: a ``ForEach`` of one remote
call per line, ``max_concurrency=10``) whose every line asks the simulator to take
``--call-ms`` to answer (``simulate``: ``latencyMs``), run ``--runs`` times one after
the other, after a warm-up order, on Azurite, a simulator and ``--devhosts`` devhost
instances. Prints one JSON object:

- ``durationMs``: submit (client clock, after the send returned) to the order's
  completion (its terminal ``status`` event), p50 / p90 / min / max over the runs;
  ``idealMs`` is items / max_concurrency * call: every slot always busy.
- ``acceptedMs``: the order's acceptance (its ``createdAt``, after the ``orders`` queue's
  poll) to its completion, p50 / p90 / min / max: the run without the wait for the
  ``orders`` trigger's poll (the queue is idle between runs, so its listener has backed
  off to host.json's ``maxPollingInterval``, 0.5 s).
- ``firstCallMs``: submit to the remote's first call of the order (the order's message
  waiting for the ``orders`` queue's poll, its acceptance, the first requests' trip),
  p50 / max: the part of ``durationMs`` before any line runs.
- ``mostInFlight``: the most lines of one order in flight at once, ``records`` from the
  item records (each attempt from its claim to its end) and ``remote`` from the
  simulator's call log (each call from its arrival for ``--call-ms``); at most 10.
- ``itemHopsMs``: where an item's time goes besides its call (``item_hops``), p50 / p90
  over every item of the measured runs.
- ``fallbacks``: replies that could not be applied in process (the order kept changing,
  or anything else: ``messaging/inline.py``) and went through the reply queue instead,
  a further hop each, counted from the devhosts' logs, per run.
- ``tablePerItem``: the app's Table requests per line (``observability/opcount.py``,
  what the functions sent, not the hosts' queue polling nor the timers'), ``transactions``
  (entity group transactions, ``table.batch``: one per save of the order) and ``all``.

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
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import stack_options
from bench.foreach_flows import MAX_CONCURRENCY
from bench.latency import done_at, machine, percentile, utc_now_text
from config.settings import DECLARATIONS, OPCOUNT_DIR
from core import workflows
from core.item_names import item_of
from core.model import Order
from core.states import StepKind
from core.timefmt import parse_iso
from demo.stack import LocalStack
from observability import opcount

FLOWS = "bench.foreach_flows"
WARM_UP_ITEMS = 10
#: What ``messaging/inline.py`` logs when a reply goes to the reply queue after all.
FALLBACK = "reply not applied in process"


def fallbacks(stack: LocalStack) -> int:
    """Replies the devhosts sent to the reply queue after failing to apply them in
    process, so far (their logs)."""
    assert stack.workdir is not None
    return sum(
        log.read_text(errors="replace").count(FALLBACK)
        for log in stack.workdir.glob("devhost-*.log")
    )


def order_of(order_id: str, items: int, call_ms: int) -> dict[str, Any]:
    slow = {"each-line": {"latencyMs": call_ms}}
    lines = [{"sku": f"S-{i:02d}", "simulate": slow} for i in range(items)]
    return {"orderId": order_id, "workflow": "each", "lines": lines}


def most_in_flight(order: Order, name: str) -> int:
    """The most attempts of the ForEach ``name``'s items that ran at once, from their
    records (each from its claim to its end, or its deadline if it never ended)."""
    moments = []
    for record in order.steps:
        found = item_of(record.step) if record.kind is StepKind.ACTION else None
        if found is not None and found[0] == name:
            for attempt in record.attempts.items:
                moments += [(attempt.claimed_at, 1), (attempt.ended_at or attempt.deadline, -1)]
    return _most(moments)


def most_at_remote(calls: list[dict[str, Any]], order_id: str, call_ms: int) -> int:
    """The most calls of the order the remote was serving at once (each from its arrival
    for ``call_ms``: the latency the order asked for)."""
    moments = []
    for call in calls:
        if str(call.get("idempotencyKey", "")).startswith(f"{order_id}:"):
            at = parse_iso(call["at"])
            moments += [(at, 1), (at + timedelta(milliseconds=call_ms), -1)]
    return _most(moments)


def first_call_at(calls: list[dict[str, Any]], order_id: str) -> float:
    """When the remote received the order's first call (epoch seconds)."""
    return min(
        parse_iso(c["at"]).timestamp()
        for c in calls
        if str(c.get("idempotencyKey", "")).startswith(f"{order_id}:")
    )


def item_hops(order: Order, calls: list[dict[str, Any]], call_ms: int) -> dict[str, list[float]]:
    """Where an item's time goes, in ms, from its record's history and the remote's log:
    ``created->claimed`` (the item started, as another ended, until an instance claimed
    it), ``claimed->call`` (the request's trip to the agent), ``call->ended`` less the
    call's own ``call_ms`` (the answer's trip back and the reply applied)."""
    arrived = {
        str(c["idempotencyKey"]): parse_iso(c["at"]).timestamp()
        for c in calls
        if str(c.get("idempotencyKey", "")).startswith(f"{order.order_id}:")
    }
    hops: dict[str, list[float]] = {"created->claimed": [], "claimed->call": [], "call->ended": []}
    for record in order.steps:
        found = item_of(record.step) if record.kind is StepKind.ACTION else None
        attempt = record.attempts.items[0] if record.attempts.items else None
        if found is None or attempt is None or attempt.ended_at is None:
            continue
        created = parse_iso(record.history[0]["at"]).timestamp()
        claimed, ended = attempt.claimed_at.timestamp(), attempt.ended_at.timestamp()
        call = arrived.get(f"{order.order_id}:{found[0]}:{found[1]}")
        hops["created->claimed"].append(1000 * (claimed - created))
        if call is not None:
            hops["claimed->call"].append(1000 * (call - claimed))
            hops["call->ended"].append(1000 * (ended - call) - call_ms)
    return hops


def spread(values: list[float]) -> dict[str, Any]:
    return {
        "p50": round(statistics.median(values)),
        "p90": round(percentile(values, 0.9)),
        "min": round(min(values)),
        "max": round(max(values)),
        "each": [round(d) for d in values],
    }


def _most(moments: list[tuple[Any, int]]) -> int:
    most = running = 0
    for _, change in sorted(moments):  # an end before a start at the same moment
        running += change
        most = max(most, running)
    return most


def wait_done(stack: LocalStack, order_id: str, timeout: float) -> Order:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        order = stack.context.store.load(order_id)
        if order is not None and order.status.terminal:
            return order
        time.sleep(0.05)
    raise SystemExit(f"order {order_id} did not end within {timeout:.0f} s")


def run(
    items: int, call_ms: int, runs: int, devhosts: int, timeout: float, transport: str
) -> dict[str, Any]:
    counts_dir = Path(tempfile.mkdtemp(prefix="opcount-"))
    workflows.use(FLOWS)
    stack = LocalStack(
        devhosts=devhosts,
        transport=transport,
        settings={
            DECLARATIONS: FLOWS,
            OPCOUNT_DIR: str(counts_dir),
            "STEP_TIMEOUT_SECONDS": "30",
        },
    )
    tag = uuid.uuid4().hex[:6]
    durations: list[float] = []
    accepted: list[float] = []
    in_flight: list[int] = []
    at_remote: list[int] = []
    counted = Counter[str]()
    statuses: Counter[str] = Counter()
    hops: dict[str, list[float]] = {}
    fell_back: list[int] = []
    first_call: list[float] = []
    with stack:
        time.sleep(2)  # let the hosts finish starting
        warm = f"warm-{tag}"
        stack.submit(order_of(warm, WARM_UP_ITEMS, call_ms))
        wait_done(stack, warm, timeout)
        for n in range(runs):
            order_id = f"each-{tag}-{n}"
            time.sleep(1.5)  # let the processes flush their counts
            baseline = opcount.collect(counts_dir)
            fell = fallbacks(stack)
            stack.submit(order_of(order_id, items, call_ms))
            submitted = time.time()
            order = wait_done(stack, order_id, timeout)
            statuses[str(order.status)] += 1
            durations.append(1000 * (done_at(order) - submitted))
            accepted.append(1000 * (done_at(order) - order.created_at.timestamp()))
            time.sleep(1.5)
            counts = opcount.collect(counts_dir)
            counts.subtract(baseline)
            counted.update(counts)
            fell_back.append(fallbacks(stack) - fell)
            calls = stack.remote_calls()
            in_flight.append(most_in_flight(order, "each"))
            at_remote.append(most_at_remote(calls, order_id, call_ms))
            first_call.append(1000 * (first_call_at(calls, order_id) - submitted))
            for name, values in item_hops(order, calls, call_ms).items():
                hops.setdefault(name, []).extend(values)
    measured = runs * items
    table = {k: v for k, v in counted.items() if k.startswith("app:table.")}
    return {
        "benchmark": "foreach",
        "date": utc_now_text(),
        "machine": machine(),
        "transport": transport,
        "devhosts": devhosts,
        "items": items,
        "maxConcurrency": MAX_CONCURRENCY,
        "callMs": call_ms,
        "runs": runs,
        "statuses": dict(statuses),
        "idealMs": items / MAX_CONCURRENCY * call_ms,
        "durationMs": spread(durations),
        "acceptedMs": spread(accepted),
        "fallbacks": fell_back,
        "firstCallMs": {"p50": round(statistics.median(first_call)), "max": round(max(first_call))},
        "mostInFlight": {"records": max(in_flight), "remote": max(at_remote)},
        "itemHopsMs": {
            name: {"p50": round(percentile(v, 0.5)), "p90": round(percentile(v, 0.9))}
            for name, v in hops.items()
            if v
        },
        "tablePerItem": {
            "transactions": round(counted["app:table.batch"] / measured, 2),
            "all": round(sum(table.values()) / measured, 2),
            "byKind": {
                k.split(":", 1)[1]: round(v / measured, 2) for k, v in sorted(table.items())
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.foreach")
    parser.add_argument("--items", type=int, default=50)
    parser.add_argument("--call-ms", type=int, default=1000, help="each remote call's latency")
    parser.add_argument("--runs", type=int, default=5)
    stack_options(parser, timeout=120)
    args = parser.parse_args(argv)
    if not 1 <= args.items <= 100 or args.runs < 1 or args.call_ms < 0:
        parser.error("--items is 1-100 (MAX_ITEMS), --runs at least 1, --call-ms 0 or more")
    result = run(args.items, args.call_ms, args.runs, args.devhosts, args.timeout, args.transport)
    print(json.dumps(result, indent=2))
    return 0 if result["statuses"] == {"completed": args.runs} else 1


if __name__ == "__main__":
    sys.exit(main())
