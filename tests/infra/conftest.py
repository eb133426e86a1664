"""Fixtures for the infrastructure checks.

They run in their own venv (`make iac-check`: .venv-iac, requirements-iac.txt),
because checkov's pins clash with the app's. In any other venv, where checkov
and pycep are absent, every test here is reported as SKIPPED with the reason
(never silently left out of collection). `make iac-check` sets
INFRA_CHECKS_REQUIRED=1: there, a missing tool is an error, not a skip.

They check the deployment: Bicep against what the code derives from the deployment's own
agents, as ``infra/agents.json`` lists them (tests/infra/deployed_agents.py), not from the
suite's declarations (tests/conftest.py); they are marked ``deployment``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from core import workflows
from tests.infra.bicep import INFRA

CHECKOV_TIMEOUT_S = 300
DEPLOYED = "tests.infra.deployed_agents"
HERE = Path(__file__).resolve().parent
#: Set by `make iac-check`: the tools must be there, so their absence fails the run.
REQUIRED_ENV = "INFRA_CHECKS_REQUIRED"
MISSING = [name for name in ("checkov", "pycep", "yaml") if importlib.util.find_spec(name) is None]
SKIP_REASON = f"needs {', '.join(MISSING)}, installed only in .venv-iac: run `make iac-check`"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This folder's tests are the deployment's; without the infra tools, each is marked
    skipped, with the reason."""
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.deployment)
    if not MISSING:
        return
    if os.environ.get(REQUIRED_ENV):
        raise pytest.UsageError(
            f"{REQUIRED_ENV} is set but {', '.join(MISSING)} cannot be imported with "
            f"{sys.executable}: reinstall the infra venv (rm -rf .venv-iac; make iac-check)"
        )
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if item.path.resolve().is_relative_to(HERE):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _deployment_declarations() -> None:
    """The deployment's agents (the suite's conftest puts its own declarations back after)."""
    workflows.use(DEPLOYED)


@pytest.fixture(scope="session")
def checkov_report() -> dict[str, Any]:
    """checkov's JSON report on infra/, run once per session.

    checkov exits 0 on a file it cannot parse and 1 on a failed check, so the
    exit code says little: the tests read the report.
    """
    command = [
        sys.executable, "-m", "checkov.main",
        "--framework", "bicep",
        "--skip-download",  # no network here: no policy metadata download
        "--directory", str(INFRA),
        "--output", "json",
    ]  # fmt: skip
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=CHECKOV_TIMEOUT_S, check=False
    )
    if run.returncode not in (0, 1):
        pytest.fail(f"checkov exited {run.returncode}:\n{run.stderr[-4000:]}")
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov printed no JSON report:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    if isinstance(report, list):  # one report per framework
        report = next(r for r in report if r.get("check_type") == "bicep")
    if "results" not in report:
        # With nothing it could scan, checkov prints a bare summary instead.
        report = {"summary": report, "results": {}}
    assert isinstance(report, dict), f"checkov's bicep report is not an object: {report!r:.200}"
    return report
