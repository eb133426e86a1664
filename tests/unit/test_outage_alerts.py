"""An outage is told once (docs/contracts.md §3.14), decided on the in-memory store and a
fake clock (no test sleeps): two instances — two scheduler contexts, each with its own
agent, breaker, outage watch and view of the controls, sharing one store and one alert
queue — ride out a remote that fails every call for eight minutes. Exactly one
``outage`` alert and one ``recovered`` alert go out, no order gets one, every order
completes, and the shared record costs a bounded number of writes whatever the traffic.
Then the crash windows of the send: a sender that dies before its send (the timer sends
it, once) and one that dies after it (sent again: at least once), and two instances that
decide the alert at the same moment (one wins the write, one alert).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from agents.agent import AgentWorker
from agents.limits import Slot
from agents.outage_watch import OutageWatch
from agents.outcomes import Try
from agents.pacing import RemotePolicy
from agents.runner import AttemptRunner
from bootstrap import AppContext, bootstrap
from core.errors import ConcurrencyConflict, StorageUnavailable
from core.messages import AgentRequest
from core.names import Names
from core.outages import Outage, OutagePolicy
from core.outcome import Applied
from core.states import OrderStatus, StepState
from core.workflows import AGENTS
from messaging.outages import OutageBook
from stores.memory import InMemoryStateStore
from tests.support import settings_from
from tests.unit.test_remote_client import T0, FakeClock, MaxRng
from tests.unit.test_services_in_memory import RecordingKeeper, RecordingQueues, RecordingTransport

AGENT = "orders"
OK = Try(Applied.YES, False, result={"ok": True})
DOWN = Try(Applied.NO, True, "process: HTTP 503 Service Unavailable", status=503)


class CountingStore(InMemoryStateStore):
    """The in-memory store, counting the outage records' reads and writes."""

    def __init__(self) -> None:
        super().__init__()
        self.outage_reads = 0
        self.outage_writes = 0

    def read_outages(self) -> dict[str, Outage]:
        self.outage_reads += 1
        return super().read_outages()

    def write_outage(self, outage: Outage) -> Outage:
        self.outage_writes += 1
        return super().write_outage(outage)


@dataclass
class Remote:
    """The agent's remote: every call fails until ``down_until``, then every call answers."""

    clock: FakeClock
    down_until: datetime
    takes: float = 0.2
    calls: list[datetime] = field(default_factory=list)

    def endpoint(self, path: str) -> str:
        return f"remote:{path}"

    async def run(self, request: AgentRequest, timeout: float, slot: Slot | None) -> Try:
        self.calls.append(self.clock.now)
        self.clock.advance(min(self.takes, timeout))
        return DOWN if self.clock.now < self.down_until else OK

    def close(self) -> None:
        pass


@dataclass
class Instance:
    ctx: AppContext
    worker: AgentWorker


@dataclass
class World:
    store: CountingStore
    clock: FakeClock
    queues: RecordingQueues
    transport: RecordingTransport
    remote: Remote
    instances: list[Instance]

    def alerts(self) -> list[dict[str, Any]]:
        return self.queues.on(Names().operator_alerts)

    def submit(self, order_id: str) -> None:
        body = json.dumps({"orderId": order_id}).encode()
        self.instances[0].ctx.scheduler.submit(body)

    def run(self, until: float, orders: list[str]) -> None:
        """Until T0 + ``until``: requests go to the instances in turn (the queue's
        competing consumers), due steps are dispatched, the supervisor's timers run every
        10 s and the dashboard's (with its stuck check) every minute."""
        handled, turn, next_timer, next_dashboard = 0, 0, self.clock.now, self.clock.now
        while self.clock.now < T0 + timedelta(seconds=until):
            while handled < len(self.transport.requests):
                request = self.transport.requests[handled]
                handled += 1
                turn += 1
                instance = self.instances[turn % len(self.instances)]
                before = len(self.transport.replies)
                asyncio.run(instance.worker.handle(request))
                for reply in self.transport.replies[before:]:
                    instance.ctx.scheduler.apply_reply(reply)
            for n, order_id in enumerate(orders):
                order = self.store.load(order_id)
                assert order is not None
                due = [
                    s
                    for s in order.active_steps()
                    if s.process_state is StepState.PENDING and s.not_before <= self.clock.now
                ]
                if due:
                    self.instances[n % len(self.instances)].ctx.scheduler.dispatch(order_id)
            if self.clock.now >= next_timer:
                for instance in self.instances:
                    instance.ctx.supervisor.run()
                    instance.ctx.outages.finish()
                next_timer = self.clock.now + timedelta(seconds=10)
            if self.clock.now >= next_dashboard:  # the stuck check alerts no waiting order
                self.instances[0].ctx.dashboard.run()
                next_dashboard = self.clock.now + timedelta(seconds=60)
            self.clock.advance(0.5)


