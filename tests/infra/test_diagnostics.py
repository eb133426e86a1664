"""Diagnostic settings (infra/app/diagnostics.bicep): the storage account and each of its
blob, queue and table services, the Service Bus namespace and the Function App send their
logs (and metrics) to the deployment's Log Analytics workspace, and main.bicep points them
at the resources it deploys (docs/deployment.md, "Diagnostic settings")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.bicep import INFRA, MAIN, Scope, body, evaluate, parse, resources_of_type

DIAGNOSTICS = INFRA / "app" / "diagnostics.bicep"
SETTING = "Microsoft.Insights/diagnosticSettings"
STORAGE = "Microsoft.Storage/storageAccounts"

#: resource type -> what its diagnostic setting must send (log categories or groups,
#: metric categories)
EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    STORAGE: (set(), {"Transaction"}),
    f"{STORAGE}/blobServices": ({"StorageRead", "StorageWrite", "StorageDelete"}, set()),
    # reads too: who read the orders' state and messages (an identity that holds data
    # access reads them; docs/deployment.md, "Diagnostic settings")
    f"{STORAGE}/queueServices": ({"StorageRead", "StorageWrite", "StorageDelete"}, set()),
    f"{STORAGE}/tableServices": ({"StorageRead", "StorageWrite", "StorageDelete"}, set()),
    "Microsoft.ServiceBus/namespaces": ({"allLogs"}, {"AllMetrics"}),
    "Microsoft.Web/sites": ({"FunctionAppLogs", "AppServiceAuthenticationLogs"}, {"AllMetrics"}),
}


def _existing() -> dict[str, dict[str, Any]]:
    """symbol -> the existing resource diagnostics.bicep points a setting at."""
    resources: dict[str, dict[str, Any]] = parse(DIAGNOSTICS)["resources"]
    return {symbol: r for symbol, r in resources.items() if r.get("existing")}


def _settings_by_type() -> dict[str, dict[str, Any]]:
    """resource type -> the properties of the one diagnostic setting scoped to it."""
    existing = _existing()
    found: dict[str, dict[str, Any]] = {}
    for symbol, setting in resources_of_type(parse(DIAGNOSTICS), SETTING).items():
        scope = body(setting).get("scope")
        assert scope in existing, f"{symbol} is scoped to {scope!r}, not a resource here"
        target = existing[scope]["type"]
        assert target not in found, f"two diagnostic settings on {target}"
        found[target] = evaluate(body(setting)["properties"], Scope(DIAGNOSTICS))
    return found


def test_every_data_resource_has_a_diagnostic_setting() -> None:
    assert set(_settings_by_type()) == set(EXPECTED)


@pytest.mark.parametrize("resource_type", sorted(EXPECTED))
def test_each_setting_sends_its_logs_and_metrics_to_the_workspace(resource_type: str) -> None:
    properties = _settings_by_type()[resource_type]
    logs, metrics = EXPECTED[resource_type]

    assert properties["workspaceId"] == "workspaceId"  # the module's parameter, below
    sent_logs = {e.get("category") or e.get("categoryGroup") for e in properties.get("logs", [])}
    sent_metrics = {e["category"] for e in properties.get("metrics", [])}
    assert (sent_logs, sent_metrics) == (logs, metrics)
    entries = [*properties.get("logs", []), *properties.get("metrics", [])]
    assert all(entry["enabled"] is True for entry in entries), entries


def test_the_services_are_the_storage_accounts_default_services() -> None:
    existing = _existing()
    storage = next(s for s, r in existing.items() if r["type"] == STORAGE)
    for resource in existing.values():
        if resource["type"].startswith(f"{STORAGE}/"):
            assert (body(resource)["parent"], body(resource)["name"]) == (storage, "default")


def test_main_points_them_at_its_own_resources_and_workspace() -> None:
    params = parse(MAIN)["modules"]["diagnostics"]["config"]["params"]

    def output(module: str, name: str) -> dict[str, Any]:
        accessor = {"operator": {"type": "property_accessor", "operands": {}}}
        accessor["operator"]["operands"] = {
            "operand_1": module,
            "operand_2": {
                "operator": {
                    "type": "property_accessor",
                    "operands": {"operand_1": "outputs", "operand_2": name},
                }
            },
        }
        return accessor

    assert params == {
        "storageAccountName": output("storage", "name"),
        "serviceBusNamespaceName": output("serviceBus", "name"),
        "functionAppName": output("functionApp", "name"),
        "workspaceId": output("monitoring", "workspaceId"),
    }
    # and each existing resource is found by the name passed in
    names = {r["type"]: body(r)["name"] for r in _existing().values()}
    assert names[STORAGE] == "storageAccountName"
    assert names["Microsoft.ServiceBus/namespaces"] == "serviceBusNamespaceName"
    assert names["Microsoft.Web/sites"] == "functionAppName"
