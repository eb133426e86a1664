"""The agents' runtime controls as rules (``core.controls``), as each instance reads them
(``core.control_cache``), and as the operator API, the CLI's parser and the console take
them (``admin/agent_admin.py``, ``admin/triggers.py``, ``console/agent_pages.py``), on the
in-memory store: the contract of docs/contracts.md §3.7 — 404 for an unknown agent, 400
for bad input (never 500), 409 for a change the state refuses.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import azure.functions as func
import pytest

from admin import triggers as api
from admin.agent_admin import parse_change
from bootstrap import reset_app_context
from console import security
from console import triggers as console
from core import controls
from core.control_cache import PERIOD, RELEASE_WINDOW, SETTLE, ControlView
from core.controls import DECLARED, AgentControl, Limits, Pause
from core.errors import StorageUnavailable, TransitionRefused
from core.workflows import AGENTS
from tests.support import DEV_OPERATOR, on_devhost
from tests.unit.test_agent_pause import App, build
from tests.unit.test_remote_client import T0

DECLARED_32 = Limits(32, None)


# --- the rules ------------------------------------------------------------------------------


def test_pause_resume_and_limits_each_leave_an_audit_entry_with_before_and_after() -> None:
    start = AgentControl("orders")
    paused, entry = controls.pause(start, DECLARED_32, "alice", "maintenance", T0)
    assert paused.pause == Pause(T0, "alice", "maintenance") and paused.version == 1
    assert entry.to_json() == {
        "at": "2030-01-01T12:00:00.000Z",
        "agent": "orders",
        "action": "pause",
        "by": "alice",
        "reason": "maintenance",
        "before": {"paused": False, "concurrency": 32, "rate": None},
        "after": {"paused": True, "concurrency": 32, "rate": None},
    }
    later = T0 + timedelta(minutes=5)
    limited, entry = controls.set_limits(
        paused, DECLARED_32, "bob", "", later, concurrency=4, rate=2.5
    )
    assert limited.limits(DECLARED_32) == Limits(4, 2.5) and limited.paused
    assert (entry.before["concurrency"], entry.after["concurrency"], entry.after["rate"]) == (
        32,
        4,
        2.5,
    )
    resumed, entry = controls.resume(limited, DECLARED_32, "carol", "done", later)
    assert not resumed.paused and resumed.resumed_at == later and resumed.version == 3
    assert resumed.limits(DECLARED_32) == Limits(4, 2.5)  # a resume keeps the limits
    back, entry = controls.set_limits(
        resumed, DECLARED_32, "carol", "", later, concurrency=DECLARED, rate=DECLARED
    )
    assert (back.concurrency, back.rate) == (None, None) and back.overrides() == {}
    assert entry.after == {"paused": False, "concurrency": 32, "rate": None}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda c: controls.pause(c, DECLARED_32, "a", "  ", T0), "no-reason"),
        (
            lambda c: controls.resume(
                controls.resume(
                    controls.pause(c, DECLARED_32, "a", "r", T0)[0], DECLARED_32, "a", "", T0
                )[0],
                DECLARED_32,
                "a",
                "",
                T0,
            ),
            "not-paused",
        ),
        (
            lambda c: controls.pause(
                controls.pause(c, DECLARED_32, "a", "r", T0)[0], DECLARED_32, "b", "r", T0
            ),
            "already-paused",
        ),
        (lambda c: controls.set_limits(c, DECLARED_32, "a", "", T0), "no-change"),
        (
            lambda c: controls.set_limits(c, DECLARED_32, "a", "", T0, concurrency=DECLARED),
            "no-change",
        ),
    ],
)
def test_changes_the_state_refuses(change: Any, reason: str) -> None:
    with pytest.raises(TransitionRefused) as refused:
        change(AgentControl("orders"))
    assert refused.value.reason == reason


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [(1, 1), (1000, 1000), ("7", 7), (" 12 ", 12), ("declared", DECLARED), ("DECLARED", DECLARED)],
)
def test_a_concurrency_is_a_whole_number_in_range_or_declared(raw: object, parsed: object) -> None:
    assert controls.parse_concurrency(raw) == parsed


@pytest.mark.parametrize(
    "raw", [0, 1001, -1, True, 2.5, "2.5", "", "x", "1e3", None, [], "١٢", "9" * 40]
)
def test_a_bad_concurrency_says_what_to_send(raw: object) -> None:
    with pytest.raises(ValueError, match=r"concurrency must be a whole number from 1 to 1000"):
        controls.parse_concurrency(raw)


@pytest.mark.parametrize(
    ("raw", "parsed"), [(0.1, 0.1), (1000, 1000.0), ("2.5", 2.5), (3, 3.0), ("declared", DECLARED)]
)
def test_a_rate_is_a_number_of_calls_a_second_in_range_or_declared(
    raw: object, parsed: object
) -> None:
    assert controls.parse_rate(raw) == parsed


@pytest.mark.parametrize(
    "raw", [0, 0.05, 1000.5, True, "nan", "inf", float("nan"), "x", "", None, {}, "1" * 30]
)
def test_a_bad_rate_says_what_to_send(raw: object) -> None:
    with pytest.raises(ValueError, match=r"rate must be a number of calls a second"):
        controls.parse_rate(raw)


def test_a_change_takes_only_its_own_fields() -> None:
    assert parse_change("pause", {"reason": " a  b "}).reason == "a b"
    assert parse_change("resume", {}).reason == ""
    limits = parse_change("limits", {"concurrency": "declared", "rate": 3})
    assert (limits.concurrency, limits.rate) == (DECLARED, 3.0)
    cases: list[tuple[str, dict[str, object], str]] = [
        ("pause", {}, "give a reason"),
        ("pause", {"reason": 5}, "reason must be text"),
        ("pause", {"reason": "x" * 501}, "at most 500"),
        ("pause", {"reason": "x", "concurrency": 3}, "not concurrency"),
        ("limits", {"reason": "x"}, 'needs "concurrency", "rate" or both'),
        ("limits", {"concurency": 3}, "not concurency"),
        ("explode", {}, "must be one of"),
    ]
    for action, fields, says in cases:
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_change(action, fields)


def test_a_declared_rate_is_checked_like_one_set_at_runtime() -> None:
    from core.workflows import Agent, DeclarationError

    assert Agent("quota", rate=2.5).describe()["rate"] == 2.5
    for bad in (0.0, 5000.0, True):
        with pytest.raises(DeclarationError, match="rate must be"):
            Agent("quota", rate=bad)


# --- what one instance knows -------------------------------------------------------------


class Source:
    def __init__(self) -> None:
        self.reads = 0
        self.controls: dict[str, AgentControl] = {}
        self.fail = False

    def read_controls(self) -> dict[str, AgentControl]:
        self.reads += 1
        if self.fail:
            raise StorageUnavailable("down")
        return dict(self.controls)


def test_an_instance_reads_the_controls_at_most_once_a_period_whoever_asks() -> None:
    app = build()
    source, warnings = Source(), list[str]()
    view = ControlView(source, app.clock, warn=warnings.append)
    for _ in range(100):  # every dispatch and every call asks
        assert view.pause_of("orders") is None
    assert source.reads == 1
    source.controls["orders"] = AgentControl("orders", pause=Pause(T0, "a", "r"))
    app.clock.advance(PERIOD.total_seconds() - 0.001)
    assert view.pause_of("orders") is None and source.reads == 1  # not yet
    app.clock.advance(0.001)
    assert view.pause_of("orders") is not None and source.reads == 2

    source.fail = True  # the store does not answer: the last controls stay in force
    app.clock.advance(PERIOD.total_seconds())
    assert view.pause_of("orders") is not None and source.reads == 3
    assert "keeping the last ones read" in warnings[0]
    assert view.pause_of("orders") is not None and source.reads == 3  # tried again next period
    view.forget()
    source.fail = False
    source.controls.clear()
    assert view.pause_of("orders") is None and source.reads == 4


def test_an_instance_that_never_read_the_controls_runs_every_agent_as_declared() -> None:
    app = build()
    source, warnings = Source(), list[str]()
    source.fail = True
    view = ControlView(source, app.clock, warn=warnings.append)
    runtime = view.runtime(AGENTS["orders"])
    assert runtime.pause is None and runtime.limits == Limits(AGENTS["orders"].concurrency)
    assert "running as declared" in warnings[0]


def test_the_runtime_at_hand_is_what_a_read_would_give_and_none_when_a_read_is_due() -> None:
    """``ControlView.runtime_at_hand``, which the agents ask on their event loop: None
    whenever ``runtime`` would read (the agent then asks that on its own threads), else
    exactly ``runtime``'s answer, with no read."""
    app = build()
    source = Source()
    view = ControlView(source, app.clock)
    spec = AGENTS["orders"]
    assert view.runtime_at_hand(spec) is None and source.reads == 0  # never read: due
    first = view.runtime(spec)
    assert source.reads == 1
    assert view.runtime_at_hand(spec) == first and source.reads == 1
    source.controls["orders"] = AgentControl("orders", pause=Pause(T0, "a", "r"))
    app.clock.advance(PERIOD.total_seconds())
    assert view.runtime_at_hand(spec) is None and source.reads == 1  # due again
    paused = view.runtime(spec)
    assert paused.pause is not None and source.reads == 2
    assert view.runtime_at_hand(spec) == paused


