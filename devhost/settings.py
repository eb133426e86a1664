"""Settings for the local host: local.settings.json, %NAME% expressions, host.json options.

Everything here is pure (no Azure SDK): it reads files and a mapping that stands for the
environment, and fails with a :class:`ConfigError` that names the setting or option at fault.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Longest queue message lease devhost takes (contract 3.9): a message held by a killed
#: process is visible again at most this long after its last renewal.
MAX_LEASE_SECONDS = 30
DEFAULT_RENEW_SECONDS = 10.0
#: Shortest idle poll; the delay doubles while a queue stays empty, up to maxPollingInterval.
MIN_POLL_SECONDS = 0.05
#: Environment prefix that overrides host.json, as in Azure (``AzureFunctionsJobHost__a__b``).
HOST_OVERRIDE_PREFIX = "azurefunctionsjobhost__"


class ConfigError(Exception):
    """A setting, host.json option or binding that devhost cannot run with."""


# --- local.settings.json and %NAME% -------------------------------------------------------


def load_local_settings(path: Path, environ: MutableMapping[str, str]) -> list[str]:
    """Add the file's ``Values`` to ``environ`` for names not already set; return those added.

    Like ``func start``: a variable already in the environment wins over the file.
    """
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read settings file {path}: {error}") from error
    values = document.get("Values", {}) if isinstance(document, dict) else None
    if not isinstance(values, dict):
        raise ConfigError(f"settings file {path}: 'Values' must be a JSON object")
    added = []
    for name, value in values.items():
        if name in environ or value is None:
            continue
        environ[name] = _setting_text(value)
        added.append(name)
    return added


def _setting_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_EXPRESSION = re.compile(r"%([^%\s]+)%")


def resolve_expressions(text: str, environ: Mapping[str, str], where: str) -> str:
    """Replace every ``%NAME%`` in ``text`` by the setting's value.

    ``where`` names the function and binding property for the error message.
    """

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise ConfigError(
                f"{where}: the app setting {name!r} (from {match.group(0)!r}) is not set; "
                "set it in the environment or in local.settings.json Values"
            )
        return environ[name]

    return _EXPRESSION.sub(lookup, text)


def resolve_binding(
    binding: Mapping[str, Any], environ: Mapping[str, str], where: str
) -> dict[str, Any]:
    """A copy of ``binding`` with ``%NAME%`` resolved in its string properties."""
    resolved: dict[str, Any] = {}
    for key, value in binding.items():
        if isinstance(value, str) and key not in ("name", "type", "direction"):
            resolved[key] = resolve_expressions(value, environ, f"{where} property {key!r}")
        else:
            resolved[key] = value
    return resolved


# --- host.json ------------------------------------------------------------------------------


def load_host_json(path: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """host.json (``{}`` when absent) with ``AzureFunctionsJobHost__...`` overrides applied."""
    document: dict[str, Any] = {}
    if path.exists():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8-sig"))
        except (OSError, ValueError) as error:
            raise ConfigError(f"cannot read {path}: {error}") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        document = loaded
    for name, value in environ.items():
        if name.lower().startswith(HOST_OVERRIDE_PREFIX):
            _set_path(document, name[len(HOST_OVERRIDE_PREFIX) :].split("__"), value)
    return document


def _set_path(document: dict[str, Any], path: list[str], value: str) -> None:
    node = document
    for part in path[:-1]:
        key = _actual_key(node, part)
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[_actual_key(node, path[-1])] = value


def _actual_key(node: Mapping[str, Any], wanted: str) -> str:
    """host.json keys are case-insensitive (as .NET configuration is)."""
    for key in node:
        if key.lower() == wanted.lower():
            return key
    return wanted


def section(document: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: Any = document
    for part in path:
        node = node.get(_actual_key(node, part)) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _option(options: Mapping[str, Any], name: str) -> Any:
    return options.get(_actual_key(options, name))


_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d+):(\d+)(?::(\d+(?:\.\d+)?))?$")


def parse_timespan(value: object, name: str, number_unit: float | None = None) -> float:
    """Seconds in a .NET TimeSpan text (``[d.]hh:mm[:ss[.fff]]``).

    A bare number is accepted only where the host accepts one (``number_unit`` seconds each,
    e.g. milliseconds for ``maxPollingInterval``).
    """
    if isinstance(value, int | float) and not isinstance(value, bool) and number_unit:
        return float(value) * number_unit
    text = str(value).strip()
    if number_unit and re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text) * number_unit
    match = _TIMESPAN.match(text)
    if not match:
        raise ConfigError(f"host.json {name}: {value!r} is not a time span like '00:00:30'")
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds or 0)


def _int_option(options: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    raw = _option(options, name)
    if raw is None:
        return default
    try:
        value = int(str(raw))
    except ValueError as error:
        raise ConfigError(f"host.json {name}: {raw!r} is not an integer") from error
    if not low <= value <= high:
        raise ConfigError(f"host.json {name}: {value} is outside {low}..{high}")
    return value


@dataclass(frozen=True)
class QueueOptions:
    """``extensions.queues`` of host.json, with the Functions host's defaults."""

    message_encoding: str = "base64"
    batch_size: int = 16
    new_batch_threshold: int = 8
    max_polling_interval: float = 60.0
    visibility_timeout: float = 0.0
    max_dequeue_count: int = 5

    @property
    def max_concurrency(self) -> int:
        """The host runs at most batchSize + newBatchThreshold messages at once per function."""
        return self.batch_size + self.new_batch_threshold

    @classmethod
    def from_host_json(cls, host: Mapping[str, Any]) -> QueueOptions:
        options = section(host, "extensions", "queues")
        encoding = str(_option(options, "messageEncoding") or "base64").lower()
        if encoding not in ("base64", "none"):
            raise ConfigError(f"host.json messageEncoding: {encoding!r} is not base64 or none")
        batch_size = _int_option(options, "batchSize", 16, 1, 32)
        raw_poll = _option(options, "maxPollingInterval")
        poll = 60.0 if raw_poll is None else parse_timespan(raw_poll, "maxPollingInterval", 0.001)
        raw_visibility = _option(options, "visibilityTimeout")
        visibility = (
            0.0 if raw_visibility is None else parse_timespan(raw_visibility, "visibilityTimeout")
        )
        if poll < 0.1:
            raise ConfigError("host.json maxPollingInterval: the minimum is 00:00:00.100")
        if visibility > 7 * 86400:
            raise ConfigError("host.json visibilityTimeout: the maximum is 7 days")
        return cls(
            message_encoding=encoding,
            batch_size=batch_size,
            new_batch_threshold=_int_option(options, "newBatchThreshold", batch_size // 2, 0, 1000),
            max_polling_interval=poll,
            visibility_timeout=visibility,
            max_dequeue_count=_int_option(options, "maxDequeueCount", 5, 1, 10_000),
        )


@dataclass(frozen=True)
class LeaseOptions:
    """How long devhost holds a queue message and how often it renews the hold.

    ``DEVHOST_LEASE_SECONDS`` / ``DEVHOST_RENEW_SECONDS`` shorten them for tests; the lease
    can never exceed 30 s (contract 3.9).
    """

    lease_seconds: int = MAX_LEASE_SECONDS
    renew_seconds: float = DEFAULT_RENEW_SECONDS

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LeaseOptions:
        try:
            lease = int(environ.get("DEVHOST_LEASE_SECONDS", MAX_LEASE_SECONDS))
            default_renew = min(DEFAULT_RENEW_SECONDS, lease / 3)
            renew = float(environ.get("DEVHOST_RENEW_SECONDS", default_renew))
        except ValueError as error:
            raise ConfigError(f"DEVHOST_LEASE_SECONDS / DEVHOST_RENEW_SECONDS: {error}") from error
        if not 1 <= lease <= MAX_LEASE_SECONDS:
            raise ConfigError(f"DEVHOST_LEASE_SECONDS must be 1..{MAX_LEASE_SECONDS}, not {lease}")
        if not 0 < renew < lease:
            raise ConfigError(
                f"DEVHOST_RENEW_SECONDS must be above 0 and below the lease ({lease} s)"
            )
        return cls(lease, renew)


@dataclass(frozen=True)
class ServiceBusOptions:
    """``extensions.serviceBus`` of host.json (the parts a local receiver needs)."""

    max_concurrent_calls: int = 16
    max_auto_lock_renewal: float = 300.0
    auto_complete: bool = True

    @classmethod
    def from_host_json(cls, host: Mapping[str, Any]) -> ServiceBusOptions:
        options = section(host, "extensions", "serviceBus")
        raw_renewal = _option(options, "maxAutoLockRenewalDuration")
        auto_complete = _option(options, "autoCompleteMessages")
        return cls(
            max_concurrent_calls=_int_option(options, "maxConcurrentCalls", 16, 1, 1000),
            max_auto_lock_renewal=(
                300.0
                if raw_renewal is None
                else parse_timespan(raw_renewal, "maxAutoLockRenewalDuration")
            ),
            auto_complete=str(auto_complete).lower() != "false",
        )


def route_prefix(host: Mapping[str, Any]) -> str:
    """``extensions.http.routePrefix`` (default ``api``; ``""`` removes the prefix)."""
    options = section(host, "extensions", "http")
    raw = _option(options, "routePrefix")
    return "api" if raw is None else str(raw).strip("/")


def default_instance_id() -> str:
    return f"devhost-{socket.gethostname()}-{os.getpid()}"
