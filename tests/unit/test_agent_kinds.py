"""Agents of every kind (issue #12): HTTP with an API key or an Entra token, Python
handlers, and the concurrency limit per agent (``agents.build``, ``agents.auth``,
``agents.python``, ``agents.limits``).

The Entra token comes through azure-identity's real ``ManagedIdentityCredential``
(its App Service protocol) from the simulator's identity endpoint, in process, and the
simulator's steps refuse calls without it. The rest runs on httpx.MockTransport or
Python handlers; the waits that are real (a handler that overruns, a slot that stays
busy) are bounded well under two seconds each.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from agents.agent import AgentWorker
from agents.auth import (
    ApiKeyHeader,
    CredentialError,
    EntraBearer,
    NoHeaders,
    auth_for,
    claims_of,
)
from agents.build import build_agent, client_of
from agents.limits import Slot
from agents.outcomes import CallOutcome, Try
from agents.pacing import RemotePolicy
from agents.python import NotApplied, PythonTry, Refused
from agents.remote import HttpTry
from agents.runner import AttemptRunner
from config.settings import Settings, SettingsError
from core import workflows
from core.messages import AgentRequest
from core.outcome import Applied, Outcome
from simulator import SimulatorServer
from tests.support import settings_from, unanswered
from tests.unit.test_remote_client import (
    ORDER,
    T0,
    FakeClock,
    MaxRng,
    RecordingTransport,
    make_request,
    ok,
    remote,
    status,
)

SECRET = "identity-header-secret"
CARRIER = "api://carrier"


def settings(url: str = "https://remote.test/api") -> Settings:
    return settings_from(
        {
            "AzureWebJobsStorage": "UseDevelopmentStorage=true",
            "AGENT_TRANSPORT": "storage",
            "REMOTE_SERVICE_URL": url,
        }
    )


_CLIENTS: list[AttemptRunner[Any]] = []


def closing[C: AttemptRunner[Any]](client: C) -> C:
    _CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


# --- API key ------------------------------------------------------------------------------


def api_key_agent(header: str = "X-Carrier-Key") -> workflows.Agent:
    return workflows.Agent("carrier", auth=workflows.ApiKey(header))


def http_client(
    spec: workflows.Agent,
    handler: Callable[[httpx.Request], httpx.Response],
    clock: FakeClock,
    env: dict[str, str],
    **policy: Any,
) -> AttemptRunner[HttpTry]:
    return closing(
        AttemptRunner(
            HttpTry(
                "http://remote.test/api",
                transport=httpx.MockTransport(handler),
                clock=clock,
                auth=auth_for(spec, env),
            ),
            RemotePolicy(**{"min_try_seconds": 0.0, **policy}),
            clock=clock,
            sleep=clock.asleep,
        )
    )


def test_an_api_key_agent_sends_the_key_of_its_setting_in_its_header() -> None:
    r = remote(FakeClock(), ok())
    client = http_client(api_key_agent(), r, r.clock, {"AGENT_CARRIER_API_KEY": " k-123 "})
    trace = {"Authorization": "Bearer stolen", "X-Carrier-Key": "stolen"}

    assert (
        asyncio.run(client.call(make_request(path="ship", step="ship", trace=trace))).kind
        == "succeeded"
    )

    headers = r.seen[0].headers
    assert headers["x-carrier-key"] == "k-123"
    assert headers["idempotency-key"] == "o-1:ship"
    assert "authorization" not in headers


def test_the_key_is_built_once_and_never_shown() -> None:
    auth = auth_for(api_key_agent(), {"AGENT_CARRIER_API_KEY": "k-123"})

    assert auth == ApiKeyHeader("X-Carrier-Key", "k-123")
    assert "k-123" not in repr(auth)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, "set the app setting AGENT_CARRIER_API_KEY"),
        ({"AGENT_CARRIER_API_KEY": "  "}, "set the app setting AGENT_CARRIER_API_KEY"),
        ({"AGENT_INVENTORY_API_KEY": "k"}, "AGENT_CARRIER_API_KEY"),
        (
            {"AGENT_CARRIER_API_KEY": "@Microsoft.KeyVault(SecretUri=https://v/secrets/k)"},
            "AGENT_CARRIER_API_KEY is a Key Vault reference the platform did not resolve",
        ),
    ],
)
def test_a_missing_api_key_fails_the_build_naming_the_setting(
    env: dict[str, str], words: str
) -> None:
    with pytest.raises(SettingsError, match=words):
        build_agent(api_key_agent(), settings(), RecordingTransport(), FakeClock(), env=env)


@pytest.mark.parametrize("header", ["Idempotency-Key", "content-type", "Bad Header"])
def test_an_api_key_cannot_take_over_the_contracts_headers(header: str) -> None:
    with pytest.raises(SettingsError, match="cannot carry an API key"):
        auth_for(api_key_agent(header), {"AGENT_CARRIER_API_KEY": "k"})


@pytest.mark.parametrize("code", [401, 403])
def test_an_api_key_refused_by_the_remote_is_a_refusal_at_once(code: int) -> None:
    r = remote(FakeClock(), status(code, error="bad key"), ok())
    client = http_client(api_key_agent(), r, r.clock, {"AGENT_CARRIER_API_KEY": "k"})

    outcome = asyncio.run(client.call(make_request()))

    assert (outcome.kind, outcome.applied, outcome.tries) == ("refused", "no", 1)
    assert outcome.error == (
        f"process: HTTP {code} bad key (the remote refused this agent's credentials)"
    )
    assert len(r.seen) == 1


# --- Entra token: the real ManagedIdentityCredential against the simulator -------------------


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatorServer]:
    """The simulator with its identity endpoint as the app's managed identity (App
    Service protocol), and ``ship`` requiring a token for api://carrier."""
    for name in ("IDENTITY_SERVER_THUMBPRINT", "IMDS_ENDPOINT", "MSI_ENDPOINT", "MSI_SECRET"):
        monkeypatch.delenv(name, raising=False)
    with SimulatorServer(identity_header=SECRET, require_token={"ship": CARRIER}) as server:
        monkeypatch.setenv("IDENTITY_ENDPOINT", server.identity_endpoint)
        monkeypatch.setenv("IDENTITY_HEADER", SECRET)
        yield server


