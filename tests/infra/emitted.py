"""What the app emits to Application Insights, read from its source (the infra venv lacks
the app's packages, and an import would not show a name a branch never reached).

- Counters: every ``METRICS.inc("<name>", key=...)`` call, exported as ``orders.<name>``
  with its keyword arguments as custom dimensions (``observability/metrics.py``). A name
  built at run time (an f-string) is kept as a pattern, apart: nothing may read it as if
  it were a name the code writes.
- Log records' custom dimensions: the order context's fields (``_FIELDS`` in
  ``observability/logs.py``), the keys of every ``extra=`` mapping (a dict literal, or a
  variable holding one, with the keys its function adds by subscript), and the keyword
  arguments of ``log_operator_alert``; ``event`` values are kept with them.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from tests.infra.bicep import REPO

#: Where the app's code is not: tests, tools, virtual environments, dependencies.
_NOT_APP = {"tests", "node_modules", "bench", ".venv", ".venv-iac", ".git", ".python_packages"}
METRIC_PREFIX = "orders."


@dataclass
class Emitted:
    #: counter name (with the ``orders.`` prefix) -> the attribute keys of its calls
    metrics: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    #: names built at run time, as regular expressions over the full name
    metric_patterns: list[re.Pattern[str]] = field(default_factory=list)
    #: custom dimensions of log records (``traces``)
    log_dimensions: set[str] = field(default_factory=set)
    #: values the code gives the ``event`` dimension
    events: set[str] = field(default_factory=set)


def app_sources() -> list[Path]:
    """``function_app.py`` and the app's packages (the folders at the root with an
    ``__init__.py``): never a virtual environment or a cache beside them (``make test``
    builds ``.venv-iac`` in the tree while this runs)."""
    packages = [
        folder
        for folder in REPO.iterdir()
        if (folder / "__init__.py").is_file()
        and folder.name not in _NOT_APP
        and not folder.name.startswith(".")
    ]
    found = [path for package in packages for path in package.rglob("*.py")]
    return sorted([REPO / "function_app.py", *found])


def _string(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _pattern(node: ast.JoinedStr) -> re.Pattern[str]:
    parts = [
        re.escape(text) if (text := _string(value)) is not None else ".+" for value in node.values
    ]
    return re.compile(re.escape(METRIC_PREFIX) + "".join(parts))


def _is_call_of(node: ast.Call, owner: str | None, name: str) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr == name and (
            owner is None or (isinstance(func.value, ast.Name) and func.value.id == owner)
        )
    return isinstance(func, ast.Name) and func.id == name and owner is None


def _dict_fields(node: ast.Dict, found: Emitted) -> None:
    for key, value in zip(node.keys, node.values, strict=True):
        name = _string(key)
        if name is None:
            continue  # a ``**spread``: its keys are found where that mapping is built
        found.log_dimensions.add(name)
        if name == "event" and (event := _string(value)) is not None:
            found.events.add(event)


def _extra_variables(function: ast.AST, found: Emitted) -> None:
    """``extra=fields``: the dict literals assigned to ``fields`` in this function, and
    the keys it adds with ``fields["key"] = ...``."""
    passed = {
        keyword.value.id
        for call in ast.walk(function)
        if isinstance(call, ast.Call)
        for keyword in call.keywords
        if keyword.arg == "extra" and isinstance(keyword.value, ast.Name)
    }
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and target.id in passed
                    and isinstance(node.value, ast.Dict)
                ):
                    _dict_fields(node.value, found)
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in passed
                    and (key := _string(target.slice)) is not None
                ):
                    found.log_dimensions.add(key)


def _scan(path: Path, found: Emitted) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            _extra_variables(node, found)
        if isinstance(node, ast.Assign) and path.name == "logs.py":
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "_FIELDS":
                    assert isinstance(node.value, ast.Tuple), "_FIELDS is no longer a tuple"
                    found.log_dimensions |= {
                        name for item in node.value.elts if (name := _string(item))
                    }
        if not isinstance(node, ast.Call):
            continue
        if _is_call_of(node, "METRICS", "inc") and node.args:
            first = node.args[0]
            keys = {keyword.arg for keyword in node.keywords if keyword.arg}
            if (name := _string(first)) is not None:
                found.metrics[METRIC_PREFIX + name] |= keys
            elif isinstance(first, ast.JoinedStr):
                found.metric_patterns.append(_pattern(first))
            else:
                raise AssertionError(f"{path}:{node.lineno}: METRICS.inc of a name not written out")
        for keyword in node.keywords:
            if keyword.arg == "extra" and isinstance(keyword.value, ast.Dict):
                _dict_fields(keyword.value, found)
        if _is_call_of(node, None, "log_operator_alert"):
            found.log_dimensions |= {keyword.arg for keyword in node.keywords if keyword.arg}


@cache
def emitted() -> Emitted:
    found = Emitted()
    for path in app_sources():
        _scan(path, found)
    assert found.metrics, "no METRICS.inc call found in the app's code"
    return found
