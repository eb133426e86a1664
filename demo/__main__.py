"""`make run`: the whole pattern, live, on this machine.

Starts Azurite, the simulated remote services and two devhost instances (the
Function App, twice, as if scaled out), submits demo orders that meet
transient errors, throttling, dropped connections, hangs past the deadline
and permanent failures, and checkout orders (steps at once, an approval the demo
gives or refuses through the HTTP API as an operator would, a cancel in a cooling-off,
a carrier that calls back, or loses or refuses its callback), an order with lines (each
reserved on its own), and a per-customer queue (three orders of one customer sent at
once run one at a time, the others waiting for their turn), shows their progress
live (a table on a terminal, a line per change elsewhere: ``demo.progress``); then
takes the remote services down (503, then unreachable) while more orders arrive,
brings them back, and ends with a summary. Exit status 1 if any order was
lost, is stuck, ended other than expected, had an effect applied twice, was undone
without naming the id its step handed out, ran beside another order of its customer, or
if the outage raised an alert or drew more than a trickle of calls. Everything started
here is stopped here, also on Ctrl-C.

    python -m demo [--copies N] [--timeout S] [--serve] [--no-outage]
                   [--transport storage|servicebus] [--simulator ARGS]

The agent queues are on localbus, the local Service Bus double, as deployed
(``AGENT_TRANSPORT=servicebus``, through the real SDK); ``--transport storage`` puts
them on Azurite's Storage queues.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.panel import Panel

from core.item_names import item_of
from core.model import Order
from core.timefmt import iso, parse_iso
from core.turns import waits
from demo.progress import progress
from demo.scenarios import BAD_MESSAGES, OUTAGE_PHASES, Scenario, outage_orders, scenarios
from demo.stack import LocalStack
from demo.verify import read_alerts, verify
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
    parser.add_argument(
        "--no-outage", dest="outage", action="store_false", help="skip the outage act"
    )
    parser.add_argument(
        "--simulator",
        type=shlex.split,
        default=[],
        metavar="ARGS",
        help="more arguments for the simulated services (python -m simulator --help), e.g. "
        "'--compensation cancel-card=issue-card' (make start SIMULATOR='...')",
    )
    parser.add_argument(
        "--transport",
        choices=("storage", "servicebus"),
        default="servicebus",
        help="the agent queues: Service Bus on localbus (as deployed), or Storage queues on "
        "Azurite",
    )
    return parser.parse_args(argv)


def row_for(scenario: Scenario, order: Order | None) -> list[str]:
    if order is None:
        return [scenario.order_id, scenario.title, "-", "[dim]not yet stored[/]", "", ""]
    active = order.active_step()
    doing = active.step if active else ""
    if waits(order):  # its key's slot is taken (docs/contracts.md §3.16)
        doing = "[dim]waiting for its turn[/]"
    steps = steps_text([(s.step, str(s.process_state), s.attempt) for s in order.steps])
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
        doing,
        steps,
    ]


def steps_text(records: list[tuple[str, str, int]]) -> str:
    """Each record's ``step:state`` (``x<attempt>`` past the first), in order; a ForEach's
    items, and their undos, on one token that counts them by state (``reserve-line[3]:
    2 Processed 1 Processing``, its head record left out): a row stays short, however
    many items an order has."""
    tokens: dict[str, list[tuple[str, str, int]]] = {}
    for record in records:
        item = item_of(record[0])
        tokens.setdefault(f"{item[0]}[]" if item else record[0], []).append(record)
    out = []
    for name, group in tokens.items():
        if name.endswith("[]"):
            counts = Counter(state for _, state, _ in group)
            said = " ".join(f"{n} {state}" for state, n in counts.items())
            out.append(f"{name[:-2]}[{len(group)}]:{said}")
        elif f"{name}[]" not in tokens:  # a head whose items show is left out
            out += [f"{name}:{state}" + (f"x{n}" if n > 1 else "") for _, state, n in group]
    return " ".join(out)


#: Where ``make start`` writes the settings a shell needs to reach the stack it started.
STACK_ENV = Path("run") / "stack.env"


def stack_env(stack: LocalStack, settings: dict[str, str]) -> str:
    """The settings to reach ``stack``, as lines a POSIX shell sources: what the CLI
    (``python -m admin``) reads and the simulator's address, and, commented, what this
    stack runs with that differs from the settings' defaults."""
    values = {
        "AzureWebJobsStorage": stack.connection_string,
        "REMOTE_SERVICE_URL": stack.simulator_url,
    }
    if stack.service_bus_connection:
        values["ServiceBusConnection"] = stack.service_bus_connection
        values["AGENT_TRANSPORT"] = "servicebus"
    lines = [
        "# written by `make start`; removed when it stops. New ports and an empty store on",
        "# every start. The app reads declarations/ when it starts: restart `make start`",
        "# after changing them (a running stack refuses a new workflow as unknown, kept on",
        "# orders-rejected with the reason).",
        "# The app runs here with (the settings' defaults are in the README):",
        *(f"#   {k}={v}" for k, v in sorted(settings.items())),
        *(f"export {k}={shlex.quote(v)}" for k, v in values.items()),
    ]
    return "\n".join(lines) + "\n"


