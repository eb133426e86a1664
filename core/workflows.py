"""Workflows and agents: the types, their validation, and the registry of what is declared
(docs/contracts.md §3.8).

What exists is declared by the user, outside ``core/``: the module named by the setting
``ORDERS_DECLARATIONS`` (default ``declarations``, the package at the repository's root)
defines ``AGENTS`` (one per remote service) and ``WORKFLOWS``. It is imported the first
time ``WORKFLOWS`` or ``AGENTS`` is read (core names no app module: the setting does), and
validated then: every error names the declaration's file and line.

A step names its agent, its remote path (default: the step's name), its timeout and,
optionally, the step that compensates it (on the same agent unless it names another).
Compensations are steps too: they get deadlines, retries, supervision and the
idempotency key ``<orderId>:<compensation step>``.

An order keeps a copy of its plan (``Plan``) from the moment it is accepted, so changing
a definition never changes an order already in flight.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from core.settings import DECLARATIONS, DEFAULT_DECLARATIONS, MAX_STEP_TIMEOUT_SECONDS

_STEP_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_AGENT_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_PATH = re.compile(r"[a-z0-9]+(?:[-/][a-z0-9]+)*")
#: A step name's longest: the Service Bus message id ``<orderId>:<step>:<attempt>`` must
#: fit 128 characters with a 64-character order id and an attempt of up to 6 digits
#: (64 + 1 + 48 + 1 + 6 = 120, leaving room).
MAX_STEP_NAME: Final = 48
#: An agent's request queue is ``agent-requests-<agent>``; a Storage queue name has 63
#: characters at most, and tests add a suffix of up to 20.
MAX_AGENT_NAME: Final = 24
DECLARATIONS_SETTING: Final = DECLARATIONS
#: The agent a step runs on when its declaration names none.
LEGACY_AGENT: Final = "orders"
#: An agent's limits, per instance: calls at once, and calls a second (declared, or set
#: at runtime: ``core.controls``).
MIN_CONCURRENCY: Final = 1
MAX_CONCURRENCY: Final = 1000
MIN_RATE: Final = 0.1
MAX_RATE: Final = 1000.0


class DeclarationError(ValueError):
    """A declaration that cannot work; the message names its file and line."""


def _declared_at() -> str:
    """``file:line`` of the user code that built the declaration (outside this module and
    the dataclass machinery)."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith("<")
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:  # pragma: no cover
        return "<unknown>"
    return f"{os.path.relpath(frame.f_code.co_filename)}:{frame.f_lineno}"


# --- agents ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NoAuth:
    kind: Literal["none"] = "none"


@dataclass(frozen=True)
class EntraToken:
    """A Microsoft Entra ID access token for ``scope`` (e.g. ``api://carrier/.default``),
    from the app's managed identity (``azure-identity``), as ``Authorization: Bearer``."""

    scope: str
    kind: Literal["entra"] = "entra"


@dataclass(frozen=True)
class ApiKey:
    """A key read from the app setting ``AGENT_<NAME>_API_KEY`` (which can be a Key Vault
    reference), sent in ``header``. Never a key in code or in Bicep."""

    header: str = "X-Api-Key"
    kind: Literal["api-key"] = "api-key"


Auth = NoAuth | EntraToken | ApiKey


