"""The platform's settings as deployed, as devhost's defaults.

``infra/platform-settings.json`` lists the app settings the deployment gives the Function
App for the platform itself (the Python runtime's thread pool, ``PYTHON_THREADPOOL_THREAD_
COUNT``): ``infra/app/function-app.bicep`` emits them from that file, and devhost, before
it starts the runtime, sets each one the environment leaves unset. So an app started as
the README says runs on the pool it has in Azure, not on Python's default of
``min(32, CPUs + 4)`` threads. A value set in the environment wins (a test or a run that
means to differ): devhost logs it beside the deployed value, and warns when the pool is
below what the functions need (``devhost.pool.shortfall``).

The app's own settings (``core/settings.py``) have their defaults in code, equal to
Bicep's parameters' defaults (``tests/infra``); they are not listed here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from devhost.settings import ConfigError

#: Where the list lives, under the app's folder (absent: nothing is applied).
PATH = Path("infra", "platform-settings.json")


def settings(root: str | Path) -> dict[str, str]:
    """The platform settings the deployment sets (name -> value); ``{}`` without the file."""
    path = Path(root, PATH)
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        entries = document["appSettings"]
        found = {str(entry["name"]): str(entry["value"]) for entry in entries}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"cannot read {path}: {error!r}") from error
    return found


@dataclass(frozen=True)
class Applied:
    """What :func:`apply` did: the defaults it set, and the settings the environment set to
    something else (name -> (its value, the deployed value))."""

    defaults: dict[str, str]
    overridden: dict[str, tuple[str, str]]


def apply(environ: MutableMapping[str, str], root: str | Path) -> Applied:
    """Set each deployed platform setting ``environ`` lacks; an existing value is kept."""
    return merge(environ, settings(root))


def merge(environ: MutableMapping[str, str], deployed: Mapping[str, str]) -> Applied:
    defaults: dict[str, str] = {}
    overridden: dict[str, tuple[str, str]] = {}
    for name, value in deployed.items():
        mine = environ.get(name)
        if mine is None or not mine.strip():
            environ[name] = defaults[name] = value
        elif mine.strip() != value:
            overridden[name] = (mine, value)
    return Applied(defaults, overridden)
