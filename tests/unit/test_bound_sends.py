"""Sends through the invocation's output bindings (messaging/bound.py): what the function
gives back, what goes out with the SDK instead, and when."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
import typing
from typing import Any

import azure.functions as func
import pytest

from messaging import bound
from messaging.storage_queues import StorageQueues


class Out:
    """A ``func.Out`` as the runtime passes one: what the function set."""

    def __init__(self) -> None:
        self.value: Any = None

    def set(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class Sent:
    """The SDK send of ``send_now``: what it sent, in order."""

    def __init__(self, fails: bool = False) -> None:
        self.messages: list[tuple[str, str]] = []
        self.fails = fails

    def __call__(self, queue: str, body: str) -> None:
        if self.fails:
            raise OSError("the account does not answer")
        self.messages.append((queue, body))


def outputs(*queues: str) -> dict[str, Out]:
    return {bound.argument_for(queue): Out() for queue in queues}


def test_outside_an_invocation_nothing_is_taken() -> None:
    assert bound.offer("agent-requests-ship", "{}") is False


def test_what_the_handler_sends_to_its_queues_is_set_on_their_bindings() -> None:
    refused: list[bool] = []

    def handler(msg: str) -> None:
        with bound.recoverable():
            assert bound.offer("agent-requests-ship", f"{msg}-1")
            assert bound.offer("agent-requests-ship", f"{msg}-2")
            refused.append(bound.offer("operator-alerts", "not bound here"))
        refused.append(bound.offer("agent-requests-ship", "whose loss nothing makes good"))

    sent = Sent()
    function = bound.sends(["agent-requests-ship", "order-dispatch"], handler, lambda: sent, str)
    outs = outputs("agent-requests-ship", "order-dispatch")
    function("m", **outs)
    assert outs["to_agent_requests_ship"].value == ["m-1", "m-2"]
    assert outs["to_order_dispatch"].value is None  # nothing for it: nothing set, nothing sent
    assert refused == [False, False]
    assert sent.messages == []
    with bound.recoverable():
        assert bound.offer("agent-requests-ship", "after") is False  # the invocation ended


def test_what_a_failed_handler_held_is_sent_at_once_and_its_error_goes_on() -> None:
    def handler(msg: str) -> None:
        with bound.recoverable():
            bound.offer("order-dispatch", "a")
            bound.offer("agent-requests-ship", "b")
        raise RuntimeError("the save after the claim failed")

    sent = Sent()
    function = bound.sends(["agent-requests-ship", "order-dispatch"], handler, lambda: sent, str)
    outs = outputs("agent-requests-ship", "order-dispatch")
    with pytest.raises(RuntimeError, match="the save after the claim failed"):
        function("m", **outs)
    assert sorted(sent.messages) == [("agent-requests-ship", "b"), ("order-dispatch", "a")]
    assert all(out.value is None for out in outs.values())  # the host would drop them


def test_a_send_that_fails_after_a_failed_handler_does_not_hide_the_handlers_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def handler(msg: str) -> None:
        with bound.recoverable():
            bound.offer("order-dispatch", "a")
        raise ValueError("the handler's own error")

    function = bound.sends(["order-dispatch"], handler, lambda: Sent(fails=True), str)
    with pytest.raises(ValueError, match="the handler's own error"):
        function("m", **outputs("order-dispatch"))
    assert "could not send a message an invocation held" in caplog.text


def test_a_thread_given_the_invocations_context_sends_through_its_outbox() -> None:
    """As ``agents.threads`` hands work over: ``contextvars.copy_context().run``."""
    taken: list[bool] = []

    def handler(msg: str) -> None:
        with bound.recoverable():
            context = contextvars.copy_context()
        worker = threading.Thread(
            target=context.run, args=(lambda: taken.append(bound.offer("q-a", "x")),)
        )
        worker.start()
        worker.join()

    function = bound.sends(["q-a"], handler, Sent, str)
    outs = outputs("q-a")
    function("m", **outs)
    assert taken == [True]
    assert outs["to_q_a"].value == ["x"]


def test_a_thread_that_runs_on_past_the_invocation_sends_with_the_sdk() -> None:
    """A bound passed: the invocation has returned, its thread still runs; the host has
    flushed the bindings already, so the outbox no longer takes anything."""
    go, done = threading.Event(), threading.Event()
    late: list[bool] = []

    def later() -> None:
        go.wait()
        late.append(bound.offer("q-a", "late"))
        done.set()

    def handler(msg: str) -> None:
        with bound.recoverable():
            threading.Thread(target=contextvars.copy_context().run, args=(later,)).start()

    function = bound.sends(["q-a"], handler, Sent, str)
    outs = outputs("q-a")
    function("m", **outs)
    go.set()
    assert done.wait(10)
    assert late == [False]
    assert outs["to_q_a"].value is None


def test_an_async_handler_gets_an_async_function_with_the_same_outbox() -> None:
    async def handler(msg: str) -> None:
        await asyncio.sleep(0)
        with bound.recoverable():
            assert bound.offer("q-a", msg)

    function = bound.sends(["q-a"], handler, Sent, str)
    assert inspect.iscoroutinefunction(function)
    outs = outputs("q-a")
    asyncio.run(function("m", **outs))
    assert outs["to_q_a"].value == ["m"]


def test_the_function_declares_one_keyword_output_per_queue_as_the_runtime_reads_it() -> None:
    def run_agent_ship(msg: func.QueueMessage) -> None:
        """doc"""

    queues = ["order-dispatch", "agent-requests-ship", "order-dispatch"]
    function = bound.sends(queues, run_agent_ship, Sent, func.QueueMessage)
    parameters = inspect.signature(function).parameters
    assert list(parameters) == ["msg", "to_order_dispatch", "to_agent_requests_ship"]
    assert parameters["msg"].annotation is func.QueueMessage
    outs = [p for name, p in parameters.items() if name != "msg"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in outs)
    # typing's List: the runtime refuses func.Out[list[str]] for a queue output
    assert all(p.annotation == func.Out[typing.List[str]] for p in outs)  # noqa: UP006
    assert func.Out[typing.List[str]] != func.Out[list[str]]  # noqa: UP006
    assert (function.__name__, function.__doc__) == ("run_agent_ship", "doc")


def test_bind_declares_each_queue_as_a_queue_output_on_the_apps_connection() -> None:
    app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)

    def submit(msg: func.QueueMessage) -> None: ...

    built = bound.bind(
        app, submit, func.QueueMessage, ["order-dispatch"], Sent, "AzureWebJobsStorage"
    )
    app.queue_trigger(arg_name="msg", queue_name="orders", connection="AzureWebJobsStorage")(built)
    [indexed] = app.get_functions()  # as it deploys: function.json's bindings
    bindings = {b["name"]: b for b in json.loads(indexed.get_function_json())["bindings"]}
    assert bindings["to_order_dispatch"] == {
        "type": "queue",
        "direction": "OUT",
        "name": "to_order_dispatch",
        "queueName": "order-dispatch",
        "connection": "AzureWebJobsStorage",
    }


def test_the_hops_are_the_own_queues_known_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from core.names import Names

    own = Names()
    assert bound.hop_queues() == [own.order_dispatch]  # every function but the submitter
    first = bound.hop_queues(first_requests=True)  # the submitter, on Storage queues
    assert first == [own.order_dispatch, *own.agent_queues()]
    assert len(own.agent_queues()) >= 1
    assert own.agent_replies not in first  # a reply always leaves at once
    # On Service Bus the submitter's requests go to Service Bus: only its dispatch is bound.
    from scheduler import triggers

    submitter, others = triggers.FIRST_HOPS, triggers.HOPS
    assert submitter == (first if triggers.ON_STORAGE_QUEUES else [own.order_dispatch])
    assert others == [own.order_dispatch]


class Client:
    def __init__(self, name: str, sent: list[tuple[str, str, Any]]) -> None:
        self.name, self._sent = name, sent

    def send_message(self, body: str, visibility_timeout: Any = None, **_: Any) -> None:
        self._sent.append((self.name, body, visibility_timeout))


class Service:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []

    def get_queue_client(self, name: str) -> Client:
        return Client(name, self.sent)


def test_the_apps_queues_give_a_message_due_now_to_the_outbox_and_a_later_one_to_the_sdk() -> None:
    service = Service()
    queues = StorageQueues(service, bindable=True)  # type: ignore[arg-type]

    def handler(msg: str) -> None:
        with bound.recoverable():
            queues.send("order-dispatch", "now")
            queues.send("order-dispatch", "later", delay_seconds=3)
            queues.send("operator-alerts", "elsewhere")

    outs = outputs("order-dispatch")
    bound.sends(["order-dispatch"], handler, Sent, str)("m", **outs)
    assert outs["to_order_dispatch"].value == ["now"]
    assert service.sent == [("order-dispatch", "later", 3), ("operator-alerts", "elsewhere", None)]


def test_queues_of_another_account_never_use_the_outbox() -> None:
    service = Service()
    queues = StorageQueues(service)  # type: ignore[arg-type]  # not the bindings' account

    def handler(msg: str) -> None:
        with bound.recoverable():
            queues.send("order-dispatch", "now")

    outs = outputs("order-dispatch")
    bound.sends(["order-dispatch"], handler, Sent, str)("m", **outs)
    assert outs["to_order_dispatch"].value is None
    assert service.sent == [("order-dispatch", "now", None)]


def test_a_wait_to_try_again_sends_what_is_held_first_and_the_outbox_stays_open() -> None:
    """``ride_out`` calls ``release`` before it sleeps: a decision made before the wait
    does not wait with it (nor past its step's deadline)."""
    from core.errors import StorageUnavailable
    from messaging.resilience import ride_out

    sent = Sent()
    tries: list[int] = []

    def work() -> None:
        tries.append(len(tries))
        if len(tries) == 1:
            with bound.recoverable():
                bound.offer("order-dispatch", "decided first")
            raise StorageUnavailable("the table does not answer")
        with bound.recoverable():
            bound.offer("order-dispatch", "decided after")

    def handler(msg: str) -> None:
        ride_out(work, what="test", sleep=lambda _: None)

    outs = outputs("order-dispatch")
    bound.sends(["order-dispatch"], handler, lambda: sent, str)("m", **outs)
    assert sent.messages == [("order-dispatch", "decided first")]
    assert outs["to_order_dispatch"].value == ["decided after"]
