"""The app uses the SDKs through their public API only.

A static scan (``ast``) of every module of the app (everything but ``tests/``, ``bench/``,
virtual environments and ``node_modules``) for two things an SDK upgrade can silently
break:

- **a private name** of azure-*, requests, urllib3, ``http.client`` or ``email``: an import
  of a module or name with a ``_``-prefixed component (dunders such as ``__version__``
  are not private), or a ``_``-prefixed attribute read from such a module, class or
  object (also through ``getattr``/``hasattr`` with a literal name, and
  ``importlib.import_module`` / ``__import__`` of a private module);
- **an assignment into an SDK module or class**: ``module.name = ...``,
  ``Class.method = ...``, ``del``, augmented assignment, ``setattr``/``delattr``, and
  ``unittest.mock.patch`` / ``patch.object`` aimed at them.

What the scan follows: names bound by imports (also inside functions and under
``TYPE_CHECKING``), values computed from them (``x = TableClient(...)``, ``for m in
(mod_a, mod_b)``, ``with ... as x``), parameters, variables and ``self`` attributes
annotated with an SDK type, and the attributes an app class inherits from an SDK base
class (looked up on the installed SDK, so a subclass reading its base's private state
is caught). What it cannot see: an SDK object that reaches a function with no annotation
from another module (``client = make_client(); client._config``). Annotate such values;
the scan then sees them.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The SDKs whose private names the app may not use (``http`` only as ``http.client``).
SDK_ROOTS = ("azure", "requests", "urllib3", "http.client", "email")
#: Folders that are not the app (tests and benchmarks may look inside the SDKs).
NOT_APP = frozenset({"tests", "bench", "node_modules", "__pycache__"})


def is_sdk(dotted: str) -> bool:
    return any(dotted == root or dotted.startswith(root + ".") for root in SDK_ROOTS)


def is_private(name: str) -> bool:
    """``_x`` and ``__x`` are private; a dunder (``__version__``) is not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def app_modules(root: Path = ROOT) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] in NOT_APP or any(p.startswith(".") or p in NOT_APP for p in parts[:-1]):
            continue
        found.append(path)
    return found


@dataclass(frozen=True)
class Ref:
    """What an expression is, as far as the scan can tell: the dotted path it came from
    (``azure.data.tables.TableClient``), and whether it is the module, class or function
    itself (``static``: reached through imports) or an object made from one."""

    origin: str
    static: bool

    def attr(self, name: str) -> Ref:
        return Ref(f"{self.origin}.{name}", self.static)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str  # "private" or "assignment"
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.text}"


@dataclass
class Scope:
    names: dict[str, Ref] = field(default_factory=dict)
    parent: Scope | None = None
    #: ``self.<attr>`` bindings of the enclosing class, shared by its methods
    instance: dict[str, Ref] | None = None
    #: the SDK base classes of the enclosing class (their private attributes are the SDK's)
    bases: tuple[str, ...] = ()

    def lookup(self, name: str) -> Ref | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return None


