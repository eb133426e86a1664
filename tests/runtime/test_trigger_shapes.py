"""The trigger shapes: what a function receives through azure-functions-runtime, driven
as the host drives it (hostrun), from the triggers devhost builds out of a real message.

Each test gives devhost a message as its SDK hands it over, lets devhost build the trigger
as the host has it, hostrun the host's ``InvocationRequest`` (hostrun/shapes.py cites the
host's and the extensions' source for every key), and checks what the probe function
(tests/fixtures/runtime_probe_app) saw against what the host's source says it sends.
Python 3.13 only (``make runtime-check``); elsewhere they skip, but under
``RUNTIME_CHECK_REQUIRED=1`` a missing runtime fails.
"""

from __future__ import annotations

import json
import os
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

if not os.environ.get("RUNTIME_CHECK_REQUIRED"):
    pytest.importorskip(
        "azure_functions_runtime",
        reason="needs azure-functions-runtime (Python 3.13): run `make runtime-check`",
    )

from devhost.app_loader import FunctionSpec
from devhost.http import HttpServer
from devhost.invoke import Invoker
from devhost.queues import QueueListener
from devhost.servicebus import host_message
from devhost.settings import LeaseOptions, QueueOptions
from devhost.timers import TimerRunner, parse_schedule
from hostrun.shapes import QueueMessage
from hostrun.worker import FunctionFailed, Result, WorkerRuntime
from observability import opcount
from tests.unit.test_devhost_queues import FakeQueue, Message

APP = Path(__file__).resolve().parents[1] / "fixtures" / "runtime_probe_app"
#: A time with all six fractional digits, as the Storage and Service Bus SDKs give them.
AT = datetime(2024, 5, 1, 12, 30, 45, 123456, tzinfo=UTC)


@pytest.fixture(scope="module")
def runtime() -> Iterator[WorkerRuntime]:
    worker = WorkerRuntime(APP).start()
    yield worker
    worker.stop()


def spec(name: str, kind: str, trigger: dict[str, Any]) -> FunctionSpec:
    return FunctionSpec(name, kind, trigger, func=lambda **_: None)


