"""function_app.py through the Functions worker's own indexer (azure-functions-runtime).

``app.get_functions()`` accepts things the worker refuses at start-up: a
trigger parameter annotated with the wrong type, a parameter no binding
names, two FunctionApp objects. This runs the worker's ``Registry`` over every
function, for both agent transports, as the host would at start-up. Needs
Python 3.13 (``make index-check`` builds its venv); elsewhere it skips, but
under ``make index-check`` (INDEX_CHECK_REQUIRED=1) a missing runtime fails.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace
from typing import Any

import pytest

if not os.environ.get("INDEX_CHECK_REQUIRED"):
    pytest.importorskip(
        "azure_functions_runtime",
        reason="needs azure-functions-runtime (Python 3.13): run `make index-check`",
    )
from azure_functions_runtime.bindings import meta
from azure_functions_runtime.functions import FunctionLoadError, Registry

# The worker passes its gRPC protos; the indexer only reads these constants.
PROTOS = SimpleNamespace(
    BindingInfo=SimpleNamespace(**{"in": 0, "out": 1, "inout": 2, "undefined": 0})
)
#: The functions the architecture names. The app may declare more (poison and dead-letter
#: alert triggers, for instance); those must index too: index() raises on any that does not.
CORE_FUNCTIONS = frozenset(
    {
        "submit_order",
        "dispatch_order",
        "handle_agent_reply",
        "scheduler_sweep",
        "run_agent_orders",
        "supervise",
        "get_order",
        "list_orders",
        "resubmit_order",
        "cancel_order",
    }
)
APP_MODULES = (
    "function_app",
    "scheduler.triggers",
    "agents.triggers",
    "supervisor.triggers",
    "admin.triggers",
)


def index(module_name: str) -> list[Any]:
    meta.load_binding_registry()
    module = importlib.import_module(module_name)
    registry = Registry()
    return [registry.add_indexed_function(fn, PROTOS) for fn in module.app.get_functions()]


@pytest.mark.parametrize("transport", ["servicebus", "storage"])
def test_every_function_indexes(transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_TRANSPORT", transport)
    for name in APP_MODULES:
        sys.modules.pop(name, None)  # the transport is read when the blueprints are built
    infos = index("function_app")
    names = [info.name for info in infos]
    assert len(names) == len(set(names)), f"function names declared twice: {sorted(names)}"
    missing = CORE_FUNCTIONS - set(names)
    assert not missing, f"function_app.py does not declare {sorted(missing)}"
    # The agents wait on the network, and the alert triggers come two per agent: the worker
    # awaits them on its event loop, never on its thread pool (agents/triggers.py,
    # supervisor/triggers.py); every other function is synchronous.
    run_async = {info.name for info in infos if info.is_async}
    agents = {name for name in names if name.startswith("run_agent_")}
    alerts = {name for name in names if name.startswith("alert_")}
    assert agents and alerts and run_async == agents | alerts, sorted(run_async ^ agents)


def test_the_indexer_refuses_a_mistyped_trigger(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    (tmp_path / "bad_app.py").write_text(
        "import azure.functions as func\n"
        "app = func.FunctionApp()\n"
        "@app.queue_trigger(arg_name='msg', queue_name='q', connection='AzureWebJobsStorage')\n"
        "def wrong(msg: func.HttpRequest) -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FunctionLoadError):
        index("bad_app")