def test_a_resume_releases_held_steps_once_every_instance_has_read_it() -> None:
    app = build()
    source = Source()
    view = ControlView(source, app.clock)
    source.controls["orders"] = AgentControl("orders", resumed_at=T0)
    source.controls["payments"] = AgentControl("payments", pause=Pause(T0, "a", "r"))
    assert not view.released("orders", T0 + SETTLE - timedelta(milliseconds=1))
    assert view.released("orders", T0 + SETTLE)
    assert view.released("inventory", T0)  # never paused
    assert not view.released("payments", T0 + RELEASE_WINDOW)
    assert view.resumed_recently(T0) == []
    assert view.resumed_recently(T0 + SETTLE) == ["orders"]
    assert view.resumed_recently(T0 + RELEASE_WINDOW + timedelta(seconds=1)) == []


# --- the operator API -----------------------------------------------------------------------


@pytest.fixture
def installed() -> Iterator[App]:
    app = build()
    reset_app_context(on_devhost(app.ctx))  # the console needs a principal: an operator
    yield app
    reset_app_context(None)


def call(
    handler: Any, method: str, path: str, body: Any = None, **route: str
) -> tuple[int, dict[str, Any]]:
    raw = (
        body
        if isinstance(body, bytes)
        else (json.dumps(body).encode() if body is not None else b"")
    )
    # a machine with the function key (no principal): "function-key" in the audit
    key = {"x-functions-key": "k"}
    response = handler(
        func.HttpRequest(method, f"http://h/api/{path}", body=raw, route_params=route, headers=key)
    )
    assert response.mimetype == "application/json"
    return response.status_code, json.loads(response.get_body())


