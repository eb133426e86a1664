"""The simulator as a real HTTP server on loopback, and its command line."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from simulator.faults import RandomFaults
from simulator.ledger import load_ledger
from simulator.server import SimulatorServer

#: A stop that did not wait for the hung call (which would hold it for an hour): far
#: from either, on a machine as busy as a shared runner.
PROMPT_SECONDS = 10

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.jsonl"


@pytest.fixture
def sim(ledger_path: Path) -> Iterator[SimulatorServer]:
    with SimulatorServer(ledger_path=ledger_path) as server:
        yield server


@pytest.fixture
def client(sim: SimulatorServer) -> Iterator[httpx.Client]:
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    with httpx.Client(base_url=sim.url, timeout=5.0, limits=limits) as http:
        yield http


def post(
    http: httpx.Client, order_id: str, step: str, *, timeout: float | None = None, **fields: Any
) -> httpx.Response:
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    return http.post(
        f"/{step}",
        json={"orderId": order_id, **fields},
        headers={"Idempotency-Key": f"{order_id}:{step}"},
        **kwargs,
    )


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met before the deadline")
        time.sleep(0.01)


def dropped(errors: list[Exception]) -> bool:
    """The one call the caller made ended with its connection dropped (the server let it
    go), not with the caller's own timeout (the hang went on)."""
    return len(errors) == 1 and not isinstance(errors[0], httpx.TimeoutException)


def hang_in_background(url: str) -> tuple[threading.Thread, list[Exception]]:
    """A call that hangs (applyFirst) on a thread; its error, if any, lands in the list."""
    errors: list[Exception] = []

    def hang() -> None:
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                post(http, "o-hang", "process", simulate={"process": "hang"})
        except httpx.HTTPError as exc:
            errors.append(exc)

    caller = threading.Thread(target=hang, daemon=True)
    caller.start()
    return caller, errors


def test_success_body(sim: SimulatorServer, client: httpx.Client) -> None:
    response = post(client, "o-1", "process", amount=10)
    assert response.status_code == 200
    answer = response.json()
    assert (answer["orderId"], answer["step"]) == ("o-1", "process")
    assert re.fullmatch(r"process-[0-9a-f]{8}", answer["confirmation"])
    assert datetime.fromisoformat(answer["appliedAt"]).utcoffset() is not None
    assert client.get("/_health").status_code == 200


