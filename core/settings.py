"""Typed settings, read once from the environment (app settings in Azure).

The names are docs/contracts.md §3.6 of the architecture; ``infra/`` emits exactly
these, and ``tests/infra`` checks that the two sets agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final
from urllib.parse import urlsplit

STORAGE: Final = "AzureWebJobsStorage"
SERVICE_BUS: Final = "ServiceBusConnection"
AGENT_TRANSPORT: Final = "AGENT_TRANSPORT"
REMOTE_SERVICE_URL: Final = "REMOTE_SERVICE_URL"
STEP_TIMEOUT_SECONDS: Final = "STEP_TIMEOUT_SECONDS"
MAX_FAILURE_COUNT: Final = "MAX_FAILURE_COUNT"
SUPERVISOR_SCHEDULE: Final = "SUPERVISOR_SCHEDULE"
DEFERRAL_WINDOW_SECONDS: Final = "DEFERRAL_WINDOW_SECONDS"
CONSOLE_READ_ONLY: Final = "CONSOLE_READ_ONLY"

#: Every application setting the code reads (identity-based connections add
#: ``__``-suffixed variants of the two connection names; see ``Connection``).
APP_SETTINGS: Final = (
    STORAGE,
    SERVICE_BUS,
    AGENT_TRANSPORT,
    REMOTE_SERVICE_URL,
    STEP_TIMEOUT_SECONDS,
    MAX_FAILURE_COUNT,
    SUPERVISOR_SCHEDULE,
    DEFERRAL_WINDOW_SECONDS,
    CONSOLE_READ_ONLY,
)

DEFAULT_STEP_TIMEOUT_SECONDS: Final = 30
DEFAULT_MAX_FAILURE_COUNT: Final = 5
DEFAULT_SUPERVISOR_SCHEDULE: Final = "*/10 * * * * *"
#: How long a step may keep waiting for its remote service (circuit open, Retry-After,
#: the service down for everyone) before it fails for good; outages shorter than this
#: are ridden out without an operator.
DEFAULT_DEFERRAL_WINDOW_SECONDS: Final = 1800

#: What the Functions host can honour (host.json; tests/unit/test_settings.py keeps
#: these equal to it). An agent invocation lasts up to a step's timeout: it must end
#: well inside the Service Bus lock renewal window and the function timeout.
HOST_FUNCTION_TIMEOUT_SECONDS: Final = 600
HOST_LOCK_RENEWAL_SECONDS: Final = 300
MAX_STEP_TIMEOUT_SECONDS: Final = HOST_LOCK_RENEWAL_SECONDS - 30


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names it."""


class Transport(StrEnum):
    SERVICE_BUS = "servicebus"
    STORAGE = "storage"


@dataclass(frozen=True)
class Connection:
    """A connection setting: a connection string, or identity-based parts.

    Identity-based form, as the Functions host reads it:
    ``<Name>__accountName`` / ``<Name>__fullyQualifiedNamespace`` (or
    ``<Name>__queueServiceUri`` / ``<Name>__tableServiceUri``), with
    ``<Name>__clientId`` for a user-assigned managed identity.
    """

    name: str
    connection_string: str | None = None
    account_name: str | None = None
    fully_qualified_namespace: str | None = None
    queue_service_uri: str | None = None
    table_service_uri: str | None = None
    client_id: str | None = None
    credential: str | None = None


_PARTS = (
    "accountName",
    "fullyQualifiedNamespace",
    "queueServiceUri",
    "tableServiceUri",
    "clientId",
    "credential",
)


def connection(env: Mapping[str, str], name: str) -> Connection | None:
    # The Functions host reads these suffixes case-insensitively; so do we.
    canonical = {part.lower(): part for part in _PARTS}
    prefix = name.lower() + "__"
    parts = {
        canonical.get(key[len(prefix) :].lower(), key[len(prefix) :]): value
        for key, value in env.items()
        if key.lower().startswith(prefix) and value
    }
    direct = env.get(name) or None
    if direct is None and not parts:
        return None
    return Connection(
        name=name,
        connection_string=direct,
        account_name=parts.get("accountName"),
        fully_qualified_namespace=parts.get("fullyQualifiedNamespace"),
        queue_service_uri=parts.get("queueServiceUri"),
        table_service_uri=parts.get("tableServiceUri"),
        client_id=parts.get("clientId"),
        credential=parts.get("credential"),
    )


def _positive_int(env: Mapping[str, str], name: str, default: int, maximum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise SettingsError(f"{name} must be a whole number from 1 to {maximum}, got {raw!r}")
    value = int(raw)
    if not 1 <= value <= maximum:
        raise SettingsError(f"{name} must be from 1 to {maximum}, got {value}")
    return value


def transport_from_env(env: Mapping[str, str]) -> Transport:
    """``AGENT_TRANSPORT``, parsed as ``Settings`` does; also read alone, when
    ``function_app.py`` is indexed, to decide which trigger types the agent queues get."""
    raw = env.get(AGENT_TRANSPORT, "").strip().lower() or Transport.SERVICE_BUS
    try:
        return Transport(raw)
    except ValueError:
        raise SettingsError(
            f"{AGENT_TRANSPORT} must be 'servicebus' or 'storage', got {raw!r}"
        ) from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "false", "0", "no"):
        return False
    if raw in ("true", "1", "yes"):
        return True
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