def wall_clock() -> datetime:
    return datetime.now(UTC)


def ship_request(order_id: str = "o-1", seconds: float = 20, **changes: Any) -> AgentRequest:
    return AgentRequest(
        order_id=order_id,
        step="ship",
        attempt=1,
        complete_by=wall_clock() + timedelta(seconds=seconds),
        path="ship",
        order={"orderId": order_id},
        **changes,
    )


def entra_agent(
    sim: SimulatorServer, scope: str = f"{CARRIER}/.default", env: dict[str, str] | None = None
) -> tuple[AgentWorker, RecordingTransport]:
    transport = RecordingTransport()
    spec = workflows.Agent("carrier", auth=workflows.EntraToken(scope), max_try_seconds=5)
    agent = build_agent(spec, settings(sim.url), transport, wall_clock, env=env or {})
    closing(agent._remote)
    return agent, transport


def ship_calls(sim: SimulatorServer) -> list[tuple[Any, bool, Any]]:
    return [(c["answer"], c["applied"], c["fault"]) for c in sim.calls() if c["step"] == "ship"]


def test_an_entra_agent_sends_the_managed_identitys_token_as_bearer(
    sim: SimulatorServer,
) -> None:
    from azure.identity import ManagedIdentityCredential

    agent, transport = entra_agent(sim, env={"AZURE_CLIENT_ID": "cid-1"})

    assert asyncio.run(agent.handle(ship_request())) is Outcome.SUCCEEDED

    auth = agent._remote.kind.auth
    assert isinstance(auth, EntraBearer)
    assert isinstance(auth.credential, ManagedIdentityCredential)
    assert ship_calls(sim) == [(200, True, None)]
    identity = sim.identity.status()
    assert identity["tokensIssued"] == 1
    assert identity["identities"] == ["client_id:cid-1"]  # AZURE_CLIENT_ID: user-assigned
    assert identity["refusedCalls"] == 0
    ((reply, _),) = transport.replies
    assert reply.result is not None and reply.result["orderId"] == "o-1"


def test_without_azure_client_id_the_system_assigned_identity_is_used(
    sim: SimulatorServer,
) -> None:
    agent, _ = entra_agent(sim)

    assert asyncio.run(agent.handle(ship_request())) is Outcome.SUCCEEDED
    assert sim.identity.status()["identities"] == ["system-assigned"]


