"""Agents as declared (docs/contracts.md §3.8): one per remote service, and how to reach it.

Also what every declaration shares: ``DeclarationError`` (whose message names the file
and line of the declaration at fault) and the rules for names. The steps and workflows
are ``core.flow``; what is deployed, ``core.workflows``.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from core.limits import MAX_STEP_TIMEOUT_SECONDS

STEP_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
AGENT_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
PATH_PATTERN = re.compile(r"[a-z0-9]+(?:[-/][a-z0-9]+)*")
#: A step name's longest: the Service Bus message id ``<orderId>:<step>:<attempt>`` must
#: fit 128 characters with a 64-character order id and an attempt of up to 6 digits
#: (64 + 1 + 48 + 1 + 6 = 120, leaving room).
MAX_STEP_NAME: Final = 48
#: An agent's request queue is ``agent-requests-<agent>``; a Storage queue name has 63
#: characters at most, and tests add a suffix of up to 20.
MAX_AGENT_NAME: Final = 24
#: The agent a step runs on when its declaration names none.
DEFAULT_AGENT: Final = "orders"
#: An agent's limits, per instance: calls at once, and calls a second (declared, or set
#: at runtime: ``core.controls``).
MIN_CONCURRENCY: Final = 1
MAX_CONCURRENCY: Final = 1000
MIN_RATE: Final = 0.1
MAX_RATE: Final = 1000.0


class DeclarationError(ValueError):
    """A declaration that cannot work; the message names its file and line."""


#: The modules whose frames are the declarations' machinery, not the user's code.
_MACHINERY: Final = {
    str(Path(__file__).with_name(name)) for name in ("agent_spec.py", "flow.py", "workflows.py")
}


def declared_at() -> str:
    """``file:line`` of the user code that built the declaration (outside the declaration
    modules and the dataclass machinery)."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename in _MACHINERY or frame.f_code.co_filename.startswith("<")
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:  # pragma: no cover
        return "<unknown>"
    return f"{_relative(frame.f_code.co_filename)}:{frame.f_lineno}"


def _relative(filename: str) -> str:
    """``filename`` from the working directory when it lies under it (as a traceback
    names it), else whole."""
    path = Path(filename)
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return filename


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

    ``health="/health"`` (http agents): the service's health endpoint, ``GET {base
    URL}/health`` with the agent's own auth, a 2xx meaning healthy. When the agent's
    calls fail and no other order's call tells whose failure it is, it asks (at most once
    per interval per instance): healthy, the failing orders' failures are their own and
    count; failing, it is an outage (``agents.healthcheck``). None: no probe, and a lone
    failing order waits, deferred, for the deferral window (the outage alert tells).
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
    health: str | None = None  # the health probe's path, e.g. "/health"
    declared_at: str = field(default_factory=declared_at, compare=False)

    def __post_init__(self) -> None:
        where = f"{self.declared_at}: agent {self.name!r}"
        if not AGENT_NAME.fullmatch(self.name) or len(self.name) > MAX_AGENT_NAME:
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
        if self.health is not None:
            if self.kind != "http":
                raise DeclarationError(
                    f"{where}: health is an http agent's health endpoint; a python agent has none"
                )
            if not (
                isinstance(self.health, str)
                and PATH_PATTERN.fullmatch(self.health.removeprefix("/"))
            ):
                raise DeclarationError(
                    f'{where}: health must be a path like a step\'s, such as "/health" '
                    f"(a-z, 0-9, - and / between them), got {self.health!r}"
                )

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
        if self.health is not None:
            out["health"] = self.health
        if isinstance(self.auth, EntraToken):
            out["scope"] = self.auth.scope
        if isinstance(self.auth, ApiKey):
            out["apiKeySetting"] = self.api_key_setting
        if self.handler is not None:
            out["handler"] = f"{self.handler.__module__}.{self.handler.__qualname__}"
        return out
