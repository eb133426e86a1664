"""What the Flex Consumption plan refuses, which pycep and checkov do not know.

ARM rejects a Flex Consumption site whose siteConfig sets `ftpsState`
(BadRequest 51021, "site configuration properties ... for Flex Consumption
sites is invalid"; Azure/azure-cli#31414). FTP stays off through the
basicPublishingCredentialsPolicies resources instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.bicep import INFRA, bicep_files, body, parse, rel, resources_of_type

#: siteConfig properties the platform refuses on a Flex Consumption site.
REFUSED_SITE_CONFIG = ("ftpsState",)


@pytest.mark.parametrize("path", bicep_files(), ids=rel)
def test_no_site_sets_a_site_config_property_flex_consumption_refuses(path: Path) -> None:
    tree = parse(path)
    configs = [
        body(site).get("properties", {}).get("siteConfig", {})
        for site in resources_of_type(tree, "Microsoft.Web/sites").values()
    ]
    # The same properties, written as a separate `web` config resource.
    configs += [
        body(config).get("properties", {})
        for config in resources_of_type(tree, "Microsoft.Web/sites/config").values()
        if body(config).get("name") == "web"
    ]
    for config in configs:
        refused = sorted(set(config) & set(REFUSED_SITE_CONFIG))
        assert not refused, f"{rel(path)} sets {refused}, which Flex Consumption rejects (51021)"


def test_ftp_and_basic_auth_publishing_are_off() -> None:
    """What keeps FTP off now that ftpsState cannot be set."""
    app = parse(INFRA / "app" / "function-app.bicep")
    (site_symbol,) = resources_of_type(app, "Microsoft.Web/sites")
    policies = resources_of_type(app, "Microsoft.Web/sites/basicPublishingCredentialsPolicies")
    assert {body(p)["name"]: body(p)["properties"]["allow"] for p in policies.values()} == {
        "ftp": False,
        "scm": False,
    }
    assert all(body(p)["parent"] == site_symbol for p in policies.values())