def test_the_simulator_refuses_a_call_without_the_token(sim: SimulatorServer) -> None:
    transport = RecordingTransport()
    spec = workflows.Agent("carrier")  # NoAuth
    agent = build_agent(spec, settings(sim.url), transport, wall_clock, env={})
    closing(agent._remote)

    assert asyncio.run(agent.handle(ship_request())) is Outcome.REFUSED

    ((reply, _),) = transport.replies
    assert reply.applied == "no"
    assert reply.error is not None and reply.error.startswith("ship: HTTP 401")
    assert ship_calls(sim) == [(401, False, "unauthorized")]
    assert sim.effects() == []


def test_one_token_serves_many_calls_and_the_credential_is_asked_once(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, _ = entra_agent(sim)
    auth = agent._remote.kind.auth
    assert isinstance(auth, EntraBearer)
    asked: list[Any] = []
    real = auth.credential.get_token_info  # type: ignore[attr-defined]

    def spy(*scopes: str, **kwargs: Any) -> Any:
        asked.append((scopes, kwargs))
        return real(*scopes, **kwargs)

    monkeypatch.setattr(auth.credential, "get_token_info", spy)

    for n in range(5):
        assert asyncio.run(agent.handle(ship_request(f"o-{n}"))) is Outcome.SUCCEEDED

    assert sim.identity.issued == 1
    assert asked == [(("api://carrier/.default",), {"options": None})]
    assert [a for a, _, _ in ship_calls(sim)] == [200] * 5


def test_a_token_close_to_expiry_is_replaced_before_it_is_sent(
    sim: SimulatorServer,
) -> None:
    # MSAL takes a cached token that expires within 5 minutes as expired already.
    sim.identity.configure(token_seconds=240)
    agent, _ = entra_agent(sim)

    for n in range(3):
        assert asyncio.run(agent.handle(ship_request(f"o-{n}"))) is Outcome.SUCCEEDED

    assert sim.identity.issued == 3
    assert sim.identity.status()["refusedCalls"] == 0


def test_a_revoked_token_is_replaced_once_and_the_call_goes_through(
    sim: SimulatorServer,
) -> None:
    agent, _ = entra_agent(sim)
    assert asyncio.run(agent.handle(ship_request("o-1"))) is Outcome.SUCCEEDED
    sim.identity.revoke()

    outcome = asyncio.run(agent._remote.call(ship_request("o-2")))

    assert (outcome.kind, outcome.tries) == ("succeeded", 1)
    assert sim.identity.issued == 2
    assert [a for a, _, _ in ship_calls(sim)] == [200, 401, 200]


def test_a_persistent_401_is_a_refusal_after_one_fresh_token(sim: SimulatorServer) -> None:
    agent, transport = entra_agent(sim, scope="api://someone-else/.default")

    assert asyncio.run(agent.handle(ship_request())) is Outcome.REFUSED

    ((reply, _),) = transport.replies
    assert reply.applied == "no"
    assert reply.error is not None
    assert reply.error.startswith("ship: HTTP 401")
    assert reply.error.endswith("(the remote refused this agent's credentials)")
    assert sim.identity.issued == 2  # the first token, and one fresh one
    assert ship_calls(sim) == [(401, False, "unauthorized")] * 2
    assert sim.effects() == []


def test_no_token_is_a_try_that_sent_nothing(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDENTITY_HEADER", "not-the-secret")
    agent, transport = entra_agent(sim)

    attempt = asyncio.run(agent._remote.kind.run(ship_request(), 3.0, None))

    assert (attempt.applied, attempt.retryable) == ("no", True)
    assert attempt.error.startswith("ship: no token for api://carrier/.default: ")
    assert "X-IDENTITY-HEADER header is missing or wrong" in attempt.error
    assert attempt.error.endswith("; the request was not sent")

    # A whole attempt, a lone order: no evidence against it, so it waits (deferred).
    assert asyncio.run(agent.handle(ship_request(seconds=2.5))) is Outcome.DEFERRED
    ((reply, _),) = transport.replies
    assert reply.applied == "no"
    assert ship_calls(sim) == []
    assert sim.identity.status()["refusedTokenRequests"] >= 1


class SlowCredential:
    """A token credential that answers once ``gate`` opens (at once without one)."""

    def __init__(self, gate: threading.Event | None = None, tokens: list[str] | None = None):
        self.gate = gate
        self.tokens = tokens or ["t-1"]
        self.calls: list[str | None] = []
        self.answered = threading.Event()

    def get_token(self, *scopes: str, claims: str | None = None, **kwargs: Any) -> Any:
        self.calls.append(claims)
        if self.gate is not None:
            self.gate.wait(30)  # a backstop: the test opens it
        self.answered.set()
        token = self.tokens[min(len(self.calls), len(self.tokens)) - 1]
        return type("AccessToken", (), {"token": token, "expires_on": 0})()


def test_a_slow_identity_endpoint_costs_a_try_at_most_its_time() -> None:
    gate = threading.Event()
    credential = SlowCredential(gate)
    auth = EntraBearer(CARRIER, credential)
    try:
        with pytest.raises(CredentialError, match=r"no token for api://carrier within 0\.2 s"):
            asyncio.run(auth.headers(0.2))
        # the try gave up at its time while the identity endpoint still had not answered
        assert credential.calls == [None] and not credential.answered.is_set()
    finally:
        gate.set()
        auth.close()


class InfoCredential:
    """A credential with ``get_token_info`` (azure-core's SupportsTokenInfo)."""

    def __init__(self, expires_in: float, refresh_in: float | None = None):
        self.expires_in, self.refresh_in = expires_in, refresh_in
        self.options: list[Any] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise AssertionError("get_token_info is preferred")

    def get_token_info(self, *scopes: str, options: Any = None) -> Any:
        from azure.core.credentials import AccessTokenInfo

        self.options.append(options)
        now = time.time()
        refresh_on = None if self.refresh_in is None else int(now + self.refresh_in)
        return AccessTokenInfo(
            f"t-{len(self.options)}", int(now + self.expires_in), refresh_on=refresh_on
        )


@pytest.mark.parametrize(
    ("expires_in", "refresh_in", "asked"),
    [
        (3600, None, 1),  # held: good for an hour
        (3600, 1800, 1),  # held: its refresh time is far
        (3600, -1, 3),  # past its refresh time: asked again every time
        (299, None, 3),  # expires within 5 minutes: asked again every time
    ],
)
def test_the_token_is_held_until_it_is_due_for_refresh(
    expires_in: float, refresh_in: float | None, asked: int
) -> None:
    credential = InfoCredential(expires_in, refresh_in)
    auth = EntraBearer(CARRIER, credential)
    try:
        tokens = [asyncio.run(auth.headers(1))["Authorization"] for _ in range(3)]
    finally:
        auth.close()

    assert len(credential.options) == asked
    assert tokens[-1] == f"Bearer t-{asked}"


def test_a_fresh_token_after_a_401_carries_the_challenges_claims() -> None:
    claims = '{"access_token":{"nbf":{"essential":true,"value":"1700000000"}}}'
    encoded = base64.urlsafe_b64encode(claims.encode()).decode().rstrip("=")
    challenge = f'Bearer realm="", error="insufficient_claims", claims="{encoded}"'
    credential = SlowCredential(tokens=["t-1", "t-2"])
    auth = EntraBearer(CARRIER, credential)
    try:
        assert asyncio.run(auth.headers(1)) == {"Authorization": "Bearer t-1"}
        assert (
            asyncio.run(auth.refresh(challenge, 1)) is True
        )  # a different token: worth sending again
        assert credential.calls == [None, claims]
        assert asyncio.run(auth.refresh('Bearer error="invalid_token"', 1)) is False  # the same t-2
        assert credential.calls[-1] == "{}"  # any claims: MSAL skips its cache
    finally:
        auth.close()
    assert claims_of(challenge) == claims
    assert claims_of('Bearer error="invalid_token"') is None
    assert claims_of(None) is None


# --- Python agents --------------------------------------------------------------------------


def python_client(
    handler: Callable[..., Any],
    clock: FakeClock | None = None,
    *,
    concurrency: int | None = None,
    **policy: Any,
) -> AttemptRunner[PythonTry]:
    clock = clock or FakeClock()
    return closing(
        AttemptRunner(
            PythonTry(handler, name="stock", clock=clock),
            RemotePolicy(**{"min_try_seconds": 0.0, **policy}),
            clock=clock,
            sleep=clock.asleep,
            rng=MaxRng(),
            concurrency=concurrency,
        )
    )


class Recorder:
    """A handler that plays a script: a value to return, or an exception to raise."""

    def __init__(self, *script: Any):
        self.script = list(script)
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        order: dict[str, Any],
        *,
        idempotency_key: str,
        deadline: datetime,
        step: str,
        attempt: int,
    ) -> Any:
        self.calls.append(
            {
                "order": order,
                "key": idempotency_key,
                "deadline": deadline,
                "step": step,
                "attempt": attempt,
            }
        )
        order["mutated"] = True  # a handler's copy: the next try gets the order as it was
        step_ = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step_, BaseException):
            raise step_
        return step_


