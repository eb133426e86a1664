"""docs/add-a-workflow.md, followed word for word in a copy of the app: its ``# file:``
and ``# append to:`` blocks applied, the deployment's agent list regenerated with the
command it gives, the tests it writes with the kit run with ``make team-tests``, then, in
real processes (Azurite, the simulator started with the arguments its last ``make start``
gives and the warehouse requiring an Entra ID token, a devhost), the ``python -m admin``
commands of its "Try it" sections run in order, as a person would: a ``quick-return``
order whose RMA reaches the warehouse, ``exchange`` orders (parallel steps, an approval
skipped, given and refused, a delay, a carrier that calls back, undos that name the ids
their steps handed out), and the shop's ``returns`` (each line received on its own, a
line refused and every line received sent back by its own receipt, a refund held for an
operator and fixed, an e-mail that bounces and undoes nothing, an order found by its RMA),
and its returns taken one per customer at a time (one waiting its turn behind another
customer's, shown so, one of another customer run at once, a waiting one cancelled, the
orders of a key found, a return without a customer rejected and alerted).
One stack for all.

It also checks the guide's promise: nothing under core/, scheduler/, supervisor/ or
stores/ changes, and the declarations it writes pass the linter.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "add-a-workflow.md"
BLOCK = re.compile(r"```python\n# (file|append to): (\S+)\n(.*?)```", re.DOTALL)
SHELL = re.compile(r"```sh\n(.*?)```", re.DOTALL)
#: The commands of the guide's "Try it" sections the test runs (the others, workflows and
#: agents-json, are run and checked on their own below).
TRIED = ("submit", "show", "event", "resubmit", "orders", "cancel", "alerts")
#: The orders the guide says are rejected (section 10: a return without a customer).
REJECTED = ("ret-12",)
NOT_COPIED = {".git", ".venv", ".venv-iac", "node_modules", "run"}

RUN = r"""
import contextlib, io, json, os, runpy, shlex, sys, time
import httpx
from demo.stack import LocalStack

COMMANDS = json.loads(sys.argv[1])
SIMULATOR = json.loads(sys.argv[2])
REJECTED = json.loads(sys.argv[3])
SETTINGS = {"STEP_TIMEOUT_SECONDS": "10", "MAX_FAILURE_COUNT": "3",
            "SUPERVISOR_SCHEDULE": "*/1 * * * * *"}


def poll(what, check, seconds=60):
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def status_of(order_id):
    order = store.load(order_id)
    return str(order.status) if order is not None else None


def alerted(text):
    ctx = stack.context
    client = ctx.queues.client(ctx.names.operator_alerts)
    return any(text in m.content for m in client.peek_messages(max_messages=32))