def serve(stack: LocalStack, console: Console, settings: dict[str, str]) -> int:
    STACK_ENV.parent.mkdir(exist_ok=True)
    STACK_ENV.write_text(stack_env(stack, settings), encoding="utf-8")
    try:
        console.print(
            f"operator console: {stack.http_url}/api/console", style="bold", soft_wrap=True
        )
        console.print(f"operator API: {stack.http_url}/api/orders?status=error", soft_wrap=True)
        console.print(f"simulated services: {stack.simulator_url}/_ledger", soft_wrap=True)
        console.print(
            "in another shell, for python -m admin and the addresses above:", soft_wrap=True
        )
        console.print(f"source {STACK_ENV}", style="bold", soft_wrap=True, highlight=False)
        console.print(
            "The app reads declarations/ when it starts: restart after changing them. "
            "Ctrl-C stops everything.",
            soft_wrap=True,
        )
        while all(h.alive for h in stack.hosts):
            time.sleep(0.5)
        console.print("[red]a devhost exited; see its log in[/]", stack.workdir)
        return 1
    finally:
        STACK_ENV.unlink(missing_ok=True)


def keep_console_up(stack: LocalStack, console: Console, code: int) -> int:
    """After the demo, on a terminal: leave the stack up so a person can open the console
    on the orders it just ran (Ctrl-C stops); in a script, end at once."""
    console.print(f"[bold]operator console: {stack.http_url}/api/console[/]")
    if not sys.stdin.isatty():
        return code
    console.print("The stack stays up so you can open it; Ctrl-C stops everything.")
    try:
        while all(h.alive for h in stack.hosts):
            time.sleep(0.5)
    except KeyboardInterrupt:
        console.print("stopping everything")
    return code  # the demo's verdict, whenever the person stops it


@dataclass
class Operator:
    """What the demo does as an operator would, through the HTTP API (a scenario's
    ``operator``): approve or refuse an order's ``approved`` event once it has waited a
    moment (long enough to be seen waiting), or cancel it in its cooling-off."""

    http_url: str
    done: dict[str, str] = field(default_factory=dict)  # orderId -> what, and the answer
    _seen: dict[str, float] = field(default_factory=dict)

    def act(
        self, cases: list[Scenario], orders: dict[str, Order | None], say: Callable[[str], None]
    ) -> None:
        for case in cases:
            order = orders.get(case.order_id)
            if case.operator is None or case.order_id in self.done or order is None:
                continue
            step = order.find("cooling-off" if case.operator == "cancel" else "approved")
            if step is None or step.waiting_for is None:
                continue
            seen = self._seen.setdefault(case.order_id, time.monotonic())
            if case.operator != "cancel" and time.monotonic() - seen < 1.0:
                continue
            self.done[case.order_id] = answer = self._send(case)
            say(f"[bold]operator:[/] {case.operator} {case.order_id} → {answer}")

    def _send(self, case: Scenario) -> str:
        base = f"{self.http_url}/api/orders/{case.order_id}"
        body: dict[str, Any]
        if case.operator == "cancel":
            url, body = f"{base}/cancel", {"reason": "the customer changed their mind"}
        elif case.operator == "approve":
            url, body = f"{base}/events/approved", {"result": {"by": "demo"}, "reason": "ok"}
        else:
            url, body = f"{base}/events/approved", {"refused": "over this customer's limit"}
        try:
            # as a person with the operator role would (devhost's stand-in for sign-in)
            operator = {"X-Dev-Principal": "demo; roles=Orders.Operator"}
            response = httpx.post(url, json=body, headers=operator, timeout=10)
        except httpx.HTTPError as exc:
            return f"no answer ({exc})"
        return f"HTTP {response.status_code}"

    def problems(self, cases: list[Scenario]) -> list[str]:
        out = []
        for case in cases:
            if case.operator is None:
                continue
            answer = self.done.get(case.order_id)
            if answer is None:
                out.append(f"{case.order_id}: never waited for the operator ({case.operator})")
            elif not answer.startswith("HTTP 2"):
                out.append(f"{case.order_id}: {case.operator} answered {answer}")
        return out