def test_a_python_agent_calls_its_handler_and_replies_its_result() -> None:
    handler = Recorder({"reservation": "r-1"})
    clock = FakeClock()
    client = python_client(handler, clock, max_try_seconds=8)
    transport = RecordingTransport()
    request = make_request(30, attempt=4)

    assert (
        asyncio.run(AgentWorker(client, transport, clock, sleep=clock.sleep).handle(request))
        == "succeeded"
    )

    [(sent, to)] = transport.replies
    assert (unanswered(sent), to) == (request.succeeded({"reservation": "r-1"}), None)
    assert sent.answered_at == clock()  # when the handler returned, by the agent's clock
    (call,) = handler.calls
    assert call["order"] == {**ORDER, "mutated": True}
    assert request.order == ORDER
    assert (call["key"], call["step"], call["attempt"]) == ("o-1:process", "process", 4)
    assert call["deadline"] == T0 + timedelta(seconds=8)  # the try's end: at most max_try


@pytest.mark.parametrize(
    ("value", "result"),
    [
        (None, {}),
        ([1, 2], {"value": [1, 2]}),
        ({"at": datetime(2030, 1, 1, tzinfo=UTC)}, {"at": "2030-01-01 00:00:00+00:00"}),
    ],
)
def test_any_return_value_is_a_success_the_reply_can_carry(value: Any, result: Any) -> None:
    outcome = asyncio.run(python_client(Recorder(value)).call(make_request()))

    assert (outcome.kind, outcome.result) == ("succeeded", result)
    json.dumps(outcome.result)