def instance(
    store: CountingStore,
    clock: FakeClock,
    queues: RecordingQueues,
    transport: RecordingTransport,
    remote: Remote,
    name: str,
) -> Instance:
    settings = settings_from(
        {
            "AzureWebJobsStorage": "UseDevelopmentStorage=true",  # never reached
            "AGENT_TRANSPORT": "storage",
            "STEP_TIMEOUT_SECONDS": "30",
            "MAX_FAILURE_COUNT": "3",
        }
    )
    ctx = bootstrap(
        replace(settings, instance_id=name),
        names=Names(),
        clock=clock,
        store=store,
        queues=queues,
        transport=transport,
        kept=RecordingKeeper(),
    )
    spec = AGENTS[AGENT]
    controls = ctx.agent_controls
    watch = OutageWatch(
        AGENT, ctx.outages, lambda: controls.outage(AGENT), ctx.outage_policy, lambda job: job()
    )
    runner = AttemptRunner(
        remote,
        RemotePolicy(),
        clock=clock,
        sleep=clock.asleep,
        rng=MaxRng(),
        concurrency=32,
        runtime=lambda: controls.runtime(spec),
        watch=watch,
    )
    return Instance(ctx, AgentWorker(runner, transport, clock, sleep=clock.sleep))


def world(down_for: float) -> World:
    store, clock = CountingStore(), FakeClock(T0)
    queues, transport = RecordingQueues(), RecordingTransport()
    remote = Remote(clock, T0 + timedelta(seconds=down_for))
    instances = [instance(store, clock, queues, transport, remote, f"i-{n}") for n in (1, 2)]
    return World(store, clock, queues, transport, remote, instances)


ORDERS = [f"o-{n}" for n in range(8)]


@pytest.fixture(scope="module")
def outage() -> World:
    """Eight minutes of a remote that fails every call, eight orders waiting, two
    instances; then it answers again. (Run once: the tests below read what happened.)"""
    w = world(down_for=480)
    for order_id in ORDERS:
        w.submit(order_id)
    w.run(until=720, orders=ORDERS)
    return w


def test_one_outage_alert_and_one_recovered_alert_for_two_instances(outage: World) -> None:
    alerts = outage.alerts()
    kinds = [a["kind"] for a in alerts]
    assert kinds == ["outage", "recovered"], alerts
    down, up = alerts
    assert set(down) == {"kind", "agent", "since", "waiting", "reason", "at"}
    assert (down["agent"], down["since"], down["waiting"]) == (AGENT, "2030-01-01T12:00:00.200Z", 8)
    assert "HTTP 503" in down["reason"]
    # Told when every call had failed for OUTAGE_ALERT_SECONDS (300), at the next failure.
    told = datetime.fromisoformat(down["at"])
    assert T0 + timedelta(seconds=300) <= told <= T0 + timedelta(seconds=315)
    assert {"kind", "agent", "since", "at"} <= set(up)
    assert (up["agent"], up["since"]) == (AGENT, down["since"])
    answered = datetime.fromisoformat(up["at"])
    assert T0 + timedelta(seconds=480) <= answered <= T0 + timedelta(seconds=495)


def test_no_order_gets_an_alert_for_waiting_and_every_order_completes(outage: World) -> None:
    assert all(a.get("kind") != "order" for a in outage.alerts())
    for order_id in ORDERS:
        order = outage.store.load(order_id)
        assert order is not None and order.status is OrderStatus.COMPLETED, order_id
        [step] = order.steps
        assert step.failure_count == 0  # waiting for an outage is not the order's failure


def test_the_remote_got_a_trickle_of_probes_not_every_order_s_retries(outage: World) -> None:
    during = [c for c in outage.remote.calls if c < outage.remote.down_until]
    # Each instance's breaker lets about one probe through every 10 s once open.
    assert len(during) < 2 * 480 / 10 + 30