class Scanner(ast.NodeVisitor):
    """Two passes per scope: bind the names (flow-insensitive), then check every use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.findings: list[Finding] = []

    # --- resolution ---------------------------------------------------------------------

    def resolve(self, node: ast.AST, scope: Scope) -> Ref | None:
        if isinstance(node, ast.Name):
            return scope.lookup(node.id)
        if isinstance(node, ast.Attribute):
            if (
                isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and scope.instance is not None
                and node.attr in scope.instance
            ):
                return scope.instance[node.attr]
            base = self.resolve(node.value, scope)
            return base.attr(node.attr) if base is not None else None
        if isinstance(node, ast.Call):
            func = self.resolve(node.func, scope)
            return Ref(func.origin + "()", static=False) if func is not None else None
        if isinstance(node, ast.Subscript | ast.Starred | ast.Await):
            inner = self.resolve(node.value, scope)
            return Ref(inner.origin + "[]", static=False) if inner is not None else None
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            for element in node.elts:  # ``for m in (mod_a, mod_b)``: any SDK element
                found = self.resolve(element, scope)
                if found is not None and is_sdk(found.origin):
                    return found
        return None

    def annotated(self, annotation: ast.AST | None, scope: Scope) -> Ref | None:
        """An object of the SDK type an annotation names (``TableClient | None`` too)."""
        if annotation is None:
            return None
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        for node in ast.walk(annotation):
            if isinstance(node, ast.Name | ast.Attribute):
                found = self.resolve(node, scope)
                if found is not None and is_sdk(found.origin):
                    return Ref(found.origin + "()", static=False)
        return None

    # --- binding ------------------------------------------------------------------------

    def bind_imports(self, node: ast.AST, scope: Scope, *, report: bool = False) -> None:
        """Bind the names an import makes; with ``report``, flag a private import."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    scope.names[alias.asname] = Ref(alias.name, static=True)
                else:
                    top = alias.name.split(".")[0]
                    scope.names[top] = Ref(top, static=True)
                private = any(map(is_private, alias.name.split(".")))
                if report and is_sdk(alias.name) and private:
                    self.flag(node, "private", f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module_private = any(map(is_private, node.module.split(".")))
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                scope.names[alias.asname or alias.name] = Ref(full, static=True)
                private = module_private or is_private(alias.name)
                if report and is_sdk(full) and private:
                    self.flag(node, "private", f"from {node.module} import {alias.name}")

    def bind_targets(self, target: ast.AST, ref: Ref | None, scope: Scope) -> None:
        if ref is None or not is_sdk(ref.origin):
            return
        if isinstance(target, ast.Name):
            scope.names[target.id] = ref
        elif (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and scope.instance is not None
        ):
            scope.instance[target.attr] = ref

    def bind(self, body: list[ast.stmt], scope: Scope) -> None:
        """Every binding in ``body``, not descending into nested functions and classes."""
        for _ in range(2):  # twice: a binding may use one made further down
            for node in _walk_scope(body):
                self.bind_imports(node, scope)
                if isinstance(node, ast.Assign):
                    ref = self.resolve(node.value, scope)
                    for target in node.targets:
                        self.bind_targets(target, ref, scope)
                elif isinstance(node, ast.AnnAssign):
                    ref = self.annotated(node.annotation, scope)
                    if ref is None and node.value is not None:
                        ref = self.resolve(node.value, scope)
                    self.bind_targets(node.target, ref, scope)
                elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
                    found = self.resolve(node.iter, scope)
                    if found is not None and isinstance(node.iter, ast.Tuple | ast.List):
                        self.bind_targets(node.target, found, scope)
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    found = self.resolve(node.context_expr, scope)
                    if found is not None:
                        found = Ref(found.origin + "()", static=False)
                    self.bind_targets(node.optional_vars, found, scope)
                elif isinstance(node, ast.NamedExpr):
                    self.bind_targets(node.target, self.resolve(node.value, scope), scope)

    # --- checking -----------------------------------------------------------------------

    def flag(self, node: ast.AST, kind: str, text: str) -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), kind, text))

    def check(self, body: list[ast.stmt], scope: Scope) -> None:
        for node in _walk_scope(body):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self.bind_imports(node, Scope(), report=True)
            elif isinstance(node, ast.Attribute):
                self.check_attribute(node, scope)
            elif isinstance(node, ast.Call):
                self.check_call(node, scope)
            elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
                targets = (
                    node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
                )
                for target in targets:
                    for each in _flatten(target):
                        self.check_target(each, scope)

    def check_attribute(self, node: ast.Attribute, scope: Scope) -> None:
        if not is_private(node.attr):
            return
        if isinstance(node.value, ast.Name) and node.value.id == "self" and scope.bases:
            base = _sdk_base_with(scope.bases, node.attr)
            if base is not None:
                self.flag(node, "private", f"self.{node.attr} (inherited from {base})")
            return
        base_ref = self.resolve(node.value, scope)
        if base_ref is not None and is_sdk(base_ref.origin):
            self.flag(node, "private", f"{base_ref.origin}.{node.attr}")

    def check_target(self, target: ast.AST, scope: Scope) -> None:
        if isinstance(target, ast.Attribute | ast.Subscript):
            owner = self.resolve(target.value, scope)
            if owner is not None and owner.static and is_sdk(owner.origin):
                what = target.attr if isinstance(target, ast.Attribute) else "[...]"
                self.flag(target, "assignment", f"{owner.origin}.{what}")

    def check_call(self, node: ast.Call, scope: Scope) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        first = node.args[0] if node.args else None
        literal = (
            node.args[1].value
            if len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            else None
        )
        owner = self.resolve(first, scope) if first is not None else None
        if owner is not None and is_sdk(owner.origin):
            if name in ("getattr", "hasattr") and literal and is_private(literal):
                self.flag(node, "private", f"{name}({owner.origin}, {literal!r})")
            if name in ("setattr", "delattr", "object") and owner.static:
                # ``object``: ``patch.object(Class, "name", ...)``
                self.flag(node, "assignment", f"{name}({owner.origin}, {literal!r})")
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            text = first.value
            dynamic = name in ("import_module", "__import__") and is_sdk(text)
            if dynamic and any(map(is_private, text.split("."))):
                self.flag(node, "private", f"{name}({text!r})")
            if name == "patch" and is_sdk(text):
                self.flag(node, "assignment", f"patch({text!r})")

    # --- scopes -------------------------------------------------------------------------

    def scan(self, tree: ast.Module) -> list[Finding]:
        module = Scope()
        self.scope_body(tree.body, module)
        return self.findings

    def scope_body(self, body: list[ast.stmt], scope: Scope) -> None:
        self.bind(body, scope)
        self.check(body, scope)
        for node in _walk_scope(body, inner=True):
            if isinstance(node, ast.ClassDef):
                self.scope_class(node, scope)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self.scope_function(node, scope)

    def scope_class(self, node: ast.ClassDef, scope: Scope) -> None:
        bases = []
        for base in node.bases:
            found = self.resolve(base, scope)
            if found is not None and found.static and is_sdk(found.origin):
                bases.append(found.origin)
        inner = Scope(parent=scope, instance={}, bases=tuple(bases))
        # The class body's names are not visible in its methods, but its ``self.x``
        # bindings are: bind every method first, then check.
        methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for method in methods:
            self.bind(method.body, self.function_scope(method, inner))
        self.bind(node.body, inner)
        self.check(node.body, inner)
        for child in _walk_scope(node.body, inner=True):
            if isinstance(child, ast.ClassDef):
                self.scope_class(child, scope)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self.scope_function(child, inner)

    def function_scope(self, node: ast.AST, scope: Scope) -> Scope:
        class_scope = scope if scope.instance is not None else None
        inner = Scope(
            parent=scope,
            instance=class_scope.instance if class_scope else None,
            bases=class_scope.bases if class_scope else (),
        )
        args = node.args  # type: ignore[attr-defined]
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        for arg in every:
            if arg is not None:
                ref = self.annotated(arg.annotation, scope)
                if ref is not None:
                    inner.names[arg.arg] = ref
        return inner

    def scope_function(self, node: ast.AST, scope: Scope) -> None:
        inner = self.function_scope(node, scope)
        for default in [*node.args.defaults, *node.args.kw_defaults]:  # type: ignore[attr-defined]
            if default is not None:
                self.check([ast.Expr(default)], scope)
        if isinstance(node, ast.Lambda):
            self.check([ast.Expr(node.body)], inner)
            return
        for decorator in node.decorator_list:  # type: ignore[attr-defined]
            self.check([ast.Expr(decorator)], scope)
        self.scope_body(node.body, inner)  # type: ignore[attr-defined]


