"""Typed settings of docs/contracts.md §3.6: defaults, parsing, and errors that name the setting."""

from __future__ import annotations

import pytest

from config.settings import APP_SETTINGS, Connection, Settings, SettingsError, Transport, agent_url

STORAGE_CS = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
SB_CS = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=a2V5"


def settings(**env: str) -> Settings:
    return Settings.from_env({"AzureWebJobsStorage": STORAGE_CS, **env})


def error(**env: str) -> str:
    with pytest.raises(SettingsError) as info:
        Settings.from_env(env)
    return str(info.value)


def test_the_contract_names_are_the_ones_read() -> None:
    assert APP_SETTINGS == (
        "AzureWebJobsStorage",
        "ServiceBusConnection",
        "AGENT_TRANSPORT",
        "REMOTE_SERVICE_URL",
        "STEP_TIMEOUT_SECONDS",
        "MAX_FAILURE_COUNT",
        "SUPERVISOR_SCHEDULE",
        "DEFERRAL_WINDOW_SECONDS",
        "CONSOLE_READ_ONLY",
        "SIGN_IN_CLIENT_ID",
        "RETENTION",
        "RETENTION_SCHEDULE",
        "RETENTION_BATCH",
        "ARCHIVE_DAYS",
        "DASHBOARD_SCHEDULE",
        "STUCK_FLOOR_SECONDS",
        "MAX_CLOCK_SKEW_SECONDS",
        "REPLY_QUEUES",
        "KEPT_DAYS",
        "OUTAGE_ALERT_SECONDS",
    )


def test_defaults() -> None:
    s = settings(ServiceBusConnection=SB_CS)

    assert s.storage == Connection(name="AzureWebJobsStorage", connection_string=STORAGE_CS)
    assert s.service_bus == Connection(name="ServiceBusConnection", connection_string=SB_CS)
    assert s.transport is Transport.SERVICE_BUS
    assert s.remote_service_url is None
    assert s.step_timeout_seconds == 30
    assert s.max_failure_count == 5
    assert s.supervisor_schedule == "*/10 * * * * *"


def test_explicit_values_are_read() -> None:
    s = settings(
        AGENT_TRANSPORT="storage",
        REMOTE_SERVICE_URL="https://remote.example/api",
        STEP_TIMEOUT_SECONDS="45",
        MAX_FAILURE_COUNT="3",
        SUPERVISOR_SCHEDULE="0 */5 * * * *",
    )

    assert s.transport is Transport.STORAGE
    assert s.service_bus is None
    assert s.remote_service_url == "https://remote.example/api"
    assert s.step_timeout_seconds == 45
    assert s.max_failure_count == 3
    assert s.supervisor_schedule == "0 */5 * * * *"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("storage", Transport.STORAGE),
        ("STORAGE", Transport.STORAGE),
        ("  Storage\n", Transport.STORAGE),
        ("servicebus", Transport.SERVICE_BUS),
        ("ServiceBus", Transport.SERVICE_BUS),
        ("", Transport.SERVICE_BUS),
        ("   ", Transport.SERVICE_BUS),
    ],
)
def test_agent_transport_is_case_and_space_insensitive(raw: str, expected: Transport) -> None:
    assert settings(AGENT_TRANSPORT=raw, ServiceBusConnection=SB_CS).transport is expected


@pytest.mark.parametrize("raw", ["kafka", "service-bus", "queues"])
def test_invalid_agent_transport_names_the_setting_and_the_choices(raw: str) -> None:
    message = error(AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT=raw)

    assert message == f"AGENT_TRANSPORT must be 'servicebus' or 'storage', got {raw!r}"


def test_servicebus_transport_without_its_connection_names_it() -> None:
    message = error(AzureWebJobsStorage=STORAGE_CS)

    assert message.startswith(
        "AGENT_TRANSPORT is 'servicebus' (the default) but ServiceBusConnection is not set"
    )
    assert "ServiceBusConnection__fullyQualifiedNamespace" in message
    assert "AGENT_TRANSPORT=storage" in message


def test_an_empty_servicebus_connection_counts_as_not_set() -> None:
    with pytest.raises(SettingsError, match="ServiceBusConnection is not set"):
        Settings.from_env(
            {"AzureWebJobsStorage": STORAGE_CS, "ServiceBusConnection": "", "AGENT_TRANSPORT": ""}
        )


