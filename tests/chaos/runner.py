"""The chaos run: several devhost instances, hundreds of orders, faults everywhere.

- the simulator injects transient errors, hangs past the deadline and dropped
  connections at random, and some orders carry permanent failures;
- every few seconds a random devhost instance is SIGKILLed and restarted at
  once; some instances also carry failpoints that kill them inside the
  narrowest windows (right after a claim, after a reply's save, after the
  remote call);
- every instance runs the supervisor's timer, so several supervisors race;
- a meddler steals agent replies and puts each back twice, delayed, so replies
  arrive duplicated, out of order, and some after their step was reset.

Then the chaos stops, every order gets time to finish, and only system-wide
invariants are checked (``invariants.py``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from demo.stack import LocalStack
from demo.verify import Verdict, drain_alerts, load_orders, verify
from simulator import load_ledger

MAX_FAILURES = 8
STEP_TIMEOUT = 4


@dataclass(frozen=True)
class ChaosPlan:
    orders: int = 150
    devhosts: int = 3
    chaos_seconds: float = 45
    kill_every: tuple[float, float] = (2.0, 4.0)
    settle_seconds: float = 150
    seed: int = 20261122


def make_orders(plan: ChaosPlan, rng: random.Random) -> dict[str, tuple[dict[str, Any], str]]:
    """order id -> (message, expected final status)."""
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for n in range(plan.orders):
        order_id = f"chaos-{plan.seed % 1000:03d}-{n:04d}"
        roll = rng.random()
        if roll < 0.60:
            out[order_id] = ({"orderId": order_id, "amount": n}, "completed")
        elif roll < 0.68:
            out[order_id] = ({"orderId": order_id, "simulate": {"process": "permanent"}}, "error")
        elif roll < 0.86:
            out[order_id] = ({"orderId": order_id, "workflow": "fulfilment"}, "completed")
        elif roll < 0.93:
            out[order_id] = (
                {"orderId": order_id, "workflow": "fulfilment", "simulate": {"ship": "permanent"}},
                "compensated",
            )
        else:
            out[order_id] = (
                {
                    "orderId": order_id,
                    "workflow": "fulfilment",
                    "simulate": {"charge-payment": "permanent"},
                },
                "compensated",
            )
    return out


class ReplyMeddler(threading.Thread):
    """Steals some agent replies and returns each twice, delayed (duplicated, reordered,
    sometimes after the step's deadline has passed and the supervisor reset it)."""

    def __init__(self, stack: LocalStack, rng: random.Random, stop: threading.Event):
        super().__init__(name="reply-meddler", daemon=True)
        ctx = stack.context
        self._queue = ctx.queues.client(ctx.names.agent_replies)
        self._rng = rng
        self._halt = stop
        self.duplicated = 0

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                for message in self._queue.receive_messages(max_messages=8, visibility_timeout=60):
                    for _ in range(2):
                        delay = self._rng.choice([0, 1, 3, STEP_TIMEOUT + 2])
                        self._queue.send_message(message.content, visibility_timeout=delay or None)
                    self._queue.delete_message(message)
                    self.duplicated += 1
            except Exception:
                pass
            self._halt.wait(0.7)


def run_chaos(plan: ChaosPlan) -> tuple[Verdict, dict[str, Any]]:
    rng = random.Random(plan.seed)
    failpoints = ["", "after-claim:0.03,agent-after-call:0.03", "after-reply-save:0.03"]
    stack = LocalStack(
        devhosts=plan.devhosts,
        settings={
            "STEP_TIMEOUT_SECONDS": str(STEP_TIMEOUT),
            "MAX_FAILURE_COUNT": str(MAX_FAILURES),
            "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
            "DEVHOST_LEASE_SECONDS": "10",
            "DEVHOST_RENEW_SECONDS": "3",
        },
        devhost_env=[
            {"ORDERS_FAILPOINTS": failpoints[i % len(failpoints)]} for i in range(plan.devhosts)
        ],
        simulator_args=[
            "--transient-rate",
            "0.08",
            "--hang-rate",
            "0.03",
            "--hang-seconds",
            str(STEP_TIMEOUT + 3),
            "--drop-rate",
            "0.04",
            "--latency-ms",
            "0-15",
            "--seed",
            str(plan.seed),
            "--max-random-faults-per-key",
            "2",
        ],
    )
    orders = make_orders(plan, rng)
    stop = threading.Event()
    kills = 0
    timings: dict[str, Any] = {}
    with stack:
        meddler = ReplyMeddler(stack, rng, stop)
        meddler.start()
        started = time.monotonic()
        pending = list(orders.items())
        rng.shuffle(pending)
        next_kill = started + rng.uniform(*plan.kill_every)
        while time.monotonic() - started < plan.chaos_seconds:
            # Submit in waves, so orders are in every stage when the kills land.
            for _ in range(min(10, len(pending))):
                _, (message, _) = pending.pop()
                stack.submit(message)
            now = time.monotonic()
            if now >= next_kill:
                victim = rng.randrange(plan.devhosts)
                stack.restart(victim)  # SIGKILL, then a fresh process at once
                kills += 1
                next_kill = now + rng.uniform(*plan.kill_every)
            for host in stack.hosts:  # failpoints kill too: bring them back
                if not host.alive:
                    host.start()
                    kills += 1
            time.sleep(0.5)
        for _, (message, _) in pending:  # whatever is left, before the settle phase
            stack.submit(message)
        stop.set()
        meddler.join(timeout=10)
        timings["chaosSeconds"] = round(time.monotonic() - started, 1)
        # Settle: no more kills; failpoints off, so the last stragglers can finish.
        for host in stack.hosts:
            host.env.pop("ORDERS_FAILPOINTS", None)
            if not host.alive:
                host.start()
        ids = list(orders)
        deadline = time.monotonic() + plan.settle_seconds
        while time.monotonic() < deadline:
            final = load_orders(stack.context, ids)
            if all(v is not None and v.status.terminal for v in final.values()):
                break
            for host in stack.hosts:
                if not host.alive:
                    host.start()
            time.sleep(1)
        timings["totalSeconds"] = round(time.monotonic() - started, 1)
        # Notices committed by a process killed before it sent them wait in the outbox
        # for the sweep (30 s grace): "every Error alerted" holds once it is empty.
        far = datetime.now(UTC) + timedelta(days=1)
        deadline = time.monotonic() + 90
        while list(stack.context.store.stale_outbox(far)) and time.monotonic() < deadline:
            time.sleep(1)
        timings["outboxDrainedAfterSeconds"] = round(
            time.monotonic() - started - timings["totalSeconds"], 1
        )
        verdict = verify(
            load_orders(stack.context, ids),
            load_ledger(stack.ledger_path),
            drain_alerts(stack.context),
            expected={o: e for o, (_, e) in orders.items()},
            max_failures=MAX_FAILURES,
        )
        rejected = stack.context.queues.client(stack.context.names.orders_rejected)
        timings.update(
            kills=kills,
            duplicatedReplies=meddler.duplicated,
            rejected=len(rejected.peek_messages(max_messages=32)),
        )
    return verdict, timings


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.chaos.runner")
    parser.add_argument("--orders", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    report, timings = run_chaos(
        ChaosPlan(orders=args.orders, chaos_seconds=args.seconds, seed=args.seed)
    )
    print(json.dumps({**report.as_json(), **timings, "seed": args.seed}, indent=2))
    for name, items in report.violations().items():
        print(f"{name}: {items[:10]}")
    return 1 if report.violations() else 0


if __name__ == "__main__":
    raise SystemExit(main())
