"""Find the functions a v2-model ``function_app.py`` declares, from their bindings.

The host's own indexing is mirrored: the module holds exactly one ``FunctionApp``
(any ``FunctionRegister``), ``app.get_functions()`` lists its functions once, and each
function's binding JSON (what deploys) decides how devhost runs it. Anything devhost
cannot run as Azure would is refused up front, with the function and binding named,
rather than silently skipped.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import azure.functions as func

from devhost.settings import ConfigError, resolve_binding

QUEUE = "queueTrigger"
TIMER = "timerTrigger"
HTTP = "httpTrigger"
SERVICE_BUS = "serviceBusTrigger"
SUPPORTED_TRIGGERS = (QUEUE, TIMER, HTTP, SERVICE_BUS)
#: The parameter name the Python worker fills with the invocation context.
CONTEXT_PARAMETER = "context"


class UnsupportedFunction(ConfigError):
    """A function uses a binding or option devhost does not run."""


@dataclass(frozen=True)
class FunctionSpec:
    """One function as devhost runs it: its trigger binding (``%NAME%`` resolved) and callable."""

    name: str
    trigger_type: str
    trigger: Mapping[str, Any]
    func: Callable[..., Any]
    directory: str
    wants_context: bool = False
    #: Name of the HTTP output binding (``$return`` or a parameter) for HTTP triggers.
    http_output: str | None = None

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
            raise ConfigError(
                f"no module {module_name!r} in {root}: run devhost from the app folder "
                "or pass --app"
            ) from error
        raise


def find_app(module: ModuleType) -> func.FunctionRegister:
    """The module's single FunctionApp (the Python worker refuses zero or several)."""
    apps = [value for value in vars(module).values() if isinstance(value, func.FunctionRegister)]
    if not apps:
        raise ConfigError(f"module {module.__name__!r} defines no azure.functions.FunctionApp")
    if len(apps) > 1:
        raise ConfigError(
            f"module {module.__name__!r} defines {len(apps)} FunctionApp objects; "
            "the Functions host accepts exactly one"
        )
    return apps[0]


def select(
    functions: Iterable[func.Function], only: set[str], exclude: set[str]
) -> list[func.Function]:
    """Apply --only / --exclude; an unknown name is an error, not a silent no-op."""
    chosen = list(functions)
    names = {str(fn.get_function_name()) for fn in chosen}
    unknown = sorted((only | exclude) - names)
    if unknown:
        raise ConfigError(
            f"unknown function name(s) {', '.join(unknown)}; the app has {', '.join(sorted(names))}"
        )
    return [
        fn
        for fn in chosen
        if (not only or fn.get_function_name() in only) and fn.get_function_name() not in exclude
    ]


def build_specs(
    functions: Iterable[func.Function], environ: Mapping[str, str], directory: str
) -> list[FunctionSpec]:
    """A :class:`FunctionSpec` per function; raises on the first one devhost cannot run."""
    return [build_spec(fn, environ, directory) for fn in functions]


def build_spec(fn: func.Function, environ: Mapping[str, str], directory: str) -> FunctionSpec:
    name = str(fn.get_function_name())
    # The JSON text, not get_dict_repr(): that one holds enums rather than what deploys.
    bindings: list[dict[str, Any]] = json.loads(fn.get_function_json())["bindings"]
    triggers = [b for b in bindings if str(b.get("type", "")).endswith("Trigger")]
    if len(triggers) != 1:
        raise UnsupportedFunction(f"function {name!r} has {len(triggers)} triggers; expected one")
    trigger = triggers[0]
    trigger_type = str(trigger["type"])
    if trigger_type not in SUPPORTED_TRIGGERS:
        raise UnsupportedFunction(
            f"function {name!r}: trigger binding {trigger.get('name')!r} of type "
            f"{trigger_type!r} is not supported by devhost "
            f"(supported: {', '.join(SUPPORTED_TRIGGERS)}); exclude it with --exclude {name}"
        )
    http_output = None
    for binding in bindings:
        if binding is trigger:
            continue
        if trigger_type == HTTP and binding.get("type") == "http" and _is_out(binding):
            http_output = str(binding["name"])
            continue
        raise UnsupportedFunction(
            f"function {name!r}: binding {binding.get('name')!r} of type {binding.get('type')!r} "
            f"(direction {binding.get('direction')}) is not supported by devhost; it runs only "
            "queue, timer, HTTP and Service Bus triggers (plus the HTTP response), so use the SDK "
            f"in the function instead, or exclude it with --exclude {name}"
        )
    if trigger_type == SERVICE_BUS:
        _check_service_bus(name, trigger)
    user_function = fn.get_user_function()
    wants_context = _check_parameters(name, user_function, bindings)
    _check_annotation(name, user_function, trigger)
    resolved = resolve_binding(trigger, environ, f"function {name!r} binding {trigger['name']!r}")
    return FunctionSpec(
        name=name,
        trigger_type=trigger_type,
        trigger=resolved,
        func=user_function,
        directory=directory,
        wants_context=wants_context,
        http_output=http_output,
    )


def _is_out(binding: Mapping[str, Any]) -> bool:
    return str(binding.get("direction", "")).upper() == "OUT"


def _check_service_bus(name: str, trigger: Mapping[str, Any]) -> None:
    if trigger.get("isSessionsEnabled"):
        raise UnsupportedFunction(
            f"function {name!r}: binding {trigger['name']!r} has isSessionsEnabled; "
            "devhost does not run session receivers"
        )
    if str(trigger.get("cardinality", "one")).lower() == "many":
        raise UnsupportedFunction(
            f"function {name!r}: binding {trigger['name']!r} has cardinality 'many'; "
            "devhost delivers one message per invocation"
        )


def _check_parameters(
    name: str, user_function: Callable[..., Any], bindings: list[dict[str, Any]]
) -> bool:
    """Every parameter is bound and every bound name is a parameter, as the worker checks."""
    parameters = set(inspect.signature(user_function).parameters)
    bound = {str(b["name"]) for b in bindings if b.get("name") != "$return"}
    unbound = sorted(parameters - bound - {CONTEXT_PARAMETER})
    if unbound:
        raise UnsupportedFunction(
            f"function {name!r}: parameter(s) {', '.join(unbound)} have no binding"
        )
    missing = sorted(bound - parameters)
    if missing:
        raise UnsupportedFunction(
            f"function {name!r}: binding(s) {', '.join(missing)} have no parameter"
        )
    return CONTEXT_PARAMETER in parameters


def _check_annotation(
    name: str, user_function: Callable[..., Any], trigger: Mapping[str, Any]
) -> None:
    """The trigger parameter's annotation must fit what the trigger passes, as the worker
    checks (with the library's own converters): e.g. a queue trigger takes a QueueMessage."""
    try:
        hints = typing.get_type_hints(user_function)
    except Exception:  # noqa: BLE001 - unresolvable annotations: the worker decides, not us
        return
    annotation = hints.get(str(trigger["name"]))
    converter = func.get_binding_registry().get(str(trigger["type"]))
    if annotation is None or converter is None or not isinstance(annotation, type):
        return
    if not converter.check_input_type_annotation(annotation):
        raise UnsupportedFunction(
            f"function {name!r}: parameter {trigger['name']!r} is annotated "
            f"{annotation.__name__}, which a {trigger['type']} cannot pass (the Functions "
            "worker refuses this function too)"
        )


def app_directory(module: ModuleType) -> str:
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
