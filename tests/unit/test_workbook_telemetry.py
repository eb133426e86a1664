"""What the workbook in infra/ (``infra/app/workbook.json``) reads is what the services
emit: orders started and ended by workflow (``orders.orders_accepted``,
``orders.orders_ended``, from whichever role ends the order), the duration of each attempt
on the ``reply_applied`` log record, and the agents' answers by agent and kind
(``orders.agent_replies``). tests/infra/test_workbook.py checks the workbook's queries
against the names; this checks that the services really emit them, with those values.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from agents.agent import AgentWorker
from agents.outcomes import CallOutcome
from core.messages import AgentRequest
from core.outcome import Applied, Outcome
from core.states import OrderStatus
from observability.metrics import METRICS
from tests.unit.test_services_in_memory import (
    RecordingTransport,
    Services,
    build,
    expire,
    reply_to,
    stored,
    submit,
)

Point = tuple[str, int, dict[str, str]]


class _Counter:
    def __init__(self, name: str, points: list[Point]) -> None:
        self._name = name
        self._points = points

    def add(self, amount: int, attributes: dict[str, str]) -> None:
        self._points.append((self._name, amount, dict(attributes)))


class RecordingMeter:
    """An OpenTelemetry meter as ``Metrics`` uses it: counters that keep every add."""

    def __init__(self) -> None:
        self.points: list[Point] = []

    def create_counter(self, name: str) -> _Counter:
        return _Counter(name, self.points)

    def of(self, name: str) -> list[dict[str, str]]:
        return [attributes for n, _, attributes in self.points if n == name]


@pytest.fixture
def meter() -> Iterator[RecordingMeter]:
    recording = RecordingMeter()
    METRICS.use_meter(recording)
    try:
        yield recording
    finally:
        METRICS.use_meter(None)
        METRICS._counters.clear()


@pytest.fixture
def s() -> Services:
    return build()


def _reply_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == "reply_applied"]


def test_an_order_is_counted_started_and_ended_by_workflow_with_its_attempts_duration(
    s: Services, meter: RecordingMeter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    submit(s, "o-wb")
    [request] = s.transport.requests
    s.clock.advance(2.5)

    s.scheduler.apply_reply(reply_to(request))

    assert meter.of("orders.orders_accepted") == [{"workflow": "order"}]
    assert meter.of("orders.orders_ended") == [{"workflow": "order", "status": "completed"}]
    [record] = _reply_records(caplog)
    fields: dict[str, Any] = record.__dict__
    assert fields["durationMs"] == 2500  # claim to report: the console timeline's bar
    assert (fields["step"], fields["attempt"], fields["orderId"]) == ("process", 1, "o-wb")
    assert fields["agent"] == stored(s, "o-wb").plan.agent_of("process")
    assert (fields["workflow"], fields["outcome"], fields["effect"]) == (
        "order",
        "succeeded",
        "applied",
    )


def test_an_order_the_supervisor_fails_is_counted_ended_in_error(
    s: Services, meter: RecordingMeter
) -> None:
    submit(s, "o-slow")
    for _ in range(2):
        expire(s)
        s.scheduler.dispatch("o-slow")
    expire(s)

    assert stored(s, "o-slow").status is OrderStatus.ERROR
    assert meter.of("orders.orders_ended") == [{"workflow": "order", "status": "error"}]


def test_a_change_that_leaves_the_order_unfinished_counts_nothing_ended(
    s: Services, meter: RecordingMeter
) -> None:
    submit(s, "o-slow")
    expire(s)  # retried: still processing
    assert meter.of("orders.orders_ended") == []


def test_a_late_report_carries_no_duration(
    s: Services, meter: RecordingMeter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    submit(s, "o-late")
    [request] = s.transport.requests
    expire(s)  # attempt 1 ended with no report; retried
    late = reply_to(request, Outcome.TRANSIENT, error="503", applied="no")

    s.scheduler.apply_reply(late)

    [record] = _reply_records(caplog)
    assert record.__dict__["effect"] == "noted" and "durationMs" not in record.__dict__


class _Remote:
    def __init__(self, outcome: CallOutcome) -> None:
        self._outcome = outcome

    async def call(self, request: AgentRequest) -> CallOutcome:
        return self._outcome


@pytest.mark.parametrize(
    ("outcome", "kind", "applied"),
    [
        (CallOutcome(Outcome.SUCCEEDED, result={}), "succeeded", "yes"),
        (CallOutcome(Outcome.REFUSED, error="422"), "failed", "no"),
        (CallOutcome(Outcome.TRANSIENT, error="503", applied=Applied.NO), "transient", Applied.NO),
        (
            CallOutcome(Outcome.TRANSIENT, error="500", applied=Applied.MAYBE),
            "transient",
            Applied.MAYBE,
        ),
        (CallOutcome(Outcome.DEFERRED, error="circuit open"), "deferred", "no"),
    ],
)
def test_an_agents_answer_is_counted_by_agent_outcome_and_applied(
    s: Services, meter: RecordingMeter, outcome: CallOutcome, kind: str, applied: str
) -> None:
    submit(s, "o-agent")
    [request] = s.transport.requests
    worker = AgentWorker(_Remote(outcome), RecordingTransport(), s.clock)  # type: ignore[arg-type]

    assert asyncio.run(worker.handle(request)) == Outcome.of_wire(kind)

    assert request.agent
    assert meter.of("orders.agent_replies") == [
        {"outcome": kind, "applied": applied, "agent": request.agent}
    ]
