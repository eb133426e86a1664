"""Upgrading from the shared request queue: ``python -m admin drain-legacy-requests``.

Versions before per-agent queues sent every agent request to ``agent-requests``, read by
one ``run_agent`` function. This version has no function on that queue: what waits there
at the upgrade is moved, once, to each request's own agent queue. Its order's plan says
which agent runs the step (a plan stored before agents gets its agents when read,
``core.workflows.legacy_agent``). A request whose deadline has passed is not moved: its
attempt gets the report "not called", the answer its agent would have given (so the
attempt is no try, docs/contracts.md §3.11). A message that cannot be read or routed
stays where it is and is listed, with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from core.errors import InvalidMessage, OrderError
from core.ports import AgentTransport, Clock, StateStore
from messaging.wire import decode_request
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)


class LegacyQueue(Protocol):
    """The shared ``agent-requests`` queue, on Storage or on Service Bus."""

    def messages(self, *, peek: bool) -> Iterator[tuple[bytes, Any]]:
        """Each waiting message's body and a handle (received, unless ``peek``)."""
        ...

    def remove(self, handle: Any) -> None:
        """The message was moved (or answered): take it off the queue."""
        ...

    def leave(self, handle: Any) -> None:
        """Leave the message where it is (it could not be moved)."""
        ...


@dataclass
class Drained:
    moved: list[str] = field(default_factory=list)  # "<orderId>:<step>:<attempt> -> <agent>"
    not_called: list[str] = field(default_factory=list)  # past their deadline: reported
    left: list[dict[str, str]] = field(default_factory=list)  # {"message", "reason"}
    dry_run: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "dryRun": self.dry_run,
            "moved": self.moved,
            "notCalled": self.not_called,
            "left": self.left,
        }


def drain(
    queue: LegacyQueue,
    store: StateStore,
    transport: AgentTransport,
    clock: Clock,
    *,
    dry_run: bool = False,
) -> Drained:
    """Move every request waiting on the legacy queue to its agent's queue."""
    out = Drained(dry_run=dry_run)
    for body, handle in queue.messages(peek=dry_run):
        preview = body[:200].decode("utf-8", "replace")
        try:
            request = decode_request(body)
            order = store.load(request.order_id)
            if order is None:
                raise InvalidMessage(f"no order {request.order_id}")
            agent = order.plan.agent_of(request.step)
        except (InvalidMessage, KeyError, ValueError, OrderError) as exc:
            reason = exc.message if isinstance(exc, OrderError) else str(exc)
            out.left.append({"message": preview, "reason": reason})
            if not dry_run:
                queue.leave(handle)
            continue
        routed = replace(request, agent=agent)
        name = f"{routed.message_id} -> {agent}"
        if dry_run:
            (out.moved if routed.complete_by > clock() else out.not_called).append(name)
            continue
        if transport.send_request(routed):
            out.moved.append(name)
        else:  # past its deadline: the answer its agent would have given
            transport.send_reply(
                routed.deferred(
                    f"{routed.step}: not called: the request waited on the retired "
                    "agent-requests queue past its deadline",
                    clock(),
                ),
                None,
            )
            out.not_called.append(name)
        queue.remove(handle)
        METRICS.inc("legacy_requests_drained")
    log.warning(
        "legacy agent-requests drained%s: %d moved, %d reported not called, %d left",
        " (dry run)" if dry_run else "",
        len(out.moved),
        len(out.not_called),
        len(out.left),
    )
    return out


class StorageLegacyQueue:
    """``agent-requests`` as a Storage queue (``AGENT_TRANSPORT=storage``)."""

    def __init__(self, client: Any, batch: int = 32):
        self._client = client
        self._batch = batch

    def messages(self, *, peek: bool) -> Iterator[tuple[bytes, Any]]:
        if peek:
            for message in self._client.peek_messages(max_messages=self._batch):
                yield _bytes(message.content), None
            return
        while True:
            batch = list(
                self._client.receive_messages(
                    messages_per_page=self._batch, max_messages=self._batch, visibility_timeout=60
                )
            )
            if not batch:
                return
            for message in batch:
                yield _bytes(message.content), message

    def remove(self, handle: Any) -> None:
        self._client.delete_message(handle)

    def leave(self, handle: Any) -> None:
        """Visible again when its lease ends (a minute): the next drain lists it again."""


class ServiceBusLegacyQueue:
    """``agent-requests`` as a Service Bus queue (``AGENT_TRANSPORT=servicebus``)."""

    def __init__(self, client: Any, queue: str, batch: int = 32):
        self._client = client
        self._queue = queue
        self._batch = batch

    def messages(self, *, peek: bool) -> Iterator[tuple[bytes, Any]]:
        with self._client.get_queue_receiver(self._queue, max_wait_time=1) as receiver:
            self._receiver = receiver
            if peek:
                for message in receiver.peek_messages(max_message_count=self._batch):
                    yield b"".join(message.body), None
                return
            while True:
                batch = receiver.receive_messages(max_message_count=self._batch, max_wait_time=1)
                if not batch:
                    return
                for message in batch:
                    yield b"".join(message.body), message

    def remove(self, handle: Any) -> None:
        self._receiver.complete_message(handle)

    def leave(self, handle: Any) -> None:
        """Its lock lapses after the drain (abandoning it would hand it straight back to
        this loop): the next drain lists it again."""


def _bytes(content: Any) -> bytes:
    if isinstance(content, bytes):
        return content
    return str(content).encode("utf-8")
