"""(d) No template holds or fetches a secret: identity everywhere.

No `list*()` call (listKeys, listConnectionStrings, listAccountSas...), no
account key or SAS in a connection string, no default on a secure parameter.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.infra.bicep import INFRA, REPO, bicep_files, body, parse, rel, resources_of_type

FORBIDDEN_TEXT = ("listKeys", "AccountKey=", "SharedAccessKey", "SharedAccessSignature")
LIST_FUNCTION = re.compile(r"\blist[A-Z]\w*\s*\(")


def _template_files() -> list[Path]:
    files = [p for p in INFRA.rglob("*") if p.is_file() and p.suffix in {".bicep", ".json"}]
    return sorted([*files, REPO / "azure.yaml"])


@pytest.mark.parametrize("path", _template_files(), ids=rel)
def test_no_key_or_sas_in_templates(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lowered = text.lower()
    found = [word for word in FORBIDDEN_TEXT if word.lower() in lowered]
    found += LIST_FUNCTION.findall(text)
    assert not found, f"{rel(path)} contains {found}: use a managed identity and RBAC instead"


@pytest.mark.parametrize("path", bicep_files(), ids=rel)
def test_secure_parameters_have_no_default(path: Path) -> None:
    for name, param in parse(path).get("parameters", {}).items():
        secure = any(d.get("type") == "secure" for d in param.get("decorators", []))
        if secure:
            assert param.get("default") is None, f"{rel(path)}: @secure() {name} has a default"


def test_parameter_file_takes_values_from_the_azd_environment() -> None:
    """main.parameters.json holds references, never a value someone pasted."""
    parameters = json.loads((INFRA / "main.parameters.json").read_text())["parameters"]
    literal = {
        name: entry["value"]
        for name, entry in parameters.items()
        if not re.fullmatch(r"\$\{[A-Z0-9_]+(=[^}]*)?\}", str(entry.get("value")))
    }
    assert not literal, f"literal values in main.parameters.json: {literal}"


def _only(path: Path, resource_type: str) -> dict[str, Any]:
    (resource,) = resources_of_type(parse(path), resource_type).values()
    return body(resource)


def test_local_authentication_is_off_everywhere() -> None:
    """Keys exist but are refused: checkov has no Service Bus or App Insights check for it."""
    app = INFRA / "app"
    storage = _only(app / "storage.bicep", "Microsoft.Storage/storageAccounts")["properties"]
    assert storage["allowSharedKeyAccess"] is False
    assert storage["defaultToOAuthAuthentication"] is True
    namespace = _only(app / "servicebus.bicep", "Microsoft.ServiceBus/namespaces")["properties"]
    assert namespace["disableLocalAuth"] is True
    insights = _only(app / "monitoring.bicep", "Microsoft.Insights/components")["properties"]
    assert insights["DisableLocalAuth"] is True
    workspace = _only(app / "monitoring.bicep", "Microsoft.OperationalInsights/workspaces")
    assert workspace["properties"]["features"]["disableLocalAuth"] is True


def test_transport_is_tls12_and_nothing_is_public_by_default() -> None:
    """What checkov's Bicep checks do not cover (CKV_AZURE_59 looks only at publicNetworkAccess)."""
    app = INFRA / "app"
    storage = _only(app / "storage.bicep", "Microsoft.Storage/storageAccounts")["properties"]
    assert storage["minimumTlsVersion"] == "TLS1_2"
    assert storage["supportsHttpsTrafficOnly"] is True
    assert storage["allowBlobPublicAccess"] is False
    containers = resources_of_type(
        parse(app / "storage.bicep"), "Microsoft.Storage/storageAccounts/blobServices/containers"
    )
    assert len(containers) == 3  # the deployment package, the host's (a loop), the archive
    for container in containers.values():
        assert body(container)["properties"]["publicAccess"] == "None"
    namespace = _only(app / "servicebus.bicep", "Microsoft.ServiceBus/namespaces")["properties"]
    assert namespace["minimumTlsVersion"] == "1.2"
    site = _only(app / "function-app.bicep", "Microsoft.Web/sites")["properties"]
    assert site["httpsOnly"] is True
    assert site["siteConfig"]["minTlsVersion"] == "1.2"
    # FTP: off through the publishing-credentials policies (test_flex_consumption); Flex
    # Consumption refuses siteConfig.ftpsState.


def test_function_app_uses_only_its_user_assigned_identity() -> None:
    app = INFRA / "app" / "function-app.bicep"
    site = _only(app, "Microsoft.Web/sites")
    assert site["identity"]["type"] == "UserAssigned"
    storage = site["properties"]["functionAppConfig"]["deployment"]["storage"]
    assert storage["authentication"]["type"] == "UserAssignedIdentity"