def test_the_api_lists_pauses_resumes_and_limits_agents(installed: App) -> None:
    status, body = call(api.list_agents, "GET", "agents")
    assert status == 200
    assert [a["name"] for a in body["agents"]] == sorted(AGENTS)
    orders = next(a for a in body["agents"] if a["name"] == "orders")
    assert orders == {
        "name": "orders",
        "paused": False,
        "pause": None,
        "limits": {"concurrency": 32, "rate": None},
        "declared": {"concurrency": 32, "rate": None},
        "overrides": {},
        "changedAt": None,
        "changedBy": None,
    }
    status, body = call(
        api.pause_agent, "POST", "agents/orders/pause", {"reason": "their outage"}, agent="orders"
    )
    assert status == 200 and body["paused"] is True
    assert body["pause"]["by"] == "function-key" and body["pause"]["reason"] == "their outage"
    status, body = call(
        api.pause_agent, "POST", "agents/orders/pause", {"reason": "again"}, agent="orders"
    )
    assert (
        status == 409 and body["reason"] == "already-paused" and "already paused" in body["error"]
    )
    status, body = call(
        api.set_agent_limits,
        "POST",
        "agents/orders/limits",
        {"concurrency": 2, "rate": 0.5},
        agent="orders",
    )
    assert status == 200 and body["limits"] == {"concurrency": 2, "rate": 0.5}
    assert body["overrides"] == {"concurrency": 2, "rate": 0.5}
    status, body = call(api.resume_agent, "POST", "agents/orders/resume", agent="orders")
    assert status == 200 and body["paused"] is False and body["limits"]["concurrency"] == 2
    status, body = call(
        api.set_agent_limits,
        "POST",
        "agents/orders/limits",
        {"concurrency": "declared", "rate": "declared"},
        agent="orders",
    )
    assert status == 200 and body["overrides"] == {}
    status, body = call(api.agent_audit, "GET", "agents/audit")
    assert status == 200
    assert [e["action"] for e in body["entries"]] == ["limits", "resume", "limits", "pause"]
    assert body["continuationToken"] is None


