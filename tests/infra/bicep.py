"""Reading infra/ without the Bicep CLI (it cannot be installed here).

pycep (the parser checkov itself uses) gives the structure of each file; the
checkov skip comments are read from the text, as checkov reads them.
"""

from __future__ import annotations

import ast
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
    try:
        tree: dict[str, Any] = _parser().parse(file_path=path)
    except Exception as error:  # lark's UnexpectedInput family, or ValueError
        raise BicepSyntaxError(f"{rel(path)} does not parse: {error}") from None
    return tree


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
    assert isinstance(config, dict), f"the properties of {resource.get('name')} are not a mapping"
    return config


def module_path(owner: Path, module: dict[str, Any]) -> Path:
    path: str = module["detail"]["path"]
    return (owner.parent / path).resolve()


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


# --- evaluating expressions -------------------------------------------------
#
# Without the Bicep CLI, what a loop or a conditional in infra/ produces is computed
# here, from pycep's tree, for the few constructs infra/ uses to deploy the agents
# and the workbook (loadJsonContent, loadTextContent, for-expressions, concat, flatten,
# contains, replace, toLower, ==, &&, ?:, [], .).
# pycep writes a name and a string literal alike ("remoteServiceUrl", "http"): a string
# that names a parameter, a variable or a loop variable in scope is read as that name;
# any other stays itself, as `Unresolved` (a str) when it could be a name the scope
# does not bind (a module parameter the test left open). What only the deployment knows
# (a resource's property, a function not modelled here) is UNKNOWN.


class Unresolved(str):
    """A string that may be a name the scope does not bind: equal to its own text."""


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


class MisparsedError(ValueError):
    """pycep 0.5.1 reads `a.b == 'x'` as `a.(b == 'x')` and `a && b ? c : d` as
    `a && (b ? c : d)`: write `('x' == a.b)` and `(a && b) ? c : d` instead."""


_NAME = re.compile(r"[A-Za-z_]\w*")
_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")


class Scope:
    """The names of one Bicep file: its parameters (``params`` given, else their default,
    else Unresolved) and its variables (evaluated when first read), plus loop variables."""

    def __init__(
        self,
        path: Path,
        params: dict[str, Any] | None = None,
        *,
        variables: dict[str, Any] | None = None,
    ) -> None:
        self.path = path
        self.tree = parse(path)
        self.given = dict(params or {})
        self.overrides = dict(variables or {})
        self.locals: dict[str, Any] = {}
        self._cache: dict[str, Any] = {}

    def with_local(self, name: str, value: Any) -> Scope:
        child = Scope.__new__(Scope)
        child.__dict__.update(self.__dict__)
        child.locals = {**self.locals, name: value}
        return child

    def binds(self, name: str) -> bool:
        return (
            name in self.locals
            or name in self.overrides
            or name in self.tree.get("parameters", {})
            or name in self.tree.get("variables", {})
        )

    def __getitem__(self, name: str) -> Any:
        if name in self.locals:
            return self.locals[name]
        if name in self.overrides:
            return self.overrides[name]
        if name not in self._cache:
            self._cache[name] = self._read(name)
        return self._cache[name]

    def _read(self, name: str) -> Any:
        variables = self.tree.get("variables", {})
        if name in variables:
            return evaluate(variables[name]["value"], self)
        param = self.tree["parameters"][name]
        if name in self.given:
            return self.given[name]
        if param.get("default") is not None:
            return evaluate(param["default"], self)
        return Unresolved(name)

    def module_params(self, module: str) -> dict[str, Any]:
        """A module's parameters as this file passes them, evaluated here."""
        params = body(self.tree["modules"][module]).get("params", {})
        return {name: evaluate(value, self) for name, value in params.items()}


def _known(*values: Any) -> bool:
    return all(v is not UNKNOWN and not isinstance(v, Unresolved) for v in values)


def evaluate(expr: Any, scope: Scope) -> Any:
    """The value of a pycep expression in ``scope`` (see above for what it models)."""
    if isinstance(expr, bool | int | float) or expr is None:
        return expr
    if isinstance(expr, str):
        if _NAME.fullmatch(expr) and scope.binds(expr):
            return scope[expr]
        if "${" in expr:
            return _interpolate(expr, scope)
        return Unresolved(expr) if _NAME.fullmatch(expr) else expr
    if isinstance(expr, list):
        return [evaluate(item, scope) for item in expr]
    if not isinstance(expr, dict):
        raise TypeError(f"not a pycep expression: {expr!r}")
    if "loop_type" in expr:
        return _loop(expr, scope)
    if "function" in expr:
        return _function(expr["function"], scope)
    if "operator" in expr:
        return _operator(expr["operator"], scope)
    return {key: evaluate(value, scope) for key, value in expr.items()}


@cache
def _parser() -> Any:
    from pycep import BicepParser

    return BicepParser()  # building its grammar takes about a second


@cache
def _parse_expression(text: str) -> Any:
    """One expression (the inside of a `${...}`), parsed once."""
    return _parser().parse(text=f"var v = {text}\n")["variables"]["v"]["value"]


def _interpolate(text: str, scope: Scope) -> Any:
    parts: list[str] = []
    last = 0
    for match in _INTERPOLATION.finditer(text):
        value = evaluate(_parse_expression(match[1]), scope)
        if not _known(value):
            return text  # what the deployment fills in; the text says which names
        parts += [text[last : match.start()], str(value)]
        last = match.end()
    return "".join([*parts, text[last:]])