with LocalStack(devhosts=1, settings=SETTINGS, simulator_args=SIMULATOR) as stack:
    store = stack.context.store
    rule = httpx.post(f"{stack.simulator_url}/_identity",
                      json={"requireToken": {"restock": "api://warehouse"}}, timeout=10)
    rule.raise_for_status()
    stack.submit({"orderId": "ret-empty", "workflow": "quick-return", "items": [], "amount": 1})
    os.environ["AzureWebJobsStorage"] = stack.connection_string
    ran, submitted = [], ["ret-empty"]
    for line in COMMANDS:
        argv = shlex.split(line, comments=True)
        command = argv[3]
        if command == "submit":
            order_id = json.loads(argv[4])["orderId"]
            if order_id == "ret-9":  # the guide: ret-8 holds c-12's turn; ret-9 waits
                poll("ret-8 to be accepted", lambda: store.load("ret-8") is not None)
            if order_id not in REJECTED:
                submitted.append(order_id)
        elif command == "alerts":  # the guide: ret-12 rejected, and an operator told
            poll("ret-12's rejection to be alerted", lambda: alerted("ret-12"))
        elif "turn=" in line:  # the orders of a key, once the one cancelled has ended
            poll("ret-11 to be cancelled", lambda: status_of("ret-11") == "cancelled")
        elif command == "orders":  # a search, once the order it looks for has its RMA
            poll("ret-2 to end", lambda: status_of("ret-2") == "completed")
        else:  # a person looks at an order once it is there
            order_id = argv[4]
            poll(order_id, lambda: store.load(order_id) is not None)
        if line.startswith(".venv/bin/python -m admin show exc-2"):
            # the guide: "once its first three steps are done, show says waitingFor"
            def waits():
                step = store.load("exc-2").find("approved")
                return step is not None and step.waiting_for is not None
            poll("exc-2 to wait for its approval", waits)
        if line.split()[3:5] in (["show", "ret-4"], ["resubmit", "ret-4"]):
            # the guide: "ret-4's refund is refused: show says error"
            poll("ret-4 to be held", lambda: status_of("ret-4") == "error")
        if line.split()[3:5] == ["event", "ret-8"]:
            # the guide: "ret-10 ... completes while ret-8 still waits"
            poll("ret-10 to complete", lambda: status_of("ret-10") == "completed")
        # `.venv/bin/python -m admin ...`: what -m does, in this process (no interpreter
        # to start for each), with the storage `make start` prints in the environment
        assert argv[:3] == [".venv/bin/python", "-m", "admin"], argv
        sys.argv, printed, code = ["admin", *argv[3:]], io.StringIO(), 0
        with contextlib.redirect_stdout(printed):
            try:
                runpy.run_module("admin", run_name="__main__", alter_sys=True)
            except SystemExit as exit:
                code = exit.code
        ran.append({"command": line, "code": code, "stdout": printed.getvalue()})
    orders = {}
    def finished():
        orders.update({o: store.load(o) for o in submitted})
        return all(o is not None and o.status.terminal for o in orders.values())
    poll("every order to end", finished, 120)
    out = {
        "orders": {
            k: {
                "status": str(o.status),
                "history": o.history,
                "steps": {s.step: {"state": str(s.process_state), "result": s.result,
                                   "error": s.last_error, "input": s.input,
                                   "continued": s.continued} for s in o.steps},
            }
            for k, o in orders.items()
        },
        "ran": ran,
        "calls": stack.remote_calls(),
        "ledger": httpx.get(f"{stack.simulator_url}/_ledger", timeout=10).json()["effects"],
        "identity": httpx.get(f"{stack.simulator_url}/_identity", timeout=10).json(),
        "workflows": httpx.get(f"{stack.http_url}/api/workflows", timeout=10).json(),
    }
    print("RESULT=" + json.dumps(out))