def test_the_shared_record_costs_writes_per_outage_not_per_call(outage: World) -> None:
    during = [c for c in outage.remote.calls if c < outage.remote.down_until]
    # Per instance: its first report, a heartbeat a minute, the crossing, the answer;
    # plus the alerts owed being removed.
    assert outage.store.outage_writes <= 2 * (1 + 480 / 60 + 2) + 2
    assert outage.store.outage_writes < len(during) / 3
    [record] = outage.store.read_outages().values()
    assert (record.failing, record.alerted, record.owed) == (False, True, ())
    assert record.waiting == 8
    [past] = record.past
    assert past.since == T0 + timedelta(seconds=0.2) and past.waiting == 8  # the first call's end


def test_both_instances_ramp_up_from_the_end_of_the_outage(outage: World) -> None:
    [record] = outage.store.read_outages().values()
    for inst in outage.instances:
        inst.ctx.agent_controls.forget()
        assert inst.ctx.agent_controls.released_at(AGENT) == record.ended_at


def test_an_outage_shorter_than_the_alert_time_is_told_nothing() -> None:
    w = world(down_for=120)
    orders = ORDERS[:4]
    for order_id in orders:
        w.submit(order_id)
    w.run(until=300, orders=orders)

    assert w.alerts() == []
    assert all(w.store.load(o).status is OrderStatus.COMPLETED for o in orders)  # type: ignore[union-attr]
    [record] = w.store.read_outages().values()  # the streak was recorded, then ended
    assert (record.failing, record.alerted, record.past) == (False, False, ())


# --- the crash windows of the send ---------------------------------------------------------