def test_not_applied_is_retried_with_backoff_and_applied_nothing() -> None:
    handler = Recorder(NotApplied("warehouse busy"), NotApplied("still busy"), {"ok": 1})
    client = python_client(handler)

    outcome = asyncio.run(client.call(make_request()))

    assert (outcome.kind, outcome.tries) == ("succeeded", 3)
    assert len(handler.calls) == 3


def test_not_applied_until_time_runs_out_says_not_applied() -> None:
    client = python_client(Recorder(NotApplied("warehouse busy")))

    outcome = asyncio.run(client.call(make_request(10)))

    # A lone order failing while nothing else is served: waits, not counted.
    assert (outcome.kind, outcome.applied) == ("deferred", "no")
    assert outcome.error.startswith("process: not applied: warehouse busy; ")
    assert outcome.tries > 1


def test_not_applied_with_a_retry_after_past_the_deadline_defers_to_it() -> None:
    handler = Recorder(NotApplied("closed for the night", retry_after=600))
    client = python_client(handler)

    outcome = asyncio.run(client.call(make_request(30)))

    assert (outcome.kind, outcome.applied, outcome.tries) == ("deferred", "no", 1)
    assert outcome.not_before == T0 + timedelta(seconds=600)
    assert len(handler.calls) == 1


def test_refused_is_a_refusal_at_once() -> None:
    handler = Recorder(Refused("no such sku"))
    client = python_client(handler)
    transport = RecordingTransport()
    clock = FakeClock()

    reply = asyncio.run(AgentWorker(client, transport, clock).handle(make_request()))

    assert reply is Outcome.REFUSED
    ((sent, _),) = transport.replies
    assert (sent.error, sent.applied) == ("process: refused: no such sku", "no")
    assert len(handler.calls) == 1


def test_any_other_exception_may_have_applied() -> None:
    client = python_client(Recorder(RuntimeError("db connection lost")))

    attempt = asyncio.run(client.kind.run(make_request(), 5, None))
    outcome = asyncio.run(client.call(make_request(10)))

    assert attempt == Try(
        Applied.MAYBE, True, "process: RuntimeError: db connection lost (may have applied)"
    )
    assert (outcome.kind, outcome.applied) == ("deferred", "maybe")


def test_a_refusal_after_an_exception_still_says_maybe() -> None:
    client = python_client(Recorder(RuntimeError("boom"), Refused("gone")))

    outcome = asyncio.run(client.call(make_request()))

    assert (outcome.kind, outcome.applied, outcome.tries) == ("refused", "maybe", 2)