"""


def copy_app(target: Path) -> None:
    for path in ROOT.iterdir():
        if path.name in NOT_COPIED or path.name.startswith((".pytest", ".ruff", ".mypy")):
            continue
        if path.is_dir():
            shutil.copytree(
                path, target / path.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(path, target / path.name)
    (target / "node_modules").symlink_to(ROOT / "node_modules")


def apply_guide(target: Path) -> list[str]:
    blocks = BLOCK.findall(GUIDE.read_text(encoding="utf-8"))
    assert len(blocks) >= 2, "the guide's code blocks were not found"
    touched = []
    for how, name, code in blocks:
        path = target / name
        if how == "file":
            assert not path.exists(), f"the guide creates {name}, which exists"
            path.write_text(code, encoding="utf-8")
        else:
            path.write_text(path.read_text(encoding="utf-8") + "\n" + code, encoding="utf-8")
        touched.append(name)
    return touched


def changed_files(target: Path) -> set[str]:
    changed = set()
    for path in target.rglob("*"):
        rel = path.relative_to(target)
        if path.is_dir() or rel.parts[0] in NOT_COPIED or "__pycache__" in rel.parts:
            continue
        if rel.parts[0].startswith((".pytest", ".ruff", ".mypy")):
            continue
        original = ROOT / rel
        if not original.exists() or original.read_bytes() != path.read_bytes():
            changed.add(str(rel))
    return changed


def test_the_guide_adds_a_workflow_with_two_agents_that_runs_end_to_end(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    copy_app(app)
    apply_guide(app)
    env = {k: v for k, v in os.environ.items() if k != "ORDERS_DECLARATIONS"}
    env["PYTHONPATH"] = str(app)
    python = sys.executable

    listed = subprocess.run(
        [python, "-m", "admin", "workflows"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    declared = json.loads(listed.stdout)
    quick = next(w for w in declared["workflows"] if w["workflow"] == "quick-return")
    assert [(s["step"], s["agent"]) for s in quick["steps"]] == [
        ("receive-return", "returns-desk"),
        ("refund-payment", "payments"),
        ("restock", "warehouse"),
    ]
    returns = next(w for w in declared["workflows"] if w["workflow"] == "returns")
    [group] = [s["parallel"] for s in returns["steps"] if "parallel" in s]
    [lines] = [s for s in returns["steps"] if "forEach" in s]
    undo = lines["step"]["compensation"]["step"]
    assert (lines["forEach"], lines["maxConcurrency"], undo) == (
        "receive-line",
        2,
        "send-back-line",
    )
    steps = [s for s in [*returns["steps"], *group] if "step" in s and "forEach" not in s]
    failing = {s["step"]: s.get("onFailure") for s in steps}
    assert (failing["refund"], failing["notify-customer"]) == ("hold", "continue"), failing
    assert returns["concurrency"] == {
        "key": "declarations.refunds.customer_of",
        "limit": 1,
        "holdOnError": False,
    }, returns
    searched = {f["name"]: f["parameter"] for f in returns["search"]}
    assert searched == {"customerId": "customerId", "receive-return.rma": "rma"}, returns
    write = subprocess.run(
        [python, "-m", "admin", "agents-json", "--write"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert write.returncode == 0, write.stderr

    changed = changed_files(app)
    assert changed == {
        "declarations/__init__.py",
        "declarations/returns.py",
        "declarations/exchange.py",
        "declarations/refunds.py",
        "declarations/tests/test_exchange.py",
        "declarations/tests/test_returns.py",
        "infra/agents.json",
    }
    assert not any(c.startswith(("core/", "scheduler/", "supervisor/", "stores/")) for c in changed)
    agents = json.loads((app / "infra" / "agents.json").read_text())["agents"]
    assert {a["name"] for a in agents} >= {"returns-desk", "warehouse", "inspection", "mailer"}

    check_the_teams_tests_pass(app, env)

    check_the_mistake_it_shows(app, env)
    for lint in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        linted = subprocess.run(
            [python, "-m", "ruff", *lint, "declarations"],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert linted.returncode == 0, (lint, linted.stdout)

    run = subprocess.run(
        [
            python,
            "-c",
            RUN,
            json.dumps(tried_commands()),
            json.dumps(simulator_args()),
            json.dumps(REJECTED),
        ],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT=")]
    assert run.returncode == 0 and lines, (run.stdout[-3000:], run.stderr[-3000:])
    result = json.loads(lines[-1].removeprefix("RESULT="))
    failed = [r for r in result["ran"] if r["code"] != 0]
    assert not failed, failed
    check_returns(result)
    check_exchanges(result)
    check_shop_returns(result)
    check_turns(result)
    # and the app lists what it runs
    deployed = {w["workflow"] for w in result["workflows"]["workflows"]}
    assert {"returns", "exchange"} <= deployed


@pytest.mark.deployment
def test_the_suite_still_passes_with_the_guides_workflows(tmp_path: Path) -> None:
    """The guide ends "then run make test": with its workflows and agents appended to
    declarations/ and infra/agents.json regenerated, the suite passes unchanged. Every test
    but the deployment's runs on its own declarations (tests/fixtures/shop.py; the suite's
    conftest fails one that reads declarations/), so these are the tests to run in the
    copy: those marked ``deployment``, and the Bicep checks, which read infra/agents.json."""
    app = tmp_path / "app"
    app.mkdir()
    copy_app(app)
    apply_guide(app)
    env = {k: v for k, v in os.environ.items() if k != "ORDERS_DECLARATIONS"}
    env["PYTHONPATH"] = str(app)
    write = subprocess.run(
        [sys.executable, "-m", "admin", "agents-json", "--write"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert write.returncode == 0, write.stderr
    suites = [
        (sys.executable, ["-m", "deployment", "tests/unit", "tests/integration"]),
        (str(ROOT / ".venv-iac" / "bin" / "python"), ["tests/infra"]),
    ]
    if not Path(suites[1][0]).exists():
        pytest.skip("the Bicep checks' virtual environment is not built: make .venv-iac/.ok")
    for python, args in suites:
        run = subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=app,
            env={**env, "INFRA_CHECKS_REQUIRED": "1"},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        summary = run.stdout.strip().splitlines()[-1:] or [run.stderr[-2000:]]
        assert run.returncode == 0, (args, run.stdout[-4000:], run.stderr[-2000:])
        assert " passed" in summary[0] and "skipped" not in summary[0], (args, summary)


def check_the_mistake_it_shows(app: Path, env: dict[str, str]) -> None:
    """The guide's example of a refused declaration is what the app says, file and line."""
    [shown] = re.findall(r"```text\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)
    declarations = app / "declarations" / "__init__.py"
    good = declarations.read_text(encoding="utf-8")
    typo = 'StepSpec("restock", agent="warehous"'
    declarations.write_text(good.replace('StepSpec("restock", agent="warehouse"', typo))
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "admin", "workflows"],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        declarations.write_text(good, encoding="utf-8")
    assert listed.returncode != 0
    assert json.loads(listed.stdout)["error"] == " ".join(shown.split()), listed.stdout


