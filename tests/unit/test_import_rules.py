"""The architecture's import rules, checked on the source (every import, also those
inside functions):

- ``core`` imports nothing of the app, and no Azure SDK: only ``core``, the standard
  library and pydantic (validation, no I/O); it imports no ``os`` and reads no
  environment: it is handed values (the settings read the environment once);
- ``config`` (the settings, who may do what) imports only ``core``; ``dashboard`` (the
  dashboard's figures and its store port) only ``core``; neither is imported by ``core``
  or ``observability``, and the scheduler and the agents know nothing of the dashboard;
- ``agents`` never import ``stores`` (an agent knows the remote, not the state);
- no role imports another: the scheduler, the agents, the supervisor and the operator
  (``admin`` and its console) meet only in ``core`` ports, ``messaging`` and ``stores``
  adapters, and the composition root (``bootstrap``), which wires them;
- ``bootstrap`` is the top: only the entry points (trigger modules, the CLI,
  ``function_app.py``) import it, and only they (with the local hosts and the tests)
  reach the process's app (``bootstrap.process``: ``uses``, ``app_context``): every
  module below the triggers is handed what it uses; ``observability`` (logs, metrics,
  traces, failpoints) is the bottom: it imports nothing of the app but ``core``;
- the console is a second face of the operator's use cases: it reads and acts through
  ``admin``'s services, never a store, and no blueprint (``*/triggers.py``) imports
  another.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = (
    "core",
    "config",
    "dashboard",
    "observability",
    "stores",
    "messaging",
    "bootstrap",
    "scheduler",
    "agents",
    "supervisor",
    "admin",
    "console",
)
#: The entry points: what the host or a person calls; the only modules that use bootstrap.
ENTRY_POINTS = frozenset(
    {
        "function_app.py",
        "scheduler/triggers.py",
        "agents/triggers.py",
        "supervisor/triggers.py",
        "admin/triggers.py",
        "admin/__main__.py",
        "console/triggers.py",
    }
)
#: The process's app and its accessors (``bootstrap/process.py``).
ACCESSORS = frozenset({"uses", "app_context", "current_app_context", "reset_app_context"})
#: Who may reach the process's app: the entry points (every ``*/triggers.py``), the local
#: hosts and the tests; ``bootstrap/`` is where it lives.
MAY_REACH_THE_APP = ENTRY_POINTS | {"devhost/", "demo/", "tests/", "bootstrap/"}


def may_reach_the_app(path: Path) -> bool:
    where = str(path.relative_to(ROOT))
    return path.name == "triggers.py" or where.startswith(tuple(MAY_REACH_THE_APP))


ROLES = {"scheduler": "scheduler", "agents": "agents", "supervisor": "supervisor"}
ROLES |= {"admin": "operator", "console": "operator"}
#: Third-party packages core may use (typed, no I/O).
CORE_MAY_IMPORT = frozenset({"pydantic"})


def imports_of(path: Path) -> set[str]:
    """The top-level package of every module ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def accessors_of(path: Path) -> set[str]:
    """What ``path`` imports of the process's app: ``bootstrap.process``, or an accessor
    by name from ``bootstrap``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name == "bootstrap.process"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == "bootstrap.process":
                found.add(node.module)
            elif node.module == "bootstrap":
                found |= {a.name for a in node.names if a.name in ACCESSORS | {"process"}}
    return found


def every_module() -> list[Path]:
    """Every Python module of the repository but the environments'."""
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not {".venv", ".venv-iac", "node_modules"} & set(p.relative_to(ROOT).parts)
    )


def modules(package: str) -> list[Path]:
    found = sorted((ROOT / package).rglob("*.py"))
    assert found, f"no modules in {package}/"
    return found


def local_packages() -> set[str]:
    return {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} | {"function_app"}


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_core_imports_only_core_the_standard_library_and_pydantic(path: Path) -> None:
    allowed = {"core", "__future__"} | set(sys.stdlib_module_names) | CORE_MAY_IMPORT
    assert imports_of(path) - allowed == set()


