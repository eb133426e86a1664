"""An ``AgentWorker`` for each declared agent (``core.workflows.Agent``): its own client, with
its base URL, authentication, timeouts, retry and breaker policy, and concurrency limit.

- ``kind="http"``: ``RemoteServiceClient`` on ``AGENT_<NAME>_URL`` (else
  ``REMOTE_SERVICE_URL``), with the agent's credentials (``agents.auth``: none, an API
  key from ``AGENT_<NAME>_API_KEY``, or an Entra token from the managed identity).
- ``kind="python"``: ``PythonAgentClient`` calling the declared handler
  (``agents.python``).

Both take at most ``concurrency`` calls at once on this instance (``agents.limits``).
A setting that is missing is a ``SettingsError`` naming it, raised here, when the
agent is first used, before any call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agents.agent import AgentWorker
from agents.auth import TokenCredential, auth_for
from agents.health import HealthPolicy
from agents.python import PythonAgentClient, check_handler
from agents.remote import RemotePolicy, RemoteServiceClient
from core import workflows
from core.ports import AgentTransport, Clock
from core.settings import Settings, SettingsError, agent_url


def policy_of(spec: workflows.Agent) -> RemotePolicy:
    return RemotePolicy(
        max_try_seconds=spec.max_try_seconds,
        connect_seconds=spec.connect_seconds,
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


def client_of(
    spec: workflows.Agent,
    settings: Settings,
    clock: Clock,
    *,
    env: Mapping[str, str] | None = None,
    credential: TokenCredential | None = None,
) -> RemoteServiceClient:
    """The client of one agent. ``credential``: for tests (an Entra token's source)."""
    env = settings.agent_settings if env is None else env
    if spec.kind == "python":
        assert spec.handler is not None  # the declaration checks it
        try:
            check_handler(spec.handler)
        except TypeError as exc:
            raise workflows.DeclarationError(
                f"{spec.declared_at}: agent {spec.name!r}: {exc}"
            ) from None
        return PythonAgentClient(
            spec.handler,
            policy_of(spec),
            clock=clock,
            name=spec.name,
            concurrency=spec.concurrency,
        )
    base_url = base_url_of(spec, settings, env)
    return RemoteServiceClient(
        base_url,
        policy_of(spec),
        clock=clock,
        auth=auth_for(spec, env, credential=credential),
        concurrency=spec.concurrency,
    )


def build_agent(
    spec: workflows.Agent,
    settings: Settings,
    transport: AgentTransport,
    clock: Clock,
    *,
    load_order: Callable[[str], dict[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
    credential: TokenCredential | None = None,
) -> AgentWorker:
    client = client_of(spec, settings, clock, env=env, credential=credential)
    return AgentWorker(
        client,
        transport,
        clock,
        load_order=load_order,
        ride_out_seconds=settings.ride_out_seconds,
    )