def test_storage_transport_needs_no_servicebus() -> None:
    assert settings(AGENT_TRANSPORT="storage").service_bus is None


def test_servicebus_connection_is_kept_with_the_storage_transport() -> None:
    s = settings(AGENT_TRANSPORT="storage", ServiceBusConnection=SB_CS)

    assert s.service_bus is not None
    assert s.service_bus.connection_string == SB_CS


def test_identity_based_storage_connection() -> None:
    s = Settings.from_env(
        {
            "AzureWebJobsStorage__accountName": "stordersprod",
            "AzureWebJobsStorage__clientId": "11111111-2222-3333-4444-555555555555",
            "AzureWebJobsStorage__credential": "managedidentity",
            "AGENT_TRANSPORT": "storage",
        }
    )

    assert s.storage == Connection(
        name="AzureWebJobsStorage",
        account_name="stordersprod",
        client_id="11111111-2222-3333-4444-555555555555",
        credential="managedidentity",
    )


def test_identity_based_storage_with_service_uris() -> None:
    s = settings(
        AzureWebJobsStorage="",
        AzureWebJobsStorage__queueServiceUri="https://st.queue.core.windows.net",
        AzureWebJobsStorage__tableServiceUri="https://st.table.core.windows.net",
        AGENT_TRANSPORT="storage",
    )

    assert s.storage.connection_string is None
    assert s.storage.queue_service_uri == "https://st.queue.core.windows.net"
    assert s.storage.table_service_uri == "https://st.table.core.windows.net"


def test_identity_based_servicebus_connection() -> None:
    s = settings(
        ServiceBusConnection__fullyQualifiedNamespace="sb-orders.servicebus.windows.net",
        ServiceBusConnection__clientId="cid",
    )

    assert s.service_bus == Connection(
        name="ServiceBusConnection",
        fully_qualified_namespace="sb-orders.servicebus.windows.net",
        client_id="cid",
    )


def test_similar_names_are_not_mistaken_for_identity_parts() -> None:
    # "AzureWebJobsStorageX__accountName" is another setting, not a part of AzureWebJobsStorage.
    message = error(AzureWebJobsStorageX__accountName="st", AGENT_TRANSPORT="storage")

    assert message.startswith("AzureWebJobsStorage is not set")


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"AzureWebJobsStorage": ""},
        {"AzureWebJobsStorage__accountName": ""},
    ],
)
def test_missing_storage_names_the_setting_and_its_identity_form(env: dict[str, str]) -> None:
    message = error(**env, AGENT_TRANSPORT="storage")

    assert message == (
        "AzureWebJobsStorage is not set: give a storage connection string, or "
        "AzureWebJobsStorage__accountName for identity-based access"
    )


@pytest.mark.parametrize("name", ["STEP_TIMEOUT_SECONDS", "MAX_FAILURE_COUNT"])
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("abc", "{name} must be a whole number from 1 to {max}, got 'abc'"),
        ("1.5", "{name} must be a whole number from 1 to {max}, got '1.5'"),
        ("30s", "{name} must be a whole number from 1 to {max}, got '30s'"),
        ("1_000", "{name} must be a whole number from 1 to {max}, got '1_000'"),
        ("-3", "{name} must be a whole number from 1 to {max}, got '-3'"),
        ("0", "{name} must be from 1 to {max}, got 0"),
        ("100000", "{name} must be from 1 to {max}, got 100000"),
    ],
)
def test_invalid_whole_numbers_name_the_setting(name: str, raw: str, expected: str) -> None:
    message = error(AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT="storage", **{name: raw})

    maximum = {"STEP_TIMEOUT_SECONDS": 86400, "MAX_FAILURE_COUNT": 100}[name]
    if name == "STEP_TIMEOUT_SECONDS" and raw == "100000":
        assert "Use at most 270" in message and "maxAutoLockRenewalDuration" in message
        return
    assert message == expected.format(name=name, max=maximum)


