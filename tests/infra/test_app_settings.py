"""(c) The app settings Bicep emits are exactly the settings the code reads.

config.settings.APP_SETTINGS names them (docs/contracts.md §3.6). A connection name may
appear as its identity-based `<Name>__<part>` variants instead of itself; the
two Application Insights settings and the Python runtime's thread pool size are read by
the platform, not the code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from config import settings
from core import names, workflows
from core.limits import MAX_STEP_TIMEOUT_SECONDS
from core.retention import DEFAULT_KEPT_DAYS, DEFAULT_RETENTION, Retention
from tests.infra.bicep import (
    FUNCTION_APP,
    INFRA,
    MAIN,
    REGENERATE,
    Scope,
    agents_json,
    app_settings,
    bicep_files,
    body,
    client_id_setting,
    function_app_scope,
    load_json,
    parse,
    rel,
    resources_of_type,
)

PLATFORM_SETTINGS = {
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    # azure-functions-runtime's pool (devhost/pool.py; tests/unit/test_thread_pool.py)
    "PYTHON_THREADPOOL_THREAD_COUNT",
}
CONNECTIONS = {settings.STORAGE, settings.SERVICE_BUS}
# The parts the Functions host and config.settings.Connection understand.
IDENTITY_PARTS = {
    "accountName",
    "fullyQualifiedNamespace",
    "blobServiceUri",
    "queueServiceUri",
    "tableServiceUri",
    "credential",
    "clientId",
}
#: Per-agent settings (core.workflows.Agent.url_setting, .api_key_setting): only for
#: the declared agents.
AGENT_SETTING = re.compile(r"AGENT_[A-Z0-9_]+_(?:URL|API_KEY)")
# Where each connection's identity-based form must point.
ENDPOINT_PART = {
    settings.STORAGE: "accountName",
    settings.SERVICE_BUS: "fullyQualifiedNamespace",
}


def _every_key_uri() -> dict[str, str]:
    """A Key Vault secret URI for every ApiKey agent: every setting Bicep can emit."""
    return {
        agent["name"]: f"https://vault.example.net/secrets/{agent['name']}"
        for agent in agents_json()
        if agent["auth"] == "api-key"
    }


def _emitted() -> dict[str, Any]:
    """Every app setting written anywhere in infra/: name -> value (evaluated as far as
    Bicep can without deploying; a parameter reads as its name). The agents' settings are
    those of infra/agents.json, with a key URI for every ApiKey agent."""
    found: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def add(name: str, value: Any, path: Path) -> None:
        assert name not in found, f"{name} is set twice ({sources[name]} and {rel(path)})"
        found[name] = value
        sources[name] = rel(path)

    for path in bicep_files():
        tree = parse(path)
        if path == FUNCTION_APP:
            scope = function_app_scope(agentApiKeySecretUris=_every_key_uri())
        else:
            scope = Scope(path)
        for setting in app_settings(scope):
            add(setting["name"], setting.get("value"), path)
        for config in resources_of_type(tree, "Microsoft.Web/sites/config").values():
            if body(config).get("name") == "appsettings":
                for name, value in body(config).get("properties", {}).items():
                    add(name, value, path)
    return found


def test_a_function_app_emits_app_settings() -> None:
    assert _emitted(), "no Microsoft.Web/sites appSettings found under infra/"


def _declared_agent_settings() -> set[str]:
    """The per-agent settings of the declared agents: AGENT_<NAME>_URL of each http
    agent, AGENT_<NAME>_API_KEY of each ApiKey agent, and the identity's client id
    (agents/auth.py) when an agent authenticates with Entra ID."""
    names = set()
    for agent in workflows.AGENTS.values():
        if agent.kind == "http":
            names.add(agent.url_setting)
        if isinstance(agent.auth, workflows.ApiKey):
            names.add(agent.api_key_setting)
        if isinstance(agent.auth, workflows.EntraToken):
            names.add(client_id_setting())
    return names


def test_emitted_settings_are_exactly_what_the_code_reads() -> None:
    emitted = set(_emitted())
    agent_settings = _declared_agent_settings()
    unexpected = []
    for name in sorted(emitted - PLATFORM_SETTINGS):
        if AGENT_SETTING.fullmatch(name) or name == client_id_setting():
            if name not in agent_settings:
                unexpected.append(
                    f"{name}: the setting of no declared agent (core.workflows.AGENTS); "
                    f"if the declarations changed, run `{REGENERATE}`"
                )
            continue
        base, _, part = name.partition("__")
        if base not in settings.APP_SETTINGS:
            unexpected.append(f"{name}: not read by the code (config.settings.APP_SETTINGS)")
        elif part and (base not in CONNECTIONS or part not in IDENTITY_PARTS):
            unexpected.append(f"{name}: {base} has no identity-based part {part!r}")
    assert not unexpected, "Bicep emits settings nothing reads:\n" + "\n".join(unexpected)

    missing = [
        name
        for name in settings.APP_SETTINGS
        if name not in emitted and not any(e.startswith(name + "__") for e in emitted)
    ]
    assert not missing, f"the code reads settings Bicep never sets: {missing}"
    missing_agents = sorted(agent_settings - emitted)
    assert not missing_agents, (
        f"declared agents' settings Bicep never sets: {missing_agents}; if the declarations "
        f"changed, run `{REGENERATE}`"
    )
    assert emitted >= PLATFORM_SETTINGS, f"missing: {sorted(PLATFORM_SETTINGS - emitted)}"


def test_the_platform_settings_are_the_file_devhost_reads() -> None:
    """infra/platform-settings.json: Bicep emits exactly its entries (name and value), and
    devhost applies the same file as its defaults (devhost/deployed.py)."""
    listed = {
        e["name"]: e["value"] for e in load_json(INFRA / "platform-settings.json")["appSettings"]
    }
    emitted = _emitted()
    assert {name: emitted.get(name) for name in listed} == listed
    assert set(listed) <= PLATFORM_SETTINGS


def test_connections_are_identity_based() -> None:
    emitted = _emitted()
    for connection in CONNECTIONS:
        assert connection not in emitted, f"{connection} must not be a connection string"
        for part in (ENDPOINT_PART[connection], "credential", "clientId"):
            assert f"{connection}__{part}" in emitted, f"{connection}__{part} is not set"
        assert emitted[f"{connection}__credential"] == "managedidentity"
    # Both connections and telemetry use the same (the app's) identity.
    client_ids = {emitted[f"{connection}__clientId"] for connection in CONNECTIONS}
    assert len(client_ids) == 1, f"connections use different identities: {client_ids}"
    (client_id,) = client_ids
    assert emitted["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"] == (
        f"Authorization=AAD;ClientId=${{{client_id}}}"
    )


def test_transport_is_service_bus() -> None:
    assert _emitted()[settings.AGENT_TRANSPORT] == settings.Transport.SERVICE_BUS.value


def test_flex_consumption_runtime_is_not_an_app_setting() -> None:
    emitted = _emitted()
    for name in ("FUNCTIONS_WORKER_RUNTIME", "FUNCTIONS_EXTENSION_VERSION"):
        assert name not in emitted, f"{name} is refused on Flex Consumption"
    app = parse(INFRA / "app" / "function-app.bicep")
    (site,) = resources_of_type(app, "Microsoft.Web/sites").values()
    runtime = body(site)["properties"]["functionAppConfig"]["runtime"]
    # The Python the app is built and tested on (pyproject.toml's requires-python)
    pyproject = (INFRA.parent / "pyproject.toml").read_text(encoding="utf-8")
    (python,) = re.findall(r'requires-python = ">=(3\.\d+)"', pyproject)
    assert runtime == {"name": "python", "version": python} == {"name": "python", "version": "3.13"}


def test_parameter_defaults_match_the_code_defaults() -> None:
    params = parse(MAIN)["parameters"]
    assert params["stepTimeoutSeconds"]["default"] == settings.DEFAULT_STEP_TIMEOUT_SECONDS
    assert params["maxFailureCount"]["default"] == settings.DEFAULT_MAX_FAILURE_COUNT
    assert params["supervisorSchedule"]["default"] == settings.DEFAULT_SUPERVISOR_SCHEDULE
    assert params["deferralWindowSeconds"]["default"] == settings.DEFAULT_DEFERRAL_WINDOW_SECONDS
    assert params["retention"]["default"] == DEFAULT_RETENTION
    assert params["retentionSchedule"]["default"] == settings.DEFAULT_RETENTION_SCHEDULE
    assert params["retentionBatch"]["default"] == settings.DEFAULT_RETENTION_BATCH
    assert params["archiveDeleteAfterDays"]["default"] == settings.DEFAULT_ARCHIVE_DAYS
    assert params["dashboardSchedule"]["default"] == settings.DEFAULT_DASHBOARD_SCHEDULE
    assert params["stuckFloorSeconds"]["default"] == settings.DEFAULT_STUCK_FLOOR_SECONDS
    assert params["maxClockSkewSeconds"]["default"] == settings.DEFAULT_MAX_CLOCK_SKEW_SECONDS
    assert params["outageAlertSeconds"]["default"] == settings.DEFAULT_OUTAGE_ALERT_SECONDS
    assert params["replyQueues"]["default"] == ""  # no status messages unless listed
    assert params["keptDays"]["default"] == DEFAULT_KEPT_DAYS
    Retention.parse(params["retention"]["default"])  # a default the app accepts


def _bounds(param: dict[str, Any]) -> dict[str, Any]:
    return {
        d["type"]: d["argument"]
        for d in param.get("decorators", [])
        if d["type"] in {"min_value", "max_value"}
    }


def test_step_timeout_cannot_exceed_what_the_host_honours() -> None:
    """The code refuses STEP_TIMEOUT_SECONDS above MAX_STEP_TIMEOUT_SECONDS (host.json lock
    renewal and function timeout): a deployment must not be able to set more."""
    for path in (MAIN, INFRA / "app" / "function-app.bicep"):
        param = parse(path)["parameters"]["stepTimeoutSeconds"]
        assert _bounds(param) == {"min_value": 1, "max_value": MAX_STEP_TIMEOUT_SECONDS}, (
            f"{rel(path)}: stepTimeoutSeconds bounds"
        )


def test_retention_batch_bounds_match_the_code() -> None:
    param = parse(MAIN)["parameters"]["retentionBatch"]
    assert _bounds(param) == {"min_value": 1, "max_value": 100_000}


def test_the_archive_container_and_its_lifecycle_rule_are_core_names() -> None:
    storage = parse(INFRA / "app" / "storage.bicep")
    main_text = MAIN.read_text(encoding="utf-8")
    assert f"var archiveContainerName = '{names.ORDERS_ARCHIVE}'" in main_text
    text = (INFRA / "app" / "storage.bicep").read_text(encoding="utf-8")
    assert "name: archiveContainerName" in text and "'${archiveContainerName}/'" in text
    assert {"archiveCoolAfterDays", "archiveDeleteAfterDays"} <= set(storage["parameters"])


def test_clock_skew_bounds_match_the_code() -> None:
    for path in (MAIN, INFRA / "app" / "function-app.bicep"):
        param = parse(path)["parameters"]["maxClockSkewSeconds"]
        assert _bounds(param) == {
            "min_value": 1,
            "max_value": settings.MAX_MAX_CLOCK_SKEW_SECONDS,
        }, rel(path)


def test_outage_alert_bounds_match_the_code() -> None:
    for path in (MAIN, INFRA / "app" / "function-app.bicep"):
        param = parse(path)["parameters"]["outageAlertSeconds"]
        assert _bounds(param) == {
            "min_value": 1,
            "max_value": settings.MAX_OUTAGE_ALERT_SECONDS,
        }, rel(path)


def test_deferral_window_bounds_match_the_code() -> None:
    for path in (MAIN, INFRA / "app" / "function-app.bicep"):
        param = parse(path)["parameters"]["deferralWindowSeconds"]
        assert _bounds(param) == {"min_value": 1, "max_value": 7 * 86_400}, rel(path)
