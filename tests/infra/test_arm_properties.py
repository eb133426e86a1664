"""Property names of the diagnostic settings, the private network and App Service
authentication, against the ARM reference (pycep checks syntax only and checkov ignores
unknown properties, so a misspelt name would first fail at `azd provision`, or, in
authsettingsV2, be dropped without a word).

The allowed names are those of the template references (learn.microsoft.com/azure/
templates): Microsoft.Insights/diagnosticSettings 2021-05-01-preview;
Microsoft.Network/virtualNetworks/subnets 2023-05-01; Microsoft.Web/sites/config
authsettingsV2 2024-04-01 (SiteAuthSettingsV2Properties); and, for private endpoints, their
DNS zone groups, private DNS zones and their virtual network links, the shapes of the
Azure-Samples Flex Consumption azd templates (storage-PrivateEndpoint.bicep,
servicebus-privateEndpoint.bicep). Only what infra/ uses is listed, not every property.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.infra.bicep import INFRA, Scope, body, evaluate, parse, resources_of_type

#: resource type -> api version -> allowed keys, by path ("" = the resource body)
ALLOWED: dict[str, tuple[str, dict[str, set[str]]]] = {
    "Microsoft.Insights/diagnosticSettings": (
        "2021-05-01-preview",
        {
            "": {"name", "scope", "properties"},
            "properties": {
                "eventHubAuthorizationRuleId",
                "eventHubName",
                "logAnalyticsDestinationType",
                "logs",
                "marketplacePartnerId",
                "metrics",
                "serviceBusRuleId",
                "storageAccountId",
                "workspaceId",
            },
            "properties.logs[]": {"category", "categoryGroup", "enabled", "retentionPolicy"},
            "properties.metrics[]": {"category", "enabled", "retentionPolicy", "timeGrain"},
        },
    ),
    "Microsoft.Network/virtualNetworks": (
        "2023-05-01",
        {
            "": {"name", "location", "tags", "properties"},
            "properties": {"addressSpace", "subnets"},
            "properties.addressSpace": {"addressPrefixes"},
            "properties.subnets[]": {"name", "properties"},
            "properties.subnets[].properties": {
                "addressPrefix",
                "addressPrefixes",
                "defaultOutboundAccess",
                "delegations",
                "natGateway",
                "networkSecurityGroup",
                "privateEndpointNetworkPolicies",
                "privateLinkServiceNetworkPolicies",
            },
            "properties.subnets[].properties.delegations[]": {"name", "properties"},
            "properties.subnets[].properties.delegations[].properties": {"serviceName"},
        },
    ),
    "Microsoft.Network/privateEndpoints": (
        "2023-11-01",
        {
            "": {"name", "location", "tags", "properties"},
            "properties": {"subnet", "privateLinkServiceConnections"},
            "properties.subnet": {"id"},
            "properties.privateLinkServiceConnections[]": {"name", "properties"},
            "properties.privateLinkServiceConnections[].properties": {
                "privateLinkServiceId",
                "groupIds",
            },
        },
    ),
    "Microsoft.Network/privateEndpoints/privateDnsZoneGroups": (
        "2023-11-01",
        {
            "": {"parent", "name", "properties"},
            "properties": {"privateDnsZoneConfigs"},
            "properties.privateDnsZoneConfigs[]": {"name", "properties"},
            "properties.privateDnsZoneConfigs[].properties": {"privateDnsZoneId"},
        },
    ),
    "Microsoft.Network/privateDnsZones": (
        "2020-06-01",
        {"": {"name", "location", "tags", "properties"}, "properties": set()},
    ),
    "Microsoft.Network/privateDnsZones/virtualNetworkLinks": (
        "2020-06-01",
        {
            "": {"parent", "name", "location", "tags", "properties"},
            "properties": {"registrationEnabled", "virtualNetwork"},
            "properties.virtualNetwork": {"id"},
        },
    ),
    "Microsoft.Web/sites/config": (
        "2024-04-01",
        {
            "": {"parent", "name", "properties"},
            "properties": {"platform", "globalValidation", "identityProviders", "login"}
            | {"httpSettings"},
            "properties.platform": {"enabled", "runtimeVersion", "configFilePath"},
            "properties.globalValidation": {
                "requireAuthentication",
                "unauthenticatedClientAction",
                "redirectToProvider",
                "excludedPaths",
            },
            "properties.httpSettings": {"requireHttps", "routes", "forwardProxy"},
            "properties.identityProviders": {
                "azureActiveDirectory",
                "apple",
                "azureStaticWebApps",
                "customOpenIdConnectProviders",
                "facebook",
                "gitHub",
                "google",
                "legacyMicrosoftAccount",
                "twitter",
            },
            "properties.identityProviders.azureActiveDirectory": {
                "enabled",
                "registration",
                "login",
                "validation",
                "isAutoProvisioned",
            },
            "properties.identityProviders.azureActiveDirectory.registration": {
                "openIdIssuer",
                "clientId",
                "clientSecretSettingName",
                "clientSecretCertificateThumbprint",
                "clientSecretCertificateSubjectAlternativeName",
                "clientSecretCertificateIssuer",
            },
            "properties.identityProviders.azureActiveDirectory.validation": {
                "jwtClaimChecks",
                "allowedAudiences",
                "defaultAuthorizationPolicy",
            },
            "properties.login": {
                "routes",
                "tokenStore",
                "preserveUrlFragmentsForLogins",
                "allowedExternalRedirectUrls",
                "cookieExpiration",
                "nonce",
            },
            "properties.login.tokenStore": {
                "enabled",
                "tokenRefreshExtensionHours",
                "fileSystem",
                "azureBlobStorage",
            },
        },
    ),
}


def _at(value: Any, path: str) -> list[Any]:
    """The values at ``path`` (``a.b[]`` walks every item of a list)."""
    values = [value]
    for part in [p for p in path.split(".") if p]:
        many = part.endswith("[]")
        key = part.removesuffix("[]")
        found = [v[key] for v in values if isinstance(v, dict) and key in v]
        values = [item for v in found for item in v] if many else found
        values = [v for v in values if isinstance(v, dict | list)]
    return values


def _uses() -> list[tuple[Path, str, dict[str, Any]]]:
    found = []
    for path in sorted((INFRA / "app").glob("*.bicep")):
        tree = parse(path)
        for resource_type in ALLOWED:
            for symbol, resource in resources_of_type(tree, resource_type).items():
                if not resource.get("existing"):
                    found.append((path, symbol, resource))
    return found


def test_the_checked_types_are_used() -> None:
    used = {resource["type"] for _, _, resource in _uses()}
    assert used == set(ALLOWED)


@pytest.mark.parametrize(
    ("path", "symbol", "resource"), _uses(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_only_known_properties_at_the_referenced_api_version(
    path: Path, symbol: str, resource: dict[str, Any]
) -> None:
    version, allowed = ALLOWED[resource["type"]]
    assert resource["api_version"] == version, f"{path.name}:{symbol}: checked at {version}"
    # evaluated, so that variables (a list of log categories) and concat() are looked into
    config = evaluate(body(resource), Scope(path))
    for where, keys in allowed.items():
        for value in _at(config, where):
            if isinstance(value, dict):
                unknown = set(value) - keys
                assert not unknown, f"{path.name}:{symbol} {where or 'body'}: {sorted(unknown)}"
