"""devhost queue triggers against a fake queue: settle, retry, poison, leases."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from devhost.app_loader import FunctionSpec
from devhost.host import DevHost
from devhost.queues import (
    EnqueueWatcher,
    LeaseLost,
    PollingBackOff,
    QueueListener,
    StorageQueue,
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
    handler: Any,
    max_dequeue: int = 3,
    clock: Clock | None = None,
    watcher: EnqueueWatcher | None = None,
    max_polling: float = 1.0,
) -> tuple[QueueListener, FakeQueue, FakeQueue]:
    spec = FunctionSpec("handle", "queueTrigger", {"name": "msg", "queueName": "q"}, handler)
    queue, poison = FakeQueue("q"), FakeQueue("q-poison")
    options = QueueOptions(4, 2, max_polling, 7.0, max_dequeue)
    built = QueueListener(
        spec,
        queue,
        poison,
        options,
        LeaseOptions(30, 10.0),
        direct_invoker(),
        clock=clock or Clock(),
        watcher=watcher,
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
    assert seen[0].body == "héllo {not base64}".encode()  # as stored
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
        seen.append(msg.body)

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


def test_a_wake_ends_the_back_off_at_once() -> None:
    # maxPollingInterval 30 s: after the first empty receives, only a wake can make the
    # listener poll again within the test's time.
    got: list[Any] = []
    built, queue, _ = listener(recorder(got), max_polling=30.0)
    stop = threading.Event()
    thread = threading.Thread(target=built.poll, args=(stop,), daemon=True)
    thread.start()
    try:
        for _ in range(200):  # the first (empty) receive, then the back-off
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


def test_an_idle_listener_waits_once_per_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """At host.json's 0.5 s ceiling a back-off is one wait, not slices of it: an idle
    devhost's poll threads were its most sampled (bench.isolation). A stop still ends a
    longer back-off within STOP_CHECK_SECONDS, and DevHost.stop wakes every listener."""
    import devhost.queues as queues_module

    built, _, _ = listener(recorder([]), max_polling=0.5)
    now = [100.0]
    waits: list[float] = []

    class Nudge(threading.Event):  # never set: each wait runs its time out, on the fake clock
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(float(timeout or 0))
            now[0] += float(timeout or 0)
            return False

    monkeypatch.setattr(queues_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    built._nudged = Nudge()
    assert built._back_off(threading.Event(), 0.5) is False
    assert waits == [0.5]
    waits.clear()
    assert built._back_off(threading.Event(), 2.5) is False
    assert waits == [1.0, 1.0, 0.5]


class Woken:
    """A registered listener that counts its wakes."""

    def __init__(self, account: str, name: str) -> None:
        self.queue = type("Q", (), {"address": (account, name)})()
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


def test_the_watcher_wakes_only_the_listeners_of_that_queue() -> None:
    watcher = EnqueueWatcher()
    mine, other_queue, other_account = Woken("acct", "q"), Woken("acct", "r"), Woken("else", "q")
    for woken in (mine, other_queue, other_account):
        watcher.register(woken)  # type: ignore[arg-type]
    watcher.notify("acct", "q")
    assert (mine.wakes, other_queue.wakes, other_account.wakes) == (1, 0, 0)


def test_a_send_with_the_sdk_wakes_no_listener() -> None:
    """The host does not see what the app sends with the Storage SDK (only its own output
    bindings), so devhost leaves ``QueueClient.send_message`` as the SDK ships it."""
    from azure.storage.queue import QueueClient

    shipped = QueueClient.send_message
    devhost = DevHost(direct_invoker(), {})
    devhost.enqueued.register(Woken("acct", "q"))  # type: ignore[arg-type]
    devhost.start(threading.Event())
    try:
        assert QueueClient.send_message is shipped
    finally:
        devhost.stop(0)


class FakeService:
    """A QueueServiceClient for ``DevHost.deliver``: what was sent, per queue."""

    account_name = "acct"

    def __init__(self) -> None:
        self.sent: dict[str, list[str]] = {}
        self.made: list[str] = []  # the queue clients built, in order

    def get_queue_client(self, name: str) -> Any:
        self.made.append(name)
        sent = self.sent.setdefault(name, [])
        return type("Client", (), {"send_message": lambda _, text, **__: sent.append(text)})()


#: A queue-triggered function with one Storage queue output binding, to queue ``q``.
FORWARD = FunctionSpec(
    "forward",
    "queueTrigger",
    {"name": "msg", "queueName": "in"},
    lambda msg, out: None,
    outputs={"out": {"type": "queue", "queueName": "q", "connection": "AzureWebJobsStorage"}},
)


def test_an_output_binding_wakes_the_listener_of_its_queue() -> None:
    """The host's SharedQueueWatcher: a message its own output binding adds."""
    devhost = DevHost(direct_invoker(), {})
    service = FakeService()
    devhost.queue_services["AzureWebJobsStorage"] = service
    mine, other = Woken("acct", "q"), Woken("acct", "in")
    devhost.enqueued.register(mine)  # type: ignore[arg-type]
    devhost.enqueued.register(other)  # type: ignore[arg-type]
    devhost.deliver(FORWARD, {"out": ["a", "b"]})
    assert service.sent["q"] == ["a", "b"]
    assert (mine.wakes, other.wakes) == (2, 0)


