"""Find the functions a v2-model ``function_app.py`` declares, from their bindings, as the
host indexes them: the module's one ``FunctionApp``, its ``get_functions()``, and each
function's binding JSON (what deploys). What devhost cannot run as Azure would is refused
up front, with the function and binding named, rather than silently skipped.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import azure.functions as func

from config.settings import function_disabled
from devhost.settings import ConfigError, resolve_binding

QUEUE = "queueTrigger"
TIMER = "timerTrigger"
HTTP = "httpTrigger"
SERVICE_BUS = "serviceBusTrigger"
SUPPORTED_TRIGGERS = (QUEUE, TIMER, HTTP, SERVICE_BUS)
QUEUE_OUTPUT = "queue"  # the one output binding devhost delivers (DevHost.deliver)


class UnsupportedFunction(ConfigError):
    """A function uses a binding or option devhost does not run."""


@dataclass(frozen=True)
class FunctionSpec:
    """One function as devhost runs it: its trigger binding (``%NAME%`` resolved), its
    callable, and its Storage queue output bindings by name (resolved too)."""

    name: str
    trigger_type: str
    trigger: Mapping[str, Any]
    func: Callable[..., Any]
    outputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def trigger_arg(self) -> str:
        return str(self.trigger["name"])


def load_module(module_name: str, root: str) -> ModuleType:
    """Import the app module with ``root`` (the app folder) first on ``sys.path``."""
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:
            hint = "run devhost from the app folder or pass --app"
            raise ConfigError(f"no module {module_name!r} in {root}: {hint}") from error
        raise


def find_app(module: ModuleType) -> func.FunctionRegister:
    """The module's single FunctionApp (the Python worker refuses zero or several)."""
    apps = [value for value in vars(module).values() if isinstance(value, func.FunctionRegister)]
    if len(apps) != 1:
        found = f"{len(apps)} FunctionApp objects" if apps else "no azure.functions.FunctionApp"
        raise ConfigError(f"module {module.__name__!r} defines {found}; the host takes exactly one")
    return apps[0]


def select(
    functions: Iterable[func.Function],
    only: set[str],
    exclude: set[str],
    environ: Mapping[str, str] | None = None,
) -> list[func.Function]:
    """Apply --only / --exclude and the ``AzureWebJobs.<name>.Disabled`` settings (true or
    1, as the host reads them); an unknown name is an error, not a silent no-op."""
    named = {str(fn.get_function_name()): fn for fn in functions}
    if unknown := sorted((only | exclude) - set(named)):
        have = ", ".join(sorted(named))
        raise ConfigError(f"unknown function name(s) {', '.join(unknown)}; the app has {have}")
    skip = exclude | {name for name in named if function_disabled(environ or {}, name)}
    return [fn for name, fn in named.items() if (not only or name in only) and name not in skip]


def build_spec(fn: func.Function, environ: Mapping[str, str]) -> FunctionSpec:
    """The :class:`FunctionSpec` of ``fn``; raises if devhost cannot run it as Azure would."""
    name = str(fn.get_function_name())
    # The JSON text, not get_dict_repr(): that one holds enums rather than what deploys.
    bindings: list[dict[str, Any]] = json.loads(fn.get_function_json())["bindings"]
    triggers = [b for b in bindings if str(b.get("type", "")).endswith("Trigger")]
    if len(triggers) != 1:
        raise UnsupportedFunction(f"function {name!r} has {len(triggers)} triggers; expected one")
    trigger, outputs = triggers[0], {}
    kind = str(trigger["type"])
    if kind not in SUPPORTED_TRIGGERS:
        raise UnsupportedFunction(
            f"function {name!r}: trigger binding {trigger.get('name')!r} of type {kind!r} is not "
            f"supported by devhost ({', '.join(SUPPORTED_TRIGGERS)}): --exclude {name}"
        )
    for binding in bindings:
        if binding is trigger or (kind == HTTP and binding.get("name") == "$return"):
            continue
        if binding.get("type") == QUEUE_OUTPUT and str(binding.get("direction")).lower() == "out":
            where = f"function {name!r} binding {binding.get('name')!r}"
            if binding.get("name") == "$return" or not binding.get("queueName"):
                raise UnsupportedFunction(
                    f"{where}: devhost delivers a Storage queue output binding set through "
                    "a named func.Out parameter with a queueName"
                )
            outputs[str(binding["name"])] = resolve_binding(binding, environ, where)
            continue
        raise UnsupportedFunction(
            f"function {name!r}: binding {binding.get('name')!r} of type {binding.get('type')!r} "
            f"(direction {binding.get('direction')}) is not supported by devhost, which runs "
            "queue, timer, HTTP and Service Bus triggers and Storage queue output bindings: use "
            f"the SDK in the function instead, or --exclude {name}"
        )
    if kind == SERVICE_BUS and (
        trigger.get("isSessionsEnabled")
        or str(trigger.get("cardinality", "one")).lower() == "many"
        or not trigger.get("queueName")
    ):
        raise UnsupportedFunction(
            f"function {name!r}: devhost runs Service Bus queue triggers, one message per "
            "invocation (no topics, isSessionsEnabled or cardinality 'many')"
        )
    user_function = fn.get_user_function()
    parameters = list(inspect.signature(user_function).parameters)
    if sorted(parameters) != sorted([trigger["name"], *outputs]):
        raise UnsupportedFunction(
            f"function {name!r}: its parameters ({', '.join(parameters)}) must be just the "
            f"trigger's {trigger['name']!r} and its output bindings"
        )
    resolved = resolve_binding(trigger, environ, f"function {name!r} binding {trigger['name']!r}")
    return FunctionSpec(name, kind, resolved, user_function, outputs)
