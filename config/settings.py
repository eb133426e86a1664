"""Typed settings, read once from the environment (app settings in Azure).

The names are docs/contracts.md §3.6 of the architecture; ``infra/`` emits exactly
these, and ``tests/infra`` checks that the two sets agree. ``Settings.from_env`` is the
one reading of them: the bootstrap calls it with the process environment and hands
each part what it uses, so nothing else reads the environment. Besides the app
settings it reads what the platform sets (the instance, the app's host name, App
Service authentication, a disabled function, Application Insights) and the test and
benchmark switches (``ORDERS_*``), each with its name in one place below.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final
from urllib.parse import urlsplit

from config.principals import SignIn, parse_dev_principal
from core.limits import (
    DECLARATIONS_SETTING,
    DEFAULT_DECLARATIONS,
    HOST_FUNCTION_TIMEOUT_SECONDS,
    HOST_LOCK_RENEWAL_SECONDS,
    MAX_STEP_TIMEOUT_SECONDS,
)
from core.reply_queues import ReplyQueues
from core.retention import DEFAULT_KEPT_DAYS, DEFAULT_RETENTION, Retention

STORAGE: Final = "AzureWebJobsStorage"
SERVICE_BUS: Final = "ServiceBusConnection"
AGENT_TRANSPORT: Final = "AGENT_TRANSPORT"
REMOTE_SERVICE_URL: Final = "REMOTE_SERVICE_URL"
STEP_TIMEOUT_SECONDS: Final = "STEP_TIMEOUT_SECONDS"
MAX_FAILURE_COUNT: Final = "MAX_FAILURE_COUNT"
SUPERVISOR_SCHEDULE: Final = "SUPERVISOR_SCHEDULE"
DEFERRAL_WINDOW_SECONDS: Final = "DEFERRAL_WINDOW_SECONDS"
CONSOLE_READ_ONLY: Final = "CONSOLE_READ_ONLY"
#: The app registration people sign in to (App Service authentication); Bicep writes it
#: from authClientId, empty without sign-in (config/principals.py).
SIGN_IN_CLIENT_ID: Final = "SIGN_IN_CLIENT_ID"
RETENTION: Final = "RETENTION"
RETENTION_SCHEDULE: Final = "RETENTION_SCHEDULE"
RETENTION_BATCH: Final = "RETENTION_BATCH"
ARCHIVE_DAYS: Final = "ARCHIVE_DAYS"
DASHBOARD_SCHEDULE: Final = "DASHBOARD_SCHEDULE"
STUCK_FLOOR_SECONDS: Final = "STUCK_FLOOR_SECONDS"
MAX_CLOCK_SKEW_SECONDS: Final = "MAX_CLOCK_SKEW_SECONDS"
REPLY_QUEUES: Final = "REPLY_QUEUES"
KEPT_DAYS: Final = "KEPT_DAYS"
OUTAGE_ALERT_SECONDS: Final = "OUTAGE_ALERT_SECONDS"

#: The module that declares the agents and workflows (``declarations/``, yours).
DECLARATIONS: Final = DECLARATIONS_SETTING
#: Set by the platform: which instance this is; App Service authentication on.
WEBSITE_INSTANCE_ID: Final = "WEBSITE_INSTANCE_ID"
WEBSITE_AUTH_ENABLED: Final = "WEBSITE_AUTH_ENABLED"
#: Set by App Service in Azure (never by devhost): where a development principal is refused.
AZURE_MARKERS: Final = ("WEBSITE_SITE_NAME", "WEBSITE_INSTANCE_ID", "WEBSITE_OWNER_NAME")
#: The host name the app is served at (Azure, func start, devhost: 127.0.0.1:<port>).
WEBSITE_HOSTNAME: Final = "WEBSITE_HOSTNAME"
#: Application Insights (set by Bicep; identity-based ingestion by its second setting).
APPINSIGHTS_CONNECTION: Final = "APPLICATIONINSIGHTS_CONNECTION_STRING"
APPINSIGHTS_AUTHENTICATION: Final = "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"
#: The identity a user-assigned managed identity's tokens are asked for (Entra agents).
AZURE_CLIENT_ID: Final = "AZURE_CLIENT_ID"
#: Agents' own settings start with this (``AGENT_<NAME>_URL``, ``AGENT_<NAME>_API_KEY``).
AGENT_SETTINGS_PREFIX: Final = "AGENT_"
#: Tests and local runs only: devhost's instance name; the ride-out budget; failpoints;
#: where to count storage requests (benchmarks).
DEVHOST_INSTANCE_ID: Final = "DEVHOST_INSTANCE_ID"
RIDE_OUT_SECONDS: Final = "ORDERS_RIDE_OUT_SECONDS"
FAILPOINTS: Final = "ORDERS_FAILPOINTS"
#: Tests only: this instance's clock runs this many seconds ahead (negative: behind).
CLOCK_OFFSET: Final = "ORDERS_CLOCK_OFFSET_SECONDS"
OPCOUNT_DIR: Final = "ORDERS_OPCOUNT_DIR"
#: devhost only: the development principal (``<name>; roles=<role>,...``) of a request
#: that names none, and X-Dev-Principal believed (config/principals.py). devhost sets it
#: to the OS user as Orders.Operator unless the environment sets it (empty: off).
DEV_PRINCIPAL: Final = "ORDERS_DEV_PRINCIPAL"
#: The function that applies agent replies (scheduler/triggers.py): where an instance
#: does not run it (``AzureWebJobs.handle_agent_reply.Disabled``), its agents send their
#: replies to the reply queue instead of applying them in process.
REPLY_HANDLER: Final = "handle_agent_reply"
DEFAULT_RIDE_OUT_SECONDS: Final = 120.0

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
    SIGN_IN_CLIENT_ID,
    RETENTION,
    RETENTION_SCHEDULE,
    RETENTION_BATCH,
    ARCHIVE_DAYS,
    DASHBOARD_SCHEDULE,
    STUCK_FLOOR_SECONDS,
    MAX_CLOCK_SKEW_SECONDS,
    REPLY_QUEUES,
    KEPT_DAYS,
    OUTAGE_ALERT_SECONDS,
)

DEFAULT_STEP_TIMEOUT_SECONDS: Final = 30
DEFAULT_MAX_FAILURE_COUNT: Final = 5
DEFAULT_SUPERVISOR_SCHEDULE: Final = "*/10 * * * * *"
#: How long a step may keep waiting for its remote service (circuit open, Retry-After,
#: the service down for everyone) before it fails for good; outages shorter than this
#: are ridden out without an operator.
DEFAULT_DEFERRAL_WINDOW_SECONDS: Final = 1800
#: Every call to an agent's remote failing for this long is an outage: one operator alert
#: for the agent (and one when it answers again), never one per order (§3.14).
DEFAULT_OUTAGE_ALERT_SECONDS: Final = 300
MAX_OUTAGE_ALERT_SECONDS: Final = 86_400
#: Retention runs every 15 minutes, each archiving at most ``RETENTION_BATCH`` orders
#: (about 96,000 a day by default; raise the batch for more).
DEFAULT_RETENTION_SCHEDULE: Final = "0 */15 * * * *"
DEFAULT_RETENTION_BATCH: Final = 1000
#: How long the archive keeps an order (Bicep's lifecycle rule deletes blobs then, and
#: sets this setting from the same parameter); after it the table forgets the order too.
DEFAULT_ARCHIVE_DAYS: Final = 730
#: The dashboard's timer (figures and the stuck check) runs once a minute.
DEFAULT_DASHBOARD_SCHEDULE: Final = "30 * * * * *"
#: A step is stuck past its p99 over the last day, and never under this.
DEFAULT_STUCK_FLOOR_SECONDS: Final = 300
#: How far apart two instances' clocks may be. No instance undoes a step before an
#: attempt of it can no longer reach its remote by any instance's clock: its deadline plus
#: this (docs/contracts.md §3.11). NTP keeps Azure instances within a second or two; the
#: price of a larger value is only a later compensation of a step in doubt.
DEFAULT_MAX_CLOCK_SKEW_SECONDS: Final = 10
MAX_MAX_CLOCK_SKEW_SECONDS: Final = 300


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
    ``<Name>__blobServiceUri`` / ``<Name>__queueServiceUri`` / ``<Name>__tableServiceUri``), with
    ``<Name>__clientId`` for a user-assigned managed identity.
    """

    name: str
    connection_string: str | None = None
    account_name: str | None = None
    fully_qualified_namespace: str | None = None
    blob_service_uri: str | None = None
    queue_service_uri: str | None = None
    table_service_uri: str | None = None
    client_id: str | None = None
    credential: str | None = None


