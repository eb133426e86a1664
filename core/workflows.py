"""Workflows and agents: what is declared, and the registry of it (docs/contracts.md §3.8,
§3.13).

What exists is declared by the user, outside ``core/``: the module named by the setting
``ORDERS_DECLARATIONS`` (default ``declarations``, the package at the repository's root)
defines ``AGENTS`` (one per remote service) and ``WORKFLOWS``. It is imported the first
time ``WORKFLOWS`` or ``AGENTS`` is read (core names no app module: the setting does), and
validated then: every error names the declaration's file and line.

The names a declarations module uses are all importable from here: ``Agent`` (and its
``NoAuth``, ``EntraToken``, ``ApiKey``: ``core.agent_spec``), ``Workflow``, ``StepSpec``,
``Compensation``, ``Parallel``, ``Event``, ``Delay`` and the ``Context`` their functions
get (``core.flow``, which says what each can say), and ``events_url``, the address a
remote calls back (``core.links``). An order keeps a copy of its plan
(``core.plans``) from the moment it is accepted.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from core.agent_spec import (
    DEFAULT_AGENT,
    MAX_AGENT_NAME,
    MAX_CONCURRENCY,
    MAX_RATE,
    MAX_STEP_NAME,
    MIN_CONCURRENCY,
    MIN_RATE,
    Agent,
    ApiKey,
    Auth,
    DeclarationError,
    EntraToken,
    NoAuth,
)
from core.concurrency import Concurrency
from core.flow import (
    FUNCTIONS,
    MAX_WAIT_SECONDS,
    Compensation,
    Context,
    Delay,
    Event,
    ForEach,
    Parallel,
    StepSpec,
    Workflow,
)
from core.item_names import item_of, template_of
from core.limits import DEFAULT_DECLARATIONS
from core.links import events_url
from core.plans import Plan, PlannedStep
from core.search import TURN, SearchError, check_across, parameter

__all__ = [
    "AGENTS",
    "DEFAULT_AGENT",
    "DEFAULT_WORKFLOW",
    "FUNCTIONS",
    "MAX_AGENT_NAME",
    "MAX_CONCURRENCY",
    "MAX_RATE",
    "MAX_STEP_NAME",
    "MAX_WAIT_SECONDS",
    "MIN_CONCURRENCY",
    "MIN_RATE",
    "WORKFLOWS",
    "Agent",
    "ApiKey",
    "Auth",
    "Compensation",
    "Concurrency",
    "Context",
    "DeclarationError",
    "Delay",
    "EntraToken",
    "Event",
    "ForEach",
    "NoAuth",
    "Parallel",
    "Plan",
    "PlannedStep",
    "StepSpec",
    "UndeclaredStep",
    "Workflow",
    "events_url",
    "function_of",
    "legacy_agent",
    "search_fields",
    "search_names",
]


# --- the registry ----------------------------------------------------------------------


class _Declared(Mapping[str, Any]):
    """``WORKFLOWS`` or ``AGENTS``: read from the declarations module on first use."""

    def __init__(self, attribute: str):
        self._attribute = attribute

    def _items(self) -> dict[str, Any]:
        return dict(_load()[self._attribute])

    def __getitem__(self, key: str) -> Any:
        return _load()[self._attribute][key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(_load()[self._attribute])


_lock = threading.Lock()
_loaded: dict[str, dict[str, Any]] | None = None
_module = DEFAULT_DECLARATIONS


def use(module: str) -> None:
    """Declare the agents and workflows from ``module`` (the ``ORDERS_DECLARATIONS``
    setting, given by the bootstrap before anything reads them)."""
    global _module, _loaded
    with _lock:
        if module != _module:
            _module, _loaded = module, None


def in_use() -> str:
    """The module the declarations are read from."""
    return _module


def _load() -> dict[str, dict[str, Any]]:
    global _loaded  # noqa: PLW0603
    if _loaded is None:
        with _lock:
            if _loaded is None:
                _loaded = validate(importlib.import_module(_module))
    return _loaded


def reload() -> None:
    """Forget what was loaded (tests that swap the declarations module)."""
    global _loaded  # noqa: PLW0603
    with _lock:
        _loaded = None


def validate(module: Any) -> dict[str, dict[str, Any]]:
    """The declarations of ``module`` (``AGENTS``, ``WORKFLOWS``: sequences), checked
    together: unique names, every agent a step names declared, one declared name per search
    parameter across workflows, ``DEFAULT_WORKFLOW``."""
    where = getattr(module, "__file__", str(module))
    agents: dict[str, Agent] = {}
    for agent in getattr(module, "AGENTS", ()):
        if not isinstance(agent, Agent):
            raise DeclarationError(f"{where}: AGENTS holds {agent!r}, not an Agent(...)")
        if agent.name in agents:
            raise DeclarationError(f"{agent.declared_at}: agent {agent.name!r} is declared twice")
        agents[agent.name] = agent
    workflows: dict[str, Workflow] = {}
    for workflow in getattr(module, "WORKFLOWS", ()):
        if not isinstance(workflow, Workflow):
            raise DeclarationError(f"{where}: WORKFLOWS holds {workflow!r}, not a Workflow(...)")
        if workflow.name in workflows:
            raise DeclarationError(
                f"{workflow.declared_at}: workflow {workflow.name!r} is declared twice"
            )
        for step in workflow.tasks():
            for agent_name in (step.agent, step.compensation.agent if step.compensation else None):
                if agent_name is not None and agent_name not in agents:
                    raise DeclarationError(
                        f"{step.declared_at}: workflow {workflow.name!r}, step {step.name!r} "
                        f"names agent {agent_name!r}, which is not declared (AGENTS has: "
                        f"{', '.join(sorted(agents)) or 'none'})"
                    )
            if step.completes_on and agents[step.agent].kind == "python":
                raise DeclarationError(
                    f"{step.declared_at}: workflow {workflow.name!r}, step {step.name!r}: "
                    f"completes_on on a python agent ({step.agent!r}); a Python handler "
                    "returns its result: it has nothing to call back"
                )
        try:
            check_across(
                {**{n: w.search for n, w in workflows.items()}, workflow.name: workflow.search}
            )
        except SearchError as exc:
            raise DeclarationError(f"{workflow.declared_at}: {exc}") from None
        workflows[workflow.name] = workflow
    if DEFAULT_WORKFLOW not in workflows:
        raise DeclarationError(f"{where}: the default workflow {DEFAULT_WORKFLOW!r} is missing")
    return {"AGENTS": agents, "WORKFLOWS": workflows}


WORKFLOWS: Final[Mapping[str, Workflow]] = _Declared("WORKFLOWS")
AGENTS: Final[Mapping[str, Agent]] = _Declared("AGENTS")
DEFAULT_WORKFLOW: Final = "order"


def declared_steps() -> frozenset[str]:
    """Every step name today's declarations give: steps, events, delays and
    compensations, of every workflow."""
    names: set[str] = set()
    for workflow in WORKFLOWS.values():
        for leaf, _ in workflow.leaves():
            names.add(leaf.name)
            if isinstance(leaf, StepSpec) and leaf.compensation is not None:
                names.add(leaf.compensation.step)
    return frozenset(names)


def declares_step(step: str) -> bool:
    """Whether today's declarations give ``step``: a step's name, or an item's record
    name ``<name>[<i>]`` of a ``ForEach`` (or of its compensation) they give."""
    names = declared_steps()
    return step in names or (item_of(step) is not None and template_of(step) in names)


def search_fields() -> dict[str, tuple[str, ...]]:
    """Every query parameter today's declarations let operators search by (docs/contracts.md
    §3.14, §3.17: an order's field, or a step's result field by its field's name), with the
    workflows that name it, sorted."""
    found: dict[str, list[str]] = {}
    for name in sorted(WORKFLOWS):
        for declared in WORKFLOWS[name].search:
            found.setdefault(parameter(declared), []).append(name)
        if WORKFLOWS[name].concurrency is not None:  # its orders' keys (§3.16)
            found.setdefault(TURN, []).append(name)
    return {f: tuple(found[f]) for f in sorted(found)}


def search_names() -> dict[str, str]:
    """Each query parameter of ``search_fields`` with the name declared for it (one per
    parameter, whichever workflows declare it: ``validate``)."""
    names = {
        parameter(declared): declared
        for name in sorted(WORKFLOWS)
        for declared in WORKFLOWS[name].search
    }
    if any(w.concurrency is not None for w in WORKFLOWS.values()):
        names[TURN] = TURN
    return names


def function_of(workflow: str, step: str, name: str) -> Callable[[Any], Any] | None:
    """The function ``name`` (``input``, ``when``, ``until``) that today's declarations give
    ``step`` of ``workflow`` (a compensation's ``input`` by its own step name); None if
    they give it none, or no longer declare the workflow or the step."""
    declared = WORKFLOWS.get(workflow)
    if declared is None:
        return None
    step = template_of(step)  # an item's record runs its ForEach's step, ``<name>[]``
    for leaf, _ in declared.leaves():
        if leaf.name == step:
            fn = getattr(leaf, name, None)
            return fn if callable(fn) else None
        if isinstance(leaf, StepSpec) and leaf.compensation and leaf.compensation.step == step:
            fn = getattr(leaf.compensation, name, None) if name == "input" else None
            return fn if callable(fn) else None
    return None


def legacy_agent(workflow: str, step: str) -> str:
    """The agent of a step stored in a plan from before agents existed (whose requests
    went to the shared ``agent-requests``): the agent the declarations give that step
    now, in its workflow, or else in any workflow. Read once, when the order is loaded;
    its next save stores it. A step no workflow declares any more cannot be routed: the
    order's records cannot be read (``CorruptOrder``), which names the step."""
    declared = WORKFLOWS.get(workflow)
    candidates = [declared] if declared is not None else []
    candidates += [w for name, w in sorted(WORKFLOWS.items()) if name != workflow]
    for candidate in candidates:
        for spec in candidate.tasks():
            if spec.name == step:
                return spec.agent
            if spec.compensation is not None and spec.compensation.step == step:
                return spec.compensation.agent or spec.agent
    raise UndeclaredStep(workflow, step)


class UndeclaredStep(ValueError):
    """A step of a plan stored before agents that no workflow declares now: its agent
    cannot be known, so the order cannot be read (``CorruptOrder``, caused by this)."""

    def __init__(self, workflow: str, step: str):
        super().__init__(
            f"step {step!r} of a plan from before agents is declared by no workflow now "
            f"(workflow {workflow!r}): declare it again, or repair the order by hand"
        )
        self.workflow = workflow
        self.step = step