class FlakyQueues(RecordingQueues):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def send(self, queue: str, body: str, **kw: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise StorageUnavailable("the alert queue did not answer")
        super().send(queue, body, **kw)


def book(store: InMemoryStateStore, queues: RecordingQueues, clock: FakeClock) -> OutageBook:
    return OutageBook(store, queues, Names(), clock, OutagePolicy())


def alerts_on(queues: RecordingQueues) -> list[dict[str, Any]]:
    return queues.on(Names().operator_alerts)


def test_a_sender_that_dies_before_its_send_leaves_it_owed_for_the_timer() -> None:
    store, clock, queues = InMemoryStateStore(), FakeClock(T0), FlakyQueues(failures=1)
    b = book(store, queues, clock)
    b.failing(AGENT, T0, T0 + timedelta(seconds=10), "HTTP 503")
    clock.at(300)
    b.failing(AGENT, T0, clock.now, "HTTP 503")  # wins the alert, but its send fails

    assert alerts_on(queues) == []
    assert len(store.read_outages()[AGENT].owed) == 1
    clock.advance(30)
    assert b.finish().sent == 0  # its sender still has the grace
    clock.advance(31)
    assert b.finish().sent == 1
    assert b.finish().sent == 0
    clock.advance(3600)
    assert b.finish().sent == 0
    [alert] = alerts_on(queues)
    assert (alert["kind"], alert["since"], alert["at"]) == (
        "outage",
        "2030-01-01T12:00:00.000Z",
        "2030-01-01T12:05:00.000Z",
    )
    assert store.read_outages()[AGENT].owed == ()


class DiesAfterSend(InMemoryStateStore):
    """Its next write of an outage record that removes an owed alert is lost (the process
    died after the send)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def write_outage(self, outage: Outage) -> Outage:
        before = self.read_outages().get(outage.agent)
        if self.armed and before is not None and len(outage.owed) < len(before.owed):
            self.armed = False
            raise StorageUnavailable("the process died")
        return super().write_outage(outage)


def test_a_sender_that_dies_after_its_send_makes_the_timer_send_it_again() -> None:
    store, clock, queues = DiesAfterSend(), FakeClock(T0), RecordingQueues()
    b = book(store, queues, clock)
    b.failing(AGENT, T0, T0 + timedelta(seconds=10), "HTTP 503")
    clock.at(300)
    store.armed = True
    b.failing(AGENT, T0, clock.now, "HTTP 503")
    assert len(alerts_on(queues)) == 1 and store.read_outages()[AGENT].owed

    clock.advance(61)
    assert b.finish().sent == 1
    clock.advance(61)
    assert b.finish().sent == 0
    # At least once: the same outage (agent, since) twice, never lost.
    first, again = alerts_on(queues)
    assert (first["kind"], first["agent"], first["since"]) == (
        again["kind"],
        again["agent"],
        again["since"],
    )


class Interleaved(InMemoryStateStore):
    """Between one reader's read and its write, another instance's whole report runs."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: list[Any] = []

    def write_outage(self, outage: Outage) -> Outage:
        while self.meanwhile:
            self.meanwhile.pop(0)()
        return super().write_outage(outage)


def test_two_instances_deciding_the_alert_at_once_send_one() -> None:
    store, clock, queues = Interleaved(), FakeClock(T0), RecordingQueues()
    a, b = book(store, queues, clock), book(store, queues, clock)
    a.failing(AGENT, T0, T0 + timedelta(seconds=10), "HTTP 503")
    clock.at(301)
    # A reads the record and decides the alert; before its write, B does the same and wins.
    store.meanwhile.append(lambda: b.failing(AGENT, T0, clock.now, "HTTP 503"))
    a.failing(AGENT, T0 + timedelta(seconds=1), clock.now, "HTTP 503")

    [alert] = alerts_on(queues)
    assert alert["kind"] == "outage"
    record = store.read_outages()[AGENT]
    assert record.alerted and record.owed == ()


def test_a_recovery_while_the_outage_alert_is_still_owed_sends_both_once() -> None:
    store, clock, queues = InMemoryStateStore(), FakeClock(T0), FlakyQueues(failures=1)
    b = book(store, queues, clock)
    b.failing(AGENT, T0, T0 + timedelta(seconds=10), "HTTP 503")
    clock.at(300)
    b.failing(AGENT, T0, clock.now, "HTTP 503")  # owed, not sent
    clock.at(320)
    b.answered(AGENT, clock.now)  # recovered: sent at once
    clock.at(400)
    b.finish()  # the outage alert, late
    clock.at(500)
    b.finish()

    assert sorted(a["kind"] for a in alerts_on(queues)) == ["outage", "recovered"]
    record = store.read_outages()[AGENT]
    assert record.owed == () and record.past[0].since == T0


def test_a_write_that_keeps_conflicting_gives_up_and_the_next_report_tries_again() -> None:
    class Always(InMemoryStateStore):
        def write_outage(self, outage: Outage) -> Outage:
            raise ConcurrencyConflict("someone else")

    b = book(Always(), RecordingQueues(), FakeClock(T0))
    with pytest.raises(ConcurrencyConflict):
        b.failing(AGENT, T0, T0 + timedelta(seconds=10), "HTTP 503")


# --- the watch: memory per call, a report when its view changes ------------------------------


class Reports:
    def __init__(self, fail: int = 0) -> None:
        self.made: list[tuple[str, datetime]] = []
        self.fail = fail

    def failing(self, agent: str, first: datetime, at: datetime, reason: str) -> Outage:
        return self._made("failing", at, Outage(agent, failing=True, since=first))

    def answered(self, agent: str, at: datetime) -> Outage:
        return self._made("answered", at, Outage(agent))

    def _made(self, kind: str, at: datetime, outage: Outage) -> Outage:
        if self.fail:
            self.fail -= 1
            raise StorageUnavailable("no storage")
        self.made.append((kind, at))
        return outage


def watch(reports: Reports, shared: Outage | None = None) -> OutageWatch:
    def run(job: Any) -> None:
        with contextlib.suppress(StorageUnavailable):  # the worker logs it
            job()

    return OutageWatch(AGENT, reports, lambda: shared, OutagePolicy(), run)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_blip_costs_no_report_and_an_outage_a_few() -> None:
    reports = Reports()
    w = watch(reports)
    for s in range(0, 9):  # nine seconds of failures, then an answer: nothing told
        w.failed(t(s), "503")
    w.answered(t(9))
    assert reports.made == []

    for s in range(20, 20 + 300):  # five minutes of failures, one a second
        w.failed(t(s), "503")
    w.answered(t(400))
    assert reports.made == [
        ("failing", t(30)),  # 10 s in
        *(("failing", t(30 + 60 * n)) for n in range(1, 5)),  # a heartbeat a minute
        ("answered", t(400)),
    ]


def test_a_report_the_store_did_not_take_is_not_tried_on_every_call() -> None:
    reports = Reports(fail=1)
    w = watch(reports)
    for s in range(0, 30):
        w.failed(t(s), "503")
    assert reports.made == [("failing", t(20))]  # tried at 10 s, failed, again 10 s later


def test_an_instance_that_never_failed_ends_a_streak_it_sees_in_the_shared_record() -> None:
    reports = Reports()
    watch(reports, shared=Outage(AGENT, failing=True, since=t(0))).answered(t(50))
    assert reports.made == [("answered", t(50))]
    quiet = Reports()
    watch(quiet, shared=Outage(AGENT)).answered(t(50))  # nothing failing: nothing to tell
    assert quiet.made == []