@pytest.mark.parametrize(("raw", "expected"), [(" 7 ", 7), ("1", 1), ("", 30), ("  ", 30)])
def test_step_timeout_is_trimmed_and_defaults_when_blank(raw: str, expected: int) -> None:
    assert settings(AGENT_TRANSPORT="storage", STEP_TIMEOUT_SECONDS=raw).step_timeout_seconds == (
        expected
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("https://remote.example", "https://remote.example"),
        ("https://remote.example/", "https://remote.example"),
        ("http://127.0.0.1:7072/api//", "http://127.0.0.1:7072/api"),
        ("  http://localhost:7072/ ", "http://localhost:7072"),
    ],
)
def test_remote_service_url_loses_its_trailing_slash(raw: str, expected: str) -> None:
    s = settings(AGENT_TRANSPORT="storage", REMOTE_SERVICE_URL=raw)

    assert s.remote_service_url == expected
    assert s.require_remote_service_url() == expected


@pytest.mark.parametrize(
    "raw", ["ftp://remote.example", "remote.example", "localhost:7072", "http://"]
)
def test_remote_service_url_must_be_http(raw: str) -> None:
    message = error(
        AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT="storage", REMOTE_SERVICE_URL=raw
    )

    assert message == f"REMOTE_SERVICE_URL must be an http(s) URL with a host, got {raw!r}"


@pytest.mark.parametrize(
    "raw",
    [
        "http://127.0.0.1:7080",
        "http://127.8.9.10/api",
        "http://localhost:7072/api",
        "http://LOCALHOST",
        "http://[::1]:7080/api",
        "https://remote.example/api",
    ],
)
def test_http_is_accepted_for_this_machine_only_https_anywhere(raw: str) -> None:
    s = settings(AGENT_TRANSPORT="storage", REMOTE_SERVICE_URL=raw)

    assert s.remote_service_url == raw.rstrip("/")
    assert agent_url({"AGENT_CARRIER_URL": raw}, "AGENT_CARRIER_URL") == raw.rstrip("/")


@pytest.mark.parametrize(
    "raw",
    [
        "http://remote.example/api",
        "HTTP://remote.example",
        "http://10.0.0.4:8080",
        "http://192.168.1.20",
        "http://[2001:db8::1]/api",
        "http://localhost.example.com",
        "http://127.0.0.1.nip.io",
    ],
)
def test_plain_http_to_another_host_is_refused_naming_the_setting(raw: str) -> None:
    """A token or an API key would cross the network in clear: refused when read."""
    message = error(
        AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT="storage", REMOTE_SERVICE_URL=raw
    )

    assert message.startswith(f"REMOTE_SERVICE_URL must be an https:// URL: got {raw!r}")
    assert "127.0.0.1, localhost, ::1" in message

    with pytest.raises(SettingsError) as info:
        agent_url({"AGENT_CARRIER_URL": raw}, "AGENT_CARRIER_URL")
    assert str(info.value).startswith(f"AGENT_CARRIER_URL must be an https:// URL: got {raw!r}")


def test_require_remote_service_url_names_the_setting_when_missing() -> None:
    s = settings(AGENT_TRANSPORT="storage", REMOTE_SERVICE_URL=" ")

    with pytest.raises(SettingsError) as info:
        s.require_remote_service_url()

    assert str(info.value) == (
        "REMOTE_SERVICE_URL is not set: agents need the base URL of the remote services"
    )


def test_settings_error_is_a_value_error() -> None:
    assert issubclass(SettingsError, ValueError)


@pytest.mark.parametrize("raw", ["* * * * *", "every minute", "*/10 * * * * * *", "0 0 * * ? ;"])
def test_supervisor_schedule_must_be_six_fields(raw: str) -> None:
    message = error(
        AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT="storage", SUPERVISOR_SCHEDULE=raw
    )

    assert message.startswith("SUPERVISOR_SCHEDULE must be a six-field NCRONTAB expression")
    assert repr(raw) in message


def test_identity_suffixes_are_case_insensitive_as_in_the_functions_host() -> None:
    s = settings(
        AzureWebJobsStorage__ACCOUNTNAME="acct",
        azurewebjobsstorage__clientid="cid",
        AGENT_TRANSPORT="storage",
    )

    assert (s.storage.account_name, s.storage.client_id) == ("acct", "cid")


def test_remote_service_url_scheme_is_case_insensitive() -> None:
    assert settings(
        AGENT_TRANSPORT="storage", REMOTE_SERVICE_URL="HTTPS://remote.example/"
    ).remote_service_url == ("HTTPS://remote.example")


