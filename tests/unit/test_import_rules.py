"""The architecture's import rules, checked on the source (every import, also those
inside functions):

- ``core`` imports nothing of the app, and no Azure SDK: only ``core``, the standard
  library and pydantic (validation, no I/O);
- ``agents`` never import ``stores`` (an agent knows the remote, not the state);
- no role imports another: the scheduler, the agents, the supervisor and the operator
  (``admin`` and its console) meet only in ``core`` ports, ``messaging`` and ``stores``
  adapters, and the composition root (``bootstrap``), which wires them;
- ``bootstrap`` is the top: only the entry points (trigger modules, the CLI, the
  console's pages, ``function_app.py``) import it; ``observability`` (logs, metrics,
  traces, failpoints) is the bottom: it imports nothing of the app but ``core``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = (
    "core",
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
        "console/pages.py",
        "console/inbox.py",
    }
)
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


#: The domain's rooms stay small enough to read whole (docs/design.md).
CORE_MAX_LINES = 600


@pytest.mark.parametrize("path", modules("core"), ids=lambda p: p.name)
def test_no_module_of_core_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= CORE_MAX_LINES, f"{path.name} has {lines} lines"


#: devhost imitates each thing of the Functions host once (issue 43), and stays this small.
DEVHOST_MAX_LINES = 2000


def test_devhost_is_at_most_2000_lines() -> None:
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
    assert set(APP) <= ruled <= local_packages()
    assert not (ROOT / "runtime").exists(), "runtime/ was split: bootstrap/ and observability/"
