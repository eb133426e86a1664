"""The dashboard's figures and the stuck check, on the in-memory store and a fake clock:
percentiles from log-scale buckets, what each event adds, the aggregator counting every
activity row once (bounded pages, a kill between its commit and its deletes, a rival
run, a late row), and one stuck alert per order."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from bootstrap import AppContext, bootstrap
from console.dashboard_page import build as build_page
from core.errors import TransitionRefused
from core.names import Names
from core.outcome import Outcome
from core.unit_of_work import OrderChanges
from dashboard.figures import (
    MAYBE_APPLIED,
    NOT_APPLIED,
    REFUSED,
    STUCK_ROW,
    Activity,
    Figures,
    InFlight,
    answer_kind,
    bucket_of,
    bucket_upper,
    fold,
    minute_row,
    percentile,
    stuck_steps,
)
from dashboard.ports import RowWrite
from stores import activity, layout
from stores.memory import InMemoryStateStore
from supervisor.aggregator import DashboardAggregator, figures_of
from tests.support import FakeClock, settings_from
from tests.unit.test_services_in_memory import (
    T0,
    RecordingKeeper,
    RecordingQueues,
    RecordingTransport,
    reply_to,
)

# --- percentiles ---------------------------------------------------------------------------


def test_buckets_are_a_quarter_doubling_wide_and_percentiles_never_undershoot() -> None:
    durations = [3, 7, 12, 12, 40, 41, 90, 150, 800, 2500] * 10
    hist: dict[int, int] = {}
    for d in durations:
        hist[bucket_of(d)] = hist.get(bucket_of(d), 0) + 1
    ordered = sorted(durations)
    for q in (0.5, 0.9, 0.99):
        true = ordered[math.ceil(q * len(ordered)) - 1]
        got = percentile(hist, q)
        assert got is not None and true <= got <= true * 2**0.25, (q, true, got)
    assert bucket_upper(bucket_of(100)) / 100 <= 2**0.25
    assert percentile({}, 0.5) is None


def test_merged_buckets_give_the_percentiles_of_the_union() -> None:
    a, b = Figures(), Figures()
    for n, d in enumerate(range(1, 400)):
        (a if n % 3 else b).add(
            Activity(T0, "attempt", step="s", agent="x", ending="succeeded", millis=d)
        )
    whole = Figures()
    for d in range(1, 400):
        whole.add(Activity(T0, "attempt", step="s", agent="x", ending="succeeded", millis=d))
    a.merge(b)
    assert a == whole
    assert Figures.from_json(json.loads(json.dumps(a.to_json()))) == whole


def test_answer_kinds_use_the_attempt_states_words() -> None:
    assert answer_kind("succeeded", "yes") is None
    assert answer_kind("refused", "no") == REFUSED
    assert answer_kind("transient", "no") == NOT_APPLIED
    assert answer_kind("transient", "maybe") == MAYBE_APPLIED
    assert answer_kind("expired", "unknown") == MAYBE_APPLIED
    assert answer_kind("deferred", "no") == "deferred"


def test_fold_takes_already_counted_rows_without_counting_them_and_stops_at_the_bucket_cap() -> (
    None
):
    rows: list[tuple[str, Activity | None]] = [
        (f"activity|k{n}", Activity(T0 + timedelta(minutes=n), "started", workflow="order"))
        for n in range(5)
    ]
    folded = fold([("activity|old", None), *rows], ["activity|k0"], max_buckets=4)
    # k0 already counted; k1..k2 fill 4 buckets (2 minutes + their hours... same hour)
    assert folded.taken[:2] == ["activity|old", "activity|k0"]
    assert folded.counted == 3  # minutes 1, 2, 3 + one hour = 4 buckets
    assert (
        sum(f.started.get("order", 0) for k, f in folded.deltas.items() if k.startswith("min|"))
        == 3
    )
    assert folded.skipped == 1


# --- the aggregator on the in-memory store --------------------------------------------------


def app(store: InMemoryStateStore, clock: FakeClock, queues: RecordingQueues) -> AppContext:
    settings = settings_from(
        {
            "AzureWebJobsStorage": "UseDevelopmentStorage=true",
            "AGENT_TRANSPORT": "storage",
            "STEP_TIMEOUT_SECONDS": "30",
            "MAX_FAILURE_COUNT": "2",
            "STUCK_FLOOR_SECONDS": "10",
        }
    )
    return bootstrap(
        replace(settings, instance_id="t"),
        names=Names(),
        clock=clock,
        store=store,
        queues=queues,
        transport=RecordingTransport(),
        kept=RecordingKeeper(),
    )


class World:
    def __init__(self) -> None:
        self.store = InMemoryStateStore()
        self.clock = FakeClock(T0)
        self.queues = RecordingQueues()
        self.app = app(self.store, self.clock, self.queues)
        self.transport: RecordingTransport = self.app.transport  # type: ignore[assignment]

    def submit(self, order_id: str, workflow: str = "order") -> None:
        body = {"orderId": order_id, "workflow": workflow}
        self.app.scheduler.submit(json.dumps(body).encode())

    def answer(self, order_id: str, outcome: Outcome, **kw: Any) -> None:
        request = [r for r in self.transport.requests if r.order_id == order_id][-1]
        self.app.scheduler.apply_reply(reply_to(request, outcome, **kw))

    def aggregator(self, **kw: Any) -> DashboardAggregator:
        kw.setdefault("shards", layout.all_shards())
        kw.setdefault("lag", timedelta(0))
        return DashboardAggregator(self.store, self.clock, **kw)

    def activity_rows(self) -> list[str]:
        return [
            str(r["RowKey"])
            for shard in layout.all_shards()
            for r in self.store.rows(shard)
            if str(r["RowKey"]).startswith(activity.PREFIX)
        ]

    def figures(self, prefix: str = "min|") -> Figures:
        total = Figures()
        for row in self.store.dashboard_rows(prefix, prefix + "~"):
            total.merge(figures_of(row))
        return total


def run_orders(w: World) -> None:
    """3 `order` orders completed, 1 refused; 2 `fulfilment` orders completed."""
    for n in range(4):
        w.submit(f"o-{n}")
        w.clock.advance(0.25 * (n + 1))
        if n < 3:
            w.answer(f"o-{n}", Outcome.SUCCEEDED)
        else:
            w.answer(f"o-{n}", Outcome.REFUSED, error="HTTP 400", settled=True)
    for n in range(2):
        w.submit(f"f-{n}", "fulfilment")
        for _ in range(3):
            w.clock.advance(0.1)
            w.answer(f"f-{n}", Outcome.SUCCEEDED)


def test_figures_are_what_the_orders_did_and_the_activity_rows_are_gone() -> None:
    w = World()
    run_orders(w)
    assert len(w.activity_rows()) == 4 * 3 + 2 * 5 + 1  # start, attempt, end; + one alert
    w.clock.advance(1)
    report = w.aggregator().run()

    assert report.counted == 23 and w.activity_rows() == []
    minute = w.figures()
    assert minute.started == {"order": 4, "fulfilment": 2}
    assert minute.finished == {"order|completed": 3, "order|error": 1, "fulfilment|completed": 2}
    assert minute.failures == {f"orders|{REFUSED}": 1}
    assert minute.alerts == 1
    durations = minute.durations
    assert sum(durations["process|orders"].values()) == 3
    assert sum(durations["ship|carrier"].values()) == 2
    # the process attempts took 0.25, 0.5, 0.75 s: p99 is the bucket holding 750 ms
    assert percentile(durations["process|orders"], 0.99) == bucket_upper(bucket_of(750))
    assert w.figures("hour|") == minute  # hours are the sum of their minutes

    again = w.aggregator().run()
    assert again.counted == 0 and w.figures() == minute


def test_reads_are_bounded_and_later_runs_go_on_from_there() -> None:
    w = World()
    for n in range(40):
        w.submit(f"o-{n}")
    w.clock.advance(1)
    first = w.aggregator(batch=2, rounds=1).run()
    assert first.counted <= 2 * 16 and first.counted < 40
    for _ in range(40):
        if not w.activity_rows():
            break
        w.aggregator(batch=2, rounds=1).run()
    assert w.figures().started == {"order": 40}


def test_a_run_killed_between_its_commit_and_its_deletes_never_counts_twice() -> None:
    w = World()
    run_orders(w)
    w.clock.advance(1)

    class Killed(Exception):
        pass

    def kill(shard: str) -> None:
        raise Killed(shard)

    with pytest.raises(Killed):
        w.aggregator(after_commit=kill).run()
    left = w.activity_rows()
    assert left, "the kill left the counted rows in place"
    w.aggregator().run()
    assert w.activity_rows() == []
    assert w.figures().started == {"order": 4, "fulfilment": 2}
    assert sum(w.figures().finished.values()) == 6


def test_a_row_that_commits_late_is_counted_by_the_next_run() -> None:
    w = World()
    w.submit("o-1")
    w.clock.advance(1)
    w.aggregator().run()
    # a transition that decided a minute ago and committed only now
    late = Activity(T0 - timedelta(minutes=1), "started", "o-late", "order")
    key = activity.row_key(late.at, "o-late", "start")
    shard = layout.shard_of("o-late")
    w.store.put_row(activity.entity(shard, key, late))
    w.aggregator().run()
    assert w.figures().started == {"order": 2}
    assert w.store.dashboard_rows(minute_row(late.at), minute_row(late.at) + "~")


def test_two_aggregators_never_both_count_a_shard() -> None:
    w = World()
    run_orders(w)
    w.clock.advance(1)
    rival = w.aggregator()

    store = w.store
    original = store.write_dashboard
    ran: list[Any] = []

    def write_after_rival(writes: list[RowWrite]) -> dict[str, str]:
        if not ran:
            ran.append(None)
            store.write_dashboard = original  # type: ignore[method-assign]
            ran[0] = rival.run()
        return original(writes)

    store.write_dashboard = write_after_rival  # type: ignore[method-assign]
    report = w.aggregator().run()
    store.write_dashboard = original  # type: ignore[method-assign]
    assert report.conflicts == 1 and ran[0].counted == 23
    assert w.figures().started == {"order": 4, "fulfilment": 2}


def test_old_buckets_are_pruned() -> None:
    w = World()
    w.submit("o-1")
    w.clock.advance(1)
    w.aggregator().run()
    assert w.store.dashboard_rows("min|", "min|~")
    w.clock.advance(4 * 3600)
    report = w.aggregator().run()
    assert report.pruned >= 1 and not w.store.dashboard_rows("min|", "min|~")
    assert w.store.dashboard_rows("hour|", "hour|~")  # hours stay 8 days


def test_poisoned_messages_are_counted() -> None:
    w = World()
    from supervisor.poison import Poisoned

    w.app.poison.alert(Poisoned("orders-poison", b"not json", None))
    w.clock.advance(1)
    w.aggregator().run()
    assert w.figures().poison == 1


def test_the_page_shows_totals_by_workflow_and_failures_by_kind() -> None:
    w = World()
    run_orders(w)
    w.clock.advance(1)
    w.aggregator().run()
    minutes = {r.row: figures_of(r) for r in w.store.dashboard_rows("min|", "min|~")}
    hours = {r.row: figures_of(r) for r in w.store.dashboard_rows("hour|", "hour|~")}
    page = build_page(minutes, hours, ([], None), w.clock())
    totals = {t.workflow: (t.started_hour, t.finished_hour, t.by_status_day) for t in page.totals}
    assert totals == {
        "fulfilment": (2, 2, {"completed": 2}),
        "order": (4, 4, {"completed": 3, "error": 1}),
    }
    [orders] = page.failures
    assert orders.agent == "orders" and orders.hour[REFUSED] == 1
    assert sum(1 for b in page.minutes.bars if b.series == "order") == 1
    assert page.alerts_hour == 1


# --- stuck steps ----------------------------------------------------------------------------


def test_stuck_means_past_the_steps_p99_and_the_floor() -> None:
    now = T0 + timedelta(hours=1)
    floor = timedelta(minutes=5)
    entries = [
        InFlight("a", "ship", "carrier", "Processing", now - timedelta(minutes=4)),  # < floor
        InFlight("b", "ship", "carrier", "Processing", now - timedelta(minutes=6)),  # stuck
        InFlight("c", "slow", "x", "Pending", now - timedelta(minutes=6)),  # under its p99
        InFlight("d", "slow", "x", "Pending", now - timedelta(minutes=11)),  # past its p99
    ]
    p99 = {"ship": 2_000.0, "slow": 600_000.0}
    found = stuck_steps(entries, p99, floor, now)
    assert [s.order_id for s in found] == ["d", "b"]
    assert found[0].threshold_seconds == 600 and found[1].threshold_seconds == 300


def test_a_stuck_step_is_listed_and_alerted_once_per_order() -> None:
    w = World()
    w.submit("o-hang")
    w.submit("o-fine")
    w.answer("o-fine", Outcome.SUCCEEDED)
    notices = w.app.notices
    changes = OrderChanges(w.store, notices, w.app.dispatch_queue)
    agg = w.aggregator(changes=changes, floor=timedelta(seconds=10))
    w.clock.advance(5)
    assert agg.run().stuck == []
    w.clock.advance(10)  # 15 s Processing: past the 10 s floor, inside its 30 s deadline
    report = agg.run()
    assert [(s.order_id, s.step, s.agent, s.state) for s in report.stuck] == [
        ("o-hang", "process", "orders", "Processing")
    ]
    assert report.alerted == ["o-hang"]
    alerts = w.queues.on(w.app.names.operator_alerts)
    assert [a["orderId"] for a in alerts] == ["o-hang"] and "Processing for 15 s" in alerts[0][
        "reason"
    ]
    w.clock.advance(5)
    again = agg.run()
    assert [s.order_id for s in again.stuck] == ["o-hang"] and again.alerted == []
    assert len(w.queues.on(w.app.names.operator_alerts)) == 1
    [row] = w.store.dashboard_rows(STUCK_ROW, STUCK_ROW + "~")
    [listed] = json.loads(str(row.value["Steps"]))
    assert listed["orderId"] == "o-hang" and listed["alerted"] is True
    # even with the list lost, the order's own marker refuses a second alert
    w.store.write_dashboard([RowWrite(STUCK_ROW, None, row.etag)])
    assert agg.run().alerted == []
    assert len(w.queues.on(w.app.names.operator_alerts)) == 1
    order = w.store.load("o-hang")
    assert order is not None and order.stuck_alerted == "process:1"


def test_mark_stuck_refuses_a_second_alert_and_a_step_that_moved_on() -> None:
    w = World()
    w.submit("o-1")
    order = w.store.load("o-1")
    assert order is not None
    order.mark_stuck("process", "stuck", w.clock())
    with pytest.raises(TransitionRefused) as again:
        order.mark_stuck("process", "stuck", w.clock())
    assert again.value.reason == "stuck-alerted"
    other = w.store.load("o-1")
    assert other is not None
    with pytest.raises(TransitionRefused) as moved:
        other.mark_stuck("ship", "stuck", w.clock())
    assert moved.value.reason == "moved-on"


def test_the_stuck_check_reads_only_work_in_flight() -> None:
    w = World()
    for n in range(30):
        w.submit(f"done-{n}")
        w.answer(f"done-{n}", Outcome.SUCCEEDED)
    w.submit("o-1")
    entries = w.store.in_flight()
    assert [(e.order_id, e.state) for e in entries] == [("o-1", "Processing")]


def test_a_step_held_for_a_paused_agent_is_never_stuck() -> None:
    """A pause is an operator's choice, shown on the Agents page and the order: its
    steps wait, Pending, with no alert however long (docs/contracts.md §3.7)."""
    from tests.unit.test_agent_pause import build

    paused = build()
    paused.pause()
    paused.submit("held-1")
    paused.submit("free-1", workflow="fulfilment")  # its first step is not on orders
    assert paused.order("held-1").steps[0].paused_for == "orders"
    flight = {e.order_id: e for e in paused.store.in_flight()}
    assert flight["held-1"].paused_for == "orders" and flight["free-1"].paused_for == ""

    paused.clock.advance(6 * 3600)
    hours_later = paused.clock()
    entries = [replace(e, since=T0) for e in flight.values()]
    found = stuck_steps(entries, {}, timedelta(minutes=5), hours_later)

    assert [s.order_id for s in found] == ["free-1"]


def test_a_step_that_waits_for_an_event_or_a_delay_is_never_stuck() -> None:
    """An approval may take days: its own timeout ends it (docs/contracts.md §3.13); the
    stuck check does not count it."""
    from stores.memory import InMemoryStateStore
    from tests.support import declarations
    from tests.unit.test_workflow_kinds import new

    store = InMemoryStateStore()
    with declarations():
        waiting = new("event-first")
        store.create(waiting)
        assert store.load(waiting.order_id) is not None
        assert [e.order_id for e in store.in_flight()] == []
