"""Who calls, and what they may do (config/principals.py): the principal App Service
authentication hands in X-MS-CLIENT-PRINCIPAL, believed only where sign-in is configured
and on; devhost's development principal, only where ORDERS_DEV_PRINCIPAL is set, which
the settings refuse in Azure and outside devhost; and the decision per access.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from config.principals import (
    OPERATOR,
    READER,
    Access,
    Principal,
    SignIn,
    from_client_principal,
    parse_dev_principal,
    refusal,
)
from config.settings import DEV_PRINCIPAL, DEVHOST_INSTANCE_ID, SettingsError
from tests.support import CLIENT_ID, SIGNED_IN, client_principal, settings_from

ENTRA = SignIn(client_id=CLIENT_ID, platform=True)
DEVHOST = SignIn(dev_default=Principal("dev", frozenset({OPERATOR}), "devhost"))
BASE = {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "AGENT_TRANSPORT": "storage"}


def encoded(document: Any) -> str:
    return base64.b64encode(json.dumps(document).encode()).decode()


# --- X-MS-CLIENT-PRINCIPAL ----------------------------------------------------------------


def test_the_platforms_principal_gives_the_name_and_the_app_roles() -> None:
    headers = client_principal("alice@contoso.com", OPERATOR, "Something.Else")
    principal = ENTRA.principal(headers, {})
    assert principal == Principal(
        "alice@contoso.com", frozenset({OPERATOR, "Something.Else"}), "entra"
    )
    assert principal.app_roles == [OPERATOR]
    assert principal.may(Access.READ) and principal.may(Access.CHANGE)


@pytest.mark.parametrize(
    "role_typ", ["roles", "http://schemas.microsoft.com/ws/2008/06/identity/claims/role"]
)
def test_roles_are_read_under_either_claim_type(role_typ: str) -> None:
    headers = client_principal("rita@contoso.com", READER, role_typ=role_typ)
    principal = ENTRA.principal(headers, {})
    assert principal is not None and principal.roles == {READER}
    assert principal.may(Access.READ) and not principal.may(Access.CHANGE)
    assert not principal.may(Access.EVENT)


def test_without_the_name_header_the_claims_name_the_principal() -> None:
    headers = client_principal("svc@contoso.com", OPERATOR)
    del headers["X-MS-CLIENT-PRINCIPAL-NAME"]
    principal = ENTRA.principal(headers, {})
    assert principal is not None and principal.name == "Svc"  # the `name` claim (name_typ)
    application = {
        "claims": [{"typ": "aud", "val": CLIENT_ID}, {"typ": "appid", "val": "app-1"}],
        "role_typ": "roles",
    }
    named = from_client_principal(encoded(application), None, CLIENT_ID)
    assert named == Principal("app-1", frozenset(), "entra")


def test_a_principal_issued_for_another_app_is_nobody() -> None:
    headers = client_principal("alice@contoso.com", OPERATOR, audience="another-app")
    principal = ENTRA.principal(headers, {})
    assert principal is not None and principal.unreadable and not principal.may(Access.READ)
    api = client_principal("alice@contoso.com", OPERATOR, audience=f"api://{CLIENT_ID}")
    assert ENTRA.principal(api, {}) is not None


MALFORMED = {
    "not base64": "%%%not base64%%%",
    "base64 of bytes": base64.b64encode(b"\xff\xfe\x00").decode(),
    "not JSON": base64.b64encode(b"{claims: nope").decode(),
    "a list": encoded([1, 2]),
    "no claims": encoded({"auth_typ": "aad"}),
    "claims not a list": encoded({"claims": {"typ": "roles"}}),
    "a claim not an object": encoded({"claims": ["roles"]}),
    "a value not a string": encoded({"claims": [{"typ": "roles", "val": 7}]}),
    "nobody named": encoded({"claims": [{"typ": "roles", "val": OPERATOR}]}),
    "deeply nested": base64.b64encode(b"[" * 20000).decode(),
    "too long": "A" * 40000,
    "empty": "",
}


@pytest.mark.parametrize("value", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_header_is_nobody_never_an_error(value: str) -> None:
    principal = ENTRA.principal({"x-ms-client-principal": value}, {})
    assert principal is not None and "X-MS-CLIENT-PRINCIPAL" in principal.unreadable
    assert from_client_principal(value, None, CLIENT_ID) is None


def test_missing_padding_is_tolerated() -> None:
    value = client_principal("alice@contoso.com", OPERATOR)["X-MS-CLIENT-PRINCIPAL"]
    assert ENTRA.principal({"X-MS-CLIENT-PRINCIPAL": value.rstrip("=")}, {}) is not None


FORGED = client_principal("mallory@contoso.com", OPERATOR)


@pytest.mark.parametrize(
    "sign_in",
    [
        SignIn(),  # no sign-in
        SignIn(platform=True),  # the platform's module, but not configured by this app
        SignIn(client_id=CLIENT_ID),  # configured, but the module is off: nothing stripped it
        DEVHOST,  # devhost believes its own header, not this one
    ],
    ids=["none", "platform-only", "configured-off", "devhost"],
)
def test_a_principal_header_nothing_vouches_for_is_ignored(sign_in: SignIn) -> None:
    assert sign_in.principal({**FORGED, "x-functions-key": "k"}, {}) is None


def test_the_name_is_cleaned_of_control_characters_and_cut() -> None:
    headers = client_principal("eve@contoso.com", OPERATOR)
    headers["X-MS-CLIENT-PRINCIPAL-NAME"] = " \u2028eve\n" + "x" * 300
    principal = ENTRA.principal(headers, {})
    assert principal is not None and principal.name == "eve" + "x" * 125


# --- devhost's development principal ------------------------------------------------------


def test_the_development_principal_is_parsed_or_refused_with_a_reason() -> None:
    assert parse_dev_principal("ann; roles=Orders.Reader") == Principal(
        "ann", frozenset({READER}), "devhost"
    )
    assert parse_dev_principal(" bob ;roles = Orders.Reader , Orders.Operator").roles == {
        READER,
        OPERATOR,
    }
    assert parse_dev_principal("nobody").roles == frozenset()
    for bad, why in [
        ("", "<name>"),
        ("; roles=Orders.Reader", "<name>"),
        ("ann; role=Orders.Reader", "roles="),
        ("ann; roles=Admin", "unknown role 'Admin'"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_dev_principal(bad)


def test_on_devhost_the_header_names_the_principal_else_the_default_or_a_key_caller() -> None:
    assert DEVHOST.principal({"X-Dev-Principal": "rita; roles=Orders.Reader"}, {}) == Principal(
        "rita", frozenset({READER}), "devhost"
    )
    assert DEVHOST.principal({}, {}) == DEVHOST.dev_default  # the developer's browser
    assert DEVHOST.principal({}, {"code": "k"}) is None  # a key caller, as in Azure
    assert DEVHOST.principal({"x-functions-key": "k"}, {}) is None
    malformed = DEVHOST.principal({"X-Dev-Principal": "; roles=nope"}, {})
    assert malformed is not None and malformed.unreadable  # nobody, never a key caller
    # anywhere else the header is the client's own
    assert SignIn().principal({"X-Dev-Principal": "rita; roles=Orders.Operator"}, {}) is None
    assert ENTRA.principal({"X-Dev-Principal": "rita; roles=Orders.Operator"}, {}) is None


def test_settings_take_the_development_principal_under_devhost_only() -> None:
    devhost = {**BASE, DEVHOST_INSTANCE_ID: "devhost-0", "WEBSITE_HOSTNAME": "127.0.0.1:7071"}
    sign_in = settings_from({**devhost, DEV_PRINCIPAL: "ann; roles=Orders.Operator"}).sign_in
    assert sign_in.dev_default == Principal("ann", frozenset({OPERATOR}), "devhost")
    assert settings_from({**devhost, DEV_PRINCIPAL: ""}).sign_in == SignIn()

    def refused(env: dict[str, str]) -> str:
        with pytest.raises(SettingsError) as info:
            settings_from({DEV_PRINCIPAL: "ann; roles=Orders.Operator", **env})
        return str(info.value)

    assert "under devhost only" in refused(BASE)  # no DEVHOST_INSTANCE_ID
    for azure in ("WEBSITE_SITE_NAME", "WEBSITE_INSTANCE_ID", "WEBSITE_OWNER_NAME"):
        assert azure in refused({**devhost, azure: "func-orders"})
    assert "SIGN_IN_CLIENT_ID" in refused({**devhost, **SIGNED_IN})
    assert "WEBSITE_AUTH_ENABLED" in refused({**devhost, "WEBSITE_AUTH_ENABLED": "True"})
    assert "WEBSITE_HOSTNAME" in refused(
        {**devhost, "WEBSITE_HOSTNAME": "func-orders.azurewebsites.net"}
    )
    assert "unknown role" in refused({**devhost, DEV_PRINCIPAL: "ann; roles=Root"})


def test_the_sign_in_client_id_is_a_guid() -> None:
    assert settings_from({**BASE, **SIGNED_IN}).sign_in == ENTRA
    assert settings_from({**BASE, "SIGN_IN_CLIENT_ID": ""}).sign_in == SignIn()
    with pytest.raises(SettingsError, match="SIGN_IN_CLIENT_ID must be the client id"):
        settings_from({**BASE, "SIGN_IN_CLIENT_ID": "api://orders"})


# --- the decision -------------------------------------------------------------------------

READER_P = Principal("rita", frozenset({READER}), "entra")
OPERATOR_P = Principal("otto", frozenset({OPERATOR}), "entra")
NOBODY_P = Principal("nora", frozenset(), "entra")
NO_SIGN_IN = SignIn()


@pytest.mark.parametrize("console", [False, True], ids=["api", "console"])
def test_a_reader_reads_and_an_operator_also_changes(console: bool) -> None:
    for access in Access:
        assert refusal(OPERATOR_P, access, ENTRA, console=console) is None
    assert refusal(READER_P, Access.READ, ENTRA, console=console) is None
    for access in (Access.CHANGE, Access.EVENT):
        refused = refusal(READER_P, access, ENTRA, console=console)
        assert refused is not None and refused.status == 403 and refused.role == OPERATOR
        assert "rita has Orders.Reader" in refused.reason
    refused = refusal(NOBODY_P, Access.READ, ENTRA, console=console)
    assert refused is not None and refused.role == READER
    assert "no role of this app" in refused.reason
    assert refusal(NOBODY_P, Access.PUBLIC, ENTRA, console=console) is None


def test_a_key_caller_changes_only_where_no_sign_in_is_configured() -> None:
    for access in (Access.READ, Access.CHANGE):
        assert refusal(None, access, NO_SIGN_IN, console=False) is None
        assert refusal(None, access, DEVHOST, console=False) is None
    for sign_in in (ENTRA, SignIn(client_id=CLIENT_ID)):
        assert refusal(None, Access.READ, sign_in, console=False) is None
        refused = refusal(None, Access.CHANGE, sign_in, console=False)
        assert refused is not None and refused.status == 403 and refused.role == OPERATOR


def test_a_key_alone_delivers_no_event_whatever_the_sign_in() -> None:
    """docs/contracts.md §3.15, "who may answer": a person's event needs Orders.Operator; a
    remote's answers on its capability URL (checked by the route, not here)."""
    for sign_in in (NO_SIGN_IN, DEVHOST, ENTRA, SignIn(client_id=CLIENT_ID)):
        refused = refusal(None, Access.EVENT, sign_in, console=False)
        assert refused is not None and refused.status == 403 and refused.role == OPERATOR
        assert "function key alone delivers nothing" in refused.reason


