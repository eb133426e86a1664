"""The private network (vnetEnabled, azd VNET_ENABLED; docs/deployment.md, "Private
network"): off by default; on, a VNet with a subnet delegated to Microsoft.App/environments
that the Function App integrates with, private endpoints and private DNS zones for the
storage account's blob, queue and table services and for the Service Bus namespace,
public network access off on both, and the namespace on Premium (Service Bus private
endpoints need it). Values are evaluated from pycep's tree (tests/infra/bicep.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.bicep import (
    INFRA,
    MAIN,
    Scope,
    body,
    evaluate,
    load_json,
    parse,
    resources_of_type,
)

NETWORK = INFRA / "app" / "network.bicep"
STORAGE = INFRA / "app" / "storage.bicep"
SERVICE_BUS = INFRA / "app" / "servicebus.bicep"
FUNCTION_APP = INFRA / "app" / "function-app.bicep"


def _accessor(symbol: str, *path: str) -> dict[str, Any]:
    """pycep's tree for ``symbol.a.b`` (a chain nests to the right)."""
    inner: Any = path[-1]
    for name in reversed(path[:-1]):
        inner = {
            "operator": {
                "type": "property_accessor",
                "operands": {"operand_1": name, "operand_2": inner},
            }
        }
    return {
        "operator": {
            "type": "property_accessor",
            "operands": {"operand_1": symbol, "operand_2": inner},
        }
    }


def _main(vnet: bool) -> Scope:
    return Scope(MAIN, {"vnetEnabled": vnet, "serviceBusSku": "Standard"})


def _only(path: Any, resource_type: str) -> dict[str, Any]:
    (resource,) = resources_of_type(parse(path), resource_type).values()
    return resource


# --- the switch ------------------------------------------------------------------------


def test_vnet_enabled_is_an_azd_variable_off_by_default() -> None:
    param = parse(MAIN)["parameters"]["vnetEnabled"]
    assert (param["type"], param["default"]) == ("bool", False)
    given = load_json(INFRA / "main.parameters.json")["parameters"]["vnetEnabled"]
    assert given == {"value": "${VNET_ENABLED=false}"}


def test_the_network_is_deployed_only_with_vnet_enabled() -> None:
    network = parse(MAIN)["modules"]["network"]
    assert network["config"]["condition"] == "vnetEnabled"
    assert network["detail"]["path"] == "app/network.bicep"
    params = body(network)["params"]
    assert params["storageAccountName"] == _accessor("storage", "outputs", "name")
    assert params["serviceBusNamespaceName"] == _accessor("serviceBus", "outputs", "name")


@pytest.mark.parametrize("vnet", [False, True])
def test_public_access_is_closed_exactly_when_the_network_is_on(vnet: bool) -> None:
    main = _main(vnet)
    expected = "Disabled" if vnet else "Enabled"
    storage_params = main.module_params("storage")
    bus_params = main.module_params("serviceBus")
    assert storage_params["publicNetworkAccess"] == expected
    assert bus_params["publicNetworkAccess"] == expected

    storage = Scope(STORAGE, {"publicNetworkAccess": expected})
    account = evaluate(
        body(_only(STORAGE, "Microsoft.Storage/storageAccounts"))["properties"], storage
    )
    assert account["publicNetworkAccess"] == expected
    assert account["networkAcls"]["defaultAction"] == ("Deny" if vnet else "Allow")
    assert account["networkAcls"]["bypass"] == ("None" if vnet else "AzureServices")

    bus = Scope(SERVICE_BUS, {"publicNetworkAccess": expected})
    namespace = body(_only(SERVICE_BUS, "Microsoft.ServiceBus/namespaces"))
    assert evaluate(namespace["properties"], bus)["publicNetworkAccess"] == expected


def test_service_bus_is_premium_with_the_network_whatever_the_sku_parameter() -> None:
    """Service Bus private endpoints exist on Premium only."""
    assert _main(True).module_params("serviceBus")["skuName"] == "Premium"
    assert _main(False).module_params("serviceBus")["skuName"] == "Standard"
    premium = Scope(MAIN, {"vnetEnabled": False, "serviceBusSku": "Premium"})
    assert premium.module_params("serviceBus")["skuName"] == "Premium"
    skus = Scope(SERVICE_BUS)["skus"]
    assert skus["Premium"] == {"name": "Premium", "tier": "Premium", "capacity": 1}