#: What reads the process's environment (``os.environ``, ``os.getenv``, ``os.putenv``).
ENVIRONMENT_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def environment_reads(path: Path) -> set[str]:
    """``os`` imported, and every name of the environment's API ``path`` uses."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = {"os"} & imports_of(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES:
            found.add(node.attr)
        elif isinstance(node, ast.Name) and node.id in ENVIRONMENT_NAMES:
            found.add(node.id)
        elif isinstance(node, ast.alias) and node.name.split(".")[-1] in ENVIRONMENT_NAMES:
            found.add(node.name)
    return found


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_core_reads_no_environment(path: Path) -> None:
    """The settings read the environment once (``config.settings``) and the composition
    root hands core what it needs (the declarations module, the app's host name)."""
    assert environment_reads(path) == set(), f"core/{path.name} reads the environment"


def test_the_rules_see_the_environment_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from os import environ\nimport os\nos.getenv('X')\n")
    assert environment_reads(sample) == {"os", "environ", "getenv"}


#: The layers beside core, what of the app each imports, and who never imports it.
BESIDE_CORE = {"config": {"core"}, "dashboard": {"core"}}
NEVER_IMPORTED_BY = {
    "config": {"core", "observability", "dashboard"},
    "dashboard": {"core", "config", "observability", "scheduler", "agents"},
}


@pytest.mark.parametrize(
    "path", [p for package in BESIDE_CORE for p in modules(package)], ids=lambda p: str(p.name)
)
def test_config_and_the_dashboard_import_only_core(path: Path) -> None:
    package = path.relative_to(ROOT).parts[0]
    app = local_packages() - BESIDE_CORE[package] - {package}
    assert imports_of(path) & app == set(), f"{package}/{path.name} reaches above core"


@pytest.mark.parametrize(
    "path",
    [p for package in APP for p in modules(package)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_config_and_the_dashboard_are_imported_only_from_above(path: Path) -> None:
    mine = path.relative_to(ROOT).parts[0]
    wrong = {layer for layer, never in NEVER_IMPORTED_BY.items() if mine in never}
    assert imports_of(path) & wrong == set(), f"{path.relative_to(ROOT)} imports {wrong}"


#: The domain's rooms stay small enough to read whole (docs/design.md).
CORE_MAX_LINES = 600


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_no_module_of_core_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= CORE_MAX_LINES, f"{path.name} has {lines} lines"


#: devhost imitates each thing of the Functions host once (issue 43), and stays this small
#: (2000, and 20 more since it layers ``AzureFunctionsJobHost__`` settings over host.json).
DEVHOST_MAX_LINES = 2020


def test_devhost_is_at_most_2020_lines() -> None:
    counts = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in modules("devhost")}
    assert sum(counts.values()) <= DEVHOST_MAX_LINES, sorted(counts.items(), key=lambda c: -c[1])


def test_the_order_is_no_class_hierarchy() -> None:
    """The aggregate by composition (§3.15): ``Order`` derives from nothing of the app's."""
    tree = ast.parse((ROOT / "core" / "model.py").read_text(encoding="utf-8"))
    [order] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Order"]
    assert order.bases == [], [ast.unparse(b) for b in order.bases]


@pytest.mark.parametrize("path", modules("agents"), ids=lambda p: p.name)
def test_agents_never_import_stores(path: Path) -> None:
    assert "stores" not in imports_of(path)


@pytest.mark.parametrize(
    "path", [p for package in ROLES for p in modules(package)], ids=lambda p: str(p.parent.name)
)
def test_no_role_imports_another(path: Path) -> None:
    mine = ROLES[path.relative_to(ROOT).parts[0]]
    others = {package for package, role in ROLES.items() if role != mine}
    assert imports_of(path) & others == set(), f"{path.relative_to(ROOT)} reaches into a role"


def test_the_rules_see_imports_inside_functions(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f():\n    from scheduler.service import Scheduler\n    import stores.tables\n"
    )
    assert imports_of(sample) == {"scheduler", "stores"}


@pytest.mark.parametrize(
    "path", [p for package in APP for p in modules(package)], ids=lambda p: str(p.name)
)
def test_only_entry_points_use_the_bootstrap(path: Path) -> None:
    where = str(path.relative_to(ROOT))
    if where in ENTRY_POINTS or where.startswith("bootstrap/"):
        return
    assert "bootstrap" not in imports_of(path), f"{where} reaches for the composition root"


@pytest.mark.parametrize(
    "path",
    [p for p in every_module() if not may_reach_the_app(p)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_only_the_entry_points_reach_the_process_app(path: Path) -> None:
    """Services, pages, views, stores and ``core`` are handed what they use: only the
    trigger modules, ``function_app.py``, the CLI, the local hosts and the tests ask the
    process's app for a part (``bootstrap.uses``)."""
    assert accessors_of(path) == set(), f"{path.relative_to(ROOT)} reaches for the app"


def test_the_rules_see_an_accessor_imported_by_name(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from bootstrap import AppContext, uses\nimport bootstrap.process\n")
    assert accessors_of(sample) == {"uses", "bootstrap.process"}


@pytest.mark.parametrize("path", modules("console"), ids=lambda p: p.name)
def test_the_console_goes_through_the_operator_services_never_a_store(path: Path) -> None:
    assert "stores" not in imports_of(path), f"console/{path.name} reads a store"


def blueprint_imports(path: Path) -> set[str]:
    """The trigger modules (``<package>.triggers``) ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.endswith(".triggers")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.endswith(".triggers"):
                found.add(node.module)
            else:
                found |= {f"{node.module}.{a.name}" for a in node.names if a.name == "triggers"}
    return found


@pytest.mark.parametrize(
    "path",
    [p for package in APP for p in modules(package) if "function_app" not in p.name],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_module_of_the_app_imports_a_blueprint(path: Path) -> None:
    """What two blueprints both need lives in a module both import (``admin/callers.py``):
    only ``function_app.py`` imports the trigger modules."""
    assert blueprint_imports(path) == set(), f"{path.relative_to(ROOT)} imports a blueprint"


def test_the_rules_see_a_blueprint_imported(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from admin.triggers import caller\nfrom console import triggers\n")
    assert blueprint_imports(sample) == {"admin.triggers", "console.triggers"}


@pytest.mark.parametrize("path", modules("observability"), ids=lambda p: p.name)
def test_observability_imports_nothing_of_the_app_but_core(path: Path) -> None:
    app = local_packages() - {"core", "observability"}
    assert imports_of(path) & app == set()


@pytest.mark.parametrize("path", modules("hostrun"), ids=lambda p: p.name)
def test_hostrun_drives_the_runtime_and_knows_nothing_of_devhost(path: Path) -> None:
    """One direction: devhost (the local host) uses hostrun (the runtime's driver)."""
    assert "devhost" not in imports_of(path)


def test_every_app_package_is_covered_by_a_rule() -> None:
    ruled = set(ROLES) | {"core", "observability", "stores", "messaging", "bootstrap"}
    ruled |= set(BESIDE_CORE)
    assert set(APP) <= ruled <= local_packages()
    assert not (ROOT / "runtime").exists(), "runtime/ was split: bootstrap/ and observability/"
    moved = ("settings.py", "principals.py", "figures.py")
    assert not [m for m in moved if (ROOT / "core" / m).exists()], "core/ is the domain"