def run(stack: LocalStack, args: argparse.Namespace, console: Console) -> int:
    run_id = uuid.uuid4().hex[:6]
    cases = scenarios(f"demo-{run_id}", args.copies)
    reply_to = f"demo-status-{run_id}"
    stack.context.queues.ensure(reply_to)  # the app never creates a replyTo queue
    for case in cases:
        stack.submit(case.message(reply_to))
    stack.submit(cases[0].message(reply_to))  # a duplicate delivery: must change nothing
    for bad in BAD_MESSAGES:
        stack.submit(bad)
    ctx = stack.context
    assert stack.http_url is not None
    operator = Operator(stack.http_url)
    started = time.monotonic()
    orders: dict[str, Order | None] = {}
    with progress(console) as view:
        while True:
            orders = {c.order_id: ctx.store.load(c.order_id) for c in cases}
            operator.act(cases, orders, view.say)
            done = sum(1 for o in orders.values() if o is not None and o.status.terminal)
            elapsed = time.monotonic() - started
            rows = [row_for(c, orders[c.order_id]) for c in cases]
            view.update(rows, elapsed, done, len(cases), "orders")
            if done == len(cases) or elapsed > args.timeout:
                break
            time.sleep(0.5)
    outage = ride_out_an_outage(stack, console, run_id, args.timeout) if args.outage else None
    if outage is not None:
        cases = cases + outage.cases
        orders.update(outage.orders)
    alerts = read_alerts(ctx)
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
        "operator": operator.done,
        "rejectedMessages": len(rejected),
        "seconds": round(time.monotonic() - started, 1),
    }
    if outage is not None:
        summary["outage"] = outage.summary(alerts)
    if console.is_terminal:
        console.print(Panel(json.dumps(summary, indent=2), title="summary"))
    else:  # a log: the JSON as it is, not boxed into 80 columns
        console.print("summary:", json.dumps(summary, indent=2), markup=False, highlight=False)
    for r in rejected:
        console.print(f"[dim]rejected:[/] {json.loads(r.content)['reason']}")
    problems = verdict.problems() + operator.problems(cases)
    if outage is not None:
        problems += outage.problems(alerts)
    if len(rejected) != len(BAD_MESSAGES):
        problems.append(f"{len(rejected)} messages rejected, expected {len(BAD_MESSAGES)}")
    if problems:
        for problem in problems:
            console.print(f"[red]✗ {problem}[/]")
        console.print(f"logs: {stack.workdir}")
        return 1
    console.print(
        "[green]✓ every order ended as expected; nothing lost, nothing stuck, "
        "no effect applied twice, every undo named the id its step handed out, every error "
        "alerted, no two orders of one customer ran at once; the outage was ridden out.[/]"
    )
    return 0