class Capture:
    """devhost's runner, keeping what each invocation gave back (its output bindings)."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime, self.results = runtime, list[Result]()

    def __call__(self, spec: FunctionSpec, trigger: Any) -> Any:
        result = self.runtime.invoke(spec.name, trigger)
        self.results.append(result)
        return result.value

    def seen(self) -> dict[str, Any]:
        seen: dict[str, Any] = json.loads(self.results[-1].outputs["out"])
        return seen


def run_queue(runtime: WorkerRuntime, name: str, message: Message) -> tuple[Capture, FakeQueue]:
    capture = Capture(runtime)
    queue, poison = FakeQueue("probe-in"), FakeQueue("probe-in-poison")
    options = QueueOptions(4, 2, 1.0, 7.0, 3)
    trigger = {"name": "msg", "queueName": "probe-in"}
    listener = QueueListener(
        spec(name, "queueTrigger", trigger),
        queue,
        poison,
        options,
        LeaseOptions(30, 10.0),
        Invoker(capture),
    )
    queue.receipts[message.id] = message.pop_receipt
    listener.dispatch(message)
    listener._pool.shutdown(wait=True)
    return capture, poison if name == "probe_fail" else queue


def test_storage_queue_message(runtime: WorkerRuntime) -> None:
    message = Message(
        "m-1",
        '{"orderId": "o-1"}',
        dequeue_count=2,
        pop_receipt="pop-1",
        inserted_on=AT,
        expires_on=AT.replace(day=8),
        next_visible_on=AT.replace(minute=31),
    )
    capture, queue = run_queue(runtime, "probe_queue", message)
    assert queue.calls == [("delete", "m-1", "pop-1")]  # success: deleted, as the host does
    # QueueTriggerBinding.CreateBindingData: Id and PopReceipt strings, DequeueCount a long
    # (JSON), the three times DateTimeOffsets (JSON, 7 fractional digits: Python keeps 6).
    assert capture.seen() == {
        "id": "m-1",
        "body": '{"orderId": "o-1"}',
        "dequeue_count": 2,
        "insertion_time": "2024-05-01T12:30:45.123456+00:00",
        "expiration_time": "2024-05-08T12:30:45.123456+00:00",
        "time_next_visible": "2024-05-01T12:31:45.123456+00:00",
        "pop_receipt": "pop-1",
    }


def test_a_failing_function_is_retried_then_poisoned(runtime: WorkerRuntime) -> None:
    capture, poison = run_queue(runtime, "probe_fail", Message("m-2", "x", dequeue_count=3))
    assert capture.results == []  # the invocation failed: no result
    assert poison.sent == ["x"]  # at maxDequeueCount: to <queue>-poison, as the host does
    with pytest.raises(FunctionFailed) as failed:
        runtime.invoke("probe_fail", _queue_value("m-3", "y"))
    assert failed.value.reason == "ValueError: refused y"
    assert "probe_fail" in failed.value.stack  # the worker's traceback of the user's code


def _queue_value(message_id: str, body: str) -> QueueMessage:
    return QueueMessage(id=message_id, body=body.encode(), dequeue_count=1, pop_receipt="p")


def test_service_bus_message(runtime: WorkerRuntime) -> None:
    sdk_message = SimpleNamespace(  # as azure-servicebus hands it to devhost
        body=[b'{"orderId": ', b'"o-1"}'],
        message_id="sb-1",
        delivery_count=0,  # the Python SDK counts earlier deliveries; .NET's is 1-based
        enqueued_time_utc=AT,
        expires_at_utc=AT.replace(day=15),
        application_properties={b"kind": b"reply", b"attempt": 2},
        lock_token="lock-1",
        reply_to="agent-replies",
        correlation_id="o-1:pay",
        content_type="application/json",
        sequence_number=42,
        subject="pay",
        session_id=None,
    )
    capture = Capture(runtime)
    Invoker(capture).call(spec("probe_bus", "serviceBusTrigger", {}), host_message(sdk_message))
    # ServiceBusTriggerBindingStrategy.AddBindingData: DeliveryCount 1 on the first delivery;
    # ApplicationProperties and UserProperties the same dictionary; Subject and Label the
    # same; EnqueuedTimeUtc and ExpiresAtUtc are `.DateTime` (kind Unspecified: no zone),
    # so azure.functions parses them as *naive* datetimes, unlike devhost's direct call.
    assert capture.seen() == {
        "message_id": "sb-1",
        "body": '{"orderId": "o-1"}',
        "delivery_count": 1,
        "enqueued_time_utc": "2024-05-01T12:30:45.123456",
        "expires_at_utc": "2024-05-15T12:30:45.123456",
        "application_properties": {"kind": "reply", "attempt": 2},
        "user_properties": {"kind": "reply", "attempt": 2},
        "lock_token": "lock-1",
        "reply_to": "agent-replies",
        "correlation_id": "o-1:pay",
        "content_type": "application/json",
        "sequence_number": 42,
        "subject": "pay",
        "label": "pay",
        "session_id": None,
    }


def test_a_service_bus_message_without_user_properties_does_not_decode(
    runtime: WorkerRuntime,
) -> None:
    """Why the driver must send UserProperties: azure.functions reads "one message" from it
    (servicebus.py, _is_cardinality_one); without it the invocation fails."""
    p = runtime.protos
    trigger = p.TypedData(string="{}")
    request = runtime.request("probe_bus", trigger, {"MessageId": p.TypedData(string="x")})
    with pytest.raises(FunctionFailed, match="UserProperties"):
        runtime.outcome("probe_bus", runtime.send(request))


def test_timer_tick(runtime: WorkerRuntime) -> None:
    capture = Capture(runtime)
    timer_spec = spec("probe_timer", "timerTrigger", {"schedule": "0 0 * * * *"})
    schedule = parse_schedule("0 0 * * * *")
    opcount.set_trigger_lookup(runtime.current_trigger)  # as devhost does
    try:
        TimerRunner(timer_spec, schedule, Invoker(capture), now=lambda: AT).fire(AT, past_due=True)
    finally:
        opcount.set_trigger_lookup(None)
    # TimerInfo as JSON: IsPastDue, ScheduleStatus (Last, Next, LastUpdated); and the
    # trigger type the runtime's pool thread is known to run (for observability.opcount).
    assert capture.seen() == {
        "trigger": "timerTrigger",
        "past_due": True,
        "schedule_status": {
            "Last": None,
            "Next": "2024-05-01T13:00:00+00:00",
            "LastUpdated": "2024-05-01T12:30:45.123456+00:00",
        },
    }


def test_http_request_and_response(runtime: WorkerRuntime) -> None:
    http_spec = spec("probe_http", "httpTrigger", {"route": "probe/{item}", "methods": ["POST"]})
    server = HttpServer(0, [http_spec], "api", Invoker(runtime.call))
    server.start()
    try:
        request = urllib.request.Request(
            f"{server.base_url}/api/probe/42?x=1&empty=",
            data=b'{"q": 1}',
            headers={"X-Trace": "t-1", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            status, content_type = response.status, response.headers["Content-Type"]
            seen = json.loads(response.read())
    finally:
        server.stop()
    assert (status, content_type) == (201, "application/json")  # the function's own
    # ToRpcHttp: header names lower-cased, empty query values left out, route parameters,
    # the body as bytes (the worker asks for RawHttpBodyBytes).
    assert seen["headers"]["x-trace"] == "t-1"
    assert "X-Trace" not in seen["headers"]
    assert seen["params"] == {"x": "1"}
    assert seen["route_params"] == {"item": "42"}
    assert seen["body"] == '{"q": 1}'
    assert (seen["method"], seen["url"]) == ("POST", f"{server.base_url}/api/probe/42?x=1&empty=")


def kinds(metadata: dict[str, Any]) -> dict[str, str]:
    return {key: value.WhichOneof("data") for key, value in metadata.items()}


def test_the_wire_shapes_are_the_hosts(runtime: WorkerRuntime) -> None:
    """The TypedData kind of every trigger_metadata key, as the host's ToRpc gives it
    (string -> string, numbers, times and dictionaries -> json): the runtime tolerates
    some drift here (a count sent as text still decodes), this does not."""
    from hostrun import shapes

    p = runtime.protos
    data, queue = shapes.trigger_data(p, _queue_value("m-4", "z"), "probe_queue")
    assert data.WhichOneof("data") == "string"
    assert kinds(queue) == {
        "QueueTrigger": "string",
        "DequeueCount": "json",
        "Id": "string",
        "PopReceipt": "string",
        "sys": "json",
    }  # the times are left out here: the value has none, and the host skips nulls
    assert json.loads(queue["DequeueCount"].json) == 1
    message = host_message(
        SimpleNamespace(
            body=[b"{}"],
            message_id="sb-2",
            delivery_count=0,
            enqueued_time_utc=AT,
            expires_at_utc=AT,
            application_properties={},
            lock_token="l",
            sequence_number=1,
        )
    )
    _, bus = shapes.trigger_data(p, message, "probe_bus")
    assert kinds(bus) == {
        "DeliveryCount": "json",
        "LockToken": "string",
        "ExpiresAtUtc": "json",
        "ExpiresAt": "json",
        "EnqueuedTimeUtc": "json",
        "EnqueuedTime": "json",
        "MessageId": "string",
        "SequenceNumber": "json",
        "ApplicationProperties": "json",
        "UserProperties": "json",
        "sys": "json",
    }
    assert json.loads(bus["EnqueuedTime"].json) == "2024-05-01T12:30:45.123456+00:00"
    assert json.loads(bus["EnqueuedTimeUtc"].json) == "2024-05-01T12:30:45.123456"


def test_naive_times_are_utc_and_property_values_are_written_as_newtonsoft_does(
    runtime: WorkerRuntime,
) -> None:
    """A naive time is UTC, whatever the machine's zone; an application property of a type
    JSON lacks (a GUID, a time, bytes, a TimeSpan) is written as Newtonsoft writes it,
    not a failed invocation on every delivery."""
    from hostrun import shapes

    message = shapes.ServiceBusMessage(
        body=b"{}",
        message_id="sb-3",
        enqueued_time_utc=datetime(2024, 5, 1, 12, 30, 45),
        application_properties={
            "id": uuid.UUID(int=1),
            "at": AT,
            "raw": b"\x00\x01",
            "ttl": timedelta(days=1, minutes=1, seconds=30, microseconds=5),
            "back": -timedelta(seconds=90),
        },
    )
    _, bus = shapes.trigger_data(runtime.protos, message, "probe_bus")
    assert json.loads(bus["EnqueuedTime"].json) == "2024-05-01T12:30:45+00:00"
    assert json.loads(bus["EnqueuedTimeUtc"].json) == "2024-05-01T12:30:45"
    assert json.loads(bus["ApplicationProperties"].json) == {
        "id": "00000000-0000-0000-0000-000000000001",
        "at": "2024-05-01T12:30:45.123456+00:00",
        "raw": "AAE=",
        "ttl": "1.00:01:30.0000050",
        "back": "-00:01:30",
    }


class FakeQueueService:
    """A QueueServiceClient holding what was sent; ``missing`` queues raise 404 once."""

    def __init__(self, missing: set[str] | None = None, broken: bool = False) -> None:
        self.sent: dict[str, list[str]] = {}
        self.created: list[str] = []
        self.missing, self.broken = missing or set(), broken

    def get_queue_client(self, name: str) -> Any:
        from azure.core.exceptions import ResourceNotFoundError, ServiceRequestError

        service = self

        class Client:
            def send_message(self, text: str, **options: Any) -> None:
                if service.broken:
                    raise ServiceRequestError("storage unreachable")
                if name in service.missing:
                    raise ResourceNotFoundError("The specified queue does not exist.")
                service.sent.setdefault(name, []).append(text)

            def create_queue(self) -> None:
                service.missing.discard(name)
                service.created.append(name)

        return Client()


def probe_spec(name: str) -> FunctionSpec:
    """The probe function as devhost builds it from its bindings (its outputs included)."""
    import sys

    from devhost.app_loader import build_spec, find_app

    app = find_app(sys.modules["function_app"])
    (fn,) = [f for f in app.get_functions() if f.get_function_name() == name]
    return build_spec(fn, {})


def test_an_output_binding_is_delivered_after_success_only(runtime: WorkerRuntime) -> None:
    from devhost.host import DevHost

    spec_ = probe_spec("probe_queue")
    assert set(spec_.outputs) == {"out"} and spec_.outputs["out"]["queueName"] == "probe-out"
    devhost = DevHost(Invoker(runtime.call), {})
    service = FakeQueueService(missing={"probe-out"})
    devhost.queue_services["AzureWebJobsStorage"] = service
    undelivered, runtime.deliver = runtime.deliver, devhost.deliver
    try:
        outcome = devhost.invoker.call(spec_, _queue_value("m-4", "hello"))
        assert outcome.succeeded, outcome.error
        assert service.created == ["probe-out"]  # created on first use, as the host does
        (sent,) = service.sent["probe-out"]
        assert json.loads(sent)["body"] == "hello"
        # a delivery that fails fails the invocation: the trigger message is retried
        devhost.queue_services["AzureWebJobsStorage"] = FakeQueueService(broken=True)
        failed = devhost.invoker.call(spec_, _queue_value("m-5", "again"))
        assert not failed.succeeded and "storage unreachable" in str(failed.error)
        # a function that raises writes nothing
        fail_spec = probe_spec("probe_fail")
        quiet = FakeQueueService()
        devhost.queue_services["AzureWebJobsStorage"] = quiet
        assert not devhost.invoker.call(fail_spec, _queue_value("m-6", "z")).succeeded
        assert quiet.sent == {}
    finally:
        runtime.deliver = undelivered
