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
  of those queues, due now (an output binding sets no visibility delay and no time to
  live), and sent inside ``recoverable()``: only a message whose loss the app makes good
  by itself may wait for the host. The host sends after the function returns and fails
  the invocation if it cannot, and what is lost then must come back without a doubt:
  an order's first requests (``Order.resendable``: the redelivered order sends them
  again, and one copy calls), and a dispatch (the scheduler's sweep dispatches a due
  step whose dispatch was lost). Any other request, and every reply, leaves at once
  with the SDK, as before, so that a send that fails is seen (``Order.unsent``).
- When the handler returns, what the outbox holds is set on the bindings: the host sends
  it before it settles the trigger message.
- When the handler raises, or is about to wait before trying again (``release``, from
  ``messaging.resilience.ride_out``), what the outbox holds is sent at once with the SDK
  (off the event loop in an async handler), so nothing waits behind a retry.
- Once the handler has ended, the outbox is closed: a thread of the invocation that runs
  on past it (a bound passed) sends with the SDK.

The messages are the same; what changes is who sends them and when: after the function,
by the host. A request so sent lives the queue's default seven days rather than its
deadline and an hour (``REQUEST_LATE_SECONDS``): read late, it is answered "not called,
too late" as before, which is still a report.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import re
import threading
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Final

import azure.functions as func

from core.names import Names
from observability.logs import get_logger

log = get_logger(__name__)

#: What the runtime accepts for a queue output of several messages (it refuses the
#: builtin ``list[str]``): one message per item.
MESSAGES: Final = func.Out[typing.List[str]]  # noqa: UP006 - the runtime wants typing's

_outbox: contextvars.ContextVar[Outbox | None] = contextvars.ContextVar("outbox", default=None)
_recoverable: contextvars.ContextVar[bool] = contextvars.ContextVar("recoverable", default=False)

Sender = Callable[[str, str], None]


class Outbox:
    """What one invocation sends to its bound queues, until it ends; ``send_now()`` gives
    the SDK send for what must leave before that."""

    def __init__(self, queues: Iterable[str], send_now: Callable[[], Sender]) -> None:
        self._held: dict[str, list[str]] = {queue: [] for queue in queues}
        self._open = True
        self._lock = threading.Lock()
        self.send_now = send_now

    def take(self, queue: str, body: str) -> bool:
        """Keep ``body`` for ``queue`` if this outbox sends there and is still open."""
        with self._lock:
            if not self._open or queue not in self._held:
                return False
            self._held[queue].append(body)
            return True

    def drain(self, close: bool = False) -> dict[str, list[str]]:
        """What it holds, by queue (the queues it holds nothing for left out), now held no
        more; ``close``: and it takes nothing after."""
        with self._lock:
            self._open = self._open and not close
            held = {queue: bodies for queue, bodies in self._held.items() if bodies}
            self._held = {} if close else {queue: [] for queue in self._held}
        return held

    def send_held(self, close: bool = False) -> None:
        """Send what it holds now, with the SDK (``drain``, then ``send_now``)."""
        if held := self.drain(close):
            _send_at_once(held, self.send_now)


@contextlib.contextmanager
def recoverable(yes: bool = True) -> Iterator[None]:
    """Within it (``yes``), a send may wait in the invocation's outbox: the app sends the
    message again by itself if the host cannot (module docstring)."""
    token = _recoverable.set(yes)
    try:
        yield
    finally:
        _recoverable.reset(token)


def offer(queue: str, body: str) -> bool:
    """Whether the current invocation's outbox took ``body`` for ``queue`` (it sends it
    when the function returns); False outside one, outside ``recoverable()``, or for a
    queue it is not bound to."""
    outbox = _outbox.get()
    return outbox is not None and _recoverable.get() and outbox.take(queue, body)


def release() -> None:
    """Send what the current invocation's outbox holds now, with the SDK: before a wait
    to try again, nothing it has decided should wait with it."""
    if (outbox := _outbox.get()) is not None:
        outbox.send_held()


def argument_for(queue: str) -> str:
    """The output binding's parameter name for ``queue`` (queue names are lowercase
    letters, digits and hyphens: the name is unique per queue)."""
    return "to_" + re.sub(r"[^a-z0-9]", "_", queue.lower())


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
    arguments = output_arguments(queues)

    def start() -> tuple[Outbox, contextvars.Token[Outbox | None]]:
        outbox = Outbox(arguments.values(), send_now)
        return outbox, _outbox.set(outbox)

    def ended(outbox: Outbox, outputs: Mapping[str, Any]) -> None:
        held = outbox.drain(close=True)
        for argument, queue in arguments.items():
            if queue in held:
                outputs[argument].set(held[queue])

    function: Callable[..., Any]
    if inspect.iscoroutinefunction(handler):
        coroutine = typing.cast(Callable[[Any], Awaitable[None]], handler)

        async def bound_async(msg: Any, **outputs: Any) -> None:
            outbox, token = start()
            try:
                await coroutine(msg)
            except BaseException:
                # SDK sends: not on the event loop
                await asyncio.to_thread(outbox.send_held, close=True)
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
                outbox.send_held(close=True)
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


def hop_queues(first_requests: bool = False) -> list[str]:
    """The app's own queues known at start whose messages may wait for the host:
    ``order-dispatch``, and with ``first_requests`` (``submit_order``, agents on Storage
    queues) every declared agent's request queue: an order's first requests, which a
    redelivered order sends again."""
    own = Names()
    return [own.order_dispatch, *(own.agent_queues() if first_requests else ())]


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
    """What an outbox held, sent with the SDK (its invocation failed, or waits to try
    again); a send that fails is logged: its claim is then as if its process had died
    before sending, which the app makes good (module docstring)."""
    try:
        send = send_now()
    except Exception:
        log.exception("could not send what an invocation held (%d queues)", len(held))
        return
    for queue, bodies in held.items():
        for body in bodies:
            try:
                send(queue, body)
            except Exception:
                log.exception("could not send a message an invocation held for %s", queue)
