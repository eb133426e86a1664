"""Storage queue triggers: poll, lease, invoke, then delete, retry or poison, as the host's
``QueueListener`` (Microsoft.Azure.WebJobs.Extensions.Storage.Queues) does.

A receive with messages is followed by the next at once, an empty one by :class:`PollingBackOff`;
only what this host adds to a queue ends a wait early (:class:`EnqueueWatcher`). Success
deletes; failure at ``maxDequeueCount`` moves it to ``<queue>-poison``, a lesser one makes it
visible after ``visibilityTimeout``. Unlike the host (10 minutes), devhost leases a message
for 30 s at most, renewed every 10 s: a killed process's message is back within 30 s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker, Listener, start_thread
from devhost.settings import LeaseOptions, QueueOptions
from hostrun.shapes import QueueMessage
from messaging.storage_queues import StorageQueues

POISON_SUFFIX = "-poison"
MIN_POLL_SECONDS = 0.1  # the host's QueuePollingIntervals.Minimum, also the back-off's step
RANDOMIZATION = 0.2  # the host's RandomizationFactor: each step 0.8 to 1.2 times
STOP_CHECK_SECONDS = 1.0  # a back-off's longest wait before it looks at the stop event


class PollingBackOff:
    """The wait after an empty receive (WebJobs' ``RandomizedExponentialBackoffStrategy``):
    100 ms if a message came since the last wait, else 100 ms more each time times 1, 2, 4
    ... (each 0.8-1.2 times that): about 0.1, 0.2, 0.3, 0.5, 0.9, 1.7 s, up to the maximum."""

    def __init__(self, maximum: float, spread: Callable[[float, float], float] = random.uniform):
        self._maximum, self._spread = max(MIN_POLL_SECONDS, maximum), spread
        self._current, self._exponent = 0.0, 0

    def next_delay(self, found: bool) -> float:
        if found:
            self._current, self._exponent = MIN_POLL_SECONDS, 1
        elif self._current != self._maximum:
            delay = MIN_POLL_SECONDS
            if self._exponent:
                factor = self._spread(1 - RANDOMIZATION, 1 + RANDOMIZATION)
                delay *= 1 + factor * 2 ** (self._exponent - 1)
            self._current = min(delay, self._maximum)
            self._exponent += delay < self._maximum
        return self._current


class LeaseLost(Exception):
    """The pop receipt no longer holds the message (another has it, or it is gone)."""


@contextlib.contextmanager
def _lease_errors(message_id: str) -> Iterator[None]:
    try:
        yield
    except HttpResponseError as error:
        if isinstance(error, ResourceNotFoundError) or error.status_code == 400:
            raise LeaseLost(f"message {message_id}: {error}") from error
        raise


class StorageQueue:
    """The queue operations a listener uses, over the app's :class:`StorageQueues`."""

    def __init__(self, queues: StorageQueues, name: str) -> None:
        self._queues, self.name, self._client = queues, name, queues.client(name)

    def create_if_missing(self) -> None:
        self._queues.ensure(self.name)

    def receive(self, count: int, visibility_seconds: int) -> list[Any]:
        # One request: only the first page (the pager would ask again for the rest).
        pages = self._client.receive_messages(
            messages_per_page=count, max_messages=count, visibility_timeout=visibility_seconds
        ).by_page()
        return list(next(pages, []))

    def delete(self, message_id: str, pop_receipt: str) -> None:
        with _lease_errors(message_id):
            self._client.delete_message(message_id, pop_receipt)

    def set_visibility(self, message_id: str, pop_receipt: str, seconds: float) -> str:
        with _lease_errors(message_id):
            updated = self._client.update_message(
                message_id, pop_receipt=pop_receipt, visibility_timeout=math.ceil(seconds)
            )
        return str(updated.pop_receipt)

    def send(self, content: str) -> None:
        self._queues.send(self.name, content)  # creates the queue if it is missing

    @property
    def address(self) -> tuple[str, str]:
        """(account, queue): what a send elsewhere in the process is matched on."""
        return (str(getattr(self._client, "account_name", "")), self.name)


class EnqueueWatcher:
    """Wakes a queue's listeners when this host adds a message to it (the host's
    ``SharedQueueWatcher``): an output binding (``DevHost.deliver``) or a move to poison.
    What the app sends with the Storage SDK wakes nobody, as in Azure."""

    def __init__(self) -> None:
        self._listeners: dict[tuple[str, str], list[QueueListener]] = {}

    def register(self, listener: QueueListener) -> None:
        self._listeners.setdefault(listener.queue.address, []).append(listener)

    def notify(self, account: str, queue: str) -> None:
        for listener in self._listeners.get((account, queue), ()):
            listener.wake()


@dataclass(eq=False)  # identity: the same message may be held twice after a lost lease
class Lease:
    message_id: str
    pop_receipt: str
    renewed_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    settled: bool = False


class QueueListener(Listener):
    """Runs one queue-triggered function: a poll thread, a lease renewer and a worker pool.
    ``watcher`` is told when a message moves to the poison queue."""

    def __init__(
        self,
        spec: FunctionSpec,
        queue: StorageQueue,
        poison: StorageQueue,
        options: QueueOptions,
        lease: LeaseOptions,
        invoker: Invoker,
        clock: Callable[[], float] = time.monotonic,
        watcher: EnqueueWatcher | None = None,
    ) -> None:
        super().__init__(spec, invoker, options.max_concurrency)
        self.queue, self.poison, self.source, self._watcher = queue, poison, queue.name, watcher
        self.options, self.lease_options, self._clock = options, lease, clock
        self._leases: set[Lease] = set()
        self._receiving = False  # between a receive and the dispatch of what it returned
        self._ready = False  # the trigger queue exists (or we may not create it)
        self._changed = threading.Condition()
        self._nudged = threading.Event()  # this host added a message (or stops): poll now

    def describe(self) -> str:
        o, lease = self.options, self.lease_options.lease_seconds
        return (
            f"queue {self.queue.name!r} (poison {self.poison.name!r}; batchSize {o.batch_size}, "
            f"newBatchThreshold {o.new_batch_threshold}, maxDequeueCount {o.max_dequeue_count}, "
            f"visibilityTimeout {o.visibility_timeout:g} s, lease {lease} s)"
        )

    @property
    def in_flight(self) -> int:
        """Messages held and not yet settled (counting a receive under way as one)."""
        with self._changed:
            return len(self._leases) + int(self._receiving)

    def start(self, stop: threading.Event) -> None:
        start_thread(f"poll-{self.spec.name}", self.poll, stop)
        start_thread(f"renew-{self.spec.name}", self.renew_loop, stop)

    def poll(self, stop: threading.Event) -> None:
        """Receive until stopped: at once after a batch that had messages, else after the
        host's back-off (:class:`PollingBackOff`), which a failing receive takes too."""
        back_off = PollingBackOff(self.options.max_polling_interval)
        found_since_wait = False
        while self._wait_for_capacity(stop):
            try:
                found = self._poll_once(stop)
                self.report_receive()
            except Exception as error:  # noqa: BLE001 - keep polling through any storage error
                found = False  # and a deleted queue is created again
                self._ready = self._ready and not isinstance(error, ResourceNotFoundError)
                self.report_receive(error)
            finally:
                with self._changed:
                    self._receiving = False
            if not found:  # else the host polls again at once (below newBatchThreshold)
                self._back_off(stop, back_off.next_delay(found_since_wait))
            found_since_wait = found

    def _back_off(self, stop: threading.Event, seconds: float) -> bool:
        """Wait ``seconds``, or less if woken (True) or stopped."""
        end = time.monotonic() + seconds
        while not stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return False
            if self._nudged.wait(min(left, STOP_CHECK_SECONDS)):
                self._nudged.clear()
                return True
        return False

    def wake(self) -> None:
        """Poll now: this host added a message to the queue, or it stops."""
        self._nudged.set()

    def _poll_once(self, stop: threading.Event) -> bool:
        """One receive, and the dispatch of what it returned; True if there was something."""
        if not self._ready:  # create the trigger queue if missing, as the host does
            try:
                self.queue.create_if_missing()
            except HttpResponseError as error:
                if error.status_code != 403:  # no right to create queues: it may exist
                    raise
                self.warn("may not create queue %s; polling it anyway", self.queue.name)
            self._ready = True
        with self._changed:
            self._receiving = True
        messages = self.queue.receive(self.options.batch_size, self.lease_options.lease_seconds)
        for message in messages:
            self.dispatch(message, stop)
        return bool(messages)

    def _wait_for_capacity(self, stop: threading.Event) -> bool:
        with self._changed:
            while len(self._leases) > self.options.new_batch_threshold and not stop.is_set():
                self._changed.wait(0.5)
        return not stop.is_set()

    def dispatch(self, message: Any, stop: threading.Event | None = None) -> None:
        count = int(message.dequeue_count or 1)
        # The host's BeginProcessingMessage: past the limit already, so earlier holders died.
        if count > self.options.max_dequeue_count:
            why = f"was dequeued {count} times without finishing, so it does not run"
            poison = partial(self._move_to_poison, message, message.pop_receipt, why)
            self._guarded(message.id, poison)
        elif stop is not None and stop.is_set():
            # Shutting down: hand it straight back rather than leave it leased.
            back = partial(self.queue.set_visibility, message.id, message.pop_receipt, 0)
            self._guarded(message.id, back)
        else:
            lease = Lease(message.id, message.pop_receipt, self._clock())
            with self._changed:
                self._leases.add(lease)
            self._pool.submit(self.process, message, lease)

    def process(self, message: Any, lease: Lease) -> None:
        try:
            content, count = message.content, message.dequeue_count
            trigger = QueueMessage(
                id=message.id,
                body=content.encode("utf-8") if isinstance(content, str) else bytes(content or b""),
                dequeue_count=count,
                pop_receipt=message.pop_receipt,
                insertion_time=message.inserted_on,
                expiration_time=message.expires_on,
                next_visible_time=message.next_visible_on,
            )
            succeeded = self.invoke(trigger, f"message {message.id}, dequeue count {count}")
            self._guarded(message.id, lambda: self._settle(message, lease, succeeded))
        finally:
            with self._changed:
                self._leases.discard(lease)
                self._changed.notify_all()

    def _settle(self, message: Any, lease: Lease, succeeded: bool) -> None:
        with lease.lock:  # no renewal may swap the pop receipt under us
            lease.settled = True
            count = int(message.dequeue_count or 1)
            if succeeded:
                self.queue.delete(message.id, lease.pop_receipt)
            elif count >= self.options.max_dequeue_count:  # the host's CompleteProcessingMessage
                self._move_to_poison(message, lease.pop_receipt, f"failed {count} times")
            else:
                visibility = self.options.visibility_timeout
                self.queue.set_visibility(message.id, lease.pop_receipt, visibility)

    def _move_to_poison(self, message: Any, pop_receipt: str, why: str) -> None:
        why += f" (maxDequeueCount {self.options.max_dequeue_count})"
        self.warn("message %s %s; moving it to %s", message.id, why, self.poison.name)
        content = message.content
        self.poison.send(content if isinstance(content, str) else bytes(content).decode())
        if self._watcher is not None:  # the host's OnMessageAddedToPoisonQueue
            self._watcher.notify(*self.poison.address)
        self.queue.delete(message.id, pop_receipt)

    def _guarded(self, message_id: str, action: Callable[[], object]) -> None:
        try:
            action()
        except LeaseLost as error:
            what = "before settling it (%s); whoever holds it now decides its fate"
            self.warn(f"lost the lease on message %s {what}", message_id, error)
        except Exception:  # logged; the lease lapses and the message returns
            what = "cannot settle message %s; it returns when its lease lapses"
            self.log.exception(f"function %s: {what}", self.spec.name, message_id)

    def renew_loop(self, stop: threading.Event) -> None:
        tick = min(1.0, self.lease_options.renew_seconds / 4)
        # Keeps renewing during shutdown's grace period: running functions still hold leases.
        while not (stop.is_set() and not self.in_flight):
            self.renew_due()
            time.sleep(tick)

    def renew_due(self) -> None:
        """Extend every lease held longer than the renew interval (one pass)."""
        with self._changed:
            leases = list(self._leases)
        for lease in leases:
            if self._clock() - lease.renewed_at < self.lease_options.renew_seconds:
                continue
            with lease.lock:
                if lease.settled:
                    continue
                try:
                    lease.pop_receipt = self.queue.set_visibility(
                        lease.message_id, lease.pop_receipt, self.lease_options.lease_seconds
                    )
                    lease.renewed_at = self._clock()
                    self.warn("renewed message %s", lease.message_id, level=logging.DEBUG)
                except Exception as error:  # noqa: BLE001 - retried on the next pass
                    if lost := isinstance(error, LeaseLost):  # another has it: not at once
                        lease.renewed_at = self._clock()
                    what = "cannot renew" if lost else "will retry renewing"
                    self.warn("%s message %s: %s", what, lease.message_id, error)