def _loop(expr: dict[str, Any], scope: Scope) -> Any:
    loop = expr["loop_type"]
    if loop["type"] != "array" or expr.get("condition") is not None:
        raise NotImplementedError(f"only [for x in array: ...] is modelled: {loop}")
    items = evaluate(loop["detail"]["array_name"], scope)
    if not isinstance(items, list):
        return UNKNOWN
    name = loop["detail"]["item_name"]
    return [evaluate(expr["config"], scope.with_local(name, item)) for item in items]


def _function(function: dict[str, Any], scope: Scope) -> Any:
    kind = function["type"]
    args = [evaluate(arg, scope) for arg in function.get("parameters", {}).values()]
    if kind == "load_json_content":
        path, json_path = function["parameters"]["file_path"], function["parameters"]["json_path"]
        value = load_json(scope.path.parent / path)
        for part in (json_path or "").split("."):
            value = value[part] if part else value
        if function.get("property_name"):
            value = value[function["property_name"]]
        return value
    if kind == "load_text_content":
        return (scope.path.parent / function["parameters"]["file_path"]).read_text(encoding="utf-8")
    if not _known(*args):
        return UNKNOWN
    if kind == "replace":
        original, old, new = args
        return str(original).replace(str(old), str(new))
    if kind == "to_lower":
        return str(args[0]).lower()
    if kind == "concat":
        if all(isinstance(a, list) for a in args):
            return [item for a in args for item in a]
        return "".join(str(a) for a in args)
    if kind == "flatten":
        (lists,) = args
        return [item for inner in lists for item in inner]
    if kind == "contains":
        container, item = args
        return item in container
    if kind == "length":
        return len(args[0])
    if kind == "empty":
        return not args[0]
    return UNKNOWN


def _operator(operator: dict[str, Any], scope: Scope) -> Any:
    kind, operands = operator["type"], operator["operands"]
    if kind == "property_accessor":
        value = evaluate(operands["operand_1"], scope)
        return _properties(value, operands["operand_2"])
    if kind == "index_accessor":
        value = evaluate(operands["operand_1"], scope)
        index = evaluate(operands["operand_2"], scope)
        if not _known(value, index) or not isinstance(value, dict | list):
            return UNKNOWN
        return value[index]  # a KeyError here fails the deployment too
    if kind == "conditional":
        condition = evaluate(operands["condition"], scope)
        if not isinstance(condition, bool):
            return UNKNOWN
        return evaluate(operands["true_value" if condition else "false_value"], scope)
    if kind in ("equals", "not_equals"):
        left, right = (evaluate(operands[k], scope) for k in ("operand_1", "operand_2"))
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        return (left == right) is (kind == "equals")
    if kind in ("and", "or"):
        left, right = (evaluate(operands[k], scope) for k in ("operand_1", "operand_2"))
        if not isinstance(left, bool) or not isinstance(right, bool):
            raise MisparsedError(f"{kind} of {left!r} and {right!r}: {MisparsedError.__doc__}")
        return (left and right) if kind == "and" else (left or right)
    if kind == "not":
        value = evaluate(operands["bool_value"], scope)
        return (not value) if isinstance(value, bool) else UNKNOWN
    return UNKNOWN


def _properties(value: Any, accessor: Any) -> Any:
    """``value.a`` or ``value.a.b...`` (pycep nests a chain to the right)."""
    if isinstance(accessor, dict) and accessor.get("operator", {}).get("type") == (
        "property_accessor"
    ):
        inner = accessor["operator"]["operands"]
        return _properties(_properties(value, inner["operand_1"]), inner["operand_2"])
    if not isinstance(accessor, str):
        raise MisparsedError(f"property {accessor!r}: {MisparsedError.__doc__}")
    if not isinstance(value, dict):
        return UNKNOWN
    if accessor not in value:
        raise KeyError(f"no property {accessor!r} in {sorted(value)}")
    return value[accessor]


# --- the deployment's agents -------------------------------------------------

FUNCTION_APP = INFRA / "app" / "function-app.bicep"
AGENTS_JSON = INFRA / "agents.json"
REGENERATE = "python -m admin agents-json --write"
#: The function app's parameters that carry the agents (main.bicep passes them on).
AGENT_PARAMS = ("agents", "agentUrls", "agentApiKeySecretUris")


def agents_json() -> list[dict[str, Any]]:
    return list(load_json(AGENTS_JSON)["agents"])


def function_app_scope(**params: Any) -> Scope:
    """function-app.bicep with the agent parameters main.bicep passes (``params``
    override them); its other parameters stay unbound, so they read as their names."""
    passed = Scope(MAIN).module_params("functionApp")
    given = {name: passed[name] for name in AGENT_PARAMS if name in passed}
    return Scope(FUNCTION_APP, {**given, **params})


def app_settings(scope: Scope) -> list[dict[str, Any]]:
    """The app settings the Function App in ``scope.path`` gets (evaluated)."""
    sites = resources_of_type(scope.tree, "Microsoft.Web/sites").values()
    settings: list[dict[str, Any]] = []
    for site in sites:
        expr = body(site).get("properties", {}).get("siteConfig", {}).get("appSettings", [])
        value = evaluate(expr, scope)
        assert isinstance(value, list), f"{rel(scope.path)}: appSettings is {value!r}"
        settings += value
    return settings


def client_id_setting() -> str:
    """agents/auth.py's CLIENT_ID_SETTING (read from the source: the agents' modules need
    the app's packages, which this venv lacks): the setting naming the user-assigned
    identity an EntraToken agent takes its tokens from."""
    tree = ast.parse((REPO / "agents" / "auth.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "CLIENT_ID_SETTING"
            and isinstance(node.value, ast.Constant)
        ):
            return str(node.value.value)
    raise AssertionError("agents/auth.py no longer defines CLIENT_ID_SETTING")
