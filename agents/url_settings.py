"""Agent URL settings that name no declared agent are refused when the app starts.

An http agent calls ``AGENT_<NAME>_URL``, else ``REMOTE_SERVICE_URL`` (``agents.build``);
in Azure the deployment writes ``AGENT_<NAME>_URL`` from azd's ``AGENT_URLS`` (a JSON
object, agent name to base URL) for each declared agent. A setting whose name matches no
agent would be ignored, so a typo (``AGENT_CARIER_URL``, ``{"carier": ...}``) would send
that agent's calls, a refund say, to ``REMOTE_SERVICE_URL``. ``check_agent_urls`` refuses
it instead, naming the setting, the closest declared agent and all of them. The app's
bootstrap runs it, and so does ``python -m admin deploy-check``, which the azd hooks run
with the environment's ``AGENT_URLS``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from config.settings import SettingsError

#: azd's per-agent base URLs (docs/deployment.md, "Agents").
AGENT_URLS: Final = "AGENT_URLS"
_URL_SETTING: Final = re.compile(r"AGENT_(?P<name>[A-Z0-9_]+)_URL")


def check_agent_urls(env: Mapping[str, str], agents: Iterable[str]) -> None:
    """Raise ``SettingsError`` for the first ``AGENT_<NAME>_URL`` setting, or entry of
    ``AGENT_URLS``, in ``env`` that names none of ``agents`` (the declared agents'
    names)."""
    declared = sorted(agents)
    by_setting = {_setting_of(a): a for a in declared}
    for key in sorted(env):
        found = _URL_SETTING.fullmatch(key)
        if found and key not in by_setting:
            guess = found["name"].lower().replace("_", "-")
            raise SettingsError(
                f"{key} names agent {guess!r}, which is not declared; "
                + _declared(guess, declared, _setting_of)
                + ". Its calls would go to REMOTE_SERVICE_URL: rename the setting, or remove it"
            )
    raw = env.get(AGENT_URLS, "").strip()
    if not raw:
        return
    try:
        urls = json.loads(raw)
    except ValueError:
        urls = None
    if not isinstance(urls, dict):
        raise SettingsError(
            f"{AGENT_URLS} must be a JSON object of agent name to base URL, like "
            f'{{"carrier": "https://carrier.example.com"}}; got {raw[:80]!r}'
        )
    for name in sorted(urls):
        if name not in declared:
            raise SettingsError(
                f"{AGENT_URLS} names agent {name!r}, which is not declared; "
                + _declared(name, declared, repr)
                + ". Its calls would go to REMOTE_SERVICE_URL: fix the name (azd env set "
                f"{AGENT_URLS} '{{...}}'), or remove it"
            )


def mentions_agent_urls(env: Mapping[str, str]) -> bool:
    """Whether ``env`` holds a setting ``check_agent_urls`` reads (then the declared
    agents are worth loading to check it)."""
    return AGENT_URLS in env or any(_URL_SETTING.fullmatch(k) for k in env)


def _setting_of(agent: str) -> str:
    """``AGENT_<NAME>_URL`` (``core.agent_spec.Agent.url_setting``)."""
    return f"AGENT_{agent.upper().replace('-', '_')}_URL"


def _declared(name: str, declared: list[str], spelt: Callable[[str], str]) -> str:
    """``did you mean X? the declared agents: ...``, the closest match first."""
    close = difflib.get_close_matches(name, declared, n=len(declared), cutoff=0.6)
    ordered = close + [a for a in declared if a not in close]
    hint = f"did you mean {spelt(close[0])}? " if close else ""
    return f"{hint}the declared agents: {', '.join(ordered) or 'none'}"
