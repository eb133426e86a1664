"""The deployment's agents as ``infra/agents.json`` lists them, as a declarations module:
what the infra checks compare Bicep with (``core.names``, the agents' settings).

``infra/agents.json`` is generated from ``declarations/`` and a unit test holds it to them
(tests/unit/test_agents_json.py), so the infra checks need not import ``declarations/``,
which may import anything the app's own environment has: these checks run in theirs
(``.venv-iac``). One workflow, the default one, calls every agent, so that each is in use.
"""

from __future__ import annotations

import json
from typing import Any

from core.workflows import Agent, ApiKey, Auth, EntraToken, NoAuth, StepSpec, Workflow
from tests.infra.bicep import INFRA


def _handler(order: dict[str, Any], **call: Any) -> dict[str, Any]:
    return {}


def _auth(entry: dict[str, Any]) -> Auth:
    if entry["auth"] == "entra":
        return EntraToken(scope=str(entry["scope"]))
    if entry["auth"] == "api-key":
        return ApiKey()
    return NoAuth()


def _agent(entry: dict[str, Any]) -> Agent:
    if entry["kind"] == "python":
        return Agent(entry["name"], kind="python", handler=_handler)
    return Agent(entry["name"], auth=_auth(entry))


AGENTS = [_agent(a) for a in json.loads((INFRA / "agents.json").read_text())["agents"]]
WORKFLOWS = [
    Workflow("order", tuple(StepSpec(f"call-{n}", agent=a.name) for n, a in enumerate(AGENTS)))
]