@dataclass
class OutageAct:
    cases: list[Scenario]
    orders: dict[str, Order | None]
    calls_while_down: int
    down_seconds: float
    recovered_after: float  # seconds from the remote's return to the last order completed

    def summary(self, alerts: list[dict[str, Any]]) -> dict[str, Any]:
        ids = {c.order_id for c in self.cases}
        return {
            "orders": len(self.cases),
            "completed": sum(
                1 for o in self.orders.values() if o is not None and str(o.status) == "completed"
            ),
            "alerts": sum(1 for a in alerts if a.get("orderId") in ids),
            "remoteDownSeconds": round(self.down_seconds, 1),
            "remoteCallsWhileDown": self.calls_while_down,
            "allDoneSecondsAfterReturn": round(self.recovered_after, 1),
        }

    def problems(self, alerts: list[dict[str, Any]]) -> list[str]:
        out = []
        ids = {c.order_id for c in self.cases}
        if any(a.get("orderId") in ids for a in alerts):
            out.append("the outage raised operator alerts")
        # every order retrying on its own would be dozens of calls a second
        if self.calls_while_down > 3 * self.down_seconds:
            out.append(f"{self.calls_while_down} remote calls while it was down: not a trickle")
        return out


def ride_out_an_outage(
    stack: LocalStack, console: Console, run_id: str, timeout: float
) -> OutageAct:
    """Act two: the remote services go down (503, then unreachable) and come back."""
    cases = outage_orders(f"demo-{run_id}")
    down = sum(float(phase["seconds"]) for phase in OUTAGE_PHASES)
    console.print(
        f"[bold]outage:[/] the remote services answer 503 for {OUTAGE_PHASES[0]['seconds']} s, "
        f"then refuse connections for {OUTAGE_PHASES[1]['seconds']} s; "
        f"{len(cases)} orders arrive meanwhile"
    )
    began = datetime.now(UTC)
    stack.outage({"phases": list(OUTAGE_PHASES)})
    for case in cases:
        stack.submit(case.message(f"demo-status-{run_id}"))
    ctx = stack.context
    started = time.monotonic()
    back_at = started + down
    orders: dict[str, Order | None] = {}
    finished_at = started
    with progress(console) as view:
        while True:
            orders = {c.order_id: ctx.store.load(c.order_id) for c in cases}
            done = sum(1 for o in orders.values() if o is not None and o.status.terminal)
            elapsed = time.monotonic() - started
            state = "DOWN" if time.monotonic() < back_at else "back"
            rows = [row_for(c, orders[c.order_id]) for c in cases]
            view.update(rows, elapsed, done, len(cases), f"outage act: remote {state}")
            if done == len(cases) or elapsed > timeout:
                finished_at = time.monotonic()
                break
            time.sleep(0.5)
    # The simulator logs every call it answered; none arrive while it is unreachable.
    until = began + timedelta(seconds=down)
    calls = [c for c in stack.remote_calls(iso(began)) if parse_iso(c["at"]) < until]
    return OutageAct(cases, orders, len(calls), down, max(finished_at - back_at, 0.0))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Not a terminal (a pipe, a CI log): lines as long as they are, never wrapped at 80.
    console = Console(soft_wrap=not sys.stdout.isatty())

    def _interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    settings = {
        "STEP_TIMEOUT_SECONDS": "5",
        "MAX_FAILURE_COUNT": "3",
        "SUPERVISOR_SCHEDULE": "*/2 * * * * *",
    }
    stack = LocalStack(
        devhosts=2,
        settings=settings,
        simulator_args=["--latency-ms", "5-40", *args.simulator],
        keep_workdir=True,
        transport=args.transport,
    )
    bus = " and localbus (Service Bus)" if args.transport == "servicebus" else ""
    console.print(f"starting Azurite{bus}, the simulator and two devhost instances ...")
    try:
        stack.start()
        console.print(
            f"up: console at {stack.http_url}/api/console, operator API at "
            f"{stack.http_url}/api/orders/<orderId>; logs in {stack.workdir}"
        )
        if args.serve:
            code = serve(stack, console, settings)
        else:
            code = run(stack, args, console)
            code = keep_console_up(stack, console, code)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; stopping everything[/]")
        code = 130
    finally:
        stack.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
