"""infra/agents.json (the agents for Bicep) is generated from the declarations by
``python -m admin agents-json --write`` and must be regenerated when they change;
``python -m admin workflows`` prints what ``GET /api/workflows`` answers."""

from __future__ import annotations

import difflib
import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from admin import __main__ as cli
from config.settings import DECLARATIONS
from core import workflows
from core.limits import DEFAULT_DECLARATIONS
from core.workflows import Agent, ApiKey, EntraToken, StepSpec, Workflow
from tests import SUITE_DECLARATIONS

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "python -m admin agents-json --write"


def _declared_agents() -> dict[str, Agent]:
    """The agents of the product's declarations (what Azure runs: no ORDERS_DECLARATIONS)."""
    module = importlib.import_module(DEFAULT_DECLARATIONS)
    return workflows.validate(module)["AGENTS"]


def _stale(committed: str, generated: str) -> str:
    diff = "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            generated.splitlines(keepends=True),
            "infra/agents.json (committed)",
            "generated from the declarations",
        )
    )
    return (
        "infra/agents.json is out of date with the agent declarations (declarations/): "
        f"run `{REGENERATE}` and commit the file (Bicep deploys each agent's queue, roles "
        f"and settings from it).\n{diff}"
    )


@pytest.mark.deployment
def test_agents_json_is_generated_from_the_declarations() -> None:
    committed = cli.AGENTS_JSON.read_text(encoding="utf-8")
    generated = cli.agents_json_text(_declared_agents())
    assert committed == generated, _stale(committed, generated)


@pytest.mark.deployment
def test_the_command_prints_the_committed_file() -> None:
    """The command itself, as an operator runs it, from the default declarations."""
    env = {k: v for k, v in os.environ.items() if k != DECLARATIONS}
    env.pop("AzureWebJobsStorage", None)  # it needs no storage
    run = subprocess.run(
        [sys.executable, "-m", "admin", "agents-json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    committed = cli.AGENTS_JSON.read_text(encoding="utf-8")
    assert run.stdout == committed, _stale(committed, run.stdout)


def test_agents_json_says_it_is_generated() -> None:
    document = json.loads(cli.AGENTS_JSON.read_text(encoding="utf-8"))
    assert REGENERATE in document["$comment"]
    assert "never edit it by hand" in document["$comment"]
    assert cli.AGENTS_JSON == REPO / "infra" / "agents.json"


def _handler(order: dict[str, Any], **_: Any) -> None:  # a python agent's handler
    return None


def test_every_kind_of_agent() -> None:
    agents = {
        a.name: a
        for a in (
            Agent("plain"),
            Agent("entra-svc", auth=EntraToken("api://entra/.default")),
            Agent("keyed", auth=ApiKey("X-Key")),
            Agent("local", kind="python", handler=_handler),
        )
    }
    document = cli.agents_json(agents)
    assert [a["name"] for a in document["agents"]] == ["entra-svc", "keyed", "local", "plain"]
    by_name = {a["name"]: a for a in document["agents"]}
    assert by_name["entra-svc"] == {
        "name": "entra-svc",
        "queue": "agent-requests-entra-svc",
        "poisonQueue": "agent-requests-entra-svc-poison",
        "kind": "http",
        "auth": "entra",
        "urlSetting": "AGENT_ENTRA_SVC_URL",
        "apiKeySetting": None,
        "scope": "api://entra/.default",
    }
    assert by_name["keyed"]["auth"] == "api-key"
    assert by_name["keyed"]["apiKeySetting"] == "AGENT_KEYED_API_KEY"
    assert by_name["keyed"]["urlSetting"] == "AGENT_KEYED_URL"
    assert by_name["local"]["kind"] == "python"
    assert by_name["local"]["urlSetting"] is None  # a python agent calls no URL
    assert by_name["plain"]["auth"] == "none" and by_name["plain"]["scope"] is None
    # Every entry has every field: Bicep reads them without checking.
    assert len({frozenset(a) for a in document["agents"]}) == 1


def test_write_writes_what_it_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "agents.json"
    monkeypatch.setattr(cli, "AGENTS_JSON", target)
    monkeypatch.delenv("AzureWebJobsStorage", raising=False)
    assert cli.main(["agents-json", "--write"]) == 0
    printed = capsys.readouterr().out
    assert target.read_text(encoding="utf-8") == printed == cli.agents_json_text()


def test_workflows_prints_what_the_api_answers(capsys: pytest.CaptureFixture[str]) -> None:
    from admin.triggers import workflows_view  # GET /api/workflows

    assert cli.main(["workflows"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(json.dumps(workflows_view()))
    assert printed == {
        "workflows": [workflows.WORKFLOWS[n].describe() for n in sorted(workflows.WORKFLOWS)],
        "agents": [workflows.AGENTS[n].describe() for n in sorted(workflows.AGENTS)],
    }


def test_a_bad_declaration_is_reported_and_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = types.ModuleType("bad_declarations_for_agents_json")
    bad.AGENTS = [Agent("orders")]  # type: ignore[attr-defined]
    bad.WORKFLOWS = [  # type: ignore[attr-defined]
        Workflow("order", (StepSpec("process", agent="missing"),))
    ]
    monkeypatch.setitem(sys.modules, bad.__name__, bad)
    monkeypatch.setenv(DECLARATIONS, bad.__name__)
    target = tmp_path / "agents.json"
    monkeypatch.setattr(cli, "AGENTS_JSON", target)
    workflows.reload()
    try:
        assert cli.main(["agents-json", "--write"]) == 2
        assert "missing" in json.loads(capsys.readouterr().out)["error"]
        assert not target.exists()
        assert cli.main(["workflows"]) == 2
    finally:
        monkeypatch.undo()
        workflows.use(SUITE_DECLARATIONS)
