"""docs/add-a-workflow.md, followed word for word in a copy of the app: its ``# file:``
and ``# append to:`` blocks applied, the deployment's agent list regenerated with the
command it gives, then a ``returns`` order run end to end in real processes (Azurite,
the simulator with the warehouse requiring an Entra ID token, a devhost).

It also checks the guide's promise: nothing under core/, scheduler/, supervisor/ or
stores/ changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "add-a-workflow.md"
BLOCK = re.compile(r"```python\n# (file|append to): (\S+)\n(.*?)```", re.DOTALL)
NOT_COPIED = {".git", ".venv", ".venv-iac", "node_modules", "run"}

RUN = r"""
import json, sys, time
import httpx
from demo.stack import LocalStack

SETTINGS = {"STEP_TIMEOUT_SECONDS": "10", "MAX_FAILURE_COUNT": "3",
            "SUPERVISOR_SCHEDULE": "*/1 * * * * *"}
with LocalStack(devhosts=1, settings=SETTINGS) as stack:
    rule = httpx.post(f"{stack.simulator_url}/_identity",
                      json={"requireToken": {"restock": "api://warehouse"}}, timeout=10)
    rule.raise_for_status()
    stack.submit({"orderId": "ret-1", "workflow": "returns", "items": ["boots"], "amount": 40})
    stack.submit({"orderId": "ret-empty", "workflow": "returns", "items": [], "amount": 1})
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        orders = {o: stack.context.store.load(o) for o in ("ret-1", "ret-empty")}
        if all(o is not None and o.status.terminal for o in orders.values()):
            break
        time.sleep(0.5)
    calls = stack.remote_calls()
    identity = httpx.get(f"{stack.simulator_url}/_identity", timeout=10).json()
    workflows = httpx.get(f"{stack.http_url}/api/workflows", timeout=10).json()
    out = {
        "orders": {
            k: None if o is None else {
                "status": str(o.status),
                "steps": {s.step: {"state": str(s.process_state), "result": s.result,
                                   "error": s.last_error} for s in o.steps},
            }
            for k, o in orders.items()
        },
        "calls": calls,
        "identity": identity,
        "workflows": workflows,
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
    returns = next(w for w in declared["workflows"] if w["workflow"] == "returns")
    assert [(s["step"], s["agent"]) for s in returns["steps"]] == [
        ("receive-return", "returns-desk"),
        ("refund-payment", "payments"),
        ("restock", "warehouse"),
    ]
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
    assert changed == {"declarations/__init__.py", "declarations/returns.py", "infra/agents.json"}
    assert not any(c.startswith(("core/", "scheduler/", "supervisor/", "stores/")) for c in changed)
    agents = json.loads((app / "infra" / "agents.json").read_text())["agents"]
    assert {a["name"] for a in agents} >= {"returns-desk", "warehouse"}

    run = subprocess.run(
        [python, "-c", RUN],
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

    done = result["orders"]["ret-1"]
    assert done["status"] == "completed", done
    assert done["steps"]["receive-return"]["result"] == {"rma": "RMA-ret-1", "items": 1}
    assert set(done["steps"]) == {"receive-return", "refund-payment", "restock"}
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
    # and the app lists what it runs
    deployed = {w["workflow"] for w in result["workflows"]["workflows"]}
    assert "returns" in deployed
