"""Fixtures for the infrastructure checks.

They run in their own venv (`make iac-check`: .venv-iac, requirements-iac.txt),
because checkov's pins clash with the app's. In any other venv, where checkov
and pycep are absent, this folder is left out of collection instead of
failing on imports.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from typing import Any

import pytest

from tests.infra.bicep import INFRA

CHECKOV_TIMEOUT_S = 300

if not all(importlib.util.find_spec(name) for name in ("checkov", "pycep", "yaml")):
    collect_ignore_glob = ["test_*.py"]


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
    return report