def test_a_singled_out_order_failing_while_others_succeed_is_transient() -> None:
    client = python_client(Recorder(NotApplied("bad data")))
    client.health("process").record_answer("o-0:process", T0.timestamp())

    outcome = asyncio.run(client.call(make_request(10, singled_out=True)))

    assert (outcome.kind, outcome.applied) == ("transient", "no")


def test_a_handler_still_running_at_the_try_deadline_may_have_applied() -> None:
    release = threading.Event()
    started: list[str] = []

    def slow(order: dict[str, Any], **call: Any) -> dict[str, Any]:
        started.append(call["idempotency_key"])
        release.wait(10)
        return {"late": True}

    client = python_client(slow, max_try_seconds=0.25)
    clock = FakeClock()
    transport = RecordingTransport()
    try:
        reply = asyncio.run(
            AgentWorker(client, transport, clock, sleep=clock.sleep).handle(make_request(2))
        )
        assert client.kind.running == 1
    finally:
        release.set()

    assert reply is Outcome.DEFERRED  # a lone order: no evidence against it
    sent = transport.replies[0][0]  # (its end is reported later: test_failure_edges)
    assert sent.applied == "maybe" and sent.running_until is not None
    assert sent.error is not None
    assert "the handler (a run started by an earlier try) is still running" in sent.error
    assert started == ["o-1:process"]  # the retries waited for it; none started another
    deadline = time.monotonic() + 2
    while client.kind.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.kind.running == 0


def test_a_handler_that_cannot_take_the_arguments_is_refused_where_it_is_declared() -> None:
    def wrong(order: dict[str, Any]) -> None:
        return None

    with pytest.raises(workflows.DeclarationError, match=r"agent 'stock': its handler must"):
        workflows.Agent("stock", kind="python", handler=wrong)


def test_a_handler_taking_kwargs_is_accepted() -> None:
    def loose(order: dict[str, Any], **call: Any) -> dict[str, Any]:
        return {"step": call["step"]}

    assert asyncio.run(python_client(loose).call(make_request())).result == {"step": "process"}


# --- the concurrency limit ------------------------------------------------------------------


