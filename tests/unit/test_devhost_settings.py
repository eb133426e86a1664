"""devhost settings: local.settings.json, %NAME% expressions, host.json options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devhost.settings import (
    ConfigError,
    LeaseOptions,
    QueueOptions,
    ServiceBusOptions,
    load_host_json,
    load_local_settings,
    parse_timespan,
    resolve_binding,
    resolve_expressions,
    route_prefix,
)


def test_local_settings_add_only_missing_names(tmp_path: Path) -> None:
    path = tmp_path / "local.settings.json"
    values = {"A": "from-file", "B": "from-file", "N": 3, "T": True}
    path.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    environ = {"A": "from-env"}
    added = load_local_settings(path, environ)
    assert environ == {"A": "from-env", "B": "from-file", "N": "3", "T": "true"}
    assert sorted(added) == ["B", "N", "T"]


def test_local_settings_unreadable_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "local.settings.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read settings file"):
        load_local_settings(path, {})


def test_expressions_resolve_from_the_environment() -> None:
    assert resolve_expressions("%Q%-x-%R%", {"Q": "orders", "R": "1"}, "here") == "orders-x-1"
    assert resolve_expressions("plain", {}, "here") == "plain"


def test_missing_setting_names_the_setting_and_the_place() -> None:
    with pytest.raises(ConfigError) as error:
        resolve_expressions("%AgentRequestQueue%", {}, "function 'agent' property 'queueName'")
    message = str(error.value)
    assert "AgentRequestQueue" in message
    assert "function 'agent'" in message


def test_binding_resolution_leaves_name_and_type_alone() -> None:
    binding = {"type": "queueTrigger", "name": "msg", "queueName": "%Q%", "direction": "IN"}
    resolved = resolve_binding(binding, {"Q": "orders"}, "f")
    assert resolved == {**binding, "queueName": "orders"}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:00:30", 30),
        ("00:01:00", 60),
        ("01:00:00", 3600),
        ("00:00:00.500", 0.5),
        ("1.00:00:00", 86400),
        ("00:05", 300),
    ],
)
def test_timespans(text: str, seconds: float) -> None:
    assert parse_timespan(text, "x") == seconds


def test_timespan_numbers_only_where_the_host_takes_them() -> None:
    assert parse_timespan(2000, "maxPollingInterval", 0.001) == 2.0
    assert parse_timespan("2000", "maxPollingInterval", 0.001) == 2.0
    with pytest.raises(ConfigError, match="visibilityTimeout"):
        parse_timespan(30, "visibilityTimeout")


def test_queue_defaults_are_the_hosts() -> None:
    options = QueueOptions.from_host_json({})
    assert options == QueueOptions("base64", 16, 8, 60.0, 0.0, 5)
    assert options.max_concurrency == 24


def test_queue_options_from_the_project_host_json() -> None:
    host = load_host_json(Path(__file__).parents[2] / "host.json", {})
    options = QueueOptions.from_host_json(host)
    assert options.message_encoding == "none"
    assert options.batch_size == 16
    assert options.new_batch_threshold == 8
    assert options.max_polling_interval == 2.0
    assert options.visibility_timeout == 5.0
    assert options.max_dequeue_count == 5


def test_new_batch_threshold_defaults_to_half_the_batch() -> None:
    options = QueueOptions.from_host_json({"extensions": {"queues": {"batchSize": 6}}})
    assert options.new_batch_threshold == 3


def test_host_json_keys_are_case_insensitive() -> None:
    host = {"Extensions": {"Queues": {"MessageEncoding": "None", "BATCHSIZE": 4}}}
    options = QueueOptions.from_host_json(host)
    assert (options.message_encoding, options.batch_size) == ("none", 4)


def test_environment_overrides_host_json(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"extensions": {"queues": {"batchSize": 16}}}))
    environ = {
        "AzureFunctionsJobHost__extensions__queues__batchSize": "2",
        "AzureFunctionsJobHost__extensions__http__routePrefix": "",
    }
    host = load_host_json(path, environ)
    assert QueueOptions.from_host_json(host).batch_size == 2
    assert route_prefix(host) == ""


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ({"batchSize": 64}, "batchSize"),
        ({"messageEncoding": "utf8"}, "messageEncoding"),
        ({"maxPollingInterval": "00:00:00.010"}, "maxPollingInterval"),
        ({"visibilityTimeout": "soon"}, "visibilityTimeout"),
        ({"maxDequeueCount": "five"}, "maxDequeueCount"),
    ],
)
def test_bad_queue_options_name_the_option(queues: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        QueueOptions.from_host_json({"extensions": {"queues": queues}})


def test_route_prefix() -> None:
    assert route_prefix({}) == "api"
    assert route_prefix({"extensions": {"http": {"routePrefix": "/v1/"}}}) == "v1"
    assert route_prefix({"extensions": {"http": {"routePrefix": ""}}}) == ""


def test_lease_defaults_and_overrides() -> None:
    assert LeaseOptions.from_env({}) == LeaseOptions(30, 10.0)
    assert LeaseOptions.from_env({"DEVHOST_LEASE_SECONDS": "3"}) == LeaseOptions(3, 1.0)
    custom = {"DEVHOST_LEASE_SECONDS": "4", "DEVHOST_RENEW_SECONDS": "0.5"}
    assert LeaseOptions.from_env(custom) == LeaseOptions(4, 0.5)


@pytest.mark.parametrize(
    "environ",
    [
        {"DEVHOST_LEASE_SECONDS": "31"},
        {"DEVHOST_LEASE_SECONDS": "0"},
        {"DEVHOST_LEASE_SECONDS": "5", "DEVHOST_RENEW_SECONDS": "5"},
        {"DEVHOST_LEASE_SECONDS": "x"},
    ],
)
def test_lease_never_beyond_30_seconds(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="DEVHOST_"):
        LeaseOptions.from_env(environ)


def test_service_bus_options() -> None:
    host = {
        "extensions": {
            "serviceBus": {"maxConcurrentCalls": 4, "maxAutoLockRenewalDuration": "00:01:00"}
        }
    }
    assert ServiceBusOptions.from_host_json(host) == ServiceBusOptions(4, 60.0, True)
    assert ServiceBusOptions.from_host_json({}) == ServiceBusOptions(16, 300.0, True)