def test_output_bindings_reuse_their_queue_client() -> None:
    """Some of the app's hops leave through output bindings, one invocation after another:
    the queue client (and its pipeline) is built once per queue, not once per delivery."""
    devhost = DevHost(direct_invoker(), {})
    service = FakeService()
    devhost.queue_services["AzureWebJobsStorage"] = service
    for n in range(3):
        devhost.deliver(FORWARD, {"out": [f"m{n}"]})
    assert service.sent["q"] == ["m0", "m1", "m2"]
    assert service.made == ["q"]


def test_a_message_moved_to_poison_wakes_the_poison_queues_listener() -> None:
    """The host's OnMessageAddedToPoisonQueue."""
    watcher = EnqueueWatcher()
    poison_listener, queue_listener = Woken("fake", "q-poison"), Woken("fake", "q")
    watcher.register(poison_listener)  # type: ignore[arg-type]
    watcher.register(queue_listener)  # type: ignore[arg-type]

    def fail(msg: Any) -> None:
        raise RuntimeError("always")

    built, _, poison = listener(fail, max_dequeue=1, watcher=watcher)
    run(built, Message("m-1", "body", dequeue_count=1))
    assert poison.sent == ["body"]
    assert (poison_listener.wakes, queue_listener.wakes) == (1, 0)


def fixed(factor: float) -> Any:
    return lambda low, high: factor


def test_the_back_off_is_the_hosts() -> None:
    """RandomizedExponentialBackoffStrategy(100 ms, maxPollingInterval): 100 ms, then 100 ms
    more times 1, 2, 4 ... (0.8-1.2 times each, at random), up to the maximum."""
    back_off = PollingBackOff(2.0, spread=fixed(1.0))
    waits = [round(back_off.next_delay(found=False), 3) for _ in range(8)]
    assert waits == [0.1, 0.2, 0.3, 0.5, 0.9, 1.7, 2.0, 2.0]
    assert back_off.next_delay(found=True) == 0.1  # a message came since the last wait
    assert round(back_off.next_delay(found=False), 3) == 0.2  # and it grows again
    low, high = PollingBackOff(2.0, spread=fixed(0.8)), PollingBackOff(2.0, spread=fixed(1.2))
    assert [round(low.next_delay(False), 3) for _ in range(3)] == [0.1, 0.18, 0.26]
    assert [round(high.next_delay(False), 3) for _ in range(3)] == [0.1, 0.22, 0.34]
    asked: list[tuple[float, float]] = []

    def spread(low: float, high: float) -> float:
        asked.append((low, high))
        return 1.0

    recorded = PollingBackOff(2.0, spread=spread)
    recorded.next_delay(False), recorded.next_delay(False)
    assert asked == [(0.8, 1.2)]  # the first wait is the minimum, unspread
    assert PollingBackOff(0.1).next_delay(False) == 0.1  # maxPollingInterval's minimum


def test_a_batch_with_messages_is_followed_by_a_receive_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's QueueListener: no wait after a batch that had messages; after an empty
    one, the back-off, starting at 100 ms if a message came since the last wait."""
    got: list[Any] = []
    built, queue, _ = listener(recorder(got), max_polling=2.0)
    queue.waiting = [Message(f"m{i}", "x") for i in range(6)]  # batchSize 4: 4, 2, then 0
    stop = threading.Event()
    receives: list[int] = []
    waits: list[float] = []
    receive = queue.receive

    def counted(count: int, visibility_seconds: int) -> list[Any]:
        batch = receive(count, visibility_seconds)
        receives.append(len(batch))
        return batch

    def back_off(_: threading.Event, seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) == 3:
            stop.set()
        return False  # no time passes: only the order of receives and waits is checked

    monkeypatch.setattr(queue, "receive", counted)
    monkeypatch.setattr(built, "_back_off", back_off)
    built.poll(stop)
    built._pool.shutdown(wait=True)
    assert receives == [4, 2, 0, 0, 0]
    assert waits[0] == 0.1 and 0.18 <= waits[1] <= 0.22 and 0.26 <= waits[2] <= 0.34
    assert len(got) == 6