def test_duplicate_returns_the_stored_answer_and_one_effect(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    first = post(client, "o-1", "process")
    second = post(client, "o-1", "process")
    assert second.status_code == 200
    assert second.content == first.content
    assert len(sim.effects()) == 1
    assert client.get("/_stats").json()["duplicatesSuppressed"] == 1


@pytest.mark.parametrize(
    ("headers", "content", "words"),
    [
        ({}, b'{"orderId": "o"}', "missing"),
        ({"Idempotency-Key": "o"}, b'{"orderId": "o"}', "does not match"),
        ({"Idempotency-Key": "o:other"}, b'{"orderId": "o"}', "does not match"),
        ({"Idempotency-Key": "o:process"}, b"[]", "JSON object"),
        ({"Idempotency-Key": "o:process"}, b"{oops", "not valid"),
        ({"Idempotency-Key": "o:process"}, b'{"orderId": "p"}', "orderId"),
        ({"Idempotency-Key": "o:process"}, b'{"callback": {"url": "x"}}', "callback"),
    ],
)
def test_bad_calls_are_400(
    client: httpx.Client, headers: dict[str, str], content: bytes, words: str
) -> None:
    response = client.post("/process", content=content, headers=headers)
    assert response.status_code == 400
    assert words in response.json()["error"]


def test_unknown_paths_are_404(client: httpx.Client) -> None:
    assert client.post("/Not_A_Step", json={"orderId": "o"}).status_code == 404
    assert client.get("/nothing").status_code == 404


def test_concurrent_calls_with_one_key_apply_once(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    # The latency keeps all twenty calls in flight together before any applies.
    simulate = {"process": {"latencyMs": 50}}
    with ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(
            pool.map(lambda _: post(client, "o-c", "process", simulate=simulate), range(20))
        )
    assert {r.status_code for r in responses} == {200}
    assert len({r.content for r in responses}) == 1
    assert len(sim.effects()) == 1
    assert sim.stats()["duplicatesSuppressed"] == 19


def test_transient_with_retry_after(sim: SimulatorServer, client: httpx.Client) -> None:
    simulate = {"process": {"fail": "transient", "times": 2, "status": 429, "retryAfter": 2}}
    first = post(client, "o-t", "process", simulate=simulate)
    assert (first.status_code, first.headers["Retry-After"]) == (429, "2")
    assert post(client, "o-t", "process", simulate=simulate).status_code == 429
    assert sim.effects() == []
    assert post(client, "o-t", "process", simulate=simulate).status_code == 200
    assert len(sim.effects()) == 1


def test_transient_shorthand_is_503(client: httpx.Client) -> None:
    response = post(client, "o-s", "process", simulate={"process": "transient:1"})
    assert response.status_code == 503
    assert "Retry-After" not in response.headers
    assert post(client, "o-s", "process", simulate={"process": "transient:1"}).status_code == 200


def test_permanent(sim: SimulatorServer, client: httpx.Client) -> None:
    simulate = {"charge-payment": {"fail": "permanent", "status": 402, "error": "Card declined."}}
    for _ in range(2):
        response = post(client, "o-p", "charge-payment", simulate=simulate)
        assert response.status_code == 402
        assert response.json() == {"error": "Card declined."}
    assert sim.effects() == []
    assert sim.stats()["byFault"] == {"permanent": 2}


def test_hang_applies_first_and_the_answer_is_lost(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    simulate = {"process": "hang:1"}
    with pytest.raises(httpx.ReadTimeout):
        post(client, "o-h", "process", timeout=0.3, simulate=simulate)
    wait_until(lambda: len(sim.effects()) == 1)
    retry = post(client, "o-h", "process", simulate=simulate)
    assert retry.status_code == 200
    assert retry.json() == sim.effects()[0]["response"]
    assert len(sim.effects()) == 1


def test_hang_without_apply_first_applies_late_and_once(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    simulate = {"process": {"fail": "hang", "seconds": 0.6, "applyFirst": False}}
    with pytest.raises(httpx.ReadTimeout):
        post(client, "o-l", "process", timeout=0.1, simulate=simulate)
    assert sim.effects() == []
    assert post(client, "o-l", "process", simulate=simulate).status_code == 200
    # The hung first call wakes, finds the effect applied, and applies nothing.
    wait_until(lambda: sim.stats()["duplicatesSuppressed"] == 1)
    assert len(sim.effects()) == 1


def test_a_short_hang_answers(sim: SimulatorServer, client: httpx.Client) -> None:
    simulate = {"process": {"fail": "hang", "seconds": 0.2}}
    assert post(client, "o-sh", "process", simulate=simulate).status_code == 200
    assert sim.stats()["byFault"] == {"hang": 1}  # it hung, then answered
    assert len(sim.effects()) == 1


def test_drop_closes_without_an_answer(sim: SimulatorServer, client: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, "o-d", "process", simulate={"process": "drop:1"})
    assert sim.effects() == []
    assert post(client, "o-d", "process", simulate={"process": "drop:1"}).status_code == 200
    assert len(sim.effects()) == 1


def test_drop_after_applying(sim: SimulatorServer, client: httpx.Client) -> None:
    simulate = {"process": {"fail": "drop", "times": 2, "applyFirst": True}}
    for _ in range(2):
        with pytest.raises(httpx.RemoteProtocolError):
            post(client, "o-da", "process", simulate=simulate)
    assert len(sim.effects()) == 1
    assert post(client, "o-da", "process", simulate=simulate).status_code == 200
    assert len(sim.effects()) == 1
    assert sim.stats()["noResponse"] == 2


def test_random_faults_give_up_after_the_bound(ledger_path: Path) -> None:
    faults = RandomFaults(transient_rate=1.0, max_per_key=2, seed=1)
    with SimulatorServer(faults=faults) as server, httpx.Client(base_url=server.url) as http:
        assert [post(http, "o-r", "process").status_code for _ in range(3)] == [503, 503, 200]
        assert server.stats()["randomFaults"] == 2


def test_compensations(sim: SimulatorServer, client: httpx.Client) -> None:
    charge = post(client, "o-1", "charge-payment").json()["charge"]
    refused = post(client, "o-1", "refund-payment")
    assert refused.status_code == 422 and "charge" in refused.json()["error"]
    post(client, "o-1", "refund-payment", charge=charge)
    post(client, "o-2", "release-stock")
    compensations = [e for e in sim.effects() if e["kind"] == "compensation"]
    assert [(e["orderId"], e["compensates"], e["undid"]) for e in compensations] == [
        ("o-1", "charge-payment", True),
        ("o-2", "reserve-stock", False),
    ]


def test_configured_compensations() -> None:
    with (
        SimulatorServer(compensations={"unship": "ship"}) as server,
        httpx.Client(base_url=server.url, timeout=5) as http,
    ):
        parcel = post(http, "o", "ship").json()["parcel"]
        post(http, "o", "unship", parcel=parcel)  # it undoes ship: it names ship's id
        post(http, "o", "release-stock")  # not a compensation in this map
        kinds = [(e["step"], e["kind"], e["undid"]) for e in server.effects()]
    assert kinds == [
        ("ship", "effect", None),
        ("unship", "compensation", True),
        ("release-stock", "effect", None),
    ]


def test_ledger_is_written_as_jsonl(
    sim: SimulatorServer, client: httpx.Client, ledger_path: Path
) -> None:
    post(client, "o-1", "reserve-stock", items=["boots"])
    post(client, "o-1", "charge-payment")
    post(client, "o-1", "reserve-stock")
    on_disk = load_ledger(ledger_path)
    assert [(e["seq"], e["step"]) for e in on_disk] == [(1, "reserve-stock"), (2, "charge-payment")]
    assert on_disk == sim.effects() == client.get("/_ledger").json()["effects"]
    entry = on_disk[0]
    assert entry["idempotencyKey"] == "o-1:reserve-stock"
    assert (entry["kind"], entry["compensates"], entry["undid"]) == ("effect", None, None)
    assert entry["request"] == {"orderId": "o-1", "items": ["boots"]}
    assert entry["ids"] == {"reservation": entry["response"]["reservation"]}


class Receiver:
    """The app's side of callbacks: an HTTP server on loopback that keeps what it gets and
    answers the statuses in ``answers`` in turn (then 200)."""

    def __init__(self, *answers: int) -> None:
        self.answers = list(answers)
        self.received: list[tuple[str, Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                receiver.received.append((self.path, json.loads(self.rfile.read(length))))
                status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    app = Receiver(503)  # the first callback meets a 503: tried again
    yield app
    app.close()


def callbacks(sim: SimulatorServer, count: int) -> list[dict[str, Any]]:
    wait_until(lambda: len([e for e in sim.effects() if e["kind"] == "callback"]) >= count)
    return [e for e in sim.effects() if e["kind"] == "callback"]


def test_a_call_that_asks_for_a_callback_is_accepted_then_called_back(
    sim: SimulatorServer, client: httpx.Client, receiver: Receiver
) -> None:
    url = f"{receiver.url}/api/orders/o-1/events/parcel-left"
    accepted = post(client, "o-1", "ship", callback={"url": url})
    assert accepted.status_code == 202
    answer = accepted.json()
    [delivered] = callbacks(sim, 1)
    assert receiver.received == [(url.removeprefix(receiver.url), {"result": answer})] * 2
    assert delivered["callback"] == {
        "url": url,
        "body": {"result": answer},
        "answer": 200,
        "tries": 2,
        "fault": None,
    }
    # asked again (the caller's deadline passed): the same answer, and called back again
    again = post(client, "o-1", "ship", callback={"url": url})
    assert (again.status_code, again.json()) == (202, answer)
    assert len(callbacks(sim, 2)) == 2 and receiver.received[-1][1] == {"result": answer}
    assert [e["kind"] for e in sim.effects()] == ["effect", "callback", "callback"]
    assert sim.stats()["effects"] == 1


def test_a_callback_the_app_refuses_is_not_tried_again(
    sim: SimulatorServer, client: httpx.Client
) -> None:
    app = Receiver(409)
    try:
        post(client, "o-2", "ship", callback={"url": f"{app.url}/api/orders/o-2/events/x"})
        [settled] = callbacks(sim, 1)
    finally:
        app.close()
    assert (settled["callback"]["answer"], settled["callback"]["tries"]) == (409, 1)


def test_a_refused_callback_says_so_and_applies_nothing(
    sim: SimulatorServer, client: httpx.Client, receiver: Receiver
) -> None:
    receiver.answers.clear()
    url = f"{receiver.url}/api/orders/o-3/events/parcel-left"
    simulate = {"ship": {"callback": "refuse:the depot is closed", "callbackMs": 0}}
    assert post(client, "o-3", "ship", callback={"url": url}, simulate=simulate).status_code == 202
    callbacks(sim, 1)
    assert receiver.received == [
        (url.removeprefix(receiver.url), {"refused": "the depot is closed"})
    ]
    assert [e["kind"] for e in sim.effects()] == ["callback"]


def test_stats_and_reset(sim: SimulatorServer, client: httpx.Client, ledger_path: Path) -> None:
    post(client, "o", "process", simulate={"process": "transient:1"})
    post(client, "o", "process", simulate={"process": "transient:1"})
    stats = client.get("/_stats").json()
    assert stats["calls"] == 2
    assert stats["byStatus"] == {"503": 1, "200": 1}
    assert stats["byFault"] == {"transient": 1}
    assert stats["effects"] == 1
    assert client.post("/_reset").status_code == 200
    assert client.get("/_stats").json()["calls"] == 0
    assert load_ledger(ledger_path) == []


def test_stop_is_prompt_with_a_hung_call_in_flight(ledger_path: Path) -> None:
    server = SimulatorServer().start()
    caller, errors = hang_in_background(server.url)
    wait_until(lambda: server.stats()["byFault"].get("hang") == 1)
    server.stop()
    caller.join(PROMPT_SECONDS)
    assert not caller.is_alive(), "the hung call still hangs after the stop"
    assert dropped(errors)  # the hung caller sees a dropped connection, not its own timeout


# --- the command line -------------------------------------------------------------


def start_cli(*args: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--port", "0", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=15)
    except queue.Empty:
        process.kill()
        raise AssertionError("the simulator did not print its URL") from None
    match = re.fullmatch(r"SIMULATOR_URL=(http://127\.0\.0\.1:\d+)\n", line)
    assert match, line
    return process, match.group(1)


def test_cli_serves_and_stops_promptly_on_sigterm(ledger_path: Path) -> None:
    process, url = start_cli("--ledger", str(ledger_path))
    try:
        with httpx.Client(base_url=url, timeout=5) as http:
            assert post(http, "o-cli", "process").status_code == 200
        caller, errors = hang_in_background(url)
        with httpx.Client(base_url=url, timeout=5) as http:
            wait_until(lambda: http.get("/_stats").json()["byFault"].get("hang") == 1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=PROMPT_SECONDS) == 0
        caller.join(PROMPT_SECONDS)
        assert dropped(errors)
        stdout, _ = process.communicate(timeout=5)
        assert stdout == ""  # exactly one line in all: the URL, already read
        steps = [(e["orderId"], e["step"]) for e in load_ledger(ledger_path)]
        assert steps == [("o-cli", "process"), ("o-hang", "process")]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def test_cli_compensations_add_a_teams_own_pairs_to_the_default_ones() -> None:
    """``make start SIMULATOR='--compensation cancel-card=issue-card'``: the ledger marks a
    team's own undo, and still the product's (``release-stock`` undoes ``reserve-stock``)."""
    process, url = start_cli("--no-ids", "--compensation", "cancel-card=issue-card")
    try:
        with httpx.Client(base_url=url, timeout=5) as http:
            for step in ("issue-card", "cancel-card", "reserve-stock", "release-stock"):
                assert post(http, "o-card", step).status_code == 200
            effects = http.get("/_ledger").json()["effects"]
        undone = {e["step"]: (e["compensates"], e["undid"]) for e in effects if e["compensates"]}
        assert undone == {
            "cancel-card": ("issue-card", True),
            "release-stock": ("reserve-stock", True),
        }
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(5)


def test_cli_refuses_bad_rates() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "simulator", "--transient-rate", "0.8", "--drop-rate", "0.8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2
    assert "rates" in result.stderr


def test_cli_starts_with_an_outage_schedule() -> None:
    process, url = start_cli("--outage", "error:503:2,unreachable:1")
    port = int(url.rsplit(":", 1)[1])

    def refused() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return False
        except ConnectionRefusedError:
            return True
        except ConnectionResetError:  # accepted into the backlog as the listener closed
            return False

    try:
        with httpx.Client(base_url=url, timeout=5) as http:
            # The first phase is in force before the URL is printed.
            assert post(http, "o-cli", "process").status_code == 503
            assert http.get("/_outage").json()["next"] == [{"mode": "unreachable", "seconds": 1.0}]
        wait_until(refused, timeout=5)
        wait_until(lambda: not refused(), timeout=5)
        with httpx.Client(base_url=url, timeout=5) as http:
            assert post(http, "o-cli", "process").status_code == 200
            stats = http.get("/_stats").json()
        assert (stats["outageAnswered"], stats["unreachablePhases"], stats["effects"]) == (1, 1, 1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def test_cli_refuses_a_bad_outage_schedule() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "simulator", "--outage", "unreachable:0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 2
    assert "--outage" in result.stderr and "> 0" in result.stderr
