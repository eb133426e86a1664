"""`make run`: the whole pattern, live, on this machine.

Starts Azurite, the simulated remote services and two devhost instances (the
Function App, twice, as if scaled out), submits demo orders that meet
transient errors, throttling, dropped connections, hangs past the deadline
and permanent failures, shows their progress live, and ends with a summary.
Exit status 1 if any order was lost, is stuck, ended other than expected, or
had an effect applied twice. Everything started here is stopped here, also on
Ctrl-C.

    python -m demo [--copies N] [--timeout S] [--serve]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import uuid
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from core.model import Order
from demo.scenarios import BAD_MESSAGES, Scenario, scenarios
from demo.stack import LocalStack
from demo.verify import drain_alerts, verify
from simulator import load_ledger

STYLE = {
    "completed": "green",
    "compensated": "cyan",
    "error": "red",
    "processing": "yellow",
    "compensating": "magenta",
    "pending": "white",
    "cancelled": "blue",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=1, help="copies of the scenario set")
    parser.add_argument("--timeout", type=float, default=180, help="seconds to wait for all")
    parser.add_argument(
        "--serve", action="store_true", help="start the stack and wait for Ctrl-C; submit nothing"
    )
    return parser.parse_args(argv)


def row_for(scenario: Scenario, order: Order | None) -> list[str]:
    if order is None:
        return [scenario.order_id, scenario.title, "-", "[dim]not yet stored[/]", "", ""]
    active = order.active_step()
    steps = " ".join(
        f"{s.step}:{s.process_state}" + (f"x{s.attempt}" if s.attempt > 1 else "")
        for s in order.steps
    )
    style = STYLE.get(str(order.status), "white")
    mark = (
        ""
        if not order.status.terminal
        else (" ✓" if str(order.status) == scenario.expected else " ✗")
    )
    return [
        scenario.order_id,
        scenario.title,
        order.workflow,
        f"[{style}]{order.status}{mark}[/]",
        active.step if active else "",
        steps,
    ]


def render(rows: list[list[str]], elapsed: float, done: int, total: int) -> Panel:
    table = Table(expand=True, show_lines=False)
    for name in ("order", "scenario", "workflow", "status", "active", "steps (state x attempts)"):
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return Panel(Group(table), title=f"orders: {done}/{total} finished, {elapsed:.0f} s")


def serve(stack: LocalStack, console: Console) -> int:
    console.print(f"AzureWebJobsStorage={stack.connection_string}")
    console.print(f"REMOTE_SERVICE_URL={stack.simulator_url}")
    console.print(f"operator API: {stack.http_url}/api/orders?status=error")
    console.print("Ctrl-C stops everything.")
    while all(h.alive for h in stack.hosts):
        time.sleep(0.5)
    console.print("[red]a devhost exited; see its log in[/]", stack.workdir)
    return 1


def run(stack: LocalStack, args: argparse.Namespace, console: Console) -> int:
    run_id = uuid.uuid4().hex[:6]
    cases = scenarios(f"demo-{run_id}", args.copies)
    reply_to = f"demo-status-{run_id}"
    for case in cases:
        stack.submit(case.message(reply_to))
    stack.submit(cases[0].message(reply_to))  # a duplicate delivery: must change nothing
    for bad in BAD_MESSAGES:
        stack.submit(bad)
    ctx = stack.context
    started = time.monotonic()
    orders: dict[str, Order | None] = {}
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        while True:
            orders = {c.order_id: ctx.store.load(c.order_id) for c in cases}
            done = sum(1 for o in orders.values() if o is not None and o.status.terminal)
            elapsed = time.monotonic() - started
            live.update(
                render([row_for(c, orders[c.order_id]) for c in cases], elapsed, done, len(cases))
            )
            if done == len(cases) or elapsed > args.timeout:
                break
            time.sleep(0.5)
    alerts = drain_alerts(ctx)
    rejected = ctx.queues.client(ctx.names.orders_rejected).peek_messages(max_messages=32)
    ledger = load_ledger(stack.ledger_path)
    verdict = verify(
        orders,
        ledger,
        alerts,
        expected={c.order_id: c.expected for c in cases},
        expected_effects={c.order_id: c.effects for c in cases},
    )
    summary: dict[str, Any] = {
        **verdict.as_json(),
        "rejectedMessages": len(rejected),
        "seconds": round(time.monotonic() - started, 1),
    }
    console.print(Panel(json.dumps(summary, indent=2), title="summary"))
    for r in rejected:
        console.print(f"[dim]rejected:[/] {json.loads(r.content)['reason']}")
    problems = verdict.problems()
    if len(rejected) != len(BAD_MESSAGES):
        problems.append(f"{len(rejected)} messages rejected, expected {len(BAD_MESSAGES)}")
    if problems:
        for problem in problems:
            console.print(f"[red]✗ {problem}[/]")
        console.print(f"logs: {stack.workdir}")
        return 1
    console.print(
        "[green]✓ every order ended as expected; nothing lost, nothing stuck, "
        "no effect applied twice, every error alerted.[/]"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()

    def _interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    stack = LocalStack(
        devhosts=2,
        settings={
            "STEP_TIMEOUT_SECONDS": "5",
            "MAX_FAILURE_COUNT": "3",
            "SUPERVISOR_SCHEDULE": "*/2 * * * * *",
        },
        simulator_args=["--latency-ms", "5-40"],
        keep_workdir=True,
    )
    console.print("starting Azurite, the simulator and two devhost instances ...")
    try:
        stack.start()
        console.print(
            f"up: operator API at {stack.http_url}/api/orders/<orderId>; logs in {stack.workdir}"
        )
        code = serve(stack, console) if args.serve else run(stack, args, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; stopping everything[/]")
        code = 130
    finally:
        stack.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
