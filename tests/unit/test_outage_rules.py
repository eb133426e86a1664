"""The rules of an agent's shared outage record and of the gentle release
(``core.outages``, docs/contracts.md §3.14), pure, on fixed times: when a failing streak
becomes an outage, that each alert is owed exactly once, how a streak ends, and the ramp.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from core.controls import Limits
from core.outages import (
    OUTAGE,
    PAST_DAYS,
    PAST_KEPT,
    RAMP_DOUBLING,
    RECOVERED,
    Outage,
    OutagePolicy,
    ramp_end,
    ramp_rate,
    report_answer,
    report_failing,
    sent,
    spread,
    stale_owed,
    take,
)
from dashboard.figures import outage_rows

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
POLICY = OutagePolicy()  # 300 s to an alert


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def failing(o: Outage, first: float, last: float, reason: str = "HTTP 503") -> Outage:
    changed = report_failing(o, at(first), at(last), reason, at(last), POLICY)
    assert changed is not None
    return changed


def test_a_report_starts_a_streak_from_the_first_failure() -> None:
    o = failing(Outage("carrier"), 0, 10)

    assert (o.failing, o.since, o.last_failure_at, o.reason) == (True, at(0), at(10), "HTTP 503")
    assert (o.alerted, o.owed) == (False, ())


def test_failed_calls_for_the_alert_time_owe_exactly_one_outage_alert() -> None:
    o = failing(Outage("carrier"), 0, 10)
    o = failing(o, 5, 299)  # another instance, a little later: since stays the earliest
    assert (o.since, o.owed) == (at(0), ())

    o = failing(o, 5, 300)  # every call has failed for 300 s
    [owed] = o.owed
    assert (owed.kind, owed.since, owed.at, owed.taken_at) == (OUTAGE, at(0), at(300), at(300))
    assert o.alerted

    again = failing(o, 100, 360)  # a heartbeat or another crossing: no second alert
    assert again.owed == o.owed


def test_the_earliest_first_failure_of_any_instance_is_the_outage_s_since() -> None:
    o = failing(Outage("carrier"), 50, 60)
    o = failing(o, 20, 70)  # this instance failed earlier, with no answer since
    assert o.since == at(20)


def test_an_answer_ends_the_streak_and_owes_the_recovered_alert_only_for_an_outage() -> None:
    short = failing(Outage("carrier"), 0, 30)
    ended = report_answer(short, at(40), at(40))
    assert ended is not None
    assert (ended.failing, ended.ended_at, ended.owed, ended.past) == (False, at(40), (), ())

    alerted = failing(failing(Outage("carrier"), 0, 10), 0, 310)
    long = sent(alerted, alerted.owed[0], waiting=12)
    assert long is not None and long.owed == () and long.waiting == 12
    over = report_answer(long, at(400), at(400))
    assert over is not None
    [owed] = over.owed
    assert (owed.kind, owed.since, owed.at) == (RECOVERED, at(0), at(400))
    [past] = over.past
    assert (past.since, past.until, past.waiting) == (at(0), at(400), 12)


def test_an_answer_from_before_the_streak_or_a_second_answer_changes_nothing() -> None:
    o = failing(Outage("carrier"), 100, 120)
    assert report_answer(o, at(90), at(130)) is None  # reported late: before the first failure
    ended = report_answer(o, at(130), at(130))
    assert ended is not None
    assert report_answer(ended, at(131), at(131)) is None  # another instance: already over


def test_a_streak_never_starts_before_the_answer_that_ended_the_last_one() -> None:
    ended = report_answer(failing(Outage("carrier"), 0, 20), at(30), at(30))
    assert ended is not None
    # An instance whose failures began before that answer: only those after it count.
    o = failing(ended, 10, 50)
    assert o.since == at(30)
    # A failure reported from before the answer tells nothing new.
    assert report_failing(ended, at(10), at(25), "x", at(40), POLICY) is None


def test_a_quiet_streak_never_alerted_is_over_but_an_outage_lasts_until_an_answer() -> None:
    quiet = failing(Outage("carrier"), 0, 20)
    later = failing(quiet, 20 + 301, 20 + 310)  # nobody failed (nor called) for 5 minutes
    assert later.since == at(321) and not later.owed

    outage = failing(failing(Outage("carrier"), 0, 20), 0, 300)
    assert outage.alerted
    still = failing(outage, 3600, 3610)  # an hour later, no answer meanwhile
    assert (still.since, still.owed) == (at(0), outage.owed)


def test_an_owed_alert_is_taken_on_and_removed_once() -> None:
    o = failing(failing(Outage("carrier"), 0, 10), 0, 300)
    [owed] = o.owed
    assert stale_owed(o, at(300 + 59), POLICY) == []  # its sender has the grace
    assert stale_owed(o, at(360), POLICY) == [owed]

    taken = take(o, owed, at(360))
    assert taken is not None and taken.owed[0].taken_at == at(360)
    assert stale_owed(taken, at(361), POLICY) == []  # the timer that took it has the grace

    done = sent(taken, owed, waiting=3)
    assert done is not None and done.owed == ()
    assert sent(done, owed, waiting=3) is None  # another sender's: nothing to remove
    assert take(done, owed, at(400)) is None


def test_past_outages_are_bounded() -> None:
    o = Outage("carrier")
    for n in range(PAST_KEPT + 3):
        start = n * 1000.0
        o = failing(failing(o, start, start + 10), start, start + 300)
        ended = report_answer(o, at(start + 400), at(start + 400))
        assert ended is not None
        o = ended
    assert len(o.past) == PAST_KEPT
    assert o.past[0].since == at((PAST_KEPT + 2) * 1000.0)  # newest first


def test_the_policy_reports_within_half_the_alert_time() -> None:
    assert OutagePolicy.of(300).report_after == timedelta(seconds=10)
    assert OutagePolicy.of(6).report_after == timedelta(seconds=3)
    assert OutagePolicy.of(6).alert_after == timedelta(seconds=6)


# --- the gentle release --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "rate"),
    [(0, 1.0), (3, 2.0), (6, 4.0), (9, 8.0), (10.5, 2**3.5), (-2, 1.0)],
)
def test_the_release_starts_at_one_call_a_second_and_doubles_every_few_seconds(
    seconds: float, rate: float
) -> None:
    assert timedelta(seconds=3) == RAMP_DOUBLING
    assert ramp_rate(Limits(32, 20.0), T0, at(seconds)) == pytest.approx(rate)


def test_the_ramp_ends_at_the_agent_s_own_limits() -> None:
    limits = Limits(32, 20.0)
    end = ramp_end(limits, T0)
    assert end == T0 + RAMP_DOUBLING * 4.321928094887363  # log2(20) doublings
    assert ramp_rate(limits, T0, end - timedelta(milliseconds=1)) == pytest.approx(20.0, rel=1e-3)
    assert ramp_rate(limits, T0, end) == 20.0
    assert ramp_rate(limits, T0, at(86_400 * 365)) == 20.0  # no overflow, years later


def test_without_a_rate_limit_the_ramp_ends_at_ten_calls_a_second_a_slot() -> None:
    limits = Limits(8)  # 80 calls a second
    assert ramp_rate(limits, T0, at(3 * 6)) == pytest.approx(64.0)
    assert ramp_rate(limits, T0, ramp_end(limits, T0)) is None  # then no limit at all
    assert ramp_end(limits, T0) == T0 + RAMP_DOUBLING * 6.321928094887363


def test_nothing_released_means_the_agent_s_own_rate() -> None:
    assert ramp_rate(Limits(32, 5.0), None, T0) == 5.0
    assert ramp_rate(Limits(32), None, T0) is None


def test_orders_told_to_come_back_during_the_ramp_are_spread_over_a_doubling() -> None:
    times = {spread(f"o-{n}:ship", T0) for n in range(200)}
    assert all(T0 <= t < T0 + RAMP_DOUBLING for t in times)
    assert len(times) > 150  # not all in the same instant
    assert spread("o-1:ship", T0) == spread("o-1:ship", T0)  # the same key: the same time


# --- what the dashboard lists ---------------------------------------------------------------


def test_the_dashboard_lists_agents_failing_now_and_outages_that_ended() -> None:
    carrier = failing(failing(Outage("carrier"), 0, 10), 0, 300)  # an outage, still on
    payments = failing(Outage("payments"), 200, 220)  # failing, not an outage yet
    orders = report_answer(failing(failing(Outage("orders"), 0, 10), 0, 310), at(400), at(400))
    assert orders is not None
    old = replace(orders, past=(replace(orders.past[0], until=at(400) - PAST_DAYS * 2),))

    current, past = outage_rows([payments, carrier, orders, Outage("idle")], at(500))
    assert [(r.agent, r.since, r.alerted, r.until) for r in current] == [
        ("carrier", at(0), True, None),
        ("payments", at(200), False, None),
    ]
    assert [(r.agent, r.since, r.until) for r in past] == [("orders", at(0), at(400))]
    assert current[0].shown == {
        "since": "2030-01-01T12:00:00.000Z",
        "until": "-",
        "lastFailure": "2030-01-01T12:05:00.000Z",
    }
    assert outage_rows([old], at(500)) == ([], [])  # ended more than 7 days ago