def test_a_step_timeout_the_host_cannot_honour_is_refused_with_the_reason() -> None:
    from core.limits import MAX_STEP_TIMEOUT_SECONDS

    message = error(
        AzureWebJobsStorage=STORAGE_CS,
        AGENT_TRANSPORT="storage",
        STEP_TIMEOUT_SECONDS=str(MAX_STEP_TIMEOUT_SECONDS + 1),
    )
    assert "maxAutoLockRenewalDuration" in message and "functionTimeout" in message
    ok = settings(AGENT_TRANSPORT="storage", STEP_TIMEOUT_SECONDS=str(MAX_STEP_TIMEOUT_SECONDS))
    assert ok.step_timeout_seconds == MAX_STEP_TIMEOUT_SECONDS


def test_the_host_limits_in_the_code_are_the_ones_in_host_json() -> None:
    import json
    from pathlib import Path

    from core.limits import HOST_FUNCTION_TIMEOUT_SECONDS, HOST_LOCK_RENEWAL_SECONDS

    def seconds(text: str) -> int:
        h, m, s = (int(x) for x in text.split(":"))
        return h * 3600 + m * 60 + s

    host = json.loads((Path(__file__).parents[2] / "host.json").read_text())
    assert seconds(host["functionTimeout"]) == HOST_FUNCTION_TIMEOUT_SECONDS
    renewal = host["extensions"]["serviceBus"]["maxAutoLockRenewalDuration"]
    assert seconds(renewal) == HOST_LOCK_RENEWAL_SECONDS


def test_the_deferral_window_is_a_setting_with_a_production_default() -> None:
    assert settings(AGENT_TRANSPORT="storage").deferral_window_seconds == 1800
    assert (
        settings(AGENT_TRANSPORT="storage", DEFERRAL_WINDOW_SECONDS="60").deferral_window_seconds
        == 60
    )
    assert "DEFERRAL_WINDOW_SECONDS" in error(
        AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT="storage", DEFERRAL_WINDOW_SECONDS="soon"
    )


def test_the_outage_alert_time_is_a_setting_with_a_production_default() -> None:
    assert settings(AGENT_TRANSPORT="storage").outage_alert_seconds == 300
    assert settings(AGENT_TRANSPORT="storage", OUTAGE_ALERT_SECONDS="60").outage_alert_seconds == 60


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "1.5", "86401"])
def test_an_outage_alert_time_out_of_bounds_is_refused_by_name(raw: str) -> None:
    message = error(
        AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT="storage", OUTAGE_ALERT_SECONDS=raw
    )
    assert "OUTAGE_ALERT_SECONDS" in message and "86400" in message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        (" True ", True),
        ("1", True),
        ("yes", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("", False),
        ("  ", False),
    ],
)
def test_console_read_only_is_a_flag_off_by_default(raw: str, expected: bool) -> None:
    assert settings(AGENT_TRANSPORT="storage").console_read_only is False
    assert settings(AGENT_TRANSPORT="storage", CONSOLE_READ_ONLY=raw).console_read_only is expected


@pytest.mark.parametrize("raw", ["on", "off", "2", "y", "enabled", "tru"])
def test_an_unknown_console_read_only_value_is_refused_naming_the_setting(raw: str) -> None:
    message = error(
        AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT="storage", CONSOLE_READ_ONLY=raw
    )

    assert message == f"CONSOLE_READ_ONLY must be true or false, got {raw.lower()!r}"


def test_reply_queues_is_empty_by_default_and_read_as_names_and_prefixes() -> None:
    assert settings(AGENT_TRANSPORT="storage").reply_queues.empty
    read = settings(AGENT_TRANSPORT="storage", REPLY_QUEUES="shop-status, partner-*")
    assert read.reply_queues.allows("shop-status") and read.reply_queues.allows("partner-x")
    assert not read.reply_queues.allows("other-queue")
    message = error(AzureWebJobsStorage=STORAGE_CS, AGENT_TRANSPORT="storage", REPLY_QUEUES="A_b")
    assert message.startswith("REPLY_QUEUES: 'A_b' is not a Storage queue name")


def test_the_apps_own_host_name_is_read_once_and_trimmed() -> None:
    """``WEBSITE_HOSTNAME`` (Azure's, devhost's ``127.0.0.1:<port>``): where a remote calls
    back; not set, it is empty and ``events_url`` says so."""
    assert settings(AGENT_TRANSPORT="storage").hostname == ""
    s = settings(AGENT_TRANSPORT="storage", WEBSITE_HOSTNAME=" func-orders.azurewebsites.net ")
    assert s.hostname == "func-orders.azurewebsites.net"