class Gate:
    """A handler that waits until released (or 10 s)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.calls = 0

    def __call__(self, order: dict[str, Any], **call: Any) -> dict[str, Any]:
        self.calls += 1
        self.entered.release()
        self.release.wait(10)
        return {"done": call["idempotency_key"]}


def in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_call_that_gets_no_slot_in_time_is_deferred_and_not_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = Gate()
    clock = FakeClock()
    client = python_client(gate, clock, concurrency=1, min_try_seconds=1.0)
    assert client.slots is not None
    waits: list[float] = []
    take = client.slots.take

    async def recording(wait: float) -> Slot | None:
        waits.append(wait)
        return await take(wait)

    monkeypatch.setattr(client.slots, "take", recording)
    first, results = in_background(lambda: asyncio.run(client.call(make_request(30))))
    assert gate.entered.acquire(timeout=5)
    transport = RecordingTransport()
    try:
        reply = asyncio.run(
            AgentWorker(client, transport, clock).handle(make_request(2, order_id="o-2"))
        )
    finally:
        gate.release.set()
        first.join(5)

    assert reply is Outcome.DEFERRED
    ((sent, _),) = transport.replies
    assert sent.applied == "no"
    assert sent.error == (
        "process: all 1 call slots of this agent on this instance stayed busy for 0.5 s, "
        "until too little time was left for a call; not called (concurrency limit)"
    )
    # 2 s left, 0.5 s margin, 1 s for a try: 0.5 s to wait for a slot (the first call's
    # wait was for none: its slot was free)
    assert waits[1:] == [pytest.approx(0.5)]
    assert gate.calls == 1
    assert results[0].kind == "succeeded"
    assert client.slots is not None and client.slots.in_use == 0


def test_a_call_waits_for_a_slot_that_comes_free_in_time() -> None:
    gate = Gate()
    client = python_client(gate, concurrency=1)
    first, _ = in_background(lambda: asyncio.run(client.call(make_request(30))))
    assert gate.entered.acquire(timeout=5)
    threading.Timer(0.2, gate.release.set).start()

    outcome = asyncio.run(client.call(make_request(30, order_id="o-2")))

    first.join(5)
    assert (outcome.kind, outcome.result) == ("succeeded", {"done": "o-2:process"})


def test_at_most_n_calls_run_at_once() -> None:
    running, peak = 0, 0
    lock = threading.Lock()

    def handler(order: dict[str, Any], **call: Any) -> dict[str, Any]:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return {}

    client = python_client(handler, concurrency=3)

    async def nine() -> list[CallOutcome]:  # at once, on one loop, as the runtime runs them
        calls = [client.call(make_request(30, order_id=f"o-{n}")) for n in range(9)]
        return list(await asyncio.wait_for(asyncio.gather(*calls), 10))

    assert [out.kind for out in asyncio.run(nine())] == ["succeeded"] * 9
    assert peak == 3


def test_a_handler_that_overran_its_try_keeps_its_slot_until_it_returns() -> None:
    gate = Gate()
    clock = FakeClock()
    client = python_client(gate, clock, concurrency=1, max_try_seconds=0.2)

    first = asyncio.run(
        client.call(make_request(1))
    )  # gives up after its tries; the handler runs on
    assert first.applied == "maybe"
    assert client.slots is not None and client.slots.in_use == 1
    busy = asyncio.run(client.call(make_request(1, order_id="o-2")))
    gate.release.set()
    deadline = time.monotonic() + 2
    while client.slots.in_use and time.monotonic() < deadline:
        time.sleep(0.01)
    free = asyncio.run(client.call(make_request(30, order_id="o-3")))

    assert busy.kind == "deferred" and "call slots" in busy.error
    assert free.kind == "succeeded"
    assert client.slots.in_use == 0


def test_an_http_agent_takes_at_most_its_concurrency_too() -> None:
    release = threading.Event()
    entered = threading.Event()

    async def hold(request: httpx.Request) -> httpx.Response:
        entered.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        return httpx.Response(200, json={"ok": True})

    clock = FakeClock()
    client = closing(
        AttemptRunner(
            HttpTry("http://remote.test/api", transport=httpx.MockTransport(hold), clock=clock),
            RemotePolicy(min_try_seconds=1.0),
            clock=clock,
            sleep=clock.asleep,
            concurrency=1,
        )
    )
    first, results = in_background(lambda: asyncio.run(client.call(make_request(30))))
    assert entered.wait(5)
    try:
        busy = asyncio.run(client.call(make_request(2, order_id="o-2")))
    finally:
        release.set()
        first.join(5)

    assert (busy.kind, busy.applied, busy.tries) == ("deferred", "no", 0)
    assert "all 1 call slots" in busy.error
    assert results == [CallOutcome(Outcome.SUCCEEDED, result={"ok": True}, tries=1)]


# --- built from the declarations ------------------------------------------------------------


def test_every_kind_is_built_with_its_own_policy_and_limit(sim: SimulatorServer) -> None:
    def handler(order: dict[str, Any], **call: Any) -> None:
        return None

    env = {"AGENT_CARRIER_API_KEY": "k", "AGENT_PAYMENTS_URL": "https://payments.test"}
    plain = client_of(
        workflows.Agent("payments", concurrency=5, max_try_seconds=4, breaker_failing_orders=7),
        settings(),
        FakeClock(),
        env=env,
    )
    keyed = client_of(api_key_agent(), settings(), FakeClock(), env=env)
    entra = client_of(
        workflows.Agent("carrier", auth=workflows.EntraToken(f"{CARRIER}/.default")),
        settings(),
        FakeClock(),
        env=env,
    )
    python = client_of(
        workflows.Agent("stock", kind="python", handler=handler, concurrency=2),
        settings(),
        FakeClock(),
        env=env,
    )
    for client in (plain, keyed, entra, python):
        closing(client)

    assert isinstance(plain.kind, HttpTry) and isinstance(plain.kind.auth, NoHeaders)
    assert plain.kind.endpoint("ship") == "https://payments.test/ship"
    assert plain.slots is not None and plain.slots.limit == 5
    assert plain.policy.max_try_seconds == 4
    assert plain.policy.health.trip_keys == 7
    assert isinstance(keyed.kind, HttpTry) and keyed.kind.auth == ApiKeyHeader("X-Carrier-Key", "k")
    assert isinstance(entra.kind, HttpTry) and isinstance(entra.kind.auth, EntraBearer)
    assert entra.kind.auth.scope == f"{CARRIER}/.default"
    assert isinstance(python.kind, PythonTry) and python.kind.handler is handler
    assert python.slots is not None and python.slots.limit == 2
    assert sim.identity.issued == 0  # no token until the first call