def check_the_teams_tests_pass(app: Path, env: dict[str, str]) -> None:
    """``make team-tests``, as the guide says, in the copy: the product's own tests of its
    workflows and those the guide writes with the kit all pass, each of them run."""
    (app / ".venv").symlink_to(ROOT / ".venv")  # the copy's virtual environment: make deps'
    ran = subprocess.run(
        ["make", "--no-print-directory", "-o", "deps", "team-tests"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, (ran.stdout[-4000:], ran.stderr[-2000:])
    written = sum(
        len(re.findall(r"^def test_", path.read_text(encoding="utf-8"), re.MULTILINE))
        for path in (app / "declarations" / "tests").glob("test_*.py")
    )
    summary = re.search(r"^(\d+) passed", ran.stdout, re.MULTILINE)
    assert summary and int(summary[1]) == written >= 10, (written, ran.stdout[-2000:])


def simulator_args() -> list[str]:
    """What the guide's last ``make start SIMULATOR='...'`` gives the simulator."""
    starts = [
        line
        for block in SHELL.findall(GUIDE.read_text(encoding="utf-8"))
        for line in block.splitlines()
        if line.startswith("make start SIMULATOR=")
    ]
    assert starts, "the guide starts no simulator with arguments"
    [assignment] = shlex.split(starts[-1].removeprefix("make start "), comments=True)
    return shlex.split(assignment.removeprefix("SIMULATOR="))


def tried_commands() -> list[str]:
    """The guide's ``python -m admin`` commands of the kinds in ``TRIED``, in order."""
    lines = [
        line.strip()
        for block in SHELL.findall(GUIDE.read_text(encoding="utf-8"))
        for line in block.splitlines()
    ]
    tried = [
        line
        for line in lines
        if line.startswith(".venv/bin/python -m admin ") and line.split()[3] in TRIED
    ]
    assert any(" submit " in t for t in tried) and any(" event " in t for t in tried), tried
    return tried


def entries(result: dict[str, Any], order_id: str, step: str) -> list[dict[str, Any]]:
    """The effects (or compensations) the simulator applied for the order's step."""
    return [
        e
        for e in result["ledger"]
        if e["orderId"] == order_id and e["step"] == step and e["kind"] != "callback"
    ]


def check_returns(result: dict[str, Any]) -> None:
    done = result["orders"]["ret-1"]
    assert done["status"] == "completed", done
    assert done["steps"]["receive-return"]["result"] == {"rma": "RMA-ret-1", "items": 1}
    assert set(done["steps"]) == {"receive-return", "refund-payment", "restock"}
    # the RMA flowed: restock's body was its input, and the warehouse received exactly that
    body = {"rma": "RMA-ret-1", "items": ["boots"]}
    assert done["steps"]["restock"]["input"] == body
    [restocked] = entries(result, "ret-1", "restock")
    assert restocked["request"] == body
    # the warehouse was called with a token from the managed identity: the simulator
    # requires one for /restock, issued by its identity endpoint for api://warehouse
    restocks = [c for c in result["calls"] if c["step"] == "restock"]
    assert restocks and all(c["answer"] == 200 for c in restocks), restocks
    identity = result["identity"]
    assert identity["requireToken"] == {"restock": "api://warehouse"}, identity
    assert identity["tokensIssued"] >= 1, identity
    # a return without items is refused by the Python agent: nothing was applied
    refused = result["orders"]["ret-empty"]
    assert refused["status"] == "error", refused
    assert "needs at least one item" in refused["steps"]["receive-return"]["error"]
    assert "refund-payment" not in refused["steps"]


def check_exchanges(result: dict[str, Any]) -> None:
    orders = result["orders"]
    statuses = {o: orders[o]["status"] for o in ("exc-1", "exc-2", "exc-3")}
    assert statuses == {"exc-1": "completed", "exc-2": "completed", "exc-3": "compensated"}, {
        o: orders[o] for o in statuses
    }
    small, approved = orders["exc-1"]["steps"], orders["exc-2"]["steps"]
    refused = orders["exc-3"]["steps"]
    assert small["approved"]["state"] == "Skipped"  # under 500: when said no
    assert small["cooling-off"]["state"] == "Processed"
    assert approved["approved"]["result"] == {"by": "ann"}
    # what show printed for exc-2 while it waited
    [shown] = [r for r in result["ran"] if r["command"].endswith("show exc-2")]
    waiting = next(s for s in json.loads(shown["stdout"])["steps"] if s["step"] == "approved")
    assert waiting["waitingFor"] == {"event": "approved"}, waiting
    for order_id in ("exc-1", "exc-2"):
        # the carrier accepted (202), then called back; ship's result is the callback's
        ship = orders[order_id]["steps"]["ship"]
        [shipped] = entries(result, order_id, "ship")
        assert ship["result"] == shipped["response"] and ship["result"]["parcel"], ship
        assert shipped["request"]["rma"] == f"RMA-{order_id}"
        assert (
            shipped["request"]["reservation"]
            == (entries(result, order_id, "reserve-stock")[0]["response"]["reservation"])
        )
        calls = [c for c in result["calls"] if c["idempotencyKey"] == f"{order_id}:ship"]
        assert calls and calls[0]["answer"] == 202, calls
        callbacks = [
            e for e in result["ledger"] if e["kind"] == "callback" and e["orderId"] == order_id
        ]
        assert callbacks and callbacks[0]["callback"]["answer"] == 200, callbacks
        url = callbacks[0]["callback"]["url"]
        assert re.fullmatch(  # the capability of the ship's run (docs/contracts.md §3.15)
            rf"http://127\.0\.0\.1:\d+/api/orders/{order_id}/events/parcel-left"
            r"\?token=r1\.[0-9a-f]{40}",
            url,
        )
    # refused: both undone, each naming the id its step handed out; nothing shipped
    assert "ship" not in refused
    for undo, step, field in (
        ("release-stock", "reserve-stock", "reservation"),
        ("refund-payment", "charge-payment", "charge"),
    ):
        [done] = entries(result, "exc-3", step)
        [undone] = entries(result, "exc-3", undo)
        assert undone["request"][field] == done["response"][field], (done, undone)
        assert undone["undid"] is True


def check_shop_returns(result: dict[str, Any]) -> None:
    """Section 9: the shop's returns, with a refund held and fixed, an e-mail that bounces,
    and an order found by its RMA."""
    orders = result["orders"]
    statuses = {o: orders[o]["status"] for o in ("ret-2", "ret-3", "ret-4", "ret-5")}
    assert set(statuses.values()) == {"completed"}, {o: orders[o] for o in statuses}
    done = orders["ret-2"]["steps"]
    assert done["receive-return"]["result"]["rma"] == "RMA-ret-2"
    assert done["refund-approved"]["state"] == "Skipped"
    # the refund named the charge and the RMA, and handed out its id (the simulator's --id)
    [refunded] = entries(result, "ret-2", "refund")
    assert (refunded["request"]["chargeId"], refunded["request"]["rma"]) == ("ch-2", "RMA-ret-2")
    assert done["refund"]["result"]["refundId"] == refunded["response"]["refundId"]
    assert done["restock"]["state"] == "Processed"
    [mailed] = entries(result, "ret-2", "notify-customer")
    assert done["notify-customer"]["result"] == mailed["response"], done["notify-customer"]
    assert orders["ret-3"]["steps"]["refund-approved"]["result"] == {"by": "ann"}
    # ret-4: held while its refund was refused, nothing undone; the fix completed it
    [shown] = [r for r in result["ran"] if r["command"].endswith("show ret-4")]
    held = json.loads(shown["stdout"])
    assert held["status"] == "error", held
    states = {s["step"]: s["ProcessState"] for s in held["steps"]}
    assert states["refund"] == "Error" and states["restock"] == "Processed", states
    assert [e["request"]["chargeId"] for e in entries(result, "ret-4", "refund")] == ["ch-4b"]
    assert entries(result, "ret-4", "reverse-refund") == []
    # ret-5: the e-mail bounced; the order went on
    bounced = orders["ret-5"]["steps"]["notify-customer"]
    assert bounced["state"] == "Error" and bounced["continued"] is True, bounced
    assert "mailbox full" in bounced["error"]
    check_return_lines(result)
    # found by a field of a step's result
    [found] = [r for r in result["ran"] if " orders --where rma=" in r["command"]]
    assert [o["orderId"] for o in json.loads(found["stdout"])["orders"]] == ["ret-2"], found


def check_return_lines(result: dict[str, Any]) -> None:
    """Section 9's ``ForEach``: ret-6's three lines each received under its own key, with
    its own receipt, which the restock names in line order; ret-7's second line refused,
    and every line received sent back naming its own receipt, nothing refunded."""
    orders = result["orders"]
    done = orders["ret-6"]
    assert done["status"] == "completed", done
    receipts = []
    for i, item in enumerate(["boots", "socks", "tent"]):
        [received] = entries(result, "ret-6", f"receive-line[{i}]")
        assert received["idempotencyKey"] == f"ret-6:receive-line:{i}"
        assert (received["request"]["line"], received["request"]["item"]) == (i, item)
        receipt = received["response"]["receipt"]
        assert done["steps"][f"receive-line[{i}]"]["result"]["receipt"] == receipt
        receipts.append(receipt)
    assert len(set(receipts)) == 3
    [restocked] = entries(result, "ret-6", "restock")
    assert restocked["request"]["receipts"] == receipts
    refused = orders["ret-7"]
    assert refused["status"] == "compensated", refused
    assert refused["steps"]["receive-line[1]"]["state"] == "Error"
    assert entries(result, "ret-7", "receive-line[1]") == []
    for i in (0, 2):  # line 2 ran only if line 0 ended before line 1's refusal came
        got = [e["response"]["receipt"] for e in entries(result, "ret-7", f"receive-line[{i}]")]
        sent_back = entries(result, "ret-7", f"send-back-line[{i}]")
        assert got == [e["request"]["receipt"] for e in sent_back], (got, sent_back)
        assert all(e["undid"] for e in sent_back)
    assert entries(result, "ret-7", "refund") == []


def turn_spans(order: dict[str, Any]) -> tuple[str, str]:
    """When the order took its turn and when it ended (its history's times)."""
    history = order["history"]
    [taken] = [h["at"] for h in history if h["event"] == "turn-taken"]
    [ended] = [
        h["at"] for h in history if h["event"] == "status" and h["status"] == order["status"]
    ]
    return taken, ended


def check_turns(result: dict[str, Any]) -> None:
    """Section 10: one return per customer at a time. ret-9 waited behind ret-8 (shown
    so) and ran only once ret-8 had ended; ret-10, another customer's, ran at once beside
    ret-8; ret-11 was cancelled while it waited; the search by key found c-12's three;
    ret-12, without a customer, was rejected and alerted, naming the key function."""
    orders = result["orders"]
    [shown] = [r for r in result["ran"] if r["command"].endswith("show ret-9")]
    waiting = json.loads(shown["stdout"])
    assert waiting["status"] == "pending", waiting
    assert waiting["waitingFor"] == [{"turn": "c-12"}], waiting
    # as the guide shows it: first in line, behind its holder, the only one waiting
    assert waiting["turn"] == {"key": "c-12", "position": 1, "holders": ["ret-8"], "waiting": 1}
    statuses = {o: orders[o]["status"] for o in ("ret-8", "ret-9", "ret-10", "ret-11")}
    assert statuses == {
        "ret-8": "completed",
        "ret-9": "completed",
        "ret-10": "completed",
        "ret-11": "cancelled",
    }, statuses
    first, second, other = (turn_spans(orders[o]) for o in ("ret-8", "ret-9", "ret-10"))
    # times in one format (ISO 8601 UTC, milliseconds): compared as text
    assert second[0] >= first[1], (first, second)  # ret-9 took its turn once ret-8 ended
    assert other[1] < first[1], (first, other)  # ret-10 ended while ret-8 waited
    assert orders["ret-11"]["steps"] == {}  # never started: nothing to undo
    [found] = [r for r in result["ran"] if " orders --where turn=" in r["command"]]
    listed = {o["orderId"] for o in json.loads(found["stdout"])["orders"]}
    assert listed == {"ret-8", "ret-9", "ret-11"}, found
    assert "ret-12" not in orders
    [alerts] = [r for r in result["ran"] if r["command"].endswith("admin alerts")]
    [rejected] = [a for a in json.loads(alerts["stdout"]) if "ret-12" in json.dumps(a)]
    assert "declarations.refunds.customer_of" in rejected["reason"], rejected
    assert "KeyError" in rejected["reason"], rejected
