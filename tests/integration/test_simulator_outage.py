"""The simulator's outage switch and call log over real HTTP on loopback.

Every wait polls with a deadline; outages last a second or two at most.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from simulator.outage import Phase
from simulator.server import HOST, SimulatorServer

#: A stop that did not wait for the hung call (which would hold it for an hour): far
#: from either, on a machine as busy as a shared runner.
PROMPT_SECONDS = 10


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer() as server:
        yield server


@pytest.fixture
def client(sim: SimulatorServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=5.0) as http:
        yield http


def post(http: httpx.Client, order_id: str, step: str = "process", **fields: Any) -> httpx.Response:
    return http.post(
        f"/{step}",
        json={"orderId": order_id, **fields},
        headers={"Idempotency-Key": f"{order_id}:{step}"},
    )


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.01)


def refused(port: int) -> bool:
    """True if a TCP connect to the port is refused (ECONNREFUSED), False if accepted (or
    reset by a listener closing as it came)."""
    try:
        with socket.create_connection((HOST, port), timeout=2):
            return False
    except ConnectionRefusedError as exc:
        assert exc.errno == errno.ECONNREFUSED
        return True
    except ConnectionResetError:  # accepted into the backlog as the listener closed: not yet
        return False


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/_health", timeout=2).status_code == 200
    except httpx.ConnectError:
        return False


# --- error outages -------------------------------------------------------------


def test_error_outage_answers_503_and_applies_nothing(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    assert post(client, "o-before").status_code == 200
    ledger_before = client.get("/_ledger").json()["effects"]
    control = client.post(
        "/_outage", json={"mode": "error", "status": 503, "seconds": 30, "retryAfter": 2}
    )
    assert control.status_code == 200
    assert control.json()["mode"] == "error"
    for order_id in ("o-during", "o-before"):  # a new key and an applied one
        response = post(client, order_id)
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "2"
        assert "outage" in response.json()["error"]
    assert client.get("/_ledger").json()["effects"] == ledger_before
    status = client.get("/_outage").json()
    assert status["mode"] == "error" and status["status"] == 503
    assert 0 < status["remainingSeconds"] <= 30
    # The control endpoints keep working during an error outage.
    assert client.get("/_health").status_code == 200

    assert client.post("/_outage", json={"mode": "off"}).json()["mode"] == "off"
    assert client.get("/_outage").json() == {
        "mode": "off",
        "remainingSeconds": 0,
        "next": [],
        "totalRemainingSeconds": 0,
    }
    assert post(client, "o-during").status_code == 200
    assert post(client, "o-before").json() == ledger_before[0]["response"]  # the stored answer
    assert [e["orderId"] for e in sim.effects()] == ["o-before", "o-during"]
    stats = client.get("/_stats").json()
    assert stats["outageAnswered"] == 2
    assert stats["byStatus"] == {"200": 3, "503": 2}
    assert stats["duplicatesSuppressed"] == 1


def test_error_outage_ends_by_itself(sim: SimulatorServer, client: httpx.Client) -> None:
    client.post("/_outage", json={"mode": "error", "status": 429, "seconds": 0.5})
    assert post(client, "o-1").status_code == 429
    wait_until(lambda: post(client, "o-1").status_code == 200)
    assert sim.wait_outage_end(2)
    assert client.get("/_outage").json()["mode"] == "off"
    assert len(sim.effects()) == 1


def test_a_new_outage_replaces_the_running_one(sim: SimulatorServer, client: httpx.Client) -> None:
    client.post("/_outage", json={"mode": "error", "status": 503, "seconds": 60})
    client.post("/_outage", json={"mode": "error", "status": 500, "seconds": 60})
    assert post(client, "o-1").status_code == 500
    sim.end_outage()
    assert post(client, "o-1").status_code == 200


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"{oops", "not valid"),
        (b'{"mode": "unreachable"}', "'seconds' is required"),
        (b'{"mode": "unreachable", "seconds": 3601}', "<= 3600"),
        (b'{"mode": "error", "status": 404, "seconds": 1}', "'status' must be"),
        (b'{"mode": "down", "seconds": 1}', "'mode' must be"),
        (b'{"phases": []}', "non-empty list"),
    ],
)
def test_bad_control_input_is_a_400(
    sim: SimulatorServer, client: httpx.Client, content: bytes, words: str
) -> None:
    response = client.post("/_outage", content=content)
    assert response.status_code == 400
    assert words in response.json()["error"]
    assert client.get("/_outage").json()["mode"] == "off"
    assert sim.listening


# --- unreachable outages -----------------------------------------------------------


def test_unreachable_refuses_connections_then_listens_again_on_the_same_port(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    port = sim.port
    applied = post(client, "o-1")
    assert applied.status_code == 200
    control = client.post("/_outage", json={"mode": "unreachable", "seconds": 1.0})
    assert control.status_code == 200  # the answer arrives...
    assert control.json()["mode"] == "unreachable"
    assert control.headers["Connection"] == "close"
    # ...and by then the port already refuses: no accepted-then-dropped connections.
    assert refused(port)
    with pytest.raises(httpx.ConnectError):
        post(client, "o-1")  # the keep-alive client reconnects, and is refused
    with httpx.Client(base_url=sim.url, timeout=2) as fresh, pytest.raises(httpx.ConnectError):
        fresh.get("/_health")
    wait_until(lambda: answers(sim.url), timeout=5)
    # It listens again because its phase ended, by the simulator's own schedule: not early.
    assert sim.outage_status()["mode"] == "off"
    assert sim.port == port and sim.listening
    # State survived: the applied key is still deduplicated.
    repeat = post(client, "o-1")
    assert repeat.status_code == 200
    assert repeat.content == applied.content
    assert len(sim.effects()) == 1
    stats = client.get("/_stats").json()
    assert (stats["duplicatesSuppressed"], stats["unreachablePhases"]) == (1, 1)
    assert sim.wait_outage_end(2)


def test_unreachable_cuts_open_keep_alive_connections(sim: SimulatorServer) -> None:
    with socket.create_connection((HOST, sim.port), timeout=5) as conn:
        conn.sendall(b"GET /_health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        sim.start_outage([Phase.unreachable(30)])
        # not listening, and the connection closed by the server, promptly (timeout 5 s)
        assert (sim.listening, conn.recv(4096)) == (False, b"")
    sim.end_outage()  # ends an unreachable phase early (in-process only, of course)
    assert sim.listening and answers(sim.url)


def test_unreachable_cuts_a_call_in_flight(sim: SimulatorServer) -> None:
    errors: list[Exception] = []

    def hang() -> None:
        try:
            with httpx.Client(base_url=sim.url, timeout=10) as http:
                post(http, "o-hang", simulate={"process": "hang"})
        except httpx.HTTPError as exc:
            errors.append(exc)

    caller = threading.Thread(target=hang, daemon=True)
    caller.start()
    wait_until(lambda: sim.stats()["byFault"].get("hang") == 1)
    sim.start_outage([Phase.unreachable(30)])
    caller.join(5)
    assert not caller.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], httpx.RemoteProtocolError)
    sim.end_outage()


def test_a_schedule_runs_error_then_unreachable_then_back(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    port = sim.port
    since = datetime.now(UTC).isoformat()
    schedule = {
        "phases": [
            {"mode": "error", "status": 503, "seconds": 1.5},
            {"mode": "unreachable", "seconds": 1.0},
        ]
    }
    control = client.post("/_outage", json=schedule)
    assert control.status_code == 200
    assert control.json()["next"] == [{"mode": "unreachable", "seconds": 1.0}]
    assert post(client, "o-1").status_code == 503
    wait_until(lambda: refused(port), timeout=5)
    wait_until(lambda: answers(sim.url), timeout=5)
    assert post(client, "o-1").status_code == 200
    assert sim.wait_outage_end(2)

    calls = client.get("/_calls", params={"since": since}).json()["calls"]
    assert {(c["answer"], c["fault"]) for c in calls[:-1]} == {(503, "outage")}
    assert (calls[-1]["answer"], calls[-1]["applied"]) == (200, True)
    stats = sim.stats()
    assert stats["unreachablePhases"] == 1 and stats["outageAnswered"] == len(calls) - 1
    assert len(sim.effects()) == 1


def test_stop_during_an_unreachable_phase_is_prompt_and_final() -> None:
    server = SimulatorServer().start()
    port = server.port
    server.outage({"mode": "unreachable", "seconds": 3600})
    stopping = threading.Thread(target=server.stop, daemon=True)
    stopping.start()
    stopping.join(PROMPT_SECONDS)
    assert not stopping.is_alive(), "the stop waits for the hour's unreachable phase to end"
    assert refused(port) and not server.listening
    with pytest.raises(RuntimeError):
        server.start_outage([Phase.error(1)])


# --- the call log ----------------------------------------------------------------


def test_call_log_lists_calls_with_times_and_answers(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    post(client, "o-1")
    middle = datetime.now(UTC)
    post(client, "o-1")
    post(client, "o-2", simulate={"process": "transient:1"})
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, "o-3", simulate={"process": {"fail": "drop", "applyFirst": True}})
    sim.outage({"mode": "error", "status": 502, "seconds": 30})
    post(client, "o-4")
    sim.end_outage()

    everything = client.get("/_calls").json()
    assert (everything["evicted"], everything["capacity"]) == (0, 200_000)
    rows = [
        (c["idempotencyKey"], c["answer"], c["applied"], c["fault"]) for c in everything["calls"]
    ]
    assert rows == [
        ("o-1:process", 200, True, None),
        ("o-1:process", 200, False, None),
        ("o-2:process", 503, False, "transient"),
        ("o-3:process", "dropped", True, "drop"),
        ("o-4:process", 502, False, "outage"),
    ]
    times = [datetime.fromisoformat(c["at"]) for c in everything["calls"]]
    assert times == sorted(times) and all(t.utcoffset() is not None for t in times)
    assert everything["calls"] == sim.calls()

    for since in (middle.isoformat(), middle.isoformat().replace("+00:00", "Z")):
        later = client.get("/_calls", params={"since": since}).json()["calls"]
        assert later == everything["calls"][1:]
        assert sim.calls(since=since) == later
    assert sim.calls(since=middle) == everything["calls"][1:]


@pytest.mark.parametrize(
    ("query", "words"),
    [("?since=yesterday", "ISO-8601"), ("?limit=3", "Unknown parameter")],
)
def test_bad_call_log_queries_are_a_400(client: httpx.Client, query: str, words: str) -> None:
    response = client.get(f"/_calls{query}")
    assert response.status_code == 400
    assert words in response.json()["error"]
