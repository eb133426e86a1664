"""devhost settings: %NAME% expressions, host.json options, lease settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from devhost.settings import (
    ConfigError,
    LeaseOptions,
    QueueOptions,
    ServiceBusOptions,
    load_json,
    parse_timespan,
    resolve_binding,
    route_prefix,
    with_overrides,
)


def test_binding_expressions_resolve_from_the_environment() -> None:
    binding = {"type": "queueTrigger", "name": "%N%", "queueName": "%Q%-x-%R%", "n": 3}
    resolved = resolve_binding(binding, {"Q": "orders", "R": "1"}, "f")
    assert resolved == {**binding, "queueName": "orders-x-1"}  # name, type left alone


def test_a_missing_setting_names_the_setting_and_the_place() -> None:
    with pytest.raises(ConfigError) as error:
        resolve_binding({"queueName": "%AgentRequestQueue%"}, {}, "function 'agent'")
    message = str(error.value)
    assert "AgentRequestQueue" in message
    assert "function 'agent' property 'queueName'" in message


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("00:00:30", 30), ("01:00:00", 3600), ("00:00:00.500", 0.5), ("1.00:00:00", 86400)],
)
def test_timespans(text: str, seconds: float) -> None:
    assert parse_timespan(text) == seconds


def test_queue_defaults_are_the_hosts() -> None:
    options = QueueOptions.from_host_json({"extensions": {"queues": {"messageEncoding": "none"}}})
    assert options == QueueOptions(16, 8, 60.0, 0.0, 5)
    assert options.max_concurrency == 24


def test_queue_options_from_the_project_host_json() -> None:
    host = load_json(Path(__file__).parents[2] / "host.json")
    options = QueueOptions.from_host_json(host)
    assert options.batch_size == 16
    assert options.new_batch_threshold == 8
    assert options.max_polling_interval == 0.5
    assert options.visibility_timeout == 5.0
    assert options.max_dequeue_count == 5


def test_app_settings_override_host_json_as_the_host_layers_them() -> None:
    """``AzureFunctionsJobHost__<path>``: the deployment's way to change host.json (the
    queue poll's ceiling, here); host.json itself untouched."""
    host = load_json(Path(__file__).parents[2] / "host.json")
    environ = {
        "AzureFunctionsJobHost__extensions__queues__maxPollingInterval": "00:00:02",
        "AzureFunctionsJobHost__extensions__queues__batchSize": "4",
        "AzureFunctionsJobHost__extensions__http__routePrefix": "orders",
        "AzureWebJobsStorage": "not an override",
    }
    merged = with_overrides(host, environ)
    options = QueueOptions.from_host_json(merged)
    assert (options.max_polling_interval, options.batch_size) == (2.0, 4)
    assert options.max_dequeue_count == 5  # what no setting names stays as host.json has it
    assert route_prefix(merged) == "orders"  # a section host.json does not have is made
    assert QueueOptions.from_host_json(host).max_polling_interval == 0.5


def test_an_override_out_of_bounds_is_refused_as_host_json_would_be() -> None:
    host = load_json(Path(__file__).parents[2] / "host.json")
    setting = {"AzureFunctionsJobHost__extensions__queues__maxPollingInterval": "00:00:00.01"}
    with pytest.raises(ConfigError, match="maxPollingInterval"):
        QueueOptions.from_host_json(with_overrides(host, setting))


def test_new_batch_threshold_defaults_to_half_the_batch() -> None:
    queues = {"messageEncoding": "none", "batchSize": 6}
    assert QueueOptions.from_host_json({"extensions": {"queues": queues}}).new_batch_threshold == 3


@pytest.mark.parametrize(
    ("queues", "message"),
    [
        ({}, "messageEncoding"),  # the host's default, base64, is not decoded
        ({"messageEncoding": "base64"}, "messageEncoding"),
        ({"messageEncoding": "none", "batchSize": 0}, "batchSize"),
        ({"messageEncoding": "none", "batchSize": 33}, "batchSize"),  # the host's maximum: 32
        ({"messageEncoding": "none", "maxPollingInterval": "00:00:00.010"}, "maxPollingInterval"),
        ({"messageEncoding": "none", "visibilityTimeout": "soon"}, "visibilityTimeout"),
        ({"messageEncoding": "none", "maxDequeueCount": "five"}, "maxDequeueCount"),
    ],
)
def test_bad_queue_options_name_the_option(queues: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        QueueOptions.from_host_json({"extensions": {"queues": queues}})


def test_unreadable_host_json_is_a_clear_error(tmp_path: Path) -> None:
    assert load_json(tmp_path / "host.json") == {}
    (tmp_path / "host.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        load_json(tmp_path / "host.json")


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
    assert ServiceBusOptions.from_host_json(host) == ServiceBusOptions(4, 60.0)
    assert ServiceBusOptions.from_host_json({}) == ServiceBusOptions(16, 300.0)
    project = load_json(Path(__file__).parents[2] / "host.json")
    assert ServiceBusOptions.from_host_json(project) == ServiceBusOptions(16, 300.0)
