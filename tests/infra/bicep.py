"""Reading infra/ without the Bicep CLI (it cannot be installed here).

pycep (the parser checkov itself uses) gives the structure of each file; the
checkov skip comments are read from the text, as checkov reads them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
MAIN = INFRA / "main.bicep"
DOCS = REPO / "docs" / "deployment.md"


def bicep_files() -> list[Path]:
    return sorted(INFRA.rglob("*.bicep"))


def rel(path: Path) -> str:
    return path.resolve().relative_to(REPO).as_posix()


class BicepSyntaxError(ValueError):
    """pycep could not parse a file; the message names it."""


@cache
def parse(path: Path) -> dict[str, Any]:
    """The pycep JSON of one file; BicepSyntaxError if it does not parse."""
    from pycep import BicepParser

    try:
        return BicepParser().parse(file_path=path)
    except Exception as error:  # lark's UnexpectedInput family, or ValueError
        raise BicepSyntaxError(f"{rel(path)} does not parse: {error}") from None


def load_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def resources_of_type(tree: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {
        name: resource
        for name, resource in tree.get("resources", {}).items()
        if resource.get("type") == resource_type
    }


def body(resource: dict[str, Any]) -> dict[str, Any]:
    """A resource's properties, looking through a `[for ...]` loop or an `if`."""
    config = resource["config"]
    while isinstance(config, dict) and ("loop_type" in config or "condition" in config):
        config = config["config"]
    return config


def module_path(owner: Path, module: dict[str, Any]) -> Path:
    return (owner.parent / module["detail"]["path"]).resolve()


# --- checkov skip comments --------------------------------------------------

_SKIP_MENTION = re.compile(r"checkov:skip", re.IGNORECASE)
# One id per line, then a colon and the reason (checkov does not match comma lists).
SKIP_LINE = re.compile(r"^\s*//\s*checkov:skip=(?P<id>CKV2?_[A-Z]+_\d+):\s*(?P<reason>\S.*?)\s*$")


@dataclass(frozen=True, order=True)
class Skip:
    check_id: str
    file: str  # repository-relative path of the Bicep file
    reason: str


def normalise(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def bicep_skips() -> tuple[list[Skip], list[str]]:
    """Every skip comment in infra/, and every malformed one (as `file:line: text`)."""
    skips: list[Skip] = []
    malformed: list[str] = []
    for path in bicep_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not _SKIP_MENTION.search(line):
                continue
            match = SKIP_LINE.match(line)
            if match is None:
                malformed.append(f"{rel(path)}:{number}: {line.strip()}")
                continue
            skips.append(Skip(match["id"], rel(path), normalise(match["reason"])))
    return skips, malformed


# A row of the skip table in docs/deployment.md: | `CKV_...` | `infra/...` | reason |
_DOC_ROW = re.compile(
    r"^\|\s*`?(?P<id>CKV2?_[A-Z]+_\d+)`?\s*\|\s*`?(?P<file>infra/[^|`]+?)`?\s*\|\s*(?P<reason>[^|]+?)\s*\|\s*$"
)


def documented_skips() -> list[Skip]:
    rows = []
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        match = _DOC_ROW.match(line)
        if match:
            rows.append(Skip(match["id"], match["file"].strip(), normalise(match["reason"])))
    return rows
