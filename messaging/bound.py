"""Sends through the invocation's output bindings, so that the host wakes the listener.

A Storage queue trigger that finds its queue empty polls again only after a back-off
that grows to host.json's ``maxPollingInterval`` (0.5 s). The Functions host shortens that
wait in one case: when a function of the same instance adds a message to the queue
through a queue **output binding** (the WebJobs queue extension's ``SharedQueueWatcher``,
which the binding notifies and every queue listener of the instance registers with). A
message sent with the Storage SDK wakes nobody. So the app's hops between its own
functions (a claimed step's request to its agent's queue, an order queued on
``order-dispatch``) go through output bindings where the queue is known when the app
starts: the next function starts at once instead of at its listener's next poll.

How it works, per invocation:

- ``sends(queues, handler)`` makes a function the runtime indexes with one output
  binding per queue (``func.Out[List[str]]``, one message per item), and runs
  ``handler`` with an ``Outbox`` in a context variable (copied into the threads the
  invocation hands work to: ``agents.threads``).
- ``StorageQueues.send`` offers a message to the outbox (``offer``) when it is for one
  of those queues and due now (an output binding sets no visibility delay and no time to
  live: a delayed message goes through the SDK as before). The outbox keeps it.
- When the handler returns, what the outbox holds is set on the bindings: the host sends
  it after the function returns and before it settles the trigger message, and fails
  the invocation if it cannot (the trigger message is then delivered again: as a process
  that died between its save and its send, which the engine rides out).
- When the handler raises, nothing would be sent by the host: what the outbox holds is
  sent at once with the SDK before the error goes on (as it would have been without
  the outbox), and the invocation fails as it would have.
- Once the handler has ended, the outbox is closed: a thread of the invocation that runs
  on past it (a bound passed) sends with the SDK.

The messages are the same; what changes is who sends them and when: after the function,
by the host. A request so sent lives the queue's default seven days rather than its
deadline and an hour (``REQUEST_LATE_SECONDS``): read late, it is answered "not called,
too late" as before, which is still a report.
"""

from __future__ import annotations

import contextvars
import inspect
import re
import threading
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import azure.functions as func

from core.names import Names
from observability.logs import get_logger

log = get_logger(__name__)

#: What the runtime accepts for a queue output of several messages (it refuses the
#: builtin ``list[str]``): one message per item.
MESSAGES: Final = func.Out[typing.List[str]]  # noqa: UP006 - the runtime wants typing's

_outbox: contextvars.ContextVar[Outbox | None] = contextvars.ContextVar("outbox", default=None)


class Outbox:
    """What one invocation sends to its bound queues, until it ends."""

    def __init__(self, queues: Iterable[str]) -> None:
        self._held: dict[str, list[str]] = {queue: [] for queue in queues}
        self._open = True
        self._lock = threading.Lock()

    def take(self, queue: str, body: str) -> bool:
        """Keep ``body`` for ``queue`` if this outbox sends there and is still open."""
        with self._lock:
            if not self._open or queue not in self._held:
                return False
            self._held[queue].append(body)
            return True

    def close(self) -> dict[str, list[str]]:
        """End it: what it holds, by queue (the queues it holds nothing for left out)."""
        with self._lock:
            self._open = False
            held, self._held = self._held, {}
        return {queue: bodies for queue, bodies in held.items() if bodies}


def offer(queue: str, body: str) -> bool:
    """Whether the current invocation's outbox took ``body`` for ``queue`` (it sends it
    when the function returns); False outside one, or for a queue it is not bound to."""
    outbox = _outbox.get()
    return outbox is not None and outbox.take(queue, body)


def argument_for(queue: str) -> str:
    """The output binding's parameter name for ``queue`` (queue names are lowercase
    letters, digits and hyphens: the name is unique per queue)."""
    return "to_" + re.sub(r"[^a-z0-9]", "_", queue.lower())


Sender = Callable[[str, str], None]


