"""An ``AgentWorker`` for each declared agent (``core.workflows.Agent``): its own client, with
its base URL, authentication, timeouts, retry and breaker policy, and concurrency limit.

Each is an ``AttemptRunner`` (``agents.runner``) around the agent's kind of try:

- ``kind="http"``: ``HttpTry`` (``agents.remote``) on ``AGENT_<NAME>_URL`` (else
  ``REMOTE_SERVICE_URL``), with the agent's credentials (``agents.auth``: none, an API
  key from ``AGENT_<NAME>_API_KEY``, or an Entra token from the managed identity).
- ``kind="python"``: ``PythonTry`` calling the declared handler
  (``agents.python``).

An http agent that declares ``health="/path"`` gets its health probe
(``agents.healthcheck``): a GET on its base URL plus that path, with its credentials.
Both take at most ``concurrency`` calls at once on this instance, and at most ``rate``
calls a second if it has one (``agents.limits``), unless an operator changed them at
runtime; a paused agent calls nothing (``runtime``: ``core.control_cache``). Each agent's
blocking work (its claim read, its reply handed over, its controls read) runs on threads
of its own (``agents.threads``): never on the runtime's pool, nor on another agent's.
A setting that is missing is a ``SettingsError`` naming it, raised here, when the
agent is first used, before any call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agents.agent import AgentWorker, Binding
from agents.auth import TokenCredential, auth_for
from agents.health import HealthPolicy
from agents.healthcheck import HealthCheck
from agents.outage_watch import OutageWatch
from agents.outcomes import TryKind
from agents.pacing import RemotePolicy
from agents.python import PythonTry, check_handler
from agents.remote import HttpTry
from agents.runner import AttemptRunner
from agents.threads import OwnThreads
from config.settings import Settings, SettingsError, agent_url
from core import workflows
from core.control_cache import AgentRuntime
from core.ports import AgentTransport, Clock


def policy_of(spec: workflows.Agent) -> RemotePolicy:
    return RemotePolicy(
        max_try_seconds=spec.max_try_seconds,
        backoff_initial_seconds=spec.backoff_initial_seconds,
        backoff_max_seconds=spec.backoff_max_seconds,
        health=HealthPolicy(trip_keys=spec.breaker_failing_orders),
    )


def base_url_of(spec: workflows.Agent, settings: Settings, env: Mapping[str, str]) -> str:
    """``AGENT_<NAME>_URL``, else ``REMOTE_SERVICE_URL``."""
    own = agent_url(env, spec.url_setting)
    if own is not None:
        return own
    if settings.remote_service_url is None:
        raise SettingsError(
            f"agent {spec.name!r} has no base URL: set {spec.url_setting} (or "
            "REMOTE_SERVICE_URL for every agent without its own)"
        )
    return settings.remote_service_url


def try_kind_of(
    spec: workflows.Agent,
    settings: Settings,
    clock: Clock,
    *,
    env: Mapping[str, str] | None = None,
    credential: TokenCredential | None = None,
) -> TryKind:
    """How one agent tries: its handler, or HTTP on its base URL with its credentials.
    ``credential``: for tests (an Entra token's source)."""
    env = settings.agent_settings if env is None else env
    if spec.kind == "python":
        assert spec.handler is not None  # the declaration checks it
        try:
            check_handler(spec.handler)
        except TypeError as exc:
            raise workflows.DeclarationError(
                f"{spec.declared_at}: agent {spec.name!r}: {exc}"
            ) from None
        return PythonTry(spec.handler, name=spec.name, clock=clock)
    return HttpTry(
        base_url_of(spec, settings, env),
        clock=clock,
        auth=auth_for(spec, env, credential=credential),
        connect_seconds=spec.connect_seconds,
    )


def client_of(
    spec: workflows.Agent,
    settings: Settings,
    clock: Clock,
    *,
    env: Mapping[str, str] | None = None,
    credential: TokenCredential | None = None,
    runtime: Callable[[], AgentRuntime] | None = None,
    runtime_at_hand: Callable[[], AgentRuntime | None] | None = None,
    threads: OwnThreads | None = None,
    watch: OutageWatch | None = None,
) -> AttemptRunner[TryKind]:
    """The attempts of one agent: its kind of try under its policy and limits (those
    declared, or what ``runtime`` says is in force: an operator's pause and limits, read
    on ``threads``, the agent's own); ``watch`` is told how its calls end (the agent's
    shared outage record, ``agents.outage_watch``)."""
    kind = try_kind_of(spec, settings, clock, env=env, credential=credential)
    policy = policy_of(spec)
    check = None
    if spec.health is not None and isinstance(kind, HttpTry):
        check = HealthCheck(
            kind,
            spec.health,
            interval=policy.health.check_interval_seconds,
            timeout=policy.health.check_timeout_seconds,
            clock=lambda: clock().timestamp(),
        )
    return AttemptRunner(
        kind,
        policy,
        clock=clock,
        concurrency=spec.concurrency,
        rate=spec.rate,
        runtime=runtime,
        runtime_at_hand=runtime_at_hand,
        threads=threads,
        watch=watch,
        check=check,
    )


def build_agent(
    spec: workflows.Agent,
    settings: Settings,
    transport: AgentTransport,
    clock: Clock,
    *,
    bind: Binding | None = None,
    env: Mapping[str, str] | None = None,
    credential: TokenCredential | None = None,
    runtime: Callable[[], AgentRuntime] | None = None,
    runtime_at_hand: Callable[[], AgentRuntime | None] | None = None,
    watch: OutageWatch | None = None,
) -> AgentWorker:
    threads = OwnThreads(spec.name)
    client = client_of(
        spec,
        settings,
        clock,
        env=env,
        credential=credential,
        runtime=runtime,
        runtime_at_hand=runtime_at_hand,
        threads=threads,
        watch=watch,
    )
    return AgentWorker(
        client,
        transport,
        clock,
        bind=bind,
        ride_out_seconds=settings.ride_out_seconds,
        threads=threads,
    )
