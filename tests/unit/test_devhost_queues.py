"""devhost queue triggers against a fake queue: settle, retry, poison, leases."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from devhost.app_loader import FunctionSpec
from devhost.queues import (
    MIN_POLL_SECONDS,
    EnqueueWatcher,
    LeaseLost,
    QueueListener,
    StorageQueue,
    next_back_off,
)
from devhost.settings import LeaseOptions, QueueOptions
from tests.support import direct_invoker


@dataclass
class Message:
    id: str
    content: str
    dequeue_count: int = 1
    pop_receipt: str = "pop-0"
    inserted_on: Any = None
    expires_on: Any = None
    next_visible_on: Any = None


@dataclass
class FakeQueue(StorageQueue):
    """A StorageQueue with its storage replaced by lists (its methods are checked against
    the real ones)."""

    name: str
    waiting: list[Message] = field(default_factory=list)
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    receipts: dict[str, str] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)

    def create_if_missing(self) -> None:
        self.calls.append(("create",))

    def receive(self, count: int, visibility_seconds: int) -> list[Any]:
        batch, self.waiting = self.waiting[:count], self.waiting[count:]
        for message in batch:
            self.receipts[message.id] = message.pop_receipt
        return batch

    def _check(self, message_id: str, pop_receipt: str) -> None:
        if self.receipts.get(message_id) != pop_receipt:
            raise LeaseLost(f"{message_id}: stale pop receipt {pop_receipt}")

    def delete(self, message_id: str, pop_receipt: str) -> None:
        self._check(message_id, pop_receipt)
        self.calls.append(("delete", message_id, pop_receipt))

    def set_visibility(self, message_id: str, pop_receipt: str, seconds: float) -> str:
        self._check(message_id, pop_receipt)
        new = f"{pop_receipt}+"
        self.receipts[message_id] = new
        self.calls.append(("visibility", message_id, seconds))
        return new

    def send(self, content: str) -> None:
        self.sent.append(content)

    @property
    def address(self) -> tuple[str, str]:
        return ("fake", self.name)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def listener(
    handler: Any, max_dequeue: int = 3, clock: Clock | None = None
) -> tuple[QueueListener, FakeQueue, FakeQueue]:
    spec = FunctionSpec("handle", "queueTrigger", {"name": "msg", "queueName": "q"}, handler)
    queue, poison = FakeQueue("q"), FakeQueue("q-poison")
    options = QueueOptions(4, 2, 1.0, 7.0, max_dequeue)
    built = QueueListener(
        spec,
        queue,
        poison,
        options,
        LeaseOptions(30, 10.0),
        direct_invoker(),
        clock=clock or Clock(),
    )
    return built, queue, poison


def recorder(into: list[Any]) -> Any:
    """A queue function (called with ``msg=``, as the worker does) that keeps what it gets."""

    def handle(msg: Any) -> None:
        into.append(msg)

    return handle


def run(built: QueueListener, message: Message) -> None:
    """Deliver one message as if just received, and wait until it is settled."""
    built.queue.receipts[message.id] = message.pop_receipt  # type: ignore[attr-defined]
    built.dispatch(message)
    built._pool.shutdown(wait=True)


def test_success_deletes_and_passes_the_message() -> None:
    seen: list[Any] = []
    built, queue, poison = listener(recorder(seen))
    run(built, Message("m1", "héllo {not base64}", dequeue_count=2))
    assert queue.calls == [("delete", "m1", "pop-0")]
    assert seen[0].get_body() == "héllo {not base64}".encode()  # as stored
    assert seen[0].id == "m1"
    assert seen[0].dequeue_count == 2
    assert poison.sent == []
    assert built.in_flight == 0


def fail(msg: Any) -> None:
    raise RuntimeError("fails")


def test_failure_below_the_limit_retries_after_visibility_timeout() -> None:
    built, queue, poison = listener(fail)
    run(built, Message("m1", "x", dequeue_count=2))
    assert queue.calls == [("visibility", "m1", 7.0)]
    assert poison.sent == []


def test_failure_at_the_limit_moves_the_original_text_to_poison() -> None:
    built, queue, poison = listener(fail)
    run(built, Message("m1", "original <text>", dequeue_count=3))
    assert poison.sent == ["original <text>"]
    assert queue.calls == [("delete", "m1", "pop-0")]


def test_a_message_at_the_limit_still_runs() -> None:
    ran: list[Any] = []
    built, queue, poison = listener(recorder(ran))
    run(built, Message("m1", "last chance", dequeue_count=3))
    assert [m.dequeue_count for m in ran] == [3]
    assert queue.calls == [("delete", "m1", "pop-0")]
    assert poison.sent == []


def test_a_message_past_the_limit_is_poisoned_without_running() -> None:
    ran: list[Any] = []
    built, queue, poison = listener(recorder(ran))
    run(built, Message("m1", "abandoned", dequeue_count=4))
    assert ran == []
    assert poison.sent == ["abandoned"]
    assert queue.calls == [("delete", "m1", "pop-0")]


def test_async_functions_run() -> None:
    seen: list[bytes] = []

    async def handler(msg: Any) -> None:
        seen.append(msg.get_body())

    built, queue, _ = listener(handler)
    run(built, Message("m1", "async"))
    assert seen == [b"async"]
    assert queue.calls == [("delete", "m1", "pop-0")]


def test_leases_are_renewed_and_the_new_pop_receipt_settles() -> None:
    clock = Clock()
    started, release = threading.Event(), threading.Event()

    def handler(msg: Any) -> None:
        started.set()
        release.wait(5)

    built, queue, _ = listener(handler, clock=clock)
    message = Message("m1", "slow")
    queue.receipts["m1"] = "pop-0"
    built.dispatch(message)
    assert started.wait(5)
    built.renew_due()
    assert queue.calls == []  # not due yet
    clock.now += 10
    built.renew_due()
    clock.now += 10
    built.renew_due()
    assert queue.calls == [("visibility", "m1", 30), ("visibility", "m1", 30)]
    release.set()
    built._pool.shutdown(wait=True)
    assert queue.calls[-1] == ("delete", "m1", "pop-0++")


def test_a_lost_lease_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    built, queue, _ = listener(lambda msg: None)
    queue.receipts["m1"] = "someone-else"
    built.dispatch(Message("m1", "x"))
    built._pool.shutdown(wait=True)
    assert "lost the lease" in caplog.text
    assert built.in_flight == 0


def test_polling_fetches_only_below_the_threshold() -> None:
    release = threading.Event()
    built, queue, _ = listener(lambda msg: release.wait(5))
    queue.waiting = [Message(f"m{i}", "x") for i in range(10)]
    stop = threading.Event()
    thread = threading.Thread(target=built.poll, args=(stop,), daemon=True)
    thread.start()
    try:
        # batchSize 4, newBatchThreshold 2: 4 running (> 2), so no second fetch yet.
        for _ in range(100):
            if built.in_flight == 4:
                break
            stop.wait(0.01)
        stop.wait(0.2)
        assert built.in_flight == 4
        assert len(queue.waiting) == 6
    finally:
        release.set()
        stop.set()
        thread.join(3)
        built._pool.shutdown(wait=True)


def test_a_wake_ends_the_back_off_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every back-off lasts 30 s here: only a wake can make the listener poll again sooner.
    monkeypatch.setattr("devhost.queues.MIN_POLL_SECONDS", 30.0)
    got: list[Any] = []
    built, queue, _ = listener(recorder(got))
    stop = threading.Event()
    thread = threading.Thread(target=built.poll, args=(stop,), daemon=True)
    thread.start()
    try:
        for _ in range(200):  # the first (empty) receive, then the long back-off
            if ("create",) in queue.calls and not built.in_flight:
                break
            stop.wait(0.01)
        stop.wait(0.1)
        queue.waiting = [Message("m-woken", "x")]
        built.wake()
        for _ in range(500):
            if got:
                break
            stop.wait(0.01)
        assert [m.id for m in got] == ["m-woken"]
    finally:
        stop.set()
        thread.join(3)
        built._pool.shutdown(wait=True)
    assert not thread.is_alive()  # the stop ends a back-off too


def test_a_send_from_this_process_wakes_the_listener_of_that_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from azure.storage.queue import QueueClient

    sent: list[str] = []
    monkeypatch.setattr(
        QueueClient, "send_message", lambda client, content, **kw: sent.append(content)
    )

    class Woken:
        def __init__(self, account: str, name: str) -> None:
            self.queue = type("Q", (), {"address": (account, name)})()
            self.wakes = 0

        def wake(self) -> None:
            self.wakes += 1

    watcher = EnqueueWatcher()
    mine, other_queue, other_account = Woken("acct", "q"), Woken("acct", "r"), Woken("else", "q")
    for woken in (mine, other_queue, other_account):
        watcher.register(woken)  # type: ignore[arg-type]
    client = QueueClient("https://acct.queue.core.windows.net", "q", credential="a2V5")
    watcher.install()
    try:
        client.send_message("hello")
        client.send_message("later", visibility_timeout=30)  # not visible yet: no wake
    finally:
        watcher.uninstall()
    assert sent == ["hello", "later"]
    assert (mine.wakes, other_queue.wakes, other_account.wakes) == (1, 0, 0)
    client.send_message("after")
    assert mine.wakes == 1  # uninstalled: the SDK's own method again


def test_the_back_off_stays_short_while_the_queue_has_traffic() -> None:
    waits, delay = [], MIN_POLL_SECONDS
    for _ in range(8):
        delay = next_back_off(delay, since_found=0.5, max_polling_interval=2.0)
        waits.append(delay)
    assert waits == [0.1] * 8  # a message came 0.5 s ago: busy
    waits, delay = [], MIN_POLL_SECONDS
    for _ in range(7):
        delay = next_back_off(delay, since_found=5.0, max_polling_interval=2.0)
        waits.append(delay)
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]  # idle: up to maxPollingInterval
    assert next_back_off(0.1, since_found=float("inf"), max_polling_interval=0.01) == 0.05