def sends(
    queues: Iterable[str],
    handler: Callable[[Any], Any],
    send_now: Callable[[], Sender],
    trigger_type: Any,
) -> Callable[..., Any]:
    """A function of ``(msg, *, to_<queue>...)`` that runs ``handler(msg)`` with an outbox
    for ``queues`` and sets what it holds on the bindings; ``send_now()`` gives the SDK
    send used for what is held when ``handler`` raises. Async if ``handler`` is. The
    caller names it and stacks the trigger and one ``queue_output`` per queue
    (``output_arguments``)."""
    arguments = {argument_for(queue): queue for queue in dict.fromkeys(queues)}

    def start() -> tuple[Outbox, contextvars.Token[Outbox | None]]:
        outbox = Outbox(arguments.values())
        return outbox, _outbox.set(outbox)

    def ended(outbox: Outbox, outputs: Mapping[str, Any]) -> None:
        held = outbox.close()
        for argument, queue in arguments.items():
            if queue in held:
                outputs[argument].set(held[queue])

    def failed(outbox: Outbox) -> None:
        held = outbox.close()
        if held:
            _send_at_once(held, send_now)

    function: Callable[..., Any]
    if inspect.iscoroutinefunction(handler):
        coroutine = typing.cast(Callable[[Any], Awaitable[None]], handler)

        async def bound_async(msg: Any, **outputs: Any) -> None:
            outbox, token = start()
            try:
                await coroutine(msg)
            except BaseException:
                failed(outbox)
                raise
            else:
                ended(outbox, outputs)
            finally:
                _outbox.reset(token)

        function = bound_async
    else:

        def bound_sync(msg: Any, **outputs: Any) -> None:
            outbox, token = start()
            try:
                handler(msg)
            except BaseException:
                failed(outbox)
                raise
            else:
                ended(outbox, outputs)
            finally:
                _outbox.reset(token)

        function = bound_sync
    parameters = [
        inspect.Parameter("msg", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=trigger_type),
        *(
            inspect.Parameter(argument, inspect.Parameter.KEYWORD_ONLY, annotation=MESSAGES)
            for argument in arguments
        ),
    ]
    setattr(function, "__signature__", inspect.Signature(parameters, return_annotation=None))  # noqa: B010
    function.__annotations__ = {
        "msg": trigger_type,
        **dict.fromkeys(arguments, MESSAGES),
        "return": None,
    }
    for attribute in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(function, attribute, getattr(handler, attribute))
    return function


def output_arguments(queues: Iterable[str]) -> dict[str, str]:
    """The output bindings ``sends`` gives a function: parameter name to queue."""
    return {argument_for(queue): queue for queue in dict.fromkeys(queues)}


def hop_queues(on_storage_queues: bool) -> list[str]:
    """The app's own queues known at start that its functions send to at once:
    ``order-dispatch``, and on Storage queues every declared agent's request queue and
    the reply queue (on Service Bus those are Service Bus queues, which push)."""
    own = Names()
    queues = [own.order_dispatch]
    if on_storage_queues:
        queues += [*own.agent_queues(), own.agent_replies]
    return queues


def bind(
    blueprint: Any,
    handler: Callable[[Any], Any],
    trigger_type: Any,
    queues: Iterable[str],
    send_now: Callable[[], Sender],
    connection: str,
) -> Any:
    """``sends(...)`` with its queue output bindings declared on ``blueprint`` (each on
    ``connection``, the account ``StorageQueues(bindable=True)`` sends to); the caller
    adds the trigger."""
    queues = list(dict.fromkeys(queues))
    built: Any = sends(queues, handler, send_now, trigger_type)
    for argument, queue in output_arguments(queues).items():
        output = blueprint.queue_output(arg_name=argument, queue_name=queue, connection=connection)
        built = output(built)
    return built


def _send_at_once(held: Mapping[str, list[str]], send_now: Callable[[], Sender]) -> None:
    """What a failed invocation held, sent with the SDK; a send that fails is logged (the
    invocation fails anyway: its claims are then as if their process died before sending)."""
    try:
        send = send_now()
    except Exception:
        log.exception("could not send what a failed invocation held (%d queues)", len(held))
        return
    for queue, bodies in held.items():
        for body in bodies:
            try:
                send(queue, body)
            except Exception:
                log.exception("could not send a message a failed invocation held for %s", queue)
