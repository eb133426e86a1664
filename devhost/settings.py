"""Settings: %NAME% expressions in bindings, host.json options, devhost's lease settings;
each fails with a :class:`ConfigError` naming the setting at fault (no Azure SDK here).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MAX_LEASE_SECONDS = 30  # the longest queue message lease devhost takes (contract 3.9)
DEFAULT_RENEW_SECONDS = 10.0


class ConfigError(Exception):
    """A setting, host.json option or binding that devhost cannot run with."""


_EXPRESSION = re.compile(r"%([^%\s]+)%")


def resolve_binding(
    binding: Mapping[str, Any], environ: Mapping[str, str], where: str
) -> dict[str, Any]:
    """A copy of ``binding`` with every ``%NAME%`` in its string properties replaced by the
    app setting's value (``where`` names the function and binding for the error message)."""

    def resolve(key: str, value: Any) -> Any:
        if not isinstance(value, str) or key in ("name", "type", "direction"):
            return value
        if missing := [name for name in _EXPRESSION.findall(value) if name not in environ]:
            raise ConfigError(f"{where} property {key!r}: app setting {missing[0]!r} is not set")
        return _EXPRESSION.sub(lambda match: environ[match.group(1)], value)

    return {key: resolve(key, value) for key, value in binding.items()}


def load_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file of settings (host.json ...), or ``{}`` when there is none."""
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig")) if path.exists() else {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {path}: {error}") from error
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return document


OVERRIDES = "AzureFunctionsJobHost__"  # an app setting over host.json: this, then its path


def with_overrides(host: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """host.json with the ``AzureFunctionsJobHost__<path>`` app settings on top, as the host
    layers them (``__`` between the parts; devhost matches host.json's case, not any case)."""
    merged: dict[str, Any] = json.loads(json.dumps(host))
    for key, value in sorted(environ.items()):
        if key.startswith(OVERRIDES):
            *sections, last = key.removeprefix(OVERRIDES).split("__")
            node = merged
            for part in sections:
                node[part] = node[part] if isinstance(node.get(part), dict) else {}
                node = node[part]
            node[last] = value
    return merged


def section(document: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: Any = document
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


_TIMESPAN = re.compile(r"^(?:(\d+)\.)?(\d+):(\d+):(\d+(?:\.\d+)?)$")


def parse_timespan(value: object) -> float:
    """Seconds in a .NET TimeSpan text as host.json holds them (``[d.]hh:mm:ss[.fff]``)."""
    match = _TIMESPAN.match(str(value).strip())
    if not match:
        raise ValueError("not a time span like '00:00:30'")
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def _option(name: str, default: Any, low: float = 0, high: float | None = None) -> Any:
    """A dataclass field read from the host.json option ``name``: a whole number if
    ``default`` is one, else a time span; from ``low`` to ``high``, as the host allows."""
    return field(default=default, metadata={"name": name, "low": low, "high": high})


def _read(cls: Any, options: Mapping[str, Any], **defaults: Any) -> Any:
    """``cls`` from a section of host.json: each field from its option, else its default
    (or what ``defaults`` says); a :class:`ConfigError` names an option out of bounds."""
    values = {}
    for option in fields(cls):
        name, low, high = (option.metadata[k] for k in ("name", "low", "high"))
        raw, value = options.get(name), defaults.get(option.name, option.default)
        if raw is not None:
            try:
                value = int(str(raw)) if isinstance(value, int) else parse_timespan(raw)
            except ValueError as error:
                raise ConfigError(f"host.json {name}: {raw!r} is not usable ({error})") from error
            if value < low or (high is not None and value > high):
                bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
                raise ConfigError(f"host.json {name}: {raw!r} must be {bounds}")
        values[option.name] = value
    return cls(**values)


@dataclass(frozen=True)
class QueueOptions:
    """``extensions.queues`` of host.json, with the Functions host's defaults and bounds."""

    batch_size: int = _option("batchSize", 16, low=1, high=32)
    new_batch_threshold: int = _option("newBatchThreshold", 8)  # default: batchSize / 2
    max_polling_interval: float = _option("maxPollingInterval", 60.0, low=0.1)
    visibility_timeout: float = _option("visibilityTimeout", 0.0)
    max_dequeue_count: int = _option("maxDequeueCount", 5, low=1)

    @property
    def max_concurrency(self) -> int:
        """The host runs at most batchSize + newBatchThreshold messages at once per function."""
        return self.batch_size + self.new_batch_threshold

    @classmethod
    def from_host_json(cls, host: Mapping[str, Any]) -> QueueOptions:
        options = section(host, "extensions", "queues")
        # Messages go to the function as stored: the host's default, base64, is not decoded.
        encoding = options.get("messageEncoding", "base64 (the default)")
        if str(encoding).lower() != "none":
            raise ConfigError(f'host.json messageEncoding must be "none", not {encoding!r}')
        batch_size = _read(cls, options).batch_size
        return _read(cls, options, new_batch_threshold=batch_size // 2)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LeaseOptions:
    """How long devhost holds a queue message and how often it renews the hold (shorter for
    tests: ``DEVHOST_LEASE_SECONDS`` / ``DEVHOST_RENEW_SECONDS``; never over 30 s)."""

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
            raise ConfigError(f"DEVHOST_RENEW_SECONDS must be above 0, below the lease ({lease} s)")
        return cls(lease, renew)


@dataclass(frozen=True)
class ServiceBusOptions:
    """``extensions.serviceBus`` of host.json (the parts a local receiver needs)."""

    max_concurrent_calls: int = _option("maxConcurrentCalls", 16, low=1)
    max_auto_lock_renewal: float = _option("maxAutoLockRenewalDuration", 300.0)

    @classmethod
    def from_host_json(cls, host: Mapping[str, Any]) -> ServiceBusOptions:
        return _read(cls, section(host, "extensions", "serviceBus"))  # type: ignore[no-any-return]


def route_prefix(host: Mapping[str, Any]) -> str:
    """``extensions.http.routePrefix`` (default ``api``; ``""`` removes the prefix)."""
    raw = section(host, "extensions", "http").get("routePrefix")
    return "api" if raw is None else str(raw).strip("/")
