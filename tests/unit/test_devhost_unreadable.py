"""A queue devhost cannot read (every receive fails for a minute: a poisoned batch under
Azurite, rights revoked in Azure) raises one operator alert naming it, and one when it
reads again; devhost's own log (its stderr, the file ``make run`` keeps) says so.
With a fake receive that always fails and a fake clock."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError

from core.names import OPERATOR_ALERTS
from devhost.unreadable import UNREADABLE_AFTER_SECONDS, UnreadableQueues
from tests.unit.test_devhost_queues import Clock, listener, recorder

T0 = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


class Alerts:
    def __init__(self, fail: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail = fail

    def __call__(self, queue: str, body: str) -> None:
        if self.fail:
            raise HttpResponseError(message="the alerts queue cannot be written either")
        assert queue == OPERATOR_ALERTS
        self.sent.append(json.loads(body))


def tracker(clock: Clock, alerts: Alerts) -> UnreadableQueues:
    start = clock.now
    return UnreadableQueues(
        alerts, clock=clock, now=lambda: T0 + timedelta(seconds=clock.now - start)
    )


def test_a_minute_of_failed_receives_is_one_alert_and_reading_again_one_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, alerts = Clock(), Alerts()
    health = tracker(clock, alerts)
    with caplog.at_level(logging.INFO, logger="devhost"):
        for _ in range(60):  # a failure a second, for a minute less a second
            health.failed("orders", "AuthorizationPermissionMismatch")
            clock.now += 1
        assert alerts.sent == []
        health.failed("orders", "AuthorizationPermissionMismatch")  # 60 s after the first
        for _ in range(100):
            health.failed("orders", "still failing")
            clock.now += 1
        health.failed("order-dispatch", "another queue: its own episode")
        health.read("orders")
        health.read("orders")  # reading on: nothing more
    assert alerts.sent == [
        {
            "kind": "queue-unreadable",
            "queue": "orders",
            "since": "2026-11-28T09:00:00.000Z",
            "reason": "every receive from orders has failed for 60 s; the last: "
            "AuthorizationPermissionMismatch. Its messages wait (none is lost): fix the "
            "cause (the identity's rights on the queue, a message the storage cannot "
            "return) and they are read again",
            "at": "2026-11-28T09:01:00.000Z",
        },
        {
            "kind": "queue-recovered",
            "queue": "orders",
            "since": "2026-11-28T09:00:00.000Z",
            "reason": "orders is read again",
            "at": "2026-11-28T09:02:40.000Z",
        },
    ]
    logged = [r for r in caplog.records if r.name.startswith("devhost")]
    assert [r.levelno for r in logged] == [logging.WARNING, logging.WARNING]
    assert "cannot read queue orders for 60 s" in logged[0].getMessage()
    assert "queue orders is read again" in logged[1].getMessage()


def test_a_short_failure_raises_nothing() -> None:
    clock, alerts = Clock(), Alerts()
    health = tracker(clock, alerts)
    health.failed("orders", "timeout")
    clock.now += UNREADABLE_AFTER_SECONDS - 1
    health.read("orders")  # the episode ends before its minute
    clock.now += 5
    health.failed("orders", "timeout")  # a new one starts from here
    assert alerts.sent == []


def test_an_alert_that_cannot_be_sent_is_logged_and_tried_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, alerts = Clock(), Alerts(fail=True)
    health = tracker(clock, alerts)
    with caplog.at_level(logging.WARNING, logger="devhost"):
        for _ in range(200):
            health.failed("orders", "connection refused")
            clock.now += 1
    failures = [r for r in caplog.records if "could not send" in r.getMessage()]
    assert 2 <= len(failures) <= 4  # once a minute, not once a receive
    alerts.fail = False
    clock.now += UNREADABLE_AFTER_SECONDS
    health.failed("orders", "connection refused")
    assert [a["kind"] for a in alerts.sent] == ["queue-unreadable"]


def test_the_listener_reports_each_receive_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll loop whose every receive fails, then one that works: one alert of each."""
    clock, alerts = Clock(), Alerts()
    got: list[Any] = []
    built, queue, _ = listener(recorder(got), clock=clock)
    built.unreadable = tracker(clock, alerts)
    stop = threading.Event()
    rounds = 0

    def receive(count: int, visibility_seconds: int) -> list[Any]:
        if rounds < 80:
            raise HttpResponseError(message="InvalidXmlDocument: a poisoned batch")
        return []

    def back_off(_: threading.Event, seconds: float) -> bool:
        nonlocal rounds
        rounds += 1
        clock.now += 1  # a second between polls
        if rounds == 85:
            stop.set()
        return False

    monkeypatch.setattr(queue, "receive", receive)
    monkeypatch.setattr(built, "_back_off", back_off)
    built.poll(stop)
    assert [(a["kind"], a["queue"]) for a in alerts.sent] == [
        ("queue-unreadable", "q"),
        ("queue-recovered", "q"),
    ]
    assert "a poisoned batch" in alerts.sent[0]["reason"]