def test_the_audit_pages_newest_first(installed: App) -> None:
    admin = installed.ctx.agents_admin
    for n in range(5):
        installed.clock.advance(1)
        admin.pause("carrier", "alice", f"pause {n}")
        installed.clock.advance(1)
        admin.resume("carrier", "alice", f"resume {n}")
    installed.clock.advance(1)
    admin.pause("orders", "bob", "other agent")
    request = func.HttpRequest(
        "GET", "http://h/api/agents/audit", body=b"", params={"pageSize": "4", "agent": "carrier"}
    )
    first = json.loads(api.agent_audit(request).get_body())
    assert [e["reason"] for e in first["entries"]] == [
        "resume 4",
        "pause 4",
        "resume 3",
        "pause 3",
    ]
    seen = list(first["entries"])
    token = first["continuationToken"]
    while token:
        request = func.HttpRequest(
            "GET",
            "http://h/api/agents/audit",
            body=b"",
            params={"pageSize": "4", "agent": "carrier", "continuationToken": token},
        )
        page = json.loads(api.agent_audit(request).get_body())
        seen += page["entries"]
        token = page["continuationToken"]
    assert len(seen) == 10 and {e["agent"] for e in seen} == {"carrier"}
    assert [e["at"] for e in seen] == sorted((e["at"] for e in seen), reverse=True)
    everyone = json.loads(
        api.agent_audit(func.HttpRequest("GET", "http://h/api/agents/audit", body=b"")).get_body()
    )
    assert everyone["entries"][0]["agent"] == "orders" and len(everyone["entries"]) == 11


