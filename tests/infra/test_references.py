"""What the Bicep CLI would catch and pycep does not: references across files.

Without `az bicep build` here, a misspelt module parameter, a missing output
or an unknown role name would only fail at deployment. These tests read the
references between main.bicep, its modules and their JSON files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.infra.bicep import (
    DOCS,
    INFRA,
    MAIN,
    BicepSyntaxError,
    bicep_files,
    body,
    load_json,
    module_path,
    parse,
    rel,
    resources_of_type,
)

GUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _modules(owner: Path) -> dict[str, Any]:
    """The modules a file declares; a file that does not parse is test_parse's to report."""
    try:
        tree = parse(owner)
    except BicepSyntaxError:
        pytest.skip(f"{rel(owner)} does not parse (see test_parse)")
    modules: dict[str, Any] = tree.get("modules", {})
    return modules


@pytest.mark.parametrize("owner", bicep_files(), ids=rel)
def test_module_parameters_match_the_module(owner: Path) -> None:
    for symbol, module in _modules(owner).items():
        target = module_path(owner, module)
        assert target.is_file(), f"{rel(owner)}: module {symbol} -> missing {target}"
        declared = parse(target).get("parameters", {})
        given = set(body(module).get("params", {}))  # through an `if` or a loop
        unknown = given - set(declared)
        assert not unknown, f"{rel(owner)}: module {symbol} gets undeclared params {unknown}"
        required = {name for name, p in declared.items() if p.get("default") is None}
        missing = required - given
        assert not missing, f"{rel(owner)}: module {symbol} misses required params {missing}"


@pytest.mark.parametrize("owner", bicep_files(), ids=rel)
def test_module_outputs_used_exist(owner: Path) -> None:
    modules = _modules(owner)
    text = owner.read_text(encoding="utf-8")
    for symbol, output in set(re.findall(r"\b(\w+)\.outputs\.(\w+)", text)):
        assert symbol in modules, f"{rel(owner)}: {symbol}.outputs.{output}: no such module"
        outputs = parse(module_path(owner, modules[symbol])).get("outputs", {})
        assert output in outputs, f"{rel(owner)}: module {symbol} has no output {output}"


def test_abbreviations_used_exist() -> None:
    abbreviations = load_json(INFRA / "abbreviations.json")
    used = set(re.findall(r"\babbrs\.(\w+)", MAIN.read_text(encoding="utf-8")))
    assert used, "main.bicep uses no abbreviation"
    assert used <= set(abbreviations), f"unknown abbreviations: {used - set(abbreviations)}"


def test_role_ids_are_named_builtin_guids_used_and_documented() -> None:
    roles: dict[str, str] = load_json(INFRA / "app" / "roles.json")
    assert all(GUID.match(guid) for guid in roles.values()), roles
    assert len(set(roles.values())) == len(roles), "a role id is listed twice"
    rbac = (INFRA / "app" / "rbac.bicep").read_text(encoding="utf-8")
    used = set(re.findall(r"roles\['([^']+)'\]", rbac))
    assert used == set(roles), (
        f"unknown in rbac.bicep: {used - set(roles)}; unused: {set(roles) - used}"
    )
    # No role id written inline anywhere else: roles.json is the one place.
    for path in bicep_files():
        inline = re.findall(
            r"'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}'",
            path.read_text(encoding="utf-8"),
        )
        assert not inline, f"{rel(path)} has inline GUIDs {inline}; name them in roles.json"
    docs = DOCS.read_text(encoding="utf-8")
    undocumented = [name for name in roles if name not in docs]
    assert not undocumented, f"docs/deployment.md does not list roles {undocumented}"


def test_role_assignments_are_data_plane_and_scoped() -> None:
    tree = parse(INFRA / "app" / "rbac.bicep")
    assignments = resources_of_type(tree, "Microsoft.Authorization/roleAssignments")
    assert assignments
    for name, assignment in assignments.items():
        assert "scope" in body(assignment), f"{name} has no scope (would be resource-group wide)"


def test_azure_yaml_deploys_one_python_function_service() -> None:
    import yaml  # in the infra venv only (conftest skips this folder elsewhere)

    config = yaml.safe_load((INFRA.parent / "azure.yaml").read_text(encoding="utf-8"))
    assert set(config["services"]) == {"orders"}
    service = config["services"]["orders"]
    assert service["project"] == "."
    assert service["host"] == "function"
    assert service["language"] == "python"
    # azd finds the Function App by its azd-service-name tag.
    app = (INFRA / "app" / "function-app.bicep").read_text(encoding="utf-8")
    assert "'azd-service-name': 'orders'" in app


def test_azure_yaml_runs_the_deploy_guard_before_provision_and_deploy() -> None:
    """python -m admin deploy-check, through infra/hooks/deploy-check.* (docs/operating.md,
    "Upgrading"); a failed check fails the command (no continueOnError)."""
    import yaml

    config = yaml.safe_load((INFRA.parent / "azure.yaml").read_text(encoding="utf-8"))
    for phase in ("provision", "deploy"):
        hook = config["hooks"][f"pre{phase}"]
        assert set(hook) == {"posix", "windows"}  # the schema: nothing else beside both
        assert hook["posix"] == {
            "shell": "sh",
            "run": f"sh ./infra/hooks/deploy-check.sh {phase}",
            "interactive": True,
        }
        assert hook["windows"] == {
            "shell": "pwsh",
            "run": f"./infra/hooks/deploy-check.ps1 -Phase {phase}",
            "interactive": True,
        }
    for script in ("deploy-check.sh", "deploy-check.ps1"):
        text = (INFRA / "hooks" / script).read_text(encoding="utf-8")
        # the storage account the hooks point the check at is an output azd keeps
        assert "AZURE_STORAGE_ACCOUNT_NAME" in text
    assert "output AZURE_STORAGE_ACCOUNT_NAME string" in MAIN.read_text(encoding="utf-8")


def test_parameter_file_covers_main_parameters() -> None:
    declared = parse(MAIN)["parameters"]
    given = load_json(INFRA / "main.parameters.json")["parameters"]
    assert set(given) <= set(declared), f"unknown parameters: {set(given) - set(declared)}"
    required = {name for name, p in declared.items() if p.get("default") is None}
    assert required <= set(given), f"parameters azd cannot fill: {required - set(given)}"
    # Defaults written in the parameter file agree with the Bicep defaults.
    for name, entry in given.items():
        match = re.fullmatch(r"\$\{[A-Z0-9_]+=(?P<default>[^}]*)\}", entry["value"])
        if match and declared[name].get("default") is not None:
            assert match["default"] == str(declared[name]["default"]).lower() or (
                match["default"] == str(declared[name]["default"])
            ), f"{name}: parameter file default {match['default']!r} != Bicep default"
