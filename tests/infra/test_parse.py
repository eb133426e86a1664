"""(a) Every Bicep file parses (pycep-parser, the parser checkov uses).

pycep 0.5.1 checks syntax only, and rejects some valid Bicep: nullable types
(`string?`), `func`, `import`, the spread operator, `resourceInput<>`, and
more than four consecutive `//` comment lines inside braces (use `/* */`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.bicep import INFRA, MAIN, BicepSyntaxError, bicep_files, parse, rel


def test_infra_has_main_and_modules() -> None:
    files = bicep_files()
    assert MAIN in files, "infra/main.bicep is missing"
    assert any(path.parent == INFRA / "app" for path in files), "no modules under infra/app/"


@pytest.mark.parametrize("path", bicep_files(), ids=rel)
def test_bicep_file_parses(path: Path) -> None:
    try:
        tree = parse(path)
    except BicepSyntaxError as error:
        pytest.fail(str(error), pytrace=False)
    assert tree.get("resources") or tree.get("modules"), f"{rel(path)} declares nothing"


def test_main_targets_the_subscription() -> None:
    assert parse(MAIN)["globals"]["scope"]["value"] == "subscription"
