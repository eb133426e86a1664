"""(f) The operator console: its read-only switch, its URL, and Entra sign-in with roles.

CONSOLE_READ_ONLY comes from the consoleReadOnly parameter and is written as a value
config.settings accepts. App Service authentication (Easy Auth, authsettingsV2) is
deployed only when authClientId names an app registration; it vouches for every caller
it can (a cookie, a token) and lets the others through for the app to decide by role
(config/principals.py), which believes it only with SIGN_IN_CLIENT_ID, written from the
same parameter. It holds no secret. The app roles the registration needs are
infra/app-roles.json, the code's role names.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from config import principals, settings
from tests.infra.bicep import (
    FUNCTION_APP,
    INFRA,
    MAIN,
    REPO,
    app_settings,
    bicep_files,
    body,
    function_app_scope,
    load_json,
    parse,
    rel,
)
from tests.infra.bicep import resources_of_type as of_type

AUTH = INFRA / "app" / "auth.bicep"
AUTH_CONFIG = "authsettingsV2"


def _app_setting(name: str, **params: Any) -> Any:
    """The value function-app.bicep gives setting ``name``, with ``params`` (evaluated)."""
    values = [
        setting.get("value")
        for setting in app_settings(function_app_scope(**params))
        if setting["name"] == name
    ]
    assert len(values) == 1, f"{rel(FUNCTION_APP)} sets {name} {len(values)} times"
    return values[0]


def _not_empty(expression: Any, symbol: str) -> bool:
    """Whether a pycep expression is `!empty(symbol)`."""
    operator = expression.get("operator", {}) if isinstance(expression, dict) else {}
    operand = operator.get("operands", {}).get("bool_value", {})
    function = operand.get("function", {}) if isinstance(operand, dict) else {}
    return (
        operator.get("type") == "not"
        and function.get("type") == "empty"
        and function.get("parameters", {}).get("item_to_test") == symbol
    )


def _is_tenant_id(expression: Any) -> bool:
    """Whether a pycep expression is `tenant().tenantId`."""
    function = expression.get("function", {}) if isinstance(expression, dict) else {}
    return function.get("type") == "tenant" and "tenantId" in str(function.get("property_name"))


# --- CONSOLE_READ_ONLY ------------------------------------------------------------------


def test_console_read_only_is_written_from_the_parameter() -> None:
    for read_only, written in ((True, "true"), (False, "false")):
        value = _app_setting(settings.CONSOLE_READ_ONLY, consoleReadOnly=read_only)
        assert value == written, (
            f"{settings.CONSOLE_READ_ONLY} must be consoleReadOnly ? 'true' : 'false'"
        )
    assert parse(FUNCTION_APP)["parameters"]["consoleReadOnly"]["type"] == "bool"


@pytest.mark.parametrize(("written", "read_only"), [("true", True), ("false", False)])
def test_the_written_values_are_what_the_code_accepts(written: str, read_only: bool) -> None:
    env = {
        settings.STORAGE: "UseDevelopmentStorage=true",
        settings.AGENT_TRANSPORT: "storage",
        settings.CONSOLE_READ_ONLY: written,
    }
    assert settings.Settings.from_env(env).console_read_only is read_only


def test_console_read_only_parameter_flows_from_azd_to_the_app() -> None:
    main = parse(MAIN)
    param = main["parameters"]["consoleReadOnly"]
    assert param["type"] == "bool"
    code_default = settings.Settings.from_env(
        {settings.STORAGE: "UseDevelopmentStorage=true", settings.AGENT_TRANSPORT: "storage"}
    ).console_read_only
    assert param["default"] is code_default is False, "off unless asked for, as in the code"
    assert any(d["type"] == "description" for d in param["decorators"])
    assert body(main["modules"]["functionApp"])["params"]["consoleReadOnly"] == "consoleReadOnly"
    given = load_json(INFRA / "main.parameters.json")["parameters"]
    assert given["consoleReadOnly"]["value"] == "${CONSOLE_READ_ONLY=false}"


def test_the_console_url_is_an_output() -> None:
    output = parse(FUNCTION_APP)["outputs"]["consoleUrl"]["value"]
    assert output == "https://${site.properties.defaultHostName}/api/console"
    # /api is the Functions host's default route prefix: host.json must not move it.
    host = json.loads((REPO / "host.json").read_text(encoding="utf-8"))
    assert host.get("extensions", {}).get("http", {}).get("routePrefix", "api") == "api"
    surfaced = parse(MAIN)["outputs"]["CONSOLE_URL"]["value"]["operator"]["operands"]
    assert surfaced["operand_1"] == "functionApp"
    assert surfaced["operand_2"]["operator"]["operands"]["operand_2"] == "consoleUrl"


# --- App Service authentication (Easy Auth) --------------------------------------------


def _auth_configs() -> dict[str, list[dict[str, Any]]]:
    """Every authsettingsV2 resource in infra/, by file."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in bicep_files():
        for config in of_type(parse(path), "Microsoft.Web/sites/config").values():
            if body(config).get("name") == AUTH_CONFIG:
                found.setdefault(rel(path), []).append(config)
    return found