def test_the_console_needs_a_principal_and_says_how_to_get_one() -> None:
    signed_out = refusal(None, Access.READ, ENTRA, console=True)
    assert signed_out is not None and signed_out.status == 401 and signed_out.sign_in
    off = refusal(None, Access.READ, NO_SIGN_IN, console=True)
    assert off is not None and off.status == 403 and not off.sign_in
    assert "AZURE_AUTH_CLIENT_ID" in off.reason and "function key does not open" in off.reason
    module_off = refusal(None, Access.READ, SignIn(client_id=CLIENT_ID), console=True)
    assert module_off is not None and "az webapp auth update" in module_off.reason
    assert refusal(None, Access.PUBLIC, NO_SIGN_IN, console=True) is None
    key_on_devhost = refusal(None, Access.READ, DEVHOST, console=True)
    assert key_on_devhost is not None and "without ?code=" in key_on_devhost.reason


# --- a principal header that cannot be read ----------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["x; roles=Orders.Admin", "; roles=Orders.Operator", "x; role=Orders.Operator", ""],
    ids=["unknown-role", "no-name", "not-roles", "empty"],
)
@pytest.mark.parametrize("key", [False, True], ids=["no-key", "with-key"])
def test_on_devhost_a_malformed_header_is_nobody_never_a_key_caller(value: str, key: bool) -> None:
    headers = {"X-Dev-Principal": value, **({"x-functions-key": "k"} if key else {})}
    principal = DEVHOST.principal(headers, {})
    assert principal is not None and not principal.roles  # not None: that is a key caller
    for console in (False, True):
        for access in (Access.READ, Access.EVENT, Access.CHANGE):
            refused = refusal(principal, access, DEVHOST, console=console)
            assert refused is not None and refused.status == 403, (access, console)
            assert "X-Dev-Principal" in refused.reason
        assert refusal(principal, Access.PUBLIC, DEVHOST, console=console) is None


def test_with_sign_in_a_platform_header_that_cannot_be_read_is_nobody() -> None:
    for value in ("%%%not base64%%%", encoded({"auth_typ": "aad"})):
        principal = ENTRA.principal({"x-ms-client-principal": value, "x-functions-key": "k"}, {})
        assert principal is not None and not principal.roles
        refused = refusal(principal, Access.EVENT, ENTRA, console=False)
        assert refused is not None and refused.status == 403
    # no header at all is still a key caller: a webhook with the function key
    assert ENTRA.principal({"x-functions-key": "k"}, {}) is None
