"""The platform's settings as deployed, as devhost's defaults: ``infra/platform-settings.json``
lists what the deployment gives the platform (the runtime's pool size; Bicep emits them from
it), and devhost sets each one the environment leaves unset before the runtime starts, so
the app runs on the pool it has in Azure. A value in the environment wins.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from devhost.settings import ConfigError, load_json

PATH = Path("infra", "platform-settings.json")  # under the app's folder; absent: nothing


def settings(root: str | Path) -> dict[str, str]:
    """The platform settings the deployment sets (name -> value); ``{}`` without the file."""
    path = Path(root, PATH)
    try:
        entries = document["appSettings"] if (document := load_json(path)) else []  # no file
        return {str(entry["name"]): str(entry["value"]) for entry in entries}
    except (KeyError, TypeError) as error:
        raise ConfigError(f"cannot read {path}: {error!r}") from error


@dataclass(frozen=True)
class Applied:
    """What :func:`apply` did: the defaults it set, and the settings the environment set to
    something else (name -> (its value, the deployed value))."""

    defaults: dict[str, str]
    overridden: dict[str, tuple[str, str]]


def apply(environ: MutableMapping[str, str], root: str | Path) -> Applied:
    """Set each deployed platform setting ``environ`` lacks (or sets empty); a value is kept."""
    applied = Applied({}, {})
    for name, value in settings(root).items():
        mine = environ.get(name, "").strip()
        if not mine:
            environ[name] = applied.defaults[name] = value
        elif mine != value:
            applied.overridden[name] = (environ[name], value)
    return applied
