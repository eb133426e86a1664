"""The kit's remotes and Python agents: each agent request the scheduler sends is bound to
its claim, as an agent binds it (``agents.binding``), recorded as the remote received it,
and answered as the test declared (``testkit.remotes``), or by the Python agent's own
handler, run as its agent runs one (``agents.python``).

Each attempt of a remote is one call: the agent's own retries within an attempt, its
breaker and limits are the product's, tested by its suite; here an attempt either
answers, refuses, fails every try (``unavailable``/``crash``) or never answers."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agents.binding import RequestBinding
from agents.python import PythonTry
from core import workflows
from core.messages import AgentReply, AgentRequest
from core.outcome import Applied
from core.plans import PlannedStep
from core.ports import StateStore
from testkit.checks import KitError, given
from testkit.remotes import (
    Answer,
    CallsBack,
    Fail,
    NoAnswer,
    Refuse,
    Remote,
    RemoteSpec,
    Result,
    Runs,
    per_call,
)


@dataclass(frozen=True)
class Call:
    """One call of a remote (or a Python agent) as it received it."""

    step: str
    attempt: int
    #: the ``Idempotency-Key`` header: the same on every attempt of the step
    key: str
    body: dict[str, Any]
    at: datetime
    #: the remote path (``POST {agent URL}/{path}``)
    path: str
    agent: str


@dataclass
class Pending:
    """A callback or a decision to deliver at ``due``."""

    due: datetime
    event: str
    body: dict[str, Any]
    by: str
    token: str | None


_CAPABILITY = re.compile(r"/api/orders/([^/?#]+)/events/([^/?#]+)\?token=([A-Za-z0-9.]+)")


class Player:
    """Plays every remote and Python agent of one run; keeps what each received
    (``calls``) and the callbacks to come (added to ``pending``)."""

    def __init__(
        self,
        store: StateStore,
        clock: Callable[[], datetime],
        steps: Mapping[str, PlannedStep],
        remotes: Mapping[str, RemoteSpec],
        pending: list[Pending],
    ) -> None:
        self._store = store
        self._clock = clock
        self._steps = steps
        self._remotes = remotes
        self._pending = pending
        self.calls: list[Call] = []
        self.order_id = ""
        self._ids: dict[str, int] = {}  # ids handed out, by field
        self._python: dict[str, PythonTry] = {}

    def call(self, request: AgentRequest) -> AgentReply | None:
        """Play the remote of one request: record what it received, answer as declared."""
        agent = request.agent
        bound = RequestBinding(self._store, agent)(request)
        body = dict(bound.order or {})
        self.calls.append(
            Call(
                bound.step,
                bound.attempt,
                bound.idempotency_key,
                body,
                self._clock(),
                bound.path,
                agent,
            )
        )
        calls = sum(1 for c in self.calls if c.step == bound.step) - 1
        spec = self._remotes.get(bound.step) or self._remotes.get(given(bound.step))
        if spec is None:
            declared = workflows.AGENTS[agent]
            if declared.kind == "python" and declared.handler is not None:
                return self._run_python(bound, declared.handler, agent)
            raise KitError(
                f"the run called {bound.step!r} (agent {agent!r}), for which remotes= declares "
                f"nothing: give remotes={{{bound.step!r}: answer({{...}})}} (or refuse, "
                "unavailable, crash, no_answer, calls_back, runs)"
            )
        return self._play(bound, per_call(spec, calls), body)

    def _play(
        self, request: AgentRequest, remote: Remote, body: dict[str, Any]
    ) -> AgentReply | None:
        path = request.path
        if isinstance(remote, Answer):
            result = _result(remote.result, body, request.step)
            if remote.id is not None:
                n = self._ids[remote.id] = self._ids.get(remote.id, 0) + 1
                result[remote.id] = f"{remote.id}-{n}"
            return request.succeeded(result)
        if isinstance(remote, Refuse):
            return request.refused(
                f"{path}: HTTP {remote.status} {remote.reason}",
                settled=remote.status in (400, 422),
            )
        if isinstance(remote, Fail):
            applied = Applied.MAYBE if remote.may_have_applied else Applied.NO
            return request.transient(f"{path}: {remote.reason}", applied)
        if isinstance(remote, NoAnswer):
            return None
        if isinstance(remote, CallsBack):
            planned = self._steps[request.step]
            event = str(planned.completes_on)
            token = self.capability(event, f"remotes={{{request.step!r}: calls_back(...)}}", body)
            callback: dict[str, Any] = (
                {"refused": remote.refused}
                if remote.refused is not None
                else {"result": _result(remote.result or {}, body, request.step)}
            )
            self._pending.append(
                Pending(
                    self._clock() + timedelta(seconds=remote.after),
                    event,
                    callback,
                    "remote",
                    token,
                )
            )
            return request.succeeded(dict(remote.accepted))
        assert isinstance(remote, Runs)
        return self._run_python(request, remote.handler, request.agent)

    def _run_python(self, request: AgentRequest, handler: Any, name: str) -> AgentReply:
        """One try of a Python handler, as its agent makes it (``agents.python``)."""
        runner = self._python.get(request.step)
        if runner is None or runner.handler is not handler:
            runner = self._python[request.step] = PythonTry(handler, name=name, clock=self._clock)
        # its step's own deadline, as its agent gives it (a handler that hangs is waited
        # for that long, in real seconds, then reported as may-have-applied)
        budget = max((request.complete_by - self._clock()).total_seconds(), 0.001)
        tried = asyncio.run(runner.run(request, budget))
        if tried.applied is Applied.YES:
            return request.succeeded(tried.result or {})
        if not tried.retryable:
            return request.refused(tried.error, settled=tried.settles)
        return request.transient(tried.error, tried.applied)

    def capability(self, event: str, where: str, body: Mapping[str, Any] | None = None) -> str:
        """The token of the URL ``events_url`` gave for ``event`` in a body a remote
        received (``body``, else any): a remote can call back only on it."""
        bodies = [body] if body is not None else [c.body for c in reversed(self.calls)]
        for received in bodies:
            for found in _CAPABILITY.finditer(json.dumps(received)):
                if found.group(1) == self.order_id and found.group(2) == event:
                    return found.group(3)
        raise KitError(
            f"{where}: the remote cannot call back: "
            + ("its body carries" if body is not None else "no body a remote received carries")
            + f" no events_url(ctx.order_id, {event!r}); put one in the step's input, e.g. "
            f'{{**ctx.order, "callback": events_url(ctx.order_id, {event!r})}}'
        )


def _result(result: Result, body: dict[str, Any], step: str) -> dict[str, Any]:
    value = result(dict(body)) if callable(result) else result
    if not isinstance(value, Mapping):
        raise KitError(f"the answer for {step!r} is {value!r}, not a JSON object")
    try:
        out = json.loads(json.dumps(dict(value)))
    except (TypeError, ValueError) as exc:
        raise KitError(f"the answer for {step!r} is not JSON: {exc}") from None
    assert isinstance(out, dict)
    return out