_PARTS = (
    "accountName",
    "fullyQualifiedNamespace",
    "blobServiceUri",
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
        blob_service_uri=parts.get("blobServiceUri"),
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


def _clock_offset(env: Mapping[str, str]) -> float:
    raw = env.get(CLOCK_OFFSET, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{CLOCK_OFFSET} must be a number of seconds, got {raw!r}") from None
    if not -300 <= value <= 300:
        raise SettingsError(f"{CLOCK_OFFSET} must be from -300 to 300 seconds, got {raw!r}")
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


def _schedule(
    env: Mapping[str, str],
    name: str = SUPERVISOR_SCHEDULE,
    default: str = DEFAULT_SUPERVISOR_SCHEDULE,
) -> str:
    raw = env.get(name, "").strip() or default
    fields = raw.split()
    if len(fields) != 6 or not all(_CRON_FIELD.fullmatch(f) for f in fields):
        raise SettingsError(
            f"{name} must be a six-field NCRONTAB expression "
            f"(second minute hour day month day-of-week, e.g. {default!r}), got {raw!r}"
        )
    return raw


def retention_schedule_of(env: Mapping[str, str]) -> str:
    """``RETENTION_SCHEDULE``: also read alone, when ``function_app.py`` is indexed (the
    retention timer's schedule is fixed then)."""
    return _schedule(env, RETENTION_SCHEDULE, DEFAULT_RETENTION_SCHEDULE)


def dashboard_schedule_of(env: Mapping[str, str]) -> str:
    """``DASHBOARD_SCHEDULE``: read when ``function_app.py`` is indexed, as the retention
    timer's schedule is."""
    return _schedule(env, DASHBOARD_SCHEDULE, DEFAULT_DASHBOARD_SCHEDULE)


def _retention(env: Mapping[str, str]) -> Retention:
    try:
        return Retention.parse(env.get(RETENTION, "").strip() or DEFAULT_RETENTION, RETENTION)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _reply_queues(env: Mapping[str, str]) -> ReplyQueues:
    try:
        return ReplyQueues.parse(env.get(REPLY_QUEUES, ""), REPLY_QUEUES)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,\-?]+")


#: Hosts an ``http://`` base URL may name: this machine only (a local simulator, a
#: service beside the app). Anything else must be ``https://``.
LOOPBACK_NAMES: Final = frozenset({"localhost"})


def is_loopback(host: str) -> bool:
    """``localhost``, or an IP address in 127.0.0.0/8 or ``::1``."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(env: Mapping[str, str], name: str = REMOTE_SERVICE_URL) -> str | None:
    """A remote services' base URL: ``https://``, or ``http://`` to a loopback host only.
    An agent's calls carry its credentials (an API key, an Entra token) and the orders'
    data: over plain ``http://`` to another host they would cross the network in clear,
    so such a setting is refused when the settings are read, not at the first call."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    parsed = urlsplit(raw)
    scheme = parsed.scheme.lower()
    if scheme not in ("http", "https") or not parsed.netloc or not parsed.hostname:
        raise SettingsError(f"{name} must be an http(s) URL with a host, got {raw!r}")
    if scheme == "http" and not is_loopback(parsed.hostname):
        raise SettingsError(
            f"{name} must be an https:// URL: got {raw!r}, and plain http:// is allowed only "
            "for this machine (127.0.0.1, localhost, ::1), since an agent's calls carry its "
            "API key or token and the order's data in clear over http"
        )
    return raw.rstrip("/")


_CLIENT_ID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def _sign_in(env: Mapping[str, str]) -> SignIn:
    """``SIGN_IN_CLIENT_ID``, ``WEBSITE_AUTH_ENABLED`` and ``ORDERS_DEV_PRINCIPAL``. A
    development principal makes X-Dev-Principal believed, which only a server no one else
    can reach may do: devhost (it listens on 127.0.0.1 only), never Azure, never beside
    sign-in."""
    client_id = env.get(SIGN_IN_CLIENT_ID, "").strip() or None
    if client_id is not None and not _CLIENT_ID.fullmatch(client_id):
        raise SettingsError(
            f"{SIGN_IN_CLIENT_ID} must be the client id (a GUID) of the app registration "
            f"people sign in to, got {client_id[:80]!r}"
        )
    platform = env.get(WEBSITE_AUTH_ENABLED, "").strip().lower() == "true"
    raw = env.get(DEV_PRINCIPAL, "").strip()
    if not raw:
        return SignIn(client_id, platform)
    hostname = urlsplit(f"//{env.get(WEBSITE_HOSTNAME, '').strip()}").hostname
    elsewhere = [name for name in AZURE_MARKERS if env.get(name, "").strip()]
    elsewhere += [SIGN_IN_CLIENT_ID] if client_id else []
    elsewhere += [WEBSITE_AUTH_ENABLED] if platform else []
    elsewhere += [WEBSITE_HOSTNAME] if hostname and not is_loopback(hostname) else []
    if elsewhere:
        raise SettingsError(
            f"{DEV_PRINCIPAL} lets any caller say who it is (X-Dev-Principal): it is for "
            f"devhost on this machine only, and {', '.join(elsewhere)} says this is not "
            f"that. Remove {DEV_PRINCIPAL}; in Azure people sign in ({SIGN_IN_CLIENT_ID})"
        )
    if not env.get(DEVHOST_INSTANCE_ID, "").strip():
        raise SettingsError(
            f"{DEV_PRINCIPAL} is accepted under devhost only (python -m devhost, which "
            "listens on 127.0.0.1 alone), since it lets any caller say who it is"
        )
    try:
        default = parse_dev_principal(raw)
    except ValueError as exc:
        raise SettingsError(f"{DEV_PRINCIPAL}: {exc}") from None
    return SignIn(client_id, platform, default)


def agent_url(env: Mapping[str, str], setting: str) -> str | None:
    """An agent's own base URL (``AGENT_<NAME>_URL``), if set; checked like
    ``REMOTE_SERVICE_URL``, which it overrides for that agent."""
    return _url(env, setting)


def instance_of(env: Mapping[str, str]) -> str:
    """Who holds a claim: the Functions instance (or devhost process) and the worker pid."""
    base = (
        env.get(DEVHOST_INSTANCE_ID)
        or env.get(WEBSITE_INSTANCE_ID, "")[:16]
        or socket.gethostname()
    )
    return f"{base}-{os.getpid()}"


def declarations_of(env: Mapping[str, str]) -> str:
    return env.get(DECLARATIONS, "").strip() or DEFAULT_DECLARATIONS


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86_400:
        raise SettingsError(f"{name} must be a number of seconds from 0 to 86400, got {raw!r}")
    return value


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
    #: the module of agent and workflow declarations
    declarations: str = DEFAULT_DECLARATIONS
    #: this process, as claims and logs name it
    instance_id: str = field(default_factory=lambda: instance_of({}))
    #: whether this instance runs the reply handler (then its agents apply replies in process)
    inline_replies: bool = True
    #: who callers are: App Service authentication, devhost's development principal, or
    #: neither (config/principals.py)
    sign_in: SignIn = field(default_factory=SignIn)
    #: Application Insights: the connection string and the authentication string, if any
    telemetry_connection: str | None = None
    telemetry_authentication: str | None = None
    #: agents' own settings (``AGENT_<NAME>_URL``, ``..._API_KEY``) and ``AZURE_CLIENT_ID``,
    #: read here once and checked when each agent is built (it knows its names)
    agent_settings: Mapping[str, str] = field(default_factory=dict)
    #: how long a trigger rides out storage trouble inside one invocation
    ride_out_seconds: float = DEFAULT_RIDE_OUT_SECONDS
    #: test switches: failpoints armed, and where storage requests are counted
    failpoints: str = ""
    clock_offset_seconds: float = 0.0
    opcount_dir: str | None = None
    #: how long finished orders stay before they are archived (core.retention)
    retention: Retention = field(default_factory=lambda: Retention.parse(DEFAULT_RETENTION))
    retention_schedule: str = DEFAULT_RETENTION_SCHEDULE
    retention_batch: int = DEFAULT_RETENTION_BATCH
    archive_days: int = DEFAULT_ARCHIVE_DAYS
    #: how long messages kept for an operator (stores/kept.py) stay before they are archived
    kept_days: int = DEFAULT_KEPT_DAYS
    #: the dashboard's timer, and the least time in one state that makes a step stuck
    dashboard_schedule: str = DEFAULT_DASHBOARD_SCHEDULE
    stuck_floor_seconds: int = DEFAULT_STUCK_FLOOR_SECONDS
    #: how far apart instances' clocks may be (an undo waits that long past a deadline)
    max_clock_skew_seconds: int = DEFAULT_MAX_CLOCK_SKEW_SECONDS
    #: the queues an order's replyTo may name (core.reply_queues; empty: none)
    reply_queues: ReplyQueues = field(default_factory=ReplyQueues)
    #: how long every call to an agent's remote fails before one outage alert (core.outages)
    outage_alert_seconds: int = DEFAULT_OUTAGE_ALERT_SECONDS
    #: the app's own host name (``WEBSITE_HOSTNAME``: Azure's, or devhost's
    #: ``127.0.0.1:<port>``), where a remote calls back (``core.links``); empty: unknown
    hostname: str = ""

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
            declarations=declarations_of(env),
            instance_id=instance_of(env),
            inline_replies=not function_disabled(env, REPLY_HANDLER),
            sign_in=_sign_in(env),
            telemetry_connection=env.get(APPINSIGHTS_CONNECTION) or None,
            telemetry_authentication=env.get(APPINSIGHTS_AUTHENTICATION) or None,
            agent_settings=MappingProxyType(
                {
                    k: v
                    for k, v in env.items()
                    if k.startswith(AGENT_SETTINGS_PREFIX) or k == AZURE_CLIENT_ID
                }
            ),
            ride_out_seconds=_seconds(env, RIDE_OUT_SECONDS, DEFAULT_RIDE_OUT_SECONDS),
            failpoints=env.get(FAILPOINTS, "").strip(),
            clock_offset_seconds=_clock_offset(env),
            opcount_dir=env.get(OPCOUNT_DIR) or None,
            retention=_retention(env),
            retention_schedule=retention_schedule_of(env),
            retention_batch=_positive_int(env, RETENTION_BATCH, DEFAULT_RETENTION_BATCH, 100_000),
            archive_days=_positive_int(env, ARCHIVE_DAYS, DEFAULT_ARCHIVE_DAYS, 36_500),
            kept_days=_positive_int(env, KEPT_DAYS, DEFAULT_KEPT_DAYS, 36_500),
            dashboard_schedule=dashboard_schedule_of(env),
            stuck_floor_seconds=_positive_int(
                env, STUCK_FLOOR_SECONDS, DEFAULT_STUCK_FLOOR_SECONDS, 7 * 86_400
            ),
            max_clock_skew_seconds=_positive_int(
                env,
                MAX_CLOCK_SKEW_SECONDS,
                DEFAULT_MAX_CLOCK_SKEW_SECONDS,
                MAX_MAX_CLOCK_SKEW_SECONDS,
            ),
            reply_queues=_reply_queues(env),
            outage_alert_seconds=_positive_int(
                env, OUTAGE_ALERT_SECONDS, DEFAULT_OUTAGE_ALERT_SECONDS, MAX_OUTAGE_ALERT_SECONDS
            ),
            hostname=env.get(WEBSITE_HOSTNAME, "").strip(),
        )

    def require_remote_service_url(self) -> str:
        if self.remote_service_url is None:
            raise SettingsError(
                f"{REMOTE_SERVICE_URL} is not set: agents need the base URL of the remote services"
            )
        return self.remote_service_url
