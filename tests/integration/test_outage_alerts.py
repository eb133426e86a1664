"""An outage told once (docs/contracts.md §3.14), on real Azurite: two app contexts (two
instances) share one state table and one ``operator-alerts`` queue. Their reports race on
the agent's outage record with ETags, and exactly one ``outage`` alert and one
``recovered`` alert reach the queue, in the contract's JSON; an alert whose sender died
before its send is sent once by the supervisor's timer on the other instance.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from bootstrap import AppContext
from core.errors import ConcurrencyConflict
from core.outages import OutagePolicy, report_failing
from core.timefmt import iso
from tests.support import FakeClock, drain, make_context

AGENT = "carrier"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def pair(storage_connection: str, tag: str, clock: FakeClock) -> tuple[AppContext, AppContext]:
    """Two instances of one app: the same table and queues, each its own parts."""
    return (
        make_context(storage_connection, tag, clock=clock),
        make_context(storage_connection, tag, clock=clock),
    )


def alerts(ctx: AppContext) -> list[dict[str, object]]:
    return [json.loads(text) for text in drain(ctx, ctx.names.operator_alerts)]


def test_two_instances_deciding_one_outage_race_on_the_etag_and_one_wins(
    pair: tuple[AppContext, AppContext], clock: FakeClock
) -> None:
    a, b = pair
    start = clock()
    a.outages.failing(AGENT, start, start + timedelta(seconds=10), "HTTP 503")
    # Both read the record, both decide that every call has failed for 300 s...
    policy = OutagePolicy()
    at = start + timedelta(seconds=301)
    read_a = a.store.read_outages()[AGENT]
    read_b = b.store.read_outages()[AGENT]
    decided_a = report_failing(read_a, start, at, "HTTP 503", at, policy)
    decided_b = report_failing(read_b, start, at, "HTTP 502", at, policy)
    assert decided_a is not None and decided_b is not None
    assert decided_a.owed and decided_b.owed
    # ...and of their conditional writes, one is refused (412 on the ETag both read).
    a.store.write_outage(decided_a)
    with pytest.raises(ConcurrencyConflict):
        b.store.write_outage(decided_b)
    assert b.store.read_outages()[AGENT].reason == "HTTP 503"


def test_reports_racing_from_two_instances_send_one_outage_and_one_recovered_alert(
    pair: tuple[AppContext, AppContext], clock: FakeClock
) -> None:
    a, b = pair
    start = clock()
    a.outages.failing(AGENT, start, start + timedelta(seconds=10), "HTTP 503")
    b.outages.failing(AGENT, start + timedelta(seconds=2), start + timedelta(seconds=12), "503")
    clock.advance(305)
    errors: list[BaseException] = []

    def report(ctx: AppContext, n: int) -> None:
        try:
            ctx.outages.failing(AGENT, start, clock(), f"HTTP 503 from {n}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=report, args=(ctx, n)) for n, ctx in enumerate(pair * 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    clock.advance(60)
    answered = clock()
    for ctx in pair * 2:  # each instance's first answer, twice over
        ctx.outages.answered(AGENT, answered)
    clock.advance(120)
    a.outages.finish()
    b.outages.finish()

    down, up = alerts(a)
    assert down == {
        "kind": "outage",
        "agent": AGENT,
        "since": iso(start),
        "waiting": 0,
        "reason": down["reason"],
        "at": iso(start + timedelta(seconds=305)),
    }
    assert "every call to agent carrier's remote has failed" in str(down["reason"])
    assert up == {
        "kind": "recovered",
        "agent": AGENT,
        "since": iso(start),
        "at": iso(answered),
        "reason": up["reason"],
    }
    record = b.store.read_outages()[AGENT]
    assert (record.failing, record.alerted, record.owed) == (False, True, ())
    assert [p.since for p in record.past] == [start]


def test_an_alert_whose_sender_died_is_sent_once_by_the_other_instance_s_timer(
    pair: tuple[AppContext, AppContext], clock: FakeClock
) -> None:
    a, b = pair
    start = clock()
    a.outages.failing(AGENT, start, start + timedelta(seconds=10), "HTTP 503")
    at = start + timedelta(seconds=300)
    # Instance A wins the alert and dies before sending it: its write alone.
    decided = report_failing(
        a.store.read_outages()[AGENT], start, at, "HTTP 503", at, OutagePolicy()
    )
    assert decided is not None
    a.store.write_outage(decided)
    clock.advance(300 + 30)
    assert b.outages.finish().sent == 0  # within the winner's grace
    clock.advance(31)
    assert b.outages.finish().sent == 1
    assert a.outages.finish().sent == 0
    [alert] = alerts(b)
    assert (alert["kind"], alert["since"], alert["at"]) == ("outage", iso(start), iso(at))
    assert b.store.read_outages()[AGENT].owed == ()
