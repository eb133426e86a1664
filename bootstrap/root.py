"""The composition root: ``bootstrap(settings)`` wires the app, once per process.

It is the one place that turns settings into an app: it checks what the settings name,
arms the switches a process has (failpoints, request logs, telemetry), and makes the
``AppContext`` whose parts (``bootstrap/parts.py``) are built on first use. Tests call it
with their own settings, names, clock and fakes instead of patching the environment.

Settings are read once: ``settings_from_environment`` is, with ``config.settings`` that it
calls, the only code of the app that reads the environment. ``index_time`` reads the
few things the trigger modules need while ``function_app.py`` is indexed (which
transport, which declarations, the timers' schedules), before any other setting may exist.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache, cached_property
from typing import Any

from agents.url_settings import check_agent_urls, mentions_agent_urls
from bootstrap.parts import AppContext, utc_now
from config.settings import (
    Settings,
    Transport,
    dashboard_schedule_of,
    declarations_of,
    retention_schedule_of,
    transport_from_env,
)
from core import links, workflows
from core.names import Names
from core.ports import Clock
from observability import failpoints, logs, telemetry


def settings_from_environment(
    overrides: Mapping[str, str] | None = None, defaults: Mapping[str, str] | None = None
) -> Settings:
    """Every setting of this process, read once (``config.settings``); ``overrides`` win over
    the environment, ``defaults`` fill what it lacks (the CLI's ``--connection``, say)."""
    return Settings.from_env({**(defaults or {}), **os.environ, **(overrides or {})})


@dataclass(frozen=True)
class IndexTime:
    """What the trigger modules need while ``function_app.py`` is indexed."""

    transport: Transport
    declarations: str
    retention_schedule: str
    dashboard_schedule: str


@cache
def index_time() -> IndexTime:
    """Read once, when the first trigger module is imported (``AGENT_TRANSPORT`` decides
    the agent queues' trigger type; the declarations, which agents get a function;
    ``RETENTION_SCHEDULE``, when the retention timer fires)."""
    env: Mapping[str, str] = os.environ
    found = IndexTime(
        transport_from_env(env),
        declarations_of(env),
        retention_schedule_of(env),
        dashboard_schedule_of(env),
    )
    workflows.use(found.declarations)
    return found


def declarations_from_environment() -> str:
    """For the CLI's declaration commands, which need no other setting: the declarations
    module (``ORDERS_DECLARATIONS``), put to use; its name."""
    name = declarations_of(os.environ)
    workflows.use(name)
    return name


def bootstrap(
    settings: Settings,
    *,
    names: Names | None = None,
    clock: Clock | None = None,
    **parts: Any,
) -> AppContext:
    """The app, wired from ``settings``. ``parts`` replaces any part by name (``store``,
    ``queues``, ``transport`` ...): tests pass in-memory twins and fakes this way. The
    clock is the system's, or (a test switch: ``ORDERS_CLOCK_OFFSET_SECONDS``) the
    system's moved by an offset: an instance whose clock is off, for the chaos suite.
    The app's host name (``WEBSITE_HOSTNAME``) is set here, once, for the links it hands
    out (``core.links.events_url``). An agent URL setting that names no declared agent is
    refused (``SettingsError``:
    ``agents.url_settings``), not left for the agent's calls to go elsewhere."""
    if clock is None:
        clock = utc_now if not settings.clock_offset_seconds else _offset(settings)
    workflows.use(settings.declarations)
    links.serve_at(settings.hostname)
    if mentions_agent_urls(settings.agent_settings):  # a typo would call REMOTE_SERVICE_URL
        check_agent_urls(settings.agent_settings, workflows.AGENTS)
    failpoints.arm(settings.failpoints)
    logs.quiet_request_logs()
    telemetry.setup(settings.telemetry_connection, settings.telemetry_authentication)
    context = AppContext(settings, names or Names(), clock)
    for name, part in parts.items():
        if not isinstance(getattr(AppContext, name, None), cached_property):
            raise TypeError(f"bootstrap: no part called {name!r}")
        context.__dict__[name] = part
    return context


def _offset(settings: Settings) -> Clock:
    offset = timedelta(seconds=settings.clock_offset_seconds)
    return lambda: datetime.now(UTC) + offset