@dataclass(frozen=True)
class Agent:
    """One remote service and how to reach it.

    ``kind="http"``: ``POST {base URL}/{path}``; the base URL is the setting
    ``AGENT_<NAME>_URL``, else ``REMOTE_SERVICE_URL``. ``kind="python"``: ``handler`` is
    called instead (``agents/python.py`` says how it reports). Each agent has its own
    request queue and function (``agent-requests-<name>``, ``run_agent_<name>``), its own
    circuit breaker, at most ``concurrency`` calls at once per instance and, with a
    ``rate``, at most that many calls a second per instance (none by default). An
    operator can pause an agent and change both limits at runtime (``core.controls``).
    """

    name: str
    kind: Literal["http", "python"] = "http"
    auth: Auth = field(default_factory=NoAuth)
    handler: Callable[..., Any] | None = None
    concurrency: int = 32  # at least what one instance runs at once (16 + 8 on Storage)
    rate: float | None = None  # calls a second per instance (a token bucket); None: no limit
    max_try_seconds: float = 10.0
    connect_seconds: float = 3.0
    backoff_initial_seconds: float = 0.2
    backoff_max_seconds: float = 5.0
    breaker_failing_orders: int = 3
    declared_at: str = field(default_factory=_declared_at, compare=False)

    def __post_init__(self) -> None:
        where = f"{self.declared_at}: agent {self.name!r}"
        if not _AGENT_NAME.fullmatch(self.name) or len(self.name) > MAX_AGENT_NAME:
            raise DeclarationError(
                f"{where}: a name is 1-{MAX_AGENT_NAME} characters of a-z, 0-9 and single "
                "hyphens, starting with a letter (it names a queue and a function)"
            )
        if self.kind == "python" and not callable(self.handler):
            raise DeclarationError(f"{where}: a python agent needs handler=<function>")
        if self.kind == "python" and self.handler is not None:
            try:
                inspect.signature(self.handler).bind(
                    {}, idempotency_key="", deadline=None, step="", attempt=1
                )
            except TypeError as exc:
                raise DeclarationError(
                    f"{where}: its handler must take (order, *, idempotency_key, deadline, "
                    f"step, attempt) ({exc}); see agents/python.py"
                ) from None
            except ValueError:  # no signature to read (a builtin): checked when it runs
                pass
        if self.kind == "http" and self.handler is not None:
            raise DeclarationError(f"{where}: an http agent has no handler (kind='python'?)")
        if not MIN_CONCURRENCY <= self.concurrency <= MAX_CONCURRENCY:
            raise DeclarationError(
                f"{where}: concurrency must be {MIN_CONCURRENCY}-{MAX_CONCURRENCY}"
            )
        if self.rate is not None and (
            isinstance(self.rate, bool) or not MIN_RATE <= self.rate <= MAX_RATE
        ):
            raise DeclarationError(
                f"{where}: rate must be {MIN_RATE:g}-{MAX_RATE:g} calls a second, or None"
            )
        if self.kind == "python" and not isinstance(self.auth, NoAuth):
            raise DeclarationError(f"{where}: a python agent authenticates in its own code")
        if isinstance(self.auth, EntraToken) and not self.auth.scope.strip():
            raise DeclarationError(f"{where}: EntraToken needs a scope")
        for name in ("max_try_seconds", "connect_seconds", "backoff_max_seconds"):
            if not 0 < getattr(self, name) <= MAX_STEP_TIMEOUT_SECONDS:
                raise DeclarationError(f"{where}: {name} must be > 0 and at most the step limit")
        if self.breaker_failing_orders < 1:
            raise DeclarationError(f"{where}: breaker_failing_orders must be at least 1")

    @property
    def setting_prefix(self) -> str:
        """``AGENT_<NAME>``: the prefix of this agent's app settings."""
        return "AGENT_" + self.name.upper().replace("-", "_")

    @property
    def url_setting(self) -> str:
        return f"{self.setting_prefix}_URL"

    @property
    def api_key_setting(self) -> str:
        return f"{self.setting_prefix}_API_KEY"

    @property
    def function_name(self) -> str:
        return "run_agent_" + self.name.replace("-", "_")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "agent": self.name,
            "kind": self.kind,
            "auth": self.auth.kind,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "function": self.function_name,
        }
        if self.kind == "http":
            out["baseUrlSetting"] = self.url_setting
        if isinstance(self.auth, EntraToken):
            out["scope"] = self.auth.scope
        if isinstance(self.auth, ApiKey):
            out["apiKeySetting"] = self.api_key_setting
        if self.handler is not None:
            out["handler"] = f"{self.handler.__module__}.{self.handler.__qualname__}"
        return out


