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

The remotes and Python agents are played by ``testkit.players``; what a test may say
is checked by ``testkit.checks``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from bootstrap import AppContext, bootstrap
from config.settings import Settings
from core import links, workflows
from core.errors import TransitionRefused
from core.model import Order
from core.names import Names
from core.states import StepState
from stores.memory import InMemoryStateStore
from supervisor.service import SKEW_GRACE
from testkit.checks import KitError, check_use, steps_of, workflow_of
from testkit.fakes import FakeClock, RecordingKeeper, RecordingQueues, RecordingTransport
from testkit.players import Pending, Player
from testkit.remotes import Decision, RemoteSpec

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
        self._answered = 0  # requests of ``transport.requests`` answered
        self._delivered: set[int] = set()  # indexes of order-dispatch messages delivered
        self._pending: list[Pending] = []
        self._waiting_since: dict[str, datetime] = {}  # event -> when the kit saw it wait
        self._decided: set[str] = set()
        env = {
            "AzureWebJobsStorage": "UseDevelopmentStorage=true",  # never reached
            "AGENT_TRANSPORT": "storage",
            "REPLY_QUEUES": STATUS_QUEUE,
            "ORDERS_DECLARATIONS": declarations,
            "WEBSITE_HOSTNAME": HOST,
            **settings,
        }
        #: the app's host name, which ``events_url`` builds callback links on
        self.host = env["WEBSITE_HOSTNAME"]
        with self.using():
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
            self.spec = workflow_of(workflow, declarations)
            self.steps = steps_of(self.spec)
            check_use(workflow, self.steps, remotes, events)
        self.player = Player(self.store, self.clock, self.steps, self.remotes, self._pending)

    # --- the declarations in force ------------------------------------------------------

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """The run's declarations in force, and the app's host name set (``events_url``
        needs one), for the block; what was there before, after it."""
        before, host = workflows.in_use(), links.served_at()
        workflows.use(self.declarations)
        links.serve_at(self.host)
        try:
            yield
        finally:
            workflows.use(before)
            links.serve_at(host)

    # --- the run ----------------------------------------------------------------------

    def submit(self, order_id: str, workflow: str, data: Mapping[str, Any]) -> None:
        """Send the order to the scheduler as an app does (the order's own ``orderId``, if
        it has one, wins over ``order_id``)."""
        if data.get("workflow", workflow) != workflow:
            raise KitError(
                f"the order says workflow {data['workflow']!r}, the run {workflow!r}: "
                "leave workflow out of the order"
            )
        body = {"orderId": order_id, "workflow": workflow, "replyTo": STATUS_QUEUE, **data}
        with self.using():
            handled = self.app.scheduler.submit(json.dumps(body, default=str).encode())
        if str(handled) == "rejected":
            rejected = (self.queues.on(self.app.names.orders_rejected) or [{}])[-1]
            raise KitError(f"the order was refused: {rejected.get('reason', '?')}")
        self.order_id = self.player.order_id = str(body["orderId"])

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
            reply = self.player.call(request)
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
                token = self.player.capability(event, f"events={{{event!r}: ...}}")
            self._pending.append(
                Pending(
                    self._waiting_since[event] + timedelta(seconds=decision.after),
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


_NOBODY = Decision()


def _by_machine(order: Order, event: str) -> bool:
    planned = order.plan.step_for_event(event)
    return planned is not None and planned.by_machine