def disabled_setting(function_name: str) -> str:
    """The platform's setting that disables a function (``AzureWebJobs.<name>.Disabled``)."""
    return f"AzureWebJobs.{function_name}.Disabled"


def function_disabled(env: Mapping[str, str], function_name: str) -> bool:
    """True when ``AzureWebJobs.<name>.Disabled`` is true or 1, as the host reads it: the
    host does not run that function here (devhost sets it for the functions that
    ``--only``/``--exclude`` leave out)."""
    return env.get(disabled_setting(function_name), "").strip().lower() in ("true", "1")


def _step_timeout(env: Mapping[str, str]) -> int:
    raw = env.get(STEP_TIMEOUT_SECONDS, "").strip()
    if raw.isdigit() and int(raw) > MAX_STEP_TIMEOUT_SECONDS:
        raise SettingsError(
            f"{STEP_TIMEOUT_SECONDS} is {int(raw)}, but an agent invocation lasts up to a "
            f"step's timeout and the host renews a Service Bus message lock for at most "
            f"{HOST_LOCK_RENEWAL_SECONDS} s (host.json maxAutoLockRenewalDuration; "
            f"functionTimeout is {HOST_FUNCTION_TIMEOUT_SECONDS} s): a longer call would be "
            f"delivered twice. Use at most {MAX_STEP_TIMEOUT_SECONDS}."
        )
    return _positive_int(env, STEP_TIMEOUT_SECONDS, DEFAULT_STEP_TIMEOUT_SECONDS, 86_400)


def _schedule(env: Mapping[str, str]) -> str:
    raw = env.get(SUPERVISOR_SCHEDULE, "").strip() or DEFAULT_SUPERVISOR_SCHEDULE
    fields = raw.split()
    if len(fields) != 6 or not all(_CRON_FIELD.fullmatch(f) for f in fields):
        raise SettingsError(
            f"{SUPERVISOR_SCHEDULE} must be a six-field NCRONTAB expression "
            f"(second minute hour day month day-of-week, e.g. '*/10 * * * * *'), got {raw!r}"
        )
    return raw


_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,\-?]+")


def _url(env: Mapping[str, str], name: str = REMOTE_SERVICE_URL) -> str | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    parsed = urlsplit(raw)
    if parsed.scheme.lower() not in ("http", "https") or not parsed.netloc:
        raise SettingsError(f"{name} must be an http(s) URL with a host, got {raw!r}")
    return raw.rstrip("/")


def agent_url(env: Mapping[str, str], setting: str) -> str | None:
    """An agent's own base URL (``AGENT_<NAME>_URL``), if set; checked like
    ``REMOTE_SERVICE_URL``, which it overrides for that agent."""
    return _url(env, setting)


@dataclass(frozen=True)
class Settings:
    storage: Connection
    service_bus: Connection | None
    transport: Transport
    remote_service_url: str | None
    step_timeout_seconds: int
    max_failure_count: int
    supervisor_schedule: str
    deferral_window_seconds: int = DEFAULT_DEFERRAL_WINDOW_SECONDS
    console_read_only: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        storage = connection(env, STORAGE)
        if storage is None:
            raise SettingsError(
                f"{STORAGE} is not set: give a storage connection string, or "
                f"{STORAGE}__accountName for identity-based access"
            )
        transport = transport_from_env(env)
        service_bus = connection(env, SERVICE_BUS)
        if transport is Transport.SERVICE_BUS and service_bus is None:
            raise SettingsError(
                f"{AGENT_TRANSPORT} is 'servicebus' (the default) but {SERVICE_BUS} is not set: "
                f"give a connection string or {SERVICE_BUS}__fullyQualifiedNamespace, "
                f"or set {AGENT_TRANSPORT}=storage"
            )
        return cls(
            storage=storage,
            service_bus=service_bus,
            transport=transport,
            remote_service_url=_url(env),
            step_timeout_seconds=_step_timeout(env),
            max_failure_count=_positive_int(env, MAX_FAILURE_COUNT, DEFAULT_MAX_FAILURE_COUNT, 100),
            supervisor_schedule=_schedule(env),
            deferral_window_seconds=_positive_int(
                env, DEFERRAL_WINDOW_SECONDS, DEFAULT_DEFERRAL_WINDOW_SECONDS, 7 * 86_400
            ),
            console_read_only=_flag(env, CONSOLE_READ_ONLY),
        )

    def require_remote_service_url(self) -> str:
        if self.remote_service_url is None:
            raise SettingsError(
                f"{REMOTE_SERVICE_URL} is not set: agents need the base URL of the remote services"
            )
        return self.remote_service_url
