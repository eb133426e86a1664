"""Every wait on the Service Bus send path is bounded, and every error is classified.

Fakes only (no network); the options are checked on a real ``ServiceBusClient`` of
azure-servicebus 7.15.0 built from a connection string (which opens nothing).
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from azure.servicebus.exceptions import (
    MessageSizeExceededError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
)

from config.settings import Connection
from core.errors import StorageUnavailable
from core.names import Names
from core.workflows import MAX_STEP_NAME, WORKFLOWS, StepSpec, Workflow
from messaging import servicebus
from messaging.servicebus import (
    CLIENT_OPTIONS,
    ServiceBusTransport,
    TransportRefused,
    client_for,
)
from tests.unit.test_servicebus_messages import Clock, Factory, FakeSender, make_request

FAKE_CONNECTION = (
    "Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=eA=="
)


@pytest.fixture
def factory() -> Factory:
    return Factory()


@pytest.fixture
def transport(factory: Factory) -> ServiceBusTransport:
    return ServiceBusTransport(factory, Names(), Clock())  # type: ignore[arg-type]


# --- the SDK's own bounds --------------------------------------------------------------


def test_the_client_bounds_retries_and_each_attempt() -> None:
    client = client_for(Connection(name="ServiceBusConnection", connection_string=FAKE_CONNECTION))
    try:
        config = client._config  # what the SDK's retry loop reads
        assert config.retry_total == 3
        assert config.retry_backoff_max == 2
        assert config.try_timeout == servicebus.TRY_TIMEOUT_SECONDS
        assert str(config.retry_mode.value) == "exponential"
        sender = client.get_queue_sender("agent-requests-inventory")
        assert sender._config.try_timeout == servicebus.TRY_TIMEOUT_SECONDS  # inherited
    finally:
        client.close()


def test_the_retry_budget_fits_in_the_send_timeout() -> None:
    # Backoffs between the tries (factor * 2^n, capped) must leave time for the tries.
    backoffs = [
        min(CLIENT_OPTIONS["retry_backoff_factor"] * 2**n, CLIENT_OPTIONS["retry_backoff_max"])
        for n in range(CLIENT_OPTIONS["retry_total"])
    ]
    assert sum(backoffs) < servicebus.SEND_TIMEOUT_SECONDS / 2
    assert servicebus.TRY_TIMEOUT_SECONDS < servicebus.SEND_TIMEOUT_SECONDS


def test_every_send_passes_the_operation_timeout(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    transport.send_request(make_request())
    transport.send_reply(make_request().succeeded({}))

    for sender in factory.client.senders.values():
        assert [timeout for _, timeout in sender.sent] == [servicebus.SEND_TIMEOUT_SECONDS]


# --- the per-sender lock -----------------------------------------------------------------


class BlockingSender(FakeSender):
    """A send that hangs until released (a connection the SDK cannot give up on)."""

    def __init__(self, queue: str) -> None:
        super().__init__(queue)
        self.entered = threading.Event()
        self.release = threading.Event()

    def send_messages(self, message: Any, timeout: float | None = None) -> None:
        self.entered.set()
        self.release.wait(timeout=30)
        super().send_messages(message, timeout)


def test_a_hung_send_makes_the_next_one_busy_not_blocked(
    factory: Factory, transport: ServiceBusTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(servicebus, "LOCK_TIMEOUT_SECONDS", 0.2)
    transport.send_request(make_request())  # builds the client
    hung = BlockingSender("agent-requests-inventory")
    factory.client.senders["agent-requests-inventory"] = hung
    transport._senders.clear()
    first = threading.Thread(target=transport.send_request, args=(make_request(),))
    first.start()
    try:
        assert hung.entered.wait(5)
        with pytest.raises(StorageUnavailable, match="busy") as info:
            transport.send_request(make_request(order_id="o-2"))
        # told busy while the first send still hangs, not once it has ended
        assert first.is_alive() and not hung.sent, "the second send waited for the hung one"
        assert info.value.retryable is True
    finally:
        hung.release.set()
        first.join(timeout=5)
    assert [m.message_id for m, _ in hung.sent] == ["o-1:reserve-stock:3"]
    transport.send_request(make_request(order_id="o-3"))  # the lock was released
    assert len(hung.sent) == 2


def test_a_transport_lock_held_too_long_is_busy_too(
    transport: ServiceBusTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(servicebus, "LOCK_TIMEOUT_SECONDS", 0.1)
    with transport._lock:  # e.g. a close() stuck on the network
        outcome: list[BaseException] = []

        def send() -> None:
            try:
                transport.send_request(make_request())
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=send)
        thread.start()
        thread.join(timeout=5)
    assert len(outcome) == 1 and isinstance(outcome[0], StorageUnavailable)


# --- building the message ----------------------------------------------------------------


def test_a_message_id_over_128_characters_is_refused_not_raised_raw(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    request = make_request(order_id="o" * 64, step="s" * 60, attempt=123456)
    assert len(request.message_id) > 128

    with pytest.raises(TransportRefused, match="128") as info:
        transport.send_request(request)

    assert info.value.retryable is False
    assert isinstance(info.value.__cause__, ValueError)
    assert all(not s.sent for c in factory.clients for s in c.senders.values())


def test_step_names_are_bounded_so_every_message_id_fits() -> None:
    longest = "a" * MAX_STEP_NAME
    Workflow("w", (StepSpec(longest),))  # accepted
    with pytest.raises(ValueError, match=f"at most {MAX_STEP_NAME}"):
        Workflow("w", (StepSpec(longest + "b"),))
    request = make_request(order_id="o" * 64, step=longest, attempt=999_999)
    assert len(request.message_id) <= 128
    servicebus.request_message(request, "agent-replies", request.complete_by - timedelta(1))


def test_the_built_in_workflows_fit_the_message_id() -> None:
    for workflow in WORKFLOWS.values():
        for spec in workflow.tasks():
            names = [spec.name] + ([spec.compensation.step] if spec.compensation else [])
            assert all(len(f"{'o' * 64}:{name}:999999") <= 128 for name in names)


# --- errors: permanent or transient ---------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ServiceBusAuthenticationError(message="token expired"),
        ServiceBusAuthorizationError(message="no Data Sender role yet"),
        ServiceBusConnectionError(message="connection reset"),
    ],
)
def test_authentication_and_authorization_are_transient(
    factory: Factory, transport: ServiceBusTransport, error: Exception
) -> None:
    transport.send_request(make_request())
    factory.client.senders["agent-requests-inventory"].error = error

    with pytest.raises(StorageUnavailable) as info:
        transport.send_request(make_request())

    assert info.value.retryable is True
    assert info.value.__cause__ is error


def test_a_message_too_large_stays_permanent(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    transport.send_request(make_request())
    error = MessageSizeExceededError(message="too large")
    factory.client.senders["agent-requests-inventory"].error = error

    with pytest.raises(TransportRefused) as info:
        transport.send_request(make_request())

    assert info.value.retryable is False
    assert info.value.__cause__ is error


def test_a_sender_the_sdk_shut_down_is_replaced(
    factory: Factory, transport: ServiceBusTransport
) -> None:
    transport.send_request(make_request())
    dead = factory.client.senders.pop("agent-requests-inventory")
    dead.error = ValueError("The handler has already been shutdown. Please use ServiceBusClient")

    with pytest.raises(StorageUnavailable):
        transport.send_request(make_request())
    assert transport.send_request(make_request()) is True

    assert factory.client.sender_requests == [
        "agent-requests-inventory",
        "agent-requests-inventory",
    ]
    assert len(factory.client.senders["agent-requests-inventory"].sent) == 1


def test_a_client_that_cannot_be_built_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise ValueError("connection string is malformed")

    transport = ServiceBusTransport(broken, Names(), Clock())

    with pytest.raises(StorageUnavailable):
        transport.send_request(make_request())


# --- the credential ------------------------------------------------------------------------


class Recorder:
    calls: list[dict[str, Any]]

    def __init__(self, **kwargs: Any) -> None:
        type(self).calls.append(kwargs)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> type[Recorder]:
    import azure.identity

    from bootstrap import clients

    class Default(Recorder):
        calls: list[dict[str, Any]] = []

    monkeypatch.setattr(azure.identity, "DefaultAzureCredential", Default)
    monkeypatch.setattr(clients, "_credentials", {})
    return Default


def test_without_a_client_id_default_credential_keeps_its_azure_client_id_fallback(
    recorded: type[Recorder],
) -> None:
    from bootstrap.clients import credential

    credential(Connection(name="ServiceBusConnection", fully_qualified_namespace="ns"))

    # An explicit managed_identity_client_id=None would switch the fallback off.
    assert recorded.calls == [{}]


def test_a_client_id_is_passed_to_default_credential(recorded: type[Recorder]) -> None:
    from bootstrap.clients import credential

    credential(Connection(name="Storage", account_name="acct", client_id="1234-abcd"))

    assert recorded.calls == [{"managed_identity_client_id": "1234-abcd"}]