def _walk_scope(body: list[ast.stmt], *, inner: bool = False) -> Iterator[ast.AST]:
    """Every node of ``body`` that belongs to this scope; with ``inner``, only the nested
    functions, lambdas and classes themselves (each is a scope of its own)."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, nested):
            if inner:
                yield node
            continue
        if not inner:
            yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _flatten(target: ast.AST) -> Iterator[ast.AST]:
    if isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _flatten(element)
    elif isinstance(target, ast.Starred):
        yield from _flatten(target.value)
    else:
        yield target


def _sdk_base_with(bases: tuple[str, ...], attr: str) -> str | None:
    """The SDK base class (dotted) that has ``attr``, looked up on the installed SDK."""
    for dotted in bases:
        module, _, name = dotted.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return dotted  # cannot look: say so rather than pass it
        if any(attr in vars(klass) for klass in getattr(cls, "__mro__", ())):
            return dotted
    return None


def scan_source(source: str, path: str = "<string>") -> list[Finding]:
    return Scanner(path).scan(ast.parse(source, filename=path))


def scan_app(root: Path = ROOT) -> list[Finding]:
    findings: list[Finding] = []
    for path in app_modules(root):
        findings += scan_source(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return findings


# --- the app ---------------------------------------------------------------------------


def test_the_app_names_no_private_sdk_name_and_assigns_into_no_sdk() -> None:
    findings = scan_app()
    assert [str(f) for f in findings] == []


def test_the_scan_covers_the_whole_app_and_nothing_else() -> None:
    scanned = {str(p.relative_to(ROOT)) for p in app_modules()}
    assert {"function_app.py", "stores/tables.py", "devhost/queues.py"} <= scanned
    assert "bootstrap/clients.py" in scanned and "hostrun/worker.py" in scanned
    assert not any(p.split("/")[0] in ("tests", "bench", ".venv") for p in scanned)


# --- planted examples: each must be found ------------------------------------------------

PLANTED_PRIVATE = {
    "a private module": "from azure.data.tables._serialize import _add_entity_properties",
    "a private name from a public module": "from azure.storage.queue import _version",
    "import of a private module": "import azure.core.pipeline._base",
    "import of a private module, aliased": "import urllib3._version as v",
    "an attribute of a module": "import http.client\nhttp.client._read_headers(fp)",
    "an attribute of an aliased module": "import email.parser as p\np._private",
    "an attribute of a class": "from requests import Session\nSession._x",
    "an instance's private state": (
        "from azure.data.tables import TableClient\n"
        "def f(table: TableClient):\n    return table._client._config.version\n"
    ),
    "an instance made here": (
        "from azure.data.tables import TableEntity\ne = TableEntity()\ne._metadata = {}\n"
    ),
    "a self attribute annotated with an SDK type": (
        "from azure.storage.queue import QueueClient\n"
        "class A:\n"
        "    def __init__(self, q: QueueClient):\n        self.q = q\n"
        "    def f(self):\n        return self.q._message_encode_policy\n"
    ),
    "getattr with a literal": (
        "from azure.storage.queue._generated import operations as o\n"
        "getattr(o, '_deserialize_xml')\n"
    ),
    "getattr on a public module": "import azure.core\ngetattr(azure.core, '_x')",
    "a dynamic import": "import importlib\nimportlib.import_module('azure.data.tables._deserialize')",
    "inside a function, under TYPE_CHECKING": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from azure.core.rest import HttpResponse\n"
        "def f(r: 'HttpResponse'):\n    return r._internal_response\n"
    ),
    "a subclass reading its SDK base's state": (
        "from azure.data.tables import TableEntity\n"
        "class E(TableEntity):\n    def m(self):\n        return self._metadata\n"
    ),
    "a loop over SDK modules": (
        "from azure.core import pipeline, rest\n"
        "for module in (pipeline, rest):\n    module._helper\n"
    ),
}

PLANTED_ASSIGNMENTS = {
    "a class's method replaced": (
        "from azure.storage.queue import QueueClient\nQueueClient.send_message = f"
    ),
    "through the module path": "import azure.storage.queue\nazure.storage.queue.QueueClient.x = 1",
    "a module's function replaced": "import http.client\nhttp.client.parse_headers = f",
    "a loop over SDK modules": (
        "from azure.core import pipeline, rest\n"
        "for module in (pipeline, rest):\n    module.helper = f\n"
    ),
    "setattr": "import urllib3\nsetattr(urllib3, 'PoolManager', P)",
    "del": "from requests import Session\ndel Session.request",
    "augmented": "import email\nemail.x += 1",
    "patch.object": (
        "from unittest import mock\nfrom azure.data.tables import TableClient\n"
        "mock.patch.object(TableClient, 'submit_transaction', f).start()\n"
    ),
    "patch by name": "from unittest.mock import patch\npatch('azure.core.pipeline.Pipeline.run', f)",
    "inside a method": (
        "class W:\n    def install(self):\n"
        "        from azure.storage.queue import QueueClient\n"
        "        QueueClient.send_message = self.wrapped\n"
    ),
}


@pytest.mark.parametrize("source", PLANTED_PRIVATE.values(), ids=PLANTED_PRIVATE.keys())
def test_a_planted_private_name_is_found(source: str) -> None:
    kinds = {f.kind for f in scan_source(source)}
    assert "private" in kinds, source


@pytest.mark.parametrize("source", PLANTED_ASSIGNMENTS.values(), ids=PLANTED_ASSIGNMENTS.keys())
def test_a_planted_assignment_is_found(source: str) -> None:
    kinds = {f.kind for f in scan_source(source)}
    assert "assignment" in kinds, source


ALLOWED = {
    "public names": (
        "from azure.data.tables import TableClient, EdmType, EntityProperty\n"
        "import azure.core\nv = azure.core.__version__\n"
        "def f(t: TableClient):\n    return t.table_name, t.submit_transaction([])\n"
    ),
    "an instance's public attribute set": (
        "import requests\ns = requests.Session()\ns.trust_env = False\n"
    ),
    "the app's own private names": (
        "class A:\n    def __init__(self):\n        self._client = None\n"
        "    def f(self):\n        return self._client._config\n"
    ),
    "an app subclass's own state": (
        "from azure.data.tables import TableEntity\n"
        "class E(TableEntity):\n    def m(self):\n        return self.__stored\n"
    ),
    "http, not http.client": "import http\nhttp._private_of_http_itself",
    "a dunder": "from azure.storage.queue import QueueClient\nQueueClient.send_message.__wrapped__",
    "a local name that shadows nothing": "_x = 1\nclass Q:\n    send_message = None\nQ.send_message = 2",
}


@pytest.mark.parametrize("source", ALLOWED.values(), ids=ALLOWED.keys())
def test_public_use_is_not_flagged(source: str) -> None:
    assert scan_source(source) == []
