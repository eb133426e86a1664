"""The app in process for one run of the kit: the app's own scheduler, supervisor and
operator admin, wired by ``bootstrap`` on the in-memory state store
(``stores/memory.py``, which stores every save as Table entities) and a fake clock;
the kit plays the agents and their remotes, and moves time.

The loop (``World.drive``): deliver the ``order-dispatch`` messages that are due; answer
each agent request the scheduler sent, as the test declared its remote (or with the
Python agent's declared handler); deliver the callbacks and decisions that are due;
when nothing more happens now, move the clock to the next moment something can (a
wake-up, a deadline the supervisor acts on, a callback or decision to come) and run the
supervisor and the sweep, as their timers would. Until the order ends, waits for an
``undecided()`` event, or has nothing left to wait for.

Each attempt of a remote is one call: the agent's own retries within an attempt, its
breaker and limits are the product's, tested by its suite; here an attempt either
answers, refuses, fails every try (``unavailable``/``crash``) or never answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agents.binding import RequestBinding
from agents.python import PythonTry
from bootstrap import AppContext, bootstrap
from core import workflows
from core.errors import TransitionRefused
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.names import Names
from core.outcome import Applied
from core.plans import PlannedStep
from core.settings import Settings
from core.states import StepState
from supervisor.service import SKEW_GRACE
from testkit.fakes import FakeClock, RecordingKeeper, RecordingQueues, RecordingTransport
from testkit.remotes import (
    Answer,
    CallsBack,
    Decision,
    Fail,
    NoAnswer,
    Refuse,
    Remote,
    RemoteSpec,
    Result,
    Runs,
    per_call,
)

#: Every run starts here (a fixed time: runs repeat exactly).
START = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)
#: The order's replyTo: the status messages the app sends for it.
STATUS_QUEUE = "testkit-status"
#: Who the kit's remotes are, as the order's history records a callback.
HOST = "testkit.invalid"
#: How long a run may move the clock, at most (a workflow that waits longer stops there).
HORIZON = timedelta(days=400)
#: How many times the loop may move the clock (a runaway loop is a kit bug, said so).
MAX_MOVES = 10_000
#: How long a Python handler may run, in real seconds, before its attempt is reported as
#: still running (it may have applied).
HANDLER_SECONDS = 10.0


class KitError(Exception):
    """A mistake in how a test uses the kit (or a declaration the kit cannot run): the
    message says what to change."""


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
class _Pending:
    """A callback or a decision to deliver at ``due``."""

    due: datetime
    event: str
    body: dict[str, Any]
    by: str
    token: str | None


_CAPABILITY = re.compile(r"/api/orders/([^/?#]+)/events/([^/?#]+)\?token=([A-Za-z0-9.]+)")


class World:
    """The app and its outside world for one run (one order)."""

    def __init__(
        self,
        declarations: str,
        workflow: str,
        remotes: Mapping[str, RemoteSpec],
        events: Mapping[str, Decision],
        settings: Mapping[str, str],
    ) -> None:
        self.declarations = declarations
        self.clock = FakeClock(START)
        self.queues = RecordingQueues(self.clock)
        self.transport = RecordingTransport()
        self.remotes = dict(remotes)
        self.events = dict(events)
        self.calls: list[Call] = []
        self._answered = 0  # requests of ``transport.requests`` answered
        self._delivered: set[int] = set()  # indexes of order-dispatch messages delivered
        self._pending: list[_Pending] = []
        self._waiting_since: dict[str, datetime] = {}  # event -> when the kit saw it wait
        self._decided: set[str] = set()
        self._ids: dict[str, int] = {}
        self._python: dict[str, PythonTry] = {}
        with self.using():
            from stores.memory import InMemoryStateStore

            env = {
                "AzureWebJobsStorage": "UseDevelopmentStorage=true",  # never reached
                "AGENT_TRANSPORT": "storage",
                "REPLY_QUEUES": STATUS_QUEUE,
                "ORDERS_DECLARATIONS": declarations,
                **settings,
            }
            self.store = InMemoryStateStore()
            self.app: AppContext = bootstrap(
                replace(Settings.from_env(env), instance_id="testkit"),
                names=Names(),
                clock=self.clock,
                store=self.store,
                queues=self.queues,
                transport=self.transport,
                kept=RecordingKeeper(),
            )
            self.spec = _workflow(workflow, declarations)
            self.steps = _steps_of(self.spec)
            self._check(workflow)

    # --- the declarations in force ------------------------------------------------------

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """The run's declarations in force, and the app's host name set (``events_url``
        needs one), for the block; what was there before, after it."""
        before = workflows.in_use()
        host = os.environ.get("WEBSITE_HOSTNAME")
        workflows.use(self.declarations)
        if not host:
            os.environ["WEBSITE_HOSTNAME"] = HOST
        try:
            yield
        finally:
            workflows.use(before)
            if not host:
                os.environ.pop("WEBSITE_HOSTNAME", None)

    def _check(self, workflow: str) -> None:
        """Refuse a remote or event the workflow does not have, or one of the wrong kind."""
        names = ", ".join(sorted(self.steps)) or "none"
        for name, spec in self.remotes.items():
            planned = self.steps.get(name)
            if planned is None:
                raise KitError(
                    f"remotes={{{name!r}: ...}}: workflow {workflow!r} has no step or "
                    f"compensation {name!r} (it has: {names})"
                )
            kind = "compensation" if planned.name != name else planned.kind
            if kind == "event":
                raise KitError(
                    f"remotes={{{name!r}: ...}}: {name!r} is an Event, decided by a person "
                    f"(or a remote's callback), not a remote's step: give it in "
                    f"events={{{name!r}: approve(...)}} (or decline, no_decision, undecided)"
                )
            if kind == "delay":
                raise KitError(
                    f"remotes={{{name!r}: ...}}: {name!r} is a Delay: it calls nothing, and "
                    "the kit's clock moves past it; give it nothing"
                )
            behaviours = spec if isinstance(spec, list | tuple) else [spec]
            for behaviour in behaviours:
                if isinstance(behaviour, Decision):
                    raise KitError(
                        f"remotes={{{name!r}: ...}}: a decision is for an Event: give "
                        f"{name!r} a remote's answer (answer, refuse, unavailable, crash, "
                        "no_answer, calls_back, runs)"
                    )
                if not isinstance(behaviour, Remote):
                    raise KitError(
                        f"remotes={{{name!r}: {behaviour!r}}}: not a remote's behaviour "
                        "(answer, refuse, unavailable, crash, no_answer, calls_back, runs)"
                    )
                if isinstance(behaviour, CallsBack) and (
                    kind == "compensation" or not planned.completes_on
                ):
                    raise KitError(
                        f"remotes={{{name!r}: calls_back(...)}}: {name!r} declares no "
                        "completes_on, so a callback completes nothing: use answer(...), or "
                        f'declare StepSpec({name!r}, ..., completes_on="<event>")'
                    )
        events = {p.name for p in self.steps.values() if p.kind == "event"}
        for name, decision in self.events.items():
            if not isinstance(decision, Decision):
                raise KitError(
                    f"events={{{name!r}: {decision!r}}}: an event takes approve(...), "
                    "decline(...), no_decision() or undecided()"
                )
            if name not in events:
                what = "a remote's step: give it in remotes=" if name in self.steps else "no event"
                raise KitError(
                    f"events={{{name!r}: ...}}: {name!r} is {what} of workflow {workflow!r} "
                    f"(its events: {', '.join(sorted(events)) or 'none'})"
                )

    # --- the run ----------------------------------------------------------------------

    def submit(self, order_id: str, workflow: str, data: Mapping[str, Any]) -> None:
        body = {"orderId": order_id, "workflow": workflow, "replyTo": STATUS_QUEUE, **data}
        with self.using():
            handled = self.app.scheduler.submit(json.dumps(body, default=str).encode())
        if str(handled) == "rejected":
            [rejected, *_] = [*self.queues.on(self.app.names.orders_rejected), {}]
            raise KitError(f"the order was refused: {rejected.get('reason', '?')}")
        self.order_id = order_id

    def order(self) -> Order:
        order = self.store.load(self.order_id)
        assert order is not None, f"order {self.order_id} is not stored"
        return order

    def drive(self, until: datetime | None = None) -> None:
        """Run until the order ends, stops for an ``undecided()`` event, or waits for
        nothing that can come within the horizon; with ``until``, until the clock reads
        that (past an ``undecided()`` event too: its timeout may pass)."""
        with self.using():
            end = until if until is not None else self.clock() + HORIZON
            for _ in range(MAX_MOVES):
                self._settle()
                order = self.order()
                if order.status.terminal or (until is None and self._stopped(order)):
                    return
                due = self._next(order)
                if due is None or due > end:
                    if until is None or self.clock() >= until:
                        return
                    due = until
                self._move(due)
            raise KitError(f"the run moved the clock {MAX_MOVES} times and did not end")

    def _move(self, when: datetime) -> None:
        """The clock to ``when``, then the supervisor and the sweep, as their timers run."""
        self.clock.set(when)
        errors = self.app.supervisor.run().errors + self.app.scheduler.sweep().errors
        if errors:
            raise KitError(f"the supervisor or the sweep failed: {'; '.join(errors)}")

    def _settle(self) -> None:
        """Everything that happens now, until nothing more does."""
        for _ in range(MAX_MOVES):
            moved = self._dispatch_due() + self._answer_requests() + self._deliver_due()
            if not moved:
                return
        raise KitError("the run kept working without the clock moving: a kit bug")

    def _dispatch_due(self) -> int:
        done = 0
        queue = self.app.names.order_dispatch
        now = self.clock()
        for n, message in enumerate(self.queues.sent):
            if message.queue != queue or n in self._delivered:
                continue
            if message.due is not None and message.due > now:
                continue
            self._delivered.add(n)
            self.app.scheduler.dispatch(json.loads(message.body)["orderId"])
            done += 1
        return done

    def _answer_requests(self) -> int:
        done = 0
        while self._answered < len(self.transport.requests):
            request = self.transport.requests[self._answered]
            self._answered += 1
            done += 1
            reply = self._call(request)
            if reply is not None:
                self.app.scheduler.apply_reply(reply)
        return done

    def _deliver_due(self) -> int:
        done = 0
        order = self.order()
        now = self.clock()
        for step in order.active_steps():
            event = (step.waiting_for or {}).get("event")
            if event is None or step.process_state is not StepState.PROCESSING:
                continue
            if event in self._decided or event in self._callbacks():
                continue  # decided already, or a remote's callback (``calls_back``)
            self._waiting_since.setdefault(event, now)
            decision = self.events.get(event)
            if decision is None:
                raise KitError(
                    f"the order waits for event {event!r}, for which events= declares "
                    f"nothing: give events={{{event!r}: approve(...)}} (or decline(...), "
                    "no_decision() for its timeout to pass, undecided() to stop the run there)"
                )
            body = decision.body
            if body is None:
                continue  # nobody decides
            self._decided.add(event)
            token = None
            if _by_machine(order, event):
                token = self._capability(event, f"events={{{event!r}: ...}}")
            self._pending.append(
                _Pending(
                    self._waiting_since[event] + _seconds(decision.after),
                    event,
                    body,
                    decision.by,
                    token,
                )
            )
        for pending in sorted(self._pending, key=lambda p: p.due):
            if pending.due > now:
                continue
            self._pending.remove(pending)
            # Refused (too late, stale): the order's history says so, as for a real one.
            with contextlib.suppress(TransitionRefused):
                self.app.events.deliver_event(
                    self.order_id, pending.event, pending.body, pending.by, token=pending.token
                )
            done += 1
        return done

    def _callbacks(self) -> set[str]:
        return {p.completes_on for p in self.steps.values() if p.completes_on}

    def _stopped(self, order: Order) -> bool:
        """The order waits for an ``undecided()`` event."""
        return any(
            self.events.get(str((s.waiting_for or {}).get("event")), _NOBODY).stop
            for s in order.active_steps()
            if s.process_state is StepState.PROCESSING
        )

    def decide(self, event: str, decision: Decision) -> None:
        """A decision for an event the run stopped at (or any the order still waits for)."""
        events = sorted(p.name for p in self.steps.values() if p.kind == "event")
        if event not in events:
            raise KitError(
                f"decide({event!r}, ...): workflow {self.spec.name!r} has no event {event!r} "
                f"(its events: {', '.join(events) or 'none'})"
            )
        self.events[event] = decision
        self._decided.discard(event)

    def _next(self, order: Order) -> datetime | None:
        """The next moment something can happen: a wake-up, a deadline the supervisor
        acts on, a callback or decision to deliver."""
        now = self.clock()
        times = [p.due for p in self._pending]
        times += [m.due for m in self._undelivered() if m.due is not None]
        grace = SKEW_GRACE + timedelta(seconds=1)
        for step in order.steps:
            if step.process_state in (StepState.PROCESSING, StepState.COMPENSATING):
                times.append(step.complete_by + grace)
            if step.process_state is StepState.PENDING:
                times.append(max(step.not_before, now) + grace)
        later = [t for t in times if t > now]
        return min(later) if later else None

    def _undelivered(self) -> list[Any]:
        queue = self.app.names.order_dispatch
        return [
            m
            for n, m in enumerate(self.queues.sent)
            if m.queue == queue and n not in self._delivered
        ]

    # --- the remotes ------------------------------------------------------------------

    def _call(self, request: AgentRequest) -> AgentReply | None:
        """Play the remote of one request: record what it received, answer as declared."""
        agent = request.agent
        bound = RequestBinding(self.store, agent)(request)
        body = dict(bound.order or {})
        self.calls.append(
            Call(
                bound.step,
                bound.attempt,
                bound.idempotency_key,
                body,
                self.clock(),
                bound.path,
                agent,
            )
        )
        calls = sum(1 for c in self.calls if c.step == bound.step) - 1
        spec = self.remotes.get(bound.step)
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
            planned = self.steps[request.step]
            event = str(planned.completes_on)
            token = self._capability(event, f"remotes={{{request.step!r}: calls_back(...)}}", body)
            callback: dict[str, Any] = (
                {"refused": remote.refused}
                if remote.refused is not None
                else {"result": _result(remote.result or {}, body, request.step)}
            )
            self._pending.append(
                _Pending(self.clock() + _seconds(remote.after), event, callback, "remote", token)
            )
            return request.succeeded(dict(remote.accepted))
        assert isinstance(remote, Runs)
        return self._run_python(request, remote.handler, request.agent)

    def _run_python(self, request: AgentRequest, handler: Any, name: str) -> AgentReply:
        """One try of a Python handler, as its agent makes it (``agents.python``)."""
        runner = self._python.get(request.step)
        if runner is None or runner.handler is not handler:
            runner = self._python[request.step] = PythonTry(handler, name=name, clock=self.clock)
        tried = asyncio.run(runner.run(request, HANDLER_SECONDS))
        if tried.applied is Applied.YES:
            return request.succeeded(tried.result or {})
        if not tried.retryable:
            return request.refused(tried.error, settled=tried.settles)
        return request.transient(tried.error, tried.applied)

    def _capability(self, event: str, where: str, body: Mapping[str, Any] | None = None) -> str:
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


_NOBODY = Decision()


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


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


def _by_machine(order: Order, event: str) -> bool:
    planned = order.plan.step_for_event(event)
    return planned is not None and planned.by_machine


def _workflow(name: str, declarations: str) -> workflows.Workflow:
    try:
        return workflows.WORKFLOWS[name]
    except KeyError:
        raise KitError(
            f"{declarations} declares no workflow {name!r} (it declares: "
            f"{', '.join(sorted(workflows.WORKFLOWS))})"
        ) from None


def _steps_of(workflow: workflows.Workflow) -> dict[str, PlannedStep]:
    """Every step, event, delay and compensation of the workflow, by name (a
    compensation maps to the step it undoes)."""
    plan = workflows.Plan.of(workflow, 30)
    out: dict[str, PlannedStep] = {}
    for planned in plan.steps:
        out[planned.name] = planned
        if planned.compensation:
            out[planned.compensation] = planned
    return out
