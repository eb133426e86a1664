"""The azd hook that runs the deploy guard (``infra/hooks/deploy-check.sh``, wired in
``azure.yaml`` before ``provision`` and ``deploy``), run by ``sh`` in a copy of the
repository's layout whose ``.venv/bin/python`` only records how it was called and exits
as told: the override, an environment not provisioned yet, the identity-based account it
points the check at, and the exit status it hands azd."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "infra" / "hooks" / "deploy-check.sh"
FAKE_PYTHON = """#!/bin/sh
# the hook's probe that it can import the app's packages: yes
case "$1" in -c) exit 0 ;; esac
{
  echo "args=$*"
  echo "storage=${AzureWebJobsStorage-unset}"
  echo "account=${AzureWebJobsStorage__accountName-unset}"
  echo "credential=${AzureWebJobsStorage__credential-unset}"
} >> "$FAKE_CALLS"
exit "${FAKE_EXIT:-0}"
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "infra" / "hooks").mkdir(parents=True)
    shutil.copy(HOOK, tmp_path / "infra" / "hooks" / HOOK.name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return tmp_path


def hook(tree: Path, phase: str, exit_code: int = 0, **env: str) -> tuple[int, list[str], str]:
    calls = tree / "calls.txt"
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "FAKE_CALLS": str(calls),
        "FAKE_EXIT": str(exit_code),
        # what a developer's shell may hold: never what the check reads
        "AzureWebJobsStorage": "UseDevelopmentStorage=true",
        "AzureWebJobsStorage__credential": "managedidentity",
        **env,
    }
    run = subprocess.run(
        ["sh", str(tree / "infra" / "hooks" / HOOK.name), phase],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    made = calls.read_text().splitlines() if calls.exists() else []
    return run.returncode, made, run.stderr


def test_a_refusal_fails_the_azd_command_and_says_how_to_override(tree: Path) -> None:
    code, calls, err = hook(tree, "deploy", 1, AZURE_STORAGE_ACCOUNT_NAME="storders1")
    assert code == 1
    assert calls == [
        "args=-m admin deploy-check --declarations declarations",
        "storage=unset",
        "account=storders1",
        "credential=unset",
    ]
    assert "REFUSED" in err and "SKIP_DEPLOY_CHECK=true azd deploy" in err


def test_a_safe_check_lets_it_go_on(tree: Path) -> None:
    code, calls, err = hook(tree, "provision", 0, AZURE_STORAGE_ACCOUNT_NAME="storders1")
    assert code == 0 and len(calls) == 4 and "safe to provision" in err


def test_a_check_that_could_not_run_fails_it_too_without_retrying_bad_usage(tree: Path) -> None:
    code, calls, err = hook(tree, "deploy", 2, AZURE_STORAGE_ACCOUNT_NAME="storders1")
    assert code == 2 and len(calls) == 4  # one call: only "storage did not answer" is retried
    assert "could not check" in err and "SKIP_DEPLOY_CHECK=true" in err


def test_the_override_skips_the_check_loudly(tree: Path) -> None:
    code, calls, err = hook(
        tree, "deploy", 1, AZURE_STORAGE_ACCOUNT_NAME="storders1", SKIP_DEPLOY_CHECK="true"
    )
    assert code == 0 and calls == [] and "SKIPPED" in err


def test_no_storage_account_yet_is_nothing_in_flight_before_a_provision_only(tree: Path) -> None:
    code, calls, _ = hook(tree, "provision", 1)
    assert code == 0 and calls == []  # the first provision: nothing deployed
    code, calls, err = hook(tree, "deploy", 0)
    assert code == 1 and calls == []  # the outputs missing: not "nothing in flight"
    assert "azd env refresh" in err


def test_azure_yaml_runs_the_hook_before_provision_and_deploy() -> None:
    """The wiring, read as text (PyYAML is in the infra venv only: tests/infra parses it)."""
    text = (ROOT / "azure.yaml").read_text(encoding="utf-8")
    for phase in ("provision", "deploy"):
        assert f"run: sh ./infra/hooks/deploy-check.sh {phase}" in text
        assert f"run: ./infra/hooks/deploy-check.ps1 -Phase {phase}" in text


# --- without a .venv: the hook builds its own, or says exactly what is missing ------------------

FAKE_BASE = """#!/bin/sh
# a python3.13 that "builds" a venv whose python is the recording fake
echo "base $*" >> "$FAKE_CALLS"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  cp "$FAKE_PYTHON_SRC" "$3/bin/python"
  chmod +x "$3/bin/python"
fi
"""
PIP_AWARE = FAKE_PYTHON.replace(
    "#!/bin/sh\n",
    '#!/bin/sh\ncase "$*" in "-m pip "*) echo "pip $*" >> "$FAKE_CALLS"; exit 0 ;; esac\n',
)


def bare(tmp_path: Path, with_base: bool) -> tuple[Path, Path]:
    """A checkout with no .venv; a bin directory with (or without) a python3.13."""
    (tmp_path / "infra" / "hooks").mkdir(parents=True)
    shutil.copy(HOOK, tmp_path / "infra" / "hooks" / HOOK.name)
    (tmp_path / "requirements.txt").write_text("azure-data-tables==12.7.0\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    source = tmp_path / "fake-python"
    source.write_text(PIP_AWARE)
    source.chmod(0o755)
    if with_base:
        base = bin_dir / "python3.13"
        base.write_text(FAKE_BASE)
        base.chmod(0o755)
    return tmp_path, source


def test_without_a_venv_it_builds_its_own_once_and_runs_the_check(tmp_path: Path) -> None:
    tree, source = bare(tmp_path, with_base=True)
    env = {
        "AZURE_STORAGE_ACCOUNT_NAME": "storders1",
        "PATH": f"{tree / 'bin'}:/usr/bin:/bin",
        "HOME": str(tree),
        "FAKE_PYTHON_SRC": str(source),
    }
    code, calls, err = hook(tree, "deploy", 0, **env)
    assert code == 0, err
    assert calls[0] == "base -m venv .venv-deploycheck"
    assert any(c.startswith("pip -m pip install") for c in calls)
    assert "args=-m admin deploy-check --declarations declarations" in calls
    assert "building its environment once" in err
    # the second time: built already, nothing rebuilt
    (tree / "calls.txt").unlink()
    code, calls, err = hook(tree, "deploy", 0, **env)
    assert code == 0 and not any(c.startswith("base ") for c in calls)


def test_without_python_3_13_it_says_what_is_missing_and_is_no_refusal(tmp_path: Path) -> None:
    tree, _ = bare(tmp_path, with_base=False)
    code, calls, err = hook(
        tree,
        "deploy",
        0,
        AZURE_STORAGE_ACCOUNT_NAME="storders1",
        PATH=f"{tree / 'bin'}:/usr/bin:/bin",
        HOME=str(tree),
    )
    assert code == 2 and calls == []
    assert "needs Python 3.13" in err and "pyenv install 3.13" in err
    assert "REFUSED" not in err and "SKIP_DEPLOY_CHECK=true azd deploy" in err


def test_a_venv_that_cannot_import_the_app_is_not_used_and_not_a_refusal(tree: Path) -> None:
    broken = tree / ".venv" / "bin" / "python"
    broken.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'azure'\" >&2\nexit 1\n"
    )
    broken.chmod(0o755)
    code, _, err = hook(
        tree,
        "deploy",
        0,
        AZURE_STORAGE_ACCOUNT_NAME="storders1",
        PATH=f"{tree / 'nowhere'}:/usr/bin:/bin",
        HOME=str(tree),
    )
    assert code == 2 and "REFUSED" not in err and "could not check" in err


def test_without_a_read_of_the_state_an_unreadable_account_is_not_checked_loudly(
    tree: Path,
) -> None:
    """With DEPLOYER_READS_STATE off (and no data roles), azd grants the deployer no read of
    the state table, so the check cannot read it with that login: said once, with how to
    have it checked, and the command goes on (no two-minute wait for roles that never
    come)."""
    code, calls, err = hook(
        tree, "deploy", 3, AZURE_STORAGE_ACCOUNT_NAME="storders1", DEPLOYER_READS_STATE="false"
    )
    assert code == 0 and len(calls) == 4  # one call, no retries
    assert "NOT CHECKED" in err and "DEPLOYER_READS_STATE true" in err
    code, calls, err = hook(
        tree, "deploy", 2, AZURE_STORAGE_ACCOUNT_NAME="storders1", GRANT_DEPLOYER_DATA_ACCESS="1"
    )
    assert code == 2 and "could not check" in err  # any other failure fails it, as before
