"""The simulator's managed identity endpoint (App Service protocol, as azure-identity 1.27
speaks it through MSAL) and the steps that require its tokens (``simulator.identity``),
over HTTP on a simulator in process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from simulator import SimulatorServer, identity
from simulator.__main__ import build_parser
from simulator.identity import IdentityEndpoint, audience_of, parse_rule

SECRET = "s3cret"


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer(identity_header=SECRET, require_token={"ship": "api://carrier"}) as s:
        yield s


def token(sim: SimulatorServer, resource: str = "api://carrier", **params: str) -> httpx.Response:
    """The request MSAL's ``_obtain_token_on_app_service`` makes."""
    return httpx.get(
        sim.identity_endpoint,
        params={"api-version": "2019-08-01", "resource": resource, **params},
        headers={"X-IDENTITY-HEADER": SECRET, "Metadata": "true"},
    )


def ship(sim: SimulatorServer, authorization: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": "o-1:ship"}
    if authorization is not None:
        headers["Authorization"] = authorization
    return httpx.post(f"{sim.url}/ship", json={"orderId": "o-1"}, headers=headers)


def test_a_token_answer_has_what_msal_reads(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeTime()
    clock.now = 1_900_000_000.5
    monkeypatch.setattr(identity, "time", clock)

    answer = token(sim, client_id="cid-1")

    assert answer.status_code == 200
    body = answer.json()
    assert set(body) == {"access_token", "expires_on", "resource", "token_type", "client_id"}
    assert body["access_token"].startswith("sim-")
    assert body["resource"] == "api://carrier"
    assert body["token_type"] == "Bearer"
    assert body["client_id"] == "cid-1"
    assert body["expires_on"] == str(1_900_000_000 + 24 * 3600)  # epoch seconds, as text
    assert sim.identity.status()["identities"] == ["client_id:cid-1"]


@pytest.mark.parametrize(
    ("headers", "params", "code", "words"),
    [
        ({}, {}, 401, "X-IDENTITY-HEADER header is missing or wrong"),
        ({"X-IDENTITY-HEADER": "guess"}, {}, 401, "X-IDENTITY-HEADER header is missing or wrong"),
        ({"X-IDENTITY-HEADER": SECRET}, {"api-version": "2018-02-01"}, 400, "api-version"),
        ({"X-IDENTITY-HEADER": SECRET}, {"resource": ""}, 400, "resource is required"),
        ({"X-IDENTITY-HEADER": SECRET}, {"client_id": "a", "object_id": "b"}, 400, "at most one"),
    ],
)
def test_a_wrong_token_request_gets_app_services_error_shape(
    sim: SimulatorServer, headers: dict[str, str], params: dict[str, str], code: int, words: str
) -> None:
    query = {"api-version": "2019-08-01", "resource": "api://carrier", **params}

    answer = httpx.get(sim.identity_endpoint, params=query, headers=headers)

    assert answer.status_code == code
    assert answer.json()["statusCode"] == code
    assert words in answer.json()["message"]
    assert sim.identity.issued == 0


def test_without_a_secret_any_non_empty_header_is_accepted() -> None:
    endpoint = IdentityEndpoint()
    query = "api-version=2019-08-01&resource=api%3A%2F%2Fx"

    assert endpoint.issue(query, "anything").status == 200
    assert endpoint.issue(query, "").status == 401
    assert endpoint.issue(query, None).status == 401


def test_a_protected_step_needs_a_token_for_its_audience(sim: SimulatorServer) -> None:
    good = token(sim).json()["access_token"]
    other = token(sim, "api://payments").json()["access_token"]

    missing = ship(sim)
    wrong_scheme = ship(sim, f"Basic {good}")
    forged = ship(sim, "Bearer sim-forged")
    elsewhere = ship(sim, f"Bearer {other}")
    fine = ship(sim, f"Bearer {good}")

    assert missing.status_code == wrong_scheme.status_code == 401
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="simulator"'
    assert forged.status_code == elsewhere.status_code == 401
    assert forged.headers["WWW-Authenticate"] == 'Bearer realm="simulator", error="invalid_token"'
    assert "not issued here" in forged.json()["error"]
    assert "'api://payments', not 'api://carrier'" in elsewhere.json()["error"]
    assert fine.status_code == 200
    assert [c["answer"] for c in sim.calls()] == [401, 401, 401, 401, 200]
    assert [c["fault"] for c in sim.calls()][:4] == ["unauthorized"] * 4
    assert len(sim.effects()) == 1
    assert sim.identity.status()["refusedCalls"] == 4


def test_other_steps_need_no_token(sim: SimulatorServer) -> None:
    answer = httpx.post(
        f"{sim.url}/process", json={"orderId": "o-1"}, headers={"Idempotency-Key": "o-1:process"}
    )

    assert answer.status_code == 200


class FakeTime:
    """``time`` as ``simulator.identity`` reads it (``time.time()``), moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        return self.now


def test_an_expired_or_revoked_token_is_refused(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeTime()
    monkeypatch.setattr(identity, "time", clock)
    sim.identity.configure(token_seconds=1)
    short = token(sim).json()["access_token"]
    sim.identity.configure(token_seconds=3600)
    kept = token(sim).json()["access_token"]
    assert ship(sim, f"Bearer {short}").status_code == 200  # good until it expires
    clock.now += 1.1

    expired = ship(sim, f"Bearer {short}")
    assert (expired.status_code, expired.json()["error"]) == (401, "The token has expired.")
    assert ship(sim, f"Bearer {kept}").status_code == 200
    sim.identity.revoke()
    revoked = ship(sim, f"Bearer {kept}")
    assert revoked.status_code == 401
    assert "not issued here, or was revoked" in revoked.json()["error"]


def test_the_control_endpoint_sets_the_rules_and_revokes(sim: SimulatorServer) -> None:
    good = token(sim).json()["access_token"]

    status = httpx.post(
        f"{sim.url}/_identity",
        json={"requireToken": {"process": "api://orders/.default"}, "revoke": True},
    ).json()

    assert status["requireToken"] == {"process": "api://orders"}
    assert status["tokensValid"] == 0
    assert ship(sim).status_code == 200  # no longer protected
    assert ship(sim, f"Bearer {good}").status_code == 200
    assert httpx.get(f"{sim.url}/_identity").json()["requireToken"] == {"process": "api://orders"}


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"require": {}},
        {"requireToken": ["ship"]},
        {"requireToken": {"Ship!": "api://x"}},
        {"requireToken": {"ship": ""}},
        {"revoke": "yes"},
        {"tokenSeconds": 0},
        {"tokenSeconds": True},
    ],
)
def test_the_control_endpoint_refuses_what_it_does_not_know(
    sim: SimulatorServer, body: Any
) -> None:
    answer = httpx.post(f"{sim.url}/_identity", json=body)

    assert answer.status_code == 400
    assert sim.identity.status()["requireToken"] == {"ship": "api://carrier"}


def test_the_command_line_takes_the_secret_and_the_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(
        ["--identity-header", "h", "--require-token", "ship=api://carrier/.default",
         "--require-token", "charge-payment=api://payments", "--token-seconds", "600"]
    )  # fmt: skip

    assert args.identity_header == "h"
    assert dict(args.require_token) == {"ship": "api://carrier", "charge-payment": "api://payments"}
    assert args.token_seconds == 600
    monkeypatch.setenv("SIMULATOR_IDENTITY_HEADER", "from-env")
    assert build_parser().parse_args([]).identity_header == "from-env"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--require-token", "ship"])


def test_audiences_are_compared_without_default() -> None:
    assert audience_of("api://x/.default") == audience_of("api://x") == "api://x"
    assert parse_rule(" ship = api://x/.default ") == ("ship", "api://x")
    with pytest.raises(ValueError, match="STEP=AUDIENCE"):
        parse_rule("ship=")
