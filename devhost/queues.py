"""Storage queue triggers: poll, lease, invoke, then delete, retry or poison.

What the Functions host does (Microsoft.Azure.WebJobs.Extensions.Storage.Queues), and
devhost with it:

- Fetch ``batchSize`` messages; fetch again only when at most ``newBatchThreshold`` are
  still running (so at most batchSize + newBatchThreshold run at once, per function and
  process). An empty queue backs the polling off exponentially, 50 ms up to
  ``maxPollingInterval``.
- Success deletes the message. Failure with ``dequeue_count >= maxDequeueCount`` copies the
  original text to ``<queue>-poison`` and deletes it; a lesser failure makes the message
  visible again after ``visibilityTimeout``. A message that arrives with its dequeue count
  already above ``maxDequeueCount`` (its earlier holders died mid-run) goes to poison
  without running.

Where devhost differs: the host leases a message for 10 minutes and renews it; devhost
leases it for at most 30 s and renews it every 10 s while the function runs (contract 3.9),
so a message held by a killed process is back within 30 s. With ``messageEncoding:
base64`` a message that is not base64 counts as a failed invocation (retried, then
poisoned); the host's extension 5.x moves it to poison at once.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.functions.queue import QueueMessage as FunctionsQueueMessage

from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker
from devhost.settings import MIN_POLL_SECONDS, LeaseOptions, QueueOptions

log = logging.getLogger("devhost.queues")
POISON_SUFFIX = "-poison"


class LeaseLost(Exception):
    """The pop receipt no longer holds the message (it expired and someone else has it, or
    the message or queue is gone)."""


class ReceivedMessage(Protocol):
    id: str
    content: Any
    dequeue_count: int | None
    pop_receipt: str | None
    inserted_on: Any
    expires_on: Any
    next_visible_on: Any


class QueuePort(Protocol):
    """The queue operations the listener needs (the SDK adapter below, or a fake in tests)."""

    name: str

    def create_if_missing(self) -> None: ...
    def receive(self, count: int, visibility_seconds: int) -> list[Any]: ...
    def delete(self, message_id: str, pop_receipt: str) -> None: ...
    def set_visibility(self, message_id: str, pop_receipt: str, seconds: float) -> str: ...
    def send(self, content: str) -> None: ...


class StorageQueue:
    """:class:`QueuePort` over an ``azure.storage.queue.QueueClient`` (no encode policies)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.name: str = client.queue_name

    def create_if_missing(self) -> None:
        with contextlib.suppress(ResourceExistsError):
            self._client.create_queue()

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
        try:
            self._client.send_message(content)
        except ResourceNotFoundError:
            self.create_if_missing()
            self._client.send_message(content)


class _lease_errors:
    def __init__(self, message_id: str) -> None:
        self._message_id = message_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        if isinstance(error, ResourceNotFoundError) or (
            isinstance(error, HttpResponseError) and error.status_code == 400
        ):
            raise LeaseLost(f"message {self._message_id}: {error}") from error


def decode_body(content: Any, encoding: str) -> bytes:
    """The message body as the function gets it; ``ValueError`` if base64 is expected but absent.

    Decoded here, not by the SDK: its TextBase64DecodePolicy fails on a bad message after the
    message was dequeued (see FACTS.md).
    """
    raw = content.encode("utf-8") if isinstance(content, str) else bytes(content or b"")
    if encoding == "none":
        return raw
    try:
        return base64.b64decode(raw, validate=True)
    except binascii.Error as error:
        raise ValueError(
            f"the message is not base64 ({error}) but messageEncoding is base64"
        ) from error


def poison_on_receive(dequeue_count: int, max_dequeue_count: int) -> bool:
    """The host's BeginProcessingMessage: past the limit already, so earlier holders died."""
    return dequeue_count > max_dequeue_count


def poison_after_failure(dequeue_count: int, max_dequeue_count: int) -> bool:
    """The host's CompleteProcessingMessage for a failure: poison at the limit, else retry."""
    return dequeue_count >= max_dequeue_count


