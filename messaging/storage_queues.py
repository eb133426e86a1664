"""Storage queues: send text as it is (no base64: host.json sets messageEncoding none)."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import OrderedDict
from datetime import datetime
from typing import TYPE_CHECKING

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError

from core.errors import QueueMissing, StorageUnavailable
from core.messages import AgentReply, AgentRequest
from core.names import Names
from core.ports import Clock
from messaging import bound
from observability.logs import get_logger

if TYPE_CHECKING:
    from azure.storage.queue import QueueClient, QueueServiceClient

log = get_logger(__name__)

MAX_DELAY_SECONDS = 7 * 24 * 3600  # the service's limit for an initial visibility delay
#: Replies live long past their step's deadline: a late success still completes the step.
REPLY_TTL_SECONDS = 3600
#: Requests live this long past their step's deadline, so that one read late (the agents
#: were down or behind) is still answered: "not called, too late" is a report that says
#: the attempt applied nothing (docs/contracts.md §3.11, "a request never sent is no
#: try"). Expired unread, it would leave the attempt with no report: may have applied.
REQUEST_LATE_SECONDS = 3600


#: Per-queue clients kept (least recently used dropped first): every distinct ``replyTo``
#: is a queue, so an unbounded cache would grow with the apps' queue names.
MAX_CACHED_CLIENTS = 256
#: How long a queue seen to exist is taken to exist without asking again.
EXISTS_SECONDS = 300.0


class StorageQueues:
    """The Storage queues of one account. ``bindable``: the account of the app's output
    bindings (``AzureWebJobsStorage``), so a message due now for a queue the running
    invocation is bound to goes through its output binding (``messaging.bound``)."""

    def __init__(
        self,
        service: QueueServiceClient,
        *,
        max_clients: int = MAX_CACHED_CLIENTS,
        bindable: bool = False,
    ):
        if max_clients < 1:
            raise ValueError("max_clients must be at least 1")
        self._service = service
        self._bindable = bindable
        self._max_clients = max_clients
        self._clients: OrderedDict[str, QueueClient] = OrderedDict()
        #: queues seen to exist, and when (``time.monotonic``)
        self._existing: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def client(self, queue: str) -> QueueClient:
        with self._lock:
            client = self._clients.get(queue)
            if client is None:
                # Clients share the service client's transport: a dropped one needs no close.
                client = self._service.get_queue_client(queue)
                self._clients[queue] = client
                if len(self._clients) > self._max_clients:
                    self._clients.popitem(last=False)
            else:
                self._clients.move_to_end(queue)
            return client

    def ensure(self, *queues: str) -> None:
        for queue in queues:
            with contextlib.suppress(ResourceExistsError):
                self.client(queue).create_queue()

    def send(
        self,
        queue: str,
        body: str,
        *,
        delay_seconds: float = 0,
        ttl_seconds: int | None = None,
        create: bool = True,
    ) -> None:
        delay = min(math.ceil(delay_seconds), MAX_DELAY_SECONDS) if delay_seconds > 0 else None
        if delay is None and self._bindable and bound.offer(queue, body):
            return  # the host sends it when the invocation returns (messaging.bound)
        client = self.client(queue)
        try:
            try:
                client.send_message(body, visibility_timeout=delay, time_to_live=ttl_seconds)
            except ResourceNotFoundError:
                if not create:  # an order's replyTo: never created by the app
                    self._forget(queue)
                    raise QueueMissing(f"queue {queue} does not exist") from None
                # First message to one of the app's queues on a fresh account.
                with contextlib.suppress(ResourceExistsError):
                    client.create_queue()
                client.send_message(body, visibility_timeout=delay, time_to_live=ttl_seconds)
        except AzureError as exc:
            raise StorageUnavailable(f"could not send to queue {queue}: {exc}") from exc

    def exists(self, queue: str) -> bool:
        """Whether ``queue`` exists; a yes is remembered for ``EXISTS_SECONDS`` (a no is
        asked again: the queue may be created meanwhile)."""
        now = time.monotonic()
        with self._lock:
            seen = self._existing.get(queue)
            if seen is not None and now - seen < EXISTS_SECONDS:
                return True
        try:
            self.client(queue).get_queue_properties()
        except ResourceNotFoundError:
            self._forget(queue)
            return False
        except AzureError as exc:
            raise StorageUnavailable(f"could not tell whether queue {queue} exists: {exc}") from exc
        with self._lock:
            self._existing[queue] = now
            self._existing.move_to_end(queue)
            while len(self._existing) > self._max_clients:
                self._existing.popitem(last=False)
        return True

    def _forget(self, queue: str) -> None:
        with self._lock:
            self._existing.pop(queue, None)


def seconds_left(deadline: datetime, now: datetime) -> int:
    """Whole seconds before ``deadline``, rounded up; 0 when it has passed."""
    left = (deadline - now).total_seconds()
    return math.ceil(left) if left > 0 else 0


class StorageQueueTransport:
    """Agent requests and replies on Storage queues (``AGENT_TRANSPORT=storage``).

    The same JSON bodies as on Service Bus. A request lives an hour past its step's
    deadline (``REQUEST_LATE_SECONDS``; one that leaves through an output binding, the
    queue's default seven days: ``messaging.bound``): the agent does not call after the
    deadline, but answers "not called", which tells the step the attempt applied nothing.
    """

    def __init__(self, queues: StorageQueues, names: Names, clock: Clock):
        self._queues = queues
        self._names = names
        self._clock = clock

    def send_request(self, request: AgentRequest) -> bool:
        ttl = seconds_left(request.complete_by, self._clock())
        if ttl == 0:
            log.warning("deadline passed before the request was sent; not sending")
            return False
        self._queues.send(
            self._names.agent_queue(request.agent),
            request.encode(),
            ttl_seconds=ttl + REQUEST_LATE_SECONDS,
        )
        return True

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        # Not bounded by the deadline: a late success is evidence (docs/contracts.md §3.11), and a
        # late report corrects what the supervisor assumed.
        self._queues.send(
            reply_to or self._names.agent_replies, reply.encode(), ttl_seconds=REPLY_TTL_SECONDS
        )
        return True