def test_sign_in_is_one_authsettings_v2_resource_on_the_function_app() -> None:
    assert list(_auth_configs()) == [rel(AUTH)], _auth_configs()
    (config,) = _auth_configs()[rel(AUTH)]
    tree = parse(AUTH)
    parent = body(config)["parent"]
    site = tree["resources"][parent]
    assert site["type"] == "Microsoft.Web/sites" and site["existing"] is True
    assert body(site)["name"] == "functionAppName"
    # The API version the repo uses for the site itself.
    (app_site,) = of_type(parse(FUNCTION_APP), "Microsoft.Web/sites").values()
    assert config["api_version"] == site["api_version"] == app_site["api_version"]


def test_sign_in_is_deployed_only_when_a_client_id_is_given() -> None:
    main = parse(MAIN)
    auth_modules = {
        symbol: module
        for symbol, module in main["modules"].items()
        if module["detail"]["path"] == "app/auth.bicep"
    }
    assert list(auth_modules) == ["auth"], "main.bicep deploys app/auth.bicep once"
    module = auth_modules["auth"]
    assert _not_empty(module["config"].get("condition"), "authClientId"), (
        "app/auth.bicep must be deployed `if (!empty(authClientId))`"
    )
    params = body(module)["params"]
    assert params["clientId"] == "authClientId"
    assert params["tenantId"] == "signInTenantId"
    assert params["functionAppName"]["operator"]["operands"]["operand_1"] == "functionApp"
    # Nothing inside the module is itself conditional: the module's condition is the switch.
    assert all("condition" not in r["config"] for r in parse(AUTH)["resources"].values())


def test_sign_in_is_off_by_default_and_in_the_deployment_tenant() -> None:
    main = parse(MAIN)
    params = main["parameters"]
    assert params["authClientId"]["type"] == "string"
    assert params["authClientId"]["default"] == "", "sign-in must be off unless asked for"
    assert _is_tenant_id(params["authTenantId"]["default"])
    # azd passes an unset variable as '', which must still mean the deployment's tenant.
    fallback = main["variables"]["signInTenantId"]["value"]["operator"]
    assert fallback["type"] == "conditional"
    operands = fallback["operands"]
    assert operands["condition"]["function"] == {
        "type": "empty",
        "parameters": {"item_to_test": "authTenantId"},
    }
    assert _is_tenant_id(operands["true_value"]) and operands["false_value"] == "authTenantId"
    given = load_json(INFRA / "main.parameters.json")["parameters"]
    assert given["authClientId"]["value"] == "${AZURE_AUTH_CLIENT_ID}"
    assert given["authTenantId"]["value"] == "${AZURE_AUTH_TENANT_ID}"
    assert _not_empty(main["outputs"]["CONSOLE_SIGN_IN_ENABLED"]["value"], "authClientId")