@pytest.mark.parametrize(
    ("handler", "agent", "body", "status", "says"),
    [
        (api.pause_agent, "nobody", {"reason": "x"}, 404, "no agent 'nobody' is declared"),
        (api.pause_agent, "Bad Name!", {"reason": "x"}, 404, "no agent"),
        (api.resume_agent, "nobody", None, 404, "no agent"),
        (api.pause_agent, "nobody", b"garbage", 404, "no agent"),  # the agent comes first
        (api.set_agent_limits, "nobody", {"concurrency": 1}, 404, "no agent"),
        (api.pause_agent, "orders", None, 400, "give a reason"),
        (api.pause_agent, "orders", {"reason": ""}, 400, "give a reason"),
        (api.pause_agent, "orders", {"reason": ["x"]}, 400, "reason must be text"),
        (api.pause_agent, "orders", [1, 2], 400, "must be a JSON object"),
        (api.pause_agent, "orders", b"not json", 400, "must be a JSON object"),
        (api.pause_agent, "orders", b"\xff\xfe", 400, "must be a JSON object"),
        (api.pause_agent, "orders", b"[" * 100_000, 400, "must be a JSON object"),
        (api.pause_agent, "orders", b'{"reason": 1e999}', 400, "must be a JSON object"),
        (api.pause_agent, "orders", {"reason": "x", "for": 3}, 400, "not for"),
        (api.resume_agent, "orders", {"reason": "x"}, 409, "is not paused"),
        (api.set_agent_limits, "orders", {}, 400, "needs"),
        (api.set_agent_limits, "orders", {"concurrency": 0}, 400, "from 1 to 1000"),
        (api.set_agent_limits, "orders", {"concurrency": "lots"}, 400, "from 1 to 1000"),
        (api.set_agent_limits, "orders", {"concurrency": True}, 400, "from 1 to 1000"),
        (api.set_agent_limits, "orders", {"rate": -1}, 400, "from 0.1 to 1000"),
        (api.set_agent_limits, "orders", {"rate": "fast"}, 400, "from 0.1 to 1000"),
        (api.set_agent_limits, "orders", {"rate": None}, 400, "needs"),
        (api.set_agent_limits, "orders", {"concurrency": "declared"}, 409, "already that"),
    ],
)
def test_bad_input_is_a_400_an_unknown_agent_a_404_never_a_500(
    installed: App, handler: Any, agent: str, body: Any, status: int, says: str
) -> None:
    got, answer = call(handler, "POST", f"agents/{agent}/x", body, agent=agent)
    assert (got, says in answer["error"]) == (status, True), answer


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"pageSize": "x"}, "pageSize"),
        ({"continuationToken": "audit|forged"}, "continuationToken"),
        ({"agent": "nobody"}, "no agent"),
    ],
)
def test_a_bad_audit_query_is_a_400_or_404(
    installed: App, params: dict[str, str], says: str
) -> None:
    response = api.agent_audit(
        func.HttpRequest("GET", "http://h/api/agents/audit", body=b"", params=params)
    )
    assert response.status_code in (400, 404)
    assert says in json.loads(response.get_body())["error"]


def test_a_store_that_does_not_answer_is_a_503_to_retry(installed: App) -> None:
    installed.store.fail_next(1, only={"write_control"})
    status, body = call(
        api.pause_agent, "POST", "agents/orders/pause", {"reason": "x"}, agent="orders"
    )
    assert status == 503 and body["retryable"] is True
    assert installed.ctx.agents_admin.show("orders")["paused"] is False


def test_two_operators_at_once_both_win_in_turn(installed: App) -> None:
    """The second write meets the first one's ETag: it reads again, decides again."""
    store = installed.store
    admin = installed.ctx.agents_admin
    real = store.write_control
    raced: list[bool] = []

    def first_another(control: AgentControl, entry: Any) -> AgentControl:
        if not raced:
            raced.append(True)
            admin.limits("orders", "bob", "meanwhile", concurrency=5)
        return real(control, entry)

    store.write_control = first_another  # type: ignore[method-assign]
    view = admin.pause("orders", "alice", "at the same time")
    assert view["paused"] and view["limits"]["concurrency"] == 5
    actions = [e["action"] for e in admin.audit()["entries"]]
    assert actions == ["pause", "limits"]


# --- the console ----------------------------------------------------------------------------

BASE = "http://h:7071/api/console"


def page(path: str, handler: Any, params: dict[str, str] | None = None, **route: str) -> str:
    response = handler(
        func.HttpRequest("GET", f"{BASE}{path}", params=params or {}, route_params=route, body=b"")
    )
    assert response.status_code == 200, response.get_body()[:500]
    return str(response.get_body().decode())


