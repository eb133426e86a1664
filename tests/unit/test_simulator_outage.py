"""Outage control input, the error switch on a fake clock, and the call log, without HTTP."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from simulator.calllog import CallLog, format_us, parse_since
from simulator.engine import Simulator
from simulator.outage import (
    OutageError,
    OutageSwitch,
    Phase,
    parse_outage,
    parse_outage_body,
    parse_outage_cli,
)


def body(order_id: str = "o-1", **fields: object) -> bytes:
    return json.dumps({"orderId": order_id, **fields}).encode()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- control input -----------------------------------------------------------


def test_single_phases_and_defaults() -> None:
    assert parse_outage({"mode": "error", "seconds": 20}) == [Phase("error", 20.0, 503)]
    assert parse_outage({"mode": "error", "status": 429, "seconds": 0.5, "retryAfter": 3}) == [
        Phase("error", 0.5, 429, 3)
    ]
    assert parse_outage({"mode": "unreachable", "seconds": 15}) == [Phase("unreachable", 15.0)]
    assert parse_outage({"mode": "off"}) == []


def test_a_schedule() -> None:
    phases = parse_outage(
        {
            "phases": [
                {"mode": "error", "status": 503, "seconds": 20},
                {"mode": "unreachable", "seconds": 15},
                {"mode": "error", "status": 500, "seconds": 1, "retryAfter": 0},
            ]
        }
    )
    assert phases == [
        Phase.error(20),
        Phase.unreachable(15),
        Phase.error(1, status=500, retry_after=0),
    ]
    assert [phase.to_json()["mode"] for phase in phases] == ["error", "unreachable", "error"]


@pytest.mark.parametrize("status", [500, 502, 503, 599, 408, 425, 429])
def test_transient_statuses_are_accepted(status: int) -> None:
    assert parse_outage({"mode": "error", "status": status, "seconds": 1})[0].status == status


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ([], "JSON object"),
        ("error", "JSON object"),
        ({}, "'mode'"),
        ({"mode": "down", "seconds": 1}, "'mode' must be"),
        ({"mode": ["error"], "seconds": 1}, "'mode' must be"),
        ({"mode": "error"}, "'seconds' is required"),
        ({"mode": "unreachable"}, "'seconds' is required"),
        ({"mode": "unreachable", "seconds": 0}, "> 0"),
        ({"mode": "unreachable", "seconds": -1}, "> 0"),
        ({"mode": "unreachable", "seconds": 3601}, "<= 3600"),
        ({"mode": "unreachable", "seconds": "5"}, "number"),
        ({"mode": "unreachable", "seconds": True}, "number"),
        ({"mode": "error", "seconds": float("inf")}, "number"),
        ({"mode": "error", "seconds": 1, "status": 404}, "'status' must be"),
        ({"mode": "error", "seconds": 1, "status": 200}, "'status' must be"),
        ({"mode": "error", "seconds": 1, "status": 600}, "'status' must be"),
        ({"mode": "error", "seconds": 1, "status": "503"}, "'status' must be"),
        ({"mode": "error", "seconds": 1, "retryAfter": -1}, "'retryAfter'"),
        ({"mode": "error", "seconds": 1, "retryAfter": 1.5}, "'retryAfter'"),
        ({"mode": "unreachable", "seconds": 1, "status": 503}, "do not apply to unreachable"),
        ({"mode": "unreachable", "seconds": 1, "retryAfter": 1}, "do not apply"),
        ({"mode": "off", "seconds": 1}, "do not apply to off"),
        ({"mode": "error", "seconds": 1, "colour": "red"}, "colour"),
        ({"phases": []}, "non-empty list"),
        ({"phases": {"mode": "error"}}, "non-empty list"),
        ({"phases": [{"mode": "off"}]}, "'off' is not a phase"),
        ({"phases": ["error"]}, "phase 1"),
        ({"phases": [{"mode": "error", "seconds": 1}, {"mode": "x"}]}, "phase 2"),
        ({"phases": [{"mode": "error", "seconds": 1}], "mode": "off"}, "not both"),
        ({"phases": [{"mode": "unreachable", "seconds": 3000}] * 2}, "at most 3600 s"),
        ({"phases": [{"mode": "error", "seconds": 1}] * 101}, "At most 100 phases"),
    ],
)
def test_bad_control_input_is_refused(raw: Any, words: str) -> None:
    with pytest.raises(OutageError) as caught:
        parse_outage(raw)
    assert words in str(caught.value)


def test_the_raw_body() -> None:
    assert parse_outage_body(b'{"mode": "off"}') == []
    for bad in (b"{oops", b"\xff", b""):
        with pytest.raises(OutageError, match="not valid"):
            parse_outage_body(bad)


def test_command_line_form() -> None:
    assert parse_outage_cli("error:503:20,unreachable:15") == [
        Phase.error(20, status=503),
        Phase.unreachable(15),
    ]
    assert parse_outage_cli("error:429:0.5:2") == [Phase.error(0.5, status=429, retry_after=2)]
    assert parse_outage_cli(" unreachable:1 , error:500:1 ") == [
        Phase.unreachable(1),
        Phase.error(1, status=500),
    ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "is not"),
        ("error:20", "is not"),
        ("error:503", "is not"),
        ("error:503:x", "is not"),
        ("unreachable", "is not"),
        ("unreachable:1:2", "is not"),
        ("off", "is not"),
        ("error:503:20,", "is not"),
        ("error:404:20", "'status' must be"),
        ("unreachable:0", "> 0"),
        ("unreachable:2000,unreachable:2000", "at most 3600"),
    ],
)
def test_bad_command_line_forms(text: str, words: str) -> None:
    with pytest.raises(OutageError) as caught:
        parse_outage_cli(text)
    assert words in str(caught.value)


def test_phases_built_in_code_are_checked_too() -> None:
    with pytest.raises(OutageError):
        Phase.error(0)
    with pytest.raises(OutageError):
        Phase.error(1, status=404)
    with pytest.raises(OutageError):
        Phase.unreachable(3601)
    with pytest.raises(OutageError):
        Phase("unreachable", 1.0, status=503)
    with pytest.raises(OutageError):
        Phase("off", 1.0)  # type: ignore[arg-type]


# --- the error switch ----------------------------------------------------------


def test_switch_answers_until_its_time_is_up() -> None:
    clock = FakeClock()
    switch = OutageSwitch(clock)
    assert switch.current() is None
    switch.set_error(Phase.error(5, status=503, retry_after=2))
    answer = switch.current()
    assert answer is not None
    assert (answer.status, answer.headers) == (503, (("Retry-After", "2"),))
    assert "outage" in json.loads(answer.body)["error"]
    clock.now += 4.999
    assert switch.current() is answer
    clock.now += 0.001
    assert switch.current() is None  # expired by itself: nobody has to clear it


def test_switch_clear_and_explicit_end() -> None:
    clock = FakeClock()
    switch = OutageSwitch(clock)
    switch.set_error(Phase.error(60, status=429), until=clock.now + 1)
    answer = switch.current()
    assert answer is not None and answer.headers == ()
    switch.clear()
    assert switch.current() is None
    with pytest.raises(OutageError):
        switch.set_error(Phase.unreachable(1))


def test_error_outage_applies_nothing_and_counts_no_call_per_key() -> None:
    clock = FakeClock()
    sim = Simulator(outage=OutageSwitch(clock))
    sim.outage.set_error(Phase.error(10, status=503, retry_after=1))
    simulate = {"process": "transient:1"}
    for _ in range(3):
        outcome = sim.handle("process", "o-1:process", body(simulate=simulate))
        assert (outcome.status, outcome.headers) == (503, (("Retry-After", "1"),))
    # Even a call that breaks the protocol gets the outage answer: the service is down.
    assert sim.handle("process", None, b"{oops").status == 503
    assert sim.effects() == []
    clock.now += 10
    # The directive's first call is still ahead: the outage did not consume it.
    assert sim.handle("process", "o-1:process", body(simulate=simulate)).status == 503
    assert sim.handle("process", "o-1:process", body(simulate=simulate)).status == 200
    stats = sim.stats()
    assert stats["outageAnswered"] == 4
    assert stats["calls"] == 6
    assert stats["byStatus"] == {"503": 5, "200": 1}
    assert stats["byFault"] == {"transient": 1}
    faults = [(c["answer"], c["fault"], c["applied"]) for c in sim.calls()]
    assert faults == [(503, "outage", False)] * 4 + [(503, "transient", False), (200, None, True)]


# --- the call log ------------------------------------------------------------


def test_call_log_records_answers_and_applied() -> None:
    sim = Simulator()
    sim.handle("process", "o-1:process", body())
    sim.handle("process", "o-1:process", body())
    sim.handle(
        "ship", "o-2:ship", body("o-2", simulate={"ship": {"fail": "drop", "applyFirst": True}})
    )
    sim.handle("ship", "o-3:ship", body("o-3", simulate={"ship": "permanent"}))
    sim.handle("ship", "wrong", body("o-4"))
    calls = sim.calls()
    assert [
        (c["step"], c["idempotencyKey"], c["answer"], c["applied"], c["fault"]) for c in calls
    ] == [
        ("process", "o-1:process", 200, True, None),
        ("process", "o-1:process", 200, False, None),
        ("ship", "o-2:ship", "dropped", True, "drop"),
        ("ship", "o-3:ship", 422, False, "permanent"),
        ("ship", "wrong", 400, False, "invalid"),
    ]
    for call in calls:
        at = datetime.fromisoformat(call["at"])
        assert at.utcoffset() == timedelta(0)
        assert call["at"].endswith("Z") and len(call["at"]) == len("2025-01-02T03:04:05.123456Z")
    sim.reset()
    assert sim.calls() == []


def test_call_log_is_a_bounded_ring() -> None:
    log = CallLog(capacity=3)
    for n in range(5):
        log.record(n, "s", f"k{n}", 200, True, None)
    assert [c["idempotencyKey"] for c in log.entries()] == ["k2", "k3", "k4"]
    assert (len(log), log.evicted) == (3, 2)
    log.clear()
    assert (len(log), log.evicted) == (0, 0)
    with pytest.raises(ValueError, match="capacity"):
        CallLog(capacity=0)


def test_since_is_inclusive_exact_and_sorted() -> None:
    log = CallLog()
    base = parse_since("2025-01-02T03:04:05.000000Z")
    # Appended in completion order; "at" is arrival, so a slow call comes in late.
    for offset, key in ((0, "a"), (2, "c"), (1, "b"), (3, "d")):
        log.record(base + offset, "s", key, 200, False, None)
    assert [c["idempotencyKey"] for c in log.entries()] == ["a", "b", "c", "d"]
    since = format_us(base + 1)
    assert since == "2025-01-02T03:04:05.000001Z"
    assert [c["idempotencyKey"] for c in log.entries(since)] == ["b", "c", "d"]
    as_offset = "2025-01-02T04:04:05.000002+01:00"
    assert [c["idempotencyKey"] for c in log.entries(as_offset)] == ["c", "d"]
    assert [c["idempotencyKey"] for c in log.entries("2025-01-02T03:04:05.000003")] == ["d"]
    moment = datetime(2025, 1, 2, 3, 4, 5, 2, tzinfo=UTC)
    assert [c["idempotencyKey"] for c in log.entries(moment)] == ["c", "d"]
    eastern = moment.astimezone(timezone(timedelta(hours=-5)))
    assert [c["idempotencyKey"] for c in log.entries(eastern)] == ["c", "d"]
    assert log.entries("2030-01-01T00:00:00Z") == []


@pytest.mark.parametrize("text", ["yesterday", "", "2025-13-01T00:00:00Z", "12:00"])
def test_bad_since_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="ISO-8601"):
        CallLog().entries(text)