def test_sign_in_vouches_for_callers_and_the_app_decides_by_role() -> None:
    (config,) = _auth_configs()[rel(AUTH)]
    properties = body(config)["properties"]
    assert properties["platform"] == {"enabled": True}
    # The app decides on every route (tests/integration/test_roles.py): the event route
    # takes a webhook with the function key alone, which no excludedPaths entry can name.
    assert properties["globalValidation"] == {
        "requireAuthentication": False,
        "unauthenticatedClientAction": "AllowAnonymous",
    }
    assert properties["httpSettings"]["requireHttps"] is True
    assert set(properties["identityProviders"]) == {"azureActiveDirectory"}, (
        "Entra ID is the only identity provider"
    )
    entra = properties["identityProviders"]["azureActiveDirectory"]
    assert entra["enabled"] is True
    assert entra["registration"]["clientId"] == "clientId"
    assert entra["registration"]["openIdIssuer"] == (
        "${environment().authentication.loginEndpoint}${tenantId}/v2.0"
    ), "the v2.0 issuer of the tenant, in whatever cloud the deployment runs"
    assert entra["validation"]["allowedAudiences"] == ["api://${clientId}", "clientId"]
    assert properties["login"]["tokenStore"] == {"enabled": False}


def _keys(tree: Any) -> list[str]:
    if isinstance(tree, dict):
        return [*tree, *(key for value in tree.values() for key in _keys(value))]
    if isinstance(tree, list):
        return [key for value in tree for key in _keys(value)]
    return []


def test_sign_in_holds_no_secret() -> None:
    """Implicit (ID-token) flow, no client secret; one would be a Key Vault reference."""
    tree = parse(AUTH)
    (config,) = _auth_configs()[rel(AUTH)]
    secretive = [key for key in _keys(body(config)) if re.search("secret|certificate", key, re.I)]
    assert not secretive, f"{rel(AUTH)} configures {secretive}: no client secret in Bicep"
    assert set(tree["parameters"]) == {"functionAppName", "clientId", "tenantId"}
    assert not any(
        d["type"] == "secure" for p in tree["parameters"].values() for d in p["decorators"]
    )
    assert not tree.get("outputs"), "the module has nothing to hand back"


def test_the_app_believes_sign_in_only_with_the_same_registration() -> None:
    """SIGN_IN_CLIENT_ID is authClientId, passed down as the auth module's clientId: the
    app reads the platform's principal header only where Bicep deployed sign-in."""
    assert _app_setting(settings.SIGN_IN_CLIENT_ID, signInClientId="abc") == "abc"
    param = parse(FUNCTION_APP)["parameters"]["signInClientId"]
    assert param["type"] == "string" and param["default"] == ""
    params = body(parse(MAIN)["modules"]["functionApp"])["params"]
    assert params["signInClientId"] == "authClientId"
    env = {settings.STORAGE: "UseDevelopmentStorage=true", settings.AGENT_TRANSPORT: "storage"}
    assert not settings.Settings.from_env({**env, settings.SIGN_IN_CLIENT_ID: ""}).sign_in.entra


def test_the_app_roles_file_names_the_roles_the_code_checks() -> None:
    roles = load_json(INFRA / "app-roles.json")
    assert [r["value"] for r in roles] == list(principals.ROLES)
    ids = [r["id"] for r in roles]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[0-9a-f-]{36}", i) for i in ids)
    for role in roles:
        # people, and applications (client credentials) that call the API
        assert role["allowedMemberTypes"] == ["User", "Application"] and role["isEnabled"]
        assert set(role) == {
            "id",
            "value",
            "displayName",
            "description",
            "allowedMemberTypes",
            "isEnabled",
        }
    docs = (REPO / "docs" / "deployment.md").read_text(encoding="utf-8")
    assert "--app-roles @infra/app-roles.json" in docs, "the deployment guide uses the file"