def functions_message(message: Any, body: bytes) -> FunctionsQueueMessage:
    build: Any = FunctionsQueueMessage  # its __init__ is untyped
    result: FunctionsQueueMessage = build(
        id=message.id,
        body=body,
        dequeue_count=message.dequeue_count,
        expiration_time=message.expires_on,
        insertion_time=message.inserted_on,
        time_next_visible=message.next_visible_on,
        pop_receipt=message.pop_receipt,
    )
    return result


@dataclass(eq=False)  # identity: the same message may be held twice after a lost lease
class Lease:
    message_id: str
    pop_receipt: str
    renewed_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    settled: bool = False


class QueueListener:
    """Runs one queue-triggered function: a poll thread, a lease renewer and a worker pool."""

    def __init__(
        self,
        spec: FunctionSpec,
        queue: QueuePort,
        poison: QueuePort,
        options: QueueOptions,
        lease: LeaseOptions,
        invoker: Invoker,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.spec = spec
        self.queue = queue
        self.poison = poison
        self.options = options
        self.lease_options = lease
        self.invoker = invoker
        self._clock = clock
        self._leases: set[Lease] = set()
        self._receiving = False  # between a receive and the dispatch of what it returned
        self._ready = False  # the trigger queue exists (or we may not create it)
        self._changed = threading.Condition()
        self._pool = ThreadPoolExecutor(
            max_workers=options.max_concurrency, thread_name_prefix=f"devhost-{spec.name}"
        )

    def describe(self) -> str:
        o = self.options
        return (
            f"queue {self.queue.name!r} (poison {self.poison.name!r}; batchSize {o.batch_size}, "
            f"newBatchThreshold {o.new_batch_threshold}, maxDequeueCount {o.max_dequeue_count}, "
            f"visibilityTimeout {o.visibility_timeout:g} s, encoding {o.message_encoding}, "
            f"lease {self.lease_options.lease_seconds} s)"
        )

    @property
    def in_flight(self) -> int:
        """Messages held and not yet settled (counting a receive under way as one)."""
        with self._changed:
            return len(self._leases) + int(self._receiving)

    def start(self, stop: threading.Event) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self.poll, args=(stop,), name=f"poll-{self.spec.name}"),
            threading.Thread(target=self.renew_loop, args=(stop,), name=f"renew-{self.spec.name}"),
        ]
        for thread in threads:
            thread.daemon = True  # a broken storage endpoint must not hold the process open
            thread.start()
        return threads

    # --- polling ---------------------------------------------------------------------------

    def poll(self, stop: threading.Event) -> None:
        delay = MIN_POLL_SECONDS
        failing = False
        while self._wait_for_capacity(stop):
            try:
                found = self._poll_once(stop)
            except Exception as error:  # noqa: BLE001 - keep polling through any storage error
                if isinstance(error, ResourceNotFoundError):
                    self._ready = False  # the queue was deleted: create it again
                (log.debug if failing else log.warning)(
                    "function %s: cannot read queue %s: %s", self.spec.name, self.queue.name, error
                )
                failing, found = True, False
            else:
                if failing:
                    log.info("function %s: queue %s answers again", self.spec.name, self.queue.name)
                failing = False
            finally:
                with self._changed:
                    self._receiving = False
            if found:
                delay = MIN_POLL_SECONDS
            else:
                stop.wait(delay)
                delay = min(delay * 2, self.options.max_polling_interval)

    def _poll_once(self, stop: threading.Event) -> bool:
        """One receive, and the dispatch of what it returned; True if there was something."""
        if not self._ready:
            self._ready = self._ensure_queue()
        with self._changed:
            self._receiving = True
        messages = self.queue.receive(self.options.batch_size, self.lease_options.lease_seconds)
        for message in messages:
            self.dispatch(message, stop)
        return bool(messages)

    def _ensure_queue(self) -> bool:
        """Create the trigger queue if missing, as the host does. Without the right to create
        queues (403) poll anyway: the queue may exist."""
        try:
            self.queue.create_if_missing()
        except HttpResponseError as error:
            if error.status_code != 403:
                raise
            log.warning(
                "function %s: not allowed to create queue %s; polling it anyway",
                self.spec.name,
                self.queue.name,
            )
        return True

    def _wait_for_capacity(self, stop: threading.Event) -> bool:
        with self._changed:
            while len(self._leases) > self.options.new_batch_threshold and not stop.is_set():
                self._changed.wait(0.5)
        return not stop.is_set()

    def dispatch(self, message: Any, stop: threading.Event | None = None) -> None:
        count = int(message.dequeue_count or 1)
        if poison_on_receive(count, self.options.max_dequeue_count):
            log.warning(
                "function %s: message %s was dequeued %d times (maxDequeueCount %d) without "
                "finishing; moving it to %s without running it",
                self.spec.name,
                message.id,
                count,
                self.options.max_dequeue_count,
                self.poison.name,
            )
            self._guarded(message.id, lambda: self._move_to_poison(message, message.pop_receipt))
            return
        if stop is not None and stop.is_set():
            # Shutting down: hand it straight back rather than leave it leased.
            self._guarded(
                message.id,
                lambda: self.queue.set_visibility(message.id, message.pop_receipt, 0),
            )
            return
        lease = Lease(message.id, message.pop_receipt, self._clock())
        with self._changed:
            self._leases.add(lease)
        self._pool.submit(self.process, message, lease)

    # --- one message -----------------------------------------------------------------------

    def process(self, message: Any, lease: Lease) -> None:
        try:
            succeeded = self._run(message)
            self._guarded(message.id, lambda: self._settle(message, lease, succeeded))
        finally:
            with self._changed:
                self._leases.discard(lease)
                self._changed.notify_all()

    def _run(self, message: Any) -> bool:
        try:
            body = decode_body(message.content, self.options.message_encoding)
        except ValueError as error:
            log.error("function %s failed: message %s: %s", self.spec.name, message.id, error)
            return False
        detail = f"message {message.id}, dequeue count {message.dequeue_count}"
        outcome = self.invoker.call(self.spec, functions_message(message, body), detail=detail)
        return outcome.succeeded

    def _settle(self, message: Any, lease: Lease, succeeded: bool) -> None:
        with lease.lock:  # no renewal may swap the pop receipt under us
            lease.settled = True
            count = int(message.dequeue_count or 1)
            if succeeded:
                self.queue.delete(message.id, lease.pop_receipt)
            elif poison_after_failure(count, self.options.max_dequeue_count):
                log.warning(
                    "function %s: message %s failed %d times (maxDequeueCount %d); moving it to %s",
                    self.spec.name,
                    message.id,
                    count,
                    self.options.max_dequeue_count,
                    self.poison.name,
                )
                self._move_to_poison(message, lease.pop_receipt)
            else:
                self.queue.set_visibility(
                    message.id, lease.pop_receipt, self.options.visibility_timeout
                )

    def _move_to_poison(self, message: Any, pop_receipt: str) -> None:
        content = message.content
        self.poison.send(content if isinstance(content, str) else bytes(content).decode())
        self.queue.delete(message.id, pop_receipt)

    def _guarded(self, message_id: str, action: Callable[[], object]) -> None:
        try:
            action()
        except LeaseLost as error:
            log.warning(
                "function %s: lost the lease on message %s before settling it (%s); "
                "whoever holds it now decides its fate",
                self.spec.name,
                message_id,
                error,
            )
        except Exception:  # logged; the lease lapses and the message returns
            log.exception(
                "function %s: cannot settle message %s; it returns when its lease lapses",
                self.spec.name,
                message_id,
            )

    # --- lease renewal ---------------------------------------------------------------------

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
                    log.debug("function %s: renewed message %s", self.spec.name, lease.message_id)
                except LeaseLost as error:
                    lease.renewed_at = self._clock()
                    log.warning(
                        "function %s: cannot renew message %s: %s",
                        self.spec.name,
                        lease.message_id,
                        error,
                    )
                except Exception as error:  # noqa: BLE001 - retried on the next pass
                    log.warning(
                        "function %s: renewing message %s failed, will retry: %s",
                        self.spec.name,
                        lease.message_id,
                        error,
                    )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)
