"""The simulated service's own health endpoint (``simulator.healthcheck``): set healthy or
failing on its own, whatever the faults and the outage switch do to step calls. The
switch on a fake clock, then over HTTP on a loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from simulator import SimulatorServer
from simulator.healthcheck import HealthError, HealthSwitch


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_healthy_until_set_failing_and_again_when_its_time_is_over() -> None:
    clock = FakeClock()
    switch = HealthSwitch(clock)
    assert switch.answer() == (200, {"status": "healthy"})

    status = switch.set({"healthy": False, "seconds": 20})
    assert status == {"healthy": False, "status": 503, "remainingSeconds": 20.0, "probes": 1}
    assert switch.answer()[0] == 503
    clock.now += 19.9
    assert switch.answer()[0] == 503
    clock.now += 0.1
    assert switch.answer()[0] == 200
    assert switch.status()["probes"] == 4


def test_failing_without_seconds_lasts_until_set_healthy_and_reset_clears_everything() -> None:
    switch = HealthSwitch(FakeClock())
    switch.set({"healthy": False, "status": 500})
    assert switch.answer()[0] == 500
    assert switch.status()["remainingSeconds"] is None
    switch.set({"healthy": True})
    assert switch.answer()[0] == 200
    switch.set({"healthy": False})
    switch.reset()
    assert switch.status() == {
        "healthy": True,
        "status": 200,
        "remainingSeconds": None,
        "probes": 0,
    }


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {},
        {"healthy": "no"},
        {"healthy": True, "seconds": 3},
        {"healthy": False, "status": 200},
        {"healthy": False, "status": 302},
        {"healthy": False, "status": True},
        {"healthy": False, "seconds": 0},
        {"healthy": False, "seconds": 3601},
        {"healthy": False, "seconds": float("nan")},
        {"healthy": False, "until": 3},
    ],
)
def test_bad_control_input_is_refused_with_a_reason(body: Any) -> None:
    switch = HealthSwitch(FakeClock())
    with pytest.raises(HealthError):
        switch.set(body)
    assert switch.status()["healthy"]


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer() as server:
        yield server


def test_over_http_the_health_is_set_on_its_own_whatever_step_calls_get(
    sim: SimulatorServer,
) -> None:
    with httpx.Client(base_url=sim.url, timeout=5) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        order = {"orderId": "o-1"}
        key = {"Idempotency-Key": "o-1:process"}

        # failing health, step calls still served
        set_failing = http.post("/_healthcheck", json={"healthy": False, "seconds": 60})
        assert set_failing.status_code == 200 and set_failing.json()["healthy"] is False
        assert http.get("/health").status_code == 503
        assert http.post("/process", json=order, headers=key).status_code == 200
        assert http.get("/_healthcheck").json()["probes"] == 2

        # an outage of step calls, health healthy
        assert http.post("/_healthcheck", json={"healthy": True}).status_code == 200
        sim.outage({"mode": "error", "status": 503, "seconds": 60})
        other = {"Idempotency-Key": "o-2:process"}
        assert http.post("/process", json={"orderId": "o-2"}, headers=other).status_code == 503
        assert http.get("/health").status_code == 200
        sim.end_outage()

        refused = http.post("/_healthcheck", json={"healthy": False, "status": 200})
        assert refused.status_code == 400 and "status" in refused.json()["error"]
        assert http.post("/_healthcheck", content=b"{").status_code == 400
        http.post("/_healthcheck", json={"healthy": False})
        assert http.post("/_reset").status_code == 200
        assert http.get("/health").status_code == 200