@pytest.mark.parametrize("vnet", [False, True])
def test_the_function_app_is_integrated_with_the_delegated_subnet(vnet: bool) -> None:
    passed = body(parse(MAIN)["modules"]["functionApp"])["params"]["virtualNetworkSubnetId"]
    operands = passed["operator"]["operands"]
    assert operands == {
        "condition": "vnetEnabled",
        "true_value": _accessor("network", "outputs", "appSubnetId"),
        "false_value": "",
    }
    subnet = "/subscriptions/s/resourceGroups/r/providers/x/subnets/app" if vnet else ""
    app = Scope(FUNCTION_APP, {"virtualNetworkSubnetId": subnet})
    site = body(_only(FUNCTION_APP, "Microsoft.Web/sites"))["properties"]
    # absent (null) without the network, the subnet with it
    assert evaluate(site["virtualNetworkSubnetId"], app) == (subnet or None)


# --- the network ------------------------------------------------------------------------


def _subnets() -> dict[str, dict[str, Any]]:
    vnet = body(_only(NETWORK, "Microsoft.Network/virtualNetworks"))
    subnets = evaluate(vnet["properties"]["subnets"], Scope(NETWORK))
    return {s["name"]: s["properties"] for s in subnets}


def test_the_app_subnet_is_delegated_to_microsoft_app_environments() -> None:
    subnets = _subnets()
    assert set(subnets) == {"app", "private-endpoints"}
    delegations = subnets["app"]["delegations"]
    assert [d["properties"]["serviceName"] for d in delegations] == ["Microsoft.App/environments"]
    assert "delegations" not in subnets["private-endpoints"]
    assert subnets["private-endpoints"]["privateEndpointNetworkPolicies"] == "Disabled"
    outputs = parse(NETWORK)["outputs"]
    assert outputs["appSubnetId"]["value"] == "${vnet.id}/subnets/${appSubnetName}"
    assert Scope(NETWORK)["appSubnetName"] == "app"


def _endpoints() -> list[dict[str, Any]]:
    """network.bicep's endpoints, as written (the targets are resource ids)."""
    raw: list[dict[str, Any]] = parse(NETWORK)["variables"]["endpoints"]["value"]
    return raw


def test_a_private_endpoint_and_dns_zone_for_blob_queue_table_and_service_bus() -> None:
    storage_id = _accessor("storage", "id")
    bus_id = _accessor("namespace", "id")
    zones = {e["groupId"]: e["zone"] for e in _endpoints()}
    assert zones == {
        "blob": "privatelink.blob.${environment().suffixes.storage}",
        "queue": "privatelink.queue.${environment().suffixes.storage}",
        "table": "privatelink.table.${environment().suffixes.storage}",
        "namespace": "privatelink.servicebus.windows.net",
    }
    targets = {e["groupId"]: e["target"] for e in _endpoints()}
    assert targets == {
        "blob": storage_id,
        "queue": storage_id,
        "table": storage_id,
        "namespace": bus_id,
    }
    existing = {
        r["type"]: body(r)["name"]
        for r in parse(NETWORK)["resources"].values()
        if r.get("existing")
    }
    assert existing == {
        "Microsoft.Storage/storageAccounts": "storageAccountName",
        "Microsoft.ServiceBus/namespaces": "serviceBusNamespaceName",
    }


def test_each_endpoint_sits_in_its_subnet_with_its_zone_linked_to_the_network() -> None:
    tree = parse(NETWORK)
    resources = tree["resources"]
    for symbol in ("zones", "zoneLinks", "privateEndpoints", "zoneGroups"):
        loop = resources[symbol]["config"]["loop_type"]
        assert loop["detail"]["array_name"] == "endpoints", symbol

    endpoint = body(resources["privateEndpoints"])["properties"]
    assert endpoint["subnet"]["id"] == "${vnet.id}/subnets/${privateEndpointSubnetName}"
    (connection,) = endpoint["privateLinkServiceConnections"]
    assert connection["properties"]["privateLinkServiceId"] == _accessor("endpoint", "target")
    assert connection["properties"]["groupIds"] == [_accessor("endpoint", "groupId")]

    link = body(resources["zoneLinks"])
    assert link["properties"]["virtualNetwork"]["id"] == _accessor("vnet", "id")
    assert link["properties"]["registrationEnabled"] is False
    assert body(resources["zones"])["name"] == _accessor("endpoint", "zone")

    group = body(resources["zoneGroups"])
    (config,) = group["properties"]["privateDnsZoneConfigs"]
    index = resources["zoneGroups"]["config"]["loop_type"]["detail"]["index_name"]
    zone_id = config["properties"]["privateDnsZoneId"]
    assert zone_id["operator"]["operands"]["operand_1"]["operator"]["operands"] == {
        "operand_1": "zones",
        "operand_2": index,
    }
    parent = group["parent"]["operator"]["operands"]
    assert parent == {"operand_1": "privateEndpoints", "operand_2": index}