def test_the_console_pauses_an_agent_through_a_confirmation(installed: App) -> None:
    listing = page("/agents", console.console_agents)
    assert re.search(r'class="agent-row" data-agent="orders" data-paused="false"', listing)
    assert 'id="no-audit"' in listing
    confirm = page(
        "/agents/orders/confirm",
        console.console_agent_confirm,
        {"action": "pause", "reason": "their maintenance"},
        agent="orders",
    )
    assert "Pause agent orders?" in confirm and 'id="agent-confirm-form"' in confirm
    assert not installed.ctx.agents_admin.show("orders")["paused"]  # the GET changed nothing
    token = re.search(r'name="csrf" value="([^"]+)"', confirm)
    assert token
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', confirm))
    response = console.console_agent_change(
        func.HttpRequest(
            "POST",
            f"{BASE}/agents/orders/change",
            body=urlencode(form).encode(),
            route_params={"agent": "orders"},
            headers={
                "host": "h:7071",
                "cookie": f"{security.COOKIE}={token.group(1)}",
                "content-type": "application/x-www-form-urlencoded",
            },
        )
    )
    assert response.status_code == 303
    location = urlsplit(response.headers["Location"])
    assert f"paused by {DEV_OPERATOR.name}" in parse_qs(location.query)["message"][0]
    listing = page("/agents", console.console_agents)
    assert re.search(r'data-agent="orders" data-paused="true"', listing)
    assert re.search(r'class="audit-row" data-agent="orders" data-action="pause"', listing)
    assert "their maintenance" in listing

    installed.submit("o-1")
    detail = page("/orders/o-1", console.console_order, orderId="o-1")
    assert 'id="agent-paused"' in detail and 'data-agent="orders"' in detail
    assert "Waiting for agent orders to be resumed: step process runs then" in detail
    assert "paused" in page("", console.console_list, {"status": "pending"})


def confirm_page(agent: str, params: dict[str, str]) -> func.HttpResponse:
    """GET the console's confirmation of a change to ``agent``."""
    request = func.HttpRequest(
        "GET",
        f"{BASE}/agents/{agent}/confirm",
        params=params,
        route_params={"agent": agent},
        body=b"",
    )
    response: func.HttpResponse = console.console_agent_confirm(request)
    return response


def change_without_token(agent: str, body: bytes) -> func.HttpResponse:
    """POST a change to ``agent`` the way a forged form would: no CSRF token."""
    request = func.HttpRequest(
        "POST",
        f"{BASE}/agents/{agent}/change",
        body=body,
        route_params={"agent": agent},
        headers={"host": "h:7071"},
    )
    response: func.HttpResponse = console.console_agent_change(request)
    return response


def test_the_console_refuses_a_forged_or_bad_change(installed: App) -> None:
    forged = change_without_token("orders", b"action=pause&reason=x")
    assert forged.status_code == 403
    assert not installed.ctx.agents_admin.show("orders")["paused"]
    bad = confirm_page("orders", {"action": "limits", "concurrency": "0"})
    assert bad.status_code == 303 and "failed=1" in bad.headers["Location"]
    unknown = confirm_page("nobody", {"action": "pause", "reason": "x"})
    assert unknown.status_code == 404


def test_a_read_only_console_shows_the_agents_and_changes_none(installed: App) -> None:
    installed.ctx.settings = dataclasses.replace(installed.ctx.settings, console_read_only=True)
    listing = page("/agents", console.console_agents)
    assert 'class="agent-row" data-agent="orders"' in listing
    assert "pause-form" not in listing and "limits-form" not in listing
    confirm = confirm_page("orders", {"action": "pause", "reason": "x"})
    assert confirm.status_code == 403
    posted = change_without_token("orders", b"action=pause&reason=x")
    assert posted.status_code == 403
    assert not installed.ctx.agents_admin.show("orders")["paused"]