@dataclass(frozen=True)
class Compensation:
    step: str
    agent: str | None = None  # None: the agent of the step it undoes
    path: str | None = None  # remote path; None: the compensation step's name
    timeout_seconds: int | None = None  # None: STEP_TIMEOUT_SECONDS

    @property
    def remote_path(self) -> str:
        return self.path or self.step


@dataclass(frozen=True)
class StepSpec:
    name: str
    agent: str = LEGACY_AGENT
    path: str | None = None  # remote path; None: the step's name
    timeout_seconds: int | None = None  # None: STEP_TIMEOUT_SECONDS
    compensation: Compensation | None = None
    declared_at: str = field(default_factory=_declared_at, compare=False)

    @property
    def remote_path(self) -> str:
        return self.path or self.name


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[StepSpec, ...]
    declared_at: str = field(default_factory=_declared_at, compare=False)

    def __post_init__(self) -> None:
        where = f"{self.declared_at}: workflow {self.name!r}"
        if not _STEP_NAME.fullmatch(self.name) or len(self.name) > 64:
            raise DeclarationError(f"{where}: a name is 1-64 characters of a-z, 0-9, hyphens")
        if not self.steps:
            raise DeclarationError(f"{where} has no steps")
        names = [s.name for s in self.steps] + [
            s.compensation.step for s in self.steps if s.compensation
        ]
        if len(set(names)) != len(names):
            raise DeclarationError(f"{where} repeats a step name: {names}")
        for step in self.steps:
            for name, path, timeout in self._parts(step):
                at = f"{step.declared_at}: workflow {self.name!r}, step {name!r}"
                if not _STEP_NAME.fullmatch(name):
                    raise DeclarationError(f"{at}: a step name is kebab-case (a-z, 0-9, -)")
                if len(name) > MAX_STEP_NAME:
                    raise DeclarationError(
                        f"{at}: {len(name)} characters; at most {MAX_STEP_NAME}, so that the "
                        "Service Bus message id <orderId>:<step>:<attempt> fits 128 characters"
                    )
                if not _PATH.fullmatch(path):
                    raise DeclarationError(f"{at}: path {path!r} is not a-z, 0-9, - and /")
                if timeout is not None and not 1 <= timeout <= MAX_STEP_TIMEOUT_SECONDS:
                    raise DeclarationError(
                        f"{at}: a timeout of {timeout} s; it must be 1-"
                        f"{MAX_STEP_TIMEOUT_SECONDS} s, what the host can honour (an agent "
                        "invocation lasts up to it; see core/settings.py)"
                    )

    @staticmethod
    def _parts(step: StepSpec) -> list[tuple[str, str, int | None]]:
        parts = [(step.name, step.remote_path, step.timeout_seconds)]
        if step.compensation:
            c = step.compensation
            parts.append((c.step, c.remote_path, c.timeout_seconds))
        return parts

    def agents(self) -> set[str]:
        used = {s.agent for s in self.steps}
        used |= {
            s.compensation.agent for s in self.steps if s.compensation and s.compensation.agent
        }
        return used

    def describe(self) -> dict[str, Any]:
        steps = []
        for s in self.steps:
            entry: dict[str, Any] = {
                "step": s.name,
                "agent": s.agent,
                "path": s.remote_path,
                "timeout": s.timeout_seconds,
            }
            if s.compensation:
                entry["compensation"] = {
                    "step": s.compensation.step,
                    "agent": s.compensation.agent or s.agent,
                    "path": s.compensation.remote_path,
                    "timeout": s.compensation.timeout_seconds,
                }
            steps.append(entry)
        return {"workflow": self.name, "steps": steps}


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
    together: unique names, every agent a step names declared, ``DEFAULT_WORKFLOW``."""
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
        for step in workflow.steps:
            for agent_name in (step.agent, step.compensation.agent if step.compensation else None):
                if agent_name is not None and agent_name not in agents:
                    raise DeclarationError(
                        f"{step.declared_at}: workflow {workflow.name!r}, step {step.name!r} "
                        f"names agent {agent_name!r}, which is not declared (AGENTS has: "
                        f"{', '.join(sorted(agents)) or 'none'})"
                    )
        workflows[workflow.name] = workflow
    if DEFAULT_WORKFLOW not in workflows:
        raise DeclarationError(f"{where}: the default workflow {DEFAULT_WORKFLOW!r} is missing")
    return {"AGENTS": agents, "WORKFLOWS": workflows}


WORKFLOWS: Final[Mapping[str, Workflow]] = _Declared("WORKFLOWS")
AGENTS: Final[Mapping[str, Agent]] = _Declared("AGENTS")
DEFAULT_WORKFLOW: Final = "order"


@dataclass(frozen=True)
class PlannedStep:
    """A step as an order will run it: timeouts resolved, compensation named."""

    name: str
    path: str
    timeout_seconds: int
    compensation: str | None = None
    compensation_path: str | None = None
    compensation_timeout_seconds: int | None = None
    #: the agent that runs it (plans stored before agents existed get it when read)
    agent: str = ""
    compensation_agent: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "path": self.path,
            "timeout": self.timeout_seconds,
        }
        if self.agent:
            out["agent"] = self.agent
        if self.compensation:
            out["compensation"] = {
                "name": self.compensation,
                "path": self.compensation_path,
                "timeout": self.compensation_timeout_seconds,
            }
            if self.compensation_agent:
                out["compensation"]["agent"] = self.compensation_agent
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any], workflow: str = DEFAULT_WORKFLOW) -> PlannedStep:
        comp = raw.get("compensation") or {}
        agent = raw.get("agent") or legacy_agent(workflow, raw["name"])
        return cls(
            name=raw["name"],
            path=raw["path"],
            timeout_seconds=int(raw["timeout"]),
            compensation=comp.get("name"),
            compensation_path=comp.get("path"),
            compensation_timeout_seconds=comp.get("timeout"),
            agent=agent,
            compensation_agent=comp.get("agent") or (agent if comp.get("name") else None),
        )


@dataclass(frozen=True)
class Plan:
    workflow: str
    steps: tuple[PlannedStep, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, workflow: Workflow, default_timeout_seconds: int) -> Plan:
        return cls(
            workflow.name,
            tuple(
                PlannedStep(
                    name=s.name,
                    path=s.remote_path,
                    timeout_seconds=s.timeout_seconds or default_timeout_seconds,
                    compensation=s.compensation.step if s.compensation else None,
                    compensation_path=s.compensation.remote_path if s.compensation else None,
                    compensation_timeout_seconds=(
                        (s.compensation.timeout_seconds or default_timeout_seconds)
                        if s.compensation
                        else None
                    ),
                    agent=s.agent,
                    compensation_agent=(
                        (s.compensation.agent or s.agent) if s.compensation else None
                    ),
                )
                for s in workflow.steps
            ),
        )

    @property
    def compensates(self) -> bool:
        """Whether a failure unwinds (some step declares a compensation)."""
        return any(s.compensation for s in self.steps)

    def index_of(self, step: str) -> int:
        for i, s in enumerate(self.steps):
            if s.name == step:
                return i
        raise KeyError(step)

    def agent_of(self, step: str) -> str:
        """The agent that runs ``step`` (an action or a compensation)."""
        for s in self.steps:
            if s.name == step:
                return s.agent
            if s.compensation == step:
                return s.compensation_agent or s.agent
        raise KeyError(step)

    def to_json(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Plan:
        workflow = raw["workflow"]
        return cls(workflow, tuple(PlannedStep.from_json(s, workflow) for s in raw["steps"]))


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
        for spec in candidate.steps:
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
