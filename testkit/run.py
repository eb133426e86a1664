"""``run_workflow``: one order of a declared workflow, run in process to its end, and what a
test reads of it (``Run``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any

from admin.service import order_view
from config.settings import declarations_of
from testkit.checks import KitError
from testkit.players import Call
from testkit.remotes import Decision, RemoteSpec
from testkit.world import START, STATUS_QUEUE, World

#: Who the kit's operator is, in the order's history.
OPERATOR = "ops@testkit"


@dataclass(frozen=True)
class Step:
    """A step (or compensation, or event, or delay) of the order, as its record stands."""

    name: str
    #: ``pending``, ``processing``, ``processed``, ``skipped``, ``error``, ``compensating``,
    #: ``compensated`` (the record's ProcessState, in lower case)
    state: str
    #: what it returned (a remote's 2xx JSON, a handler's dict, an event's result)
    result: dict[str, Any] | None
    #: the last failure's text (a remote's refusal, a raised exception ...)
    error: str | None
    #: how many attempts were made
    attempts: int
    #: the body its calls sent, as its ``input`` decided (None: the order's JSON)
    input: dict[str, Any] | None
    #: it failed and the order went on (``on_failure="continue"``)
    continued: bool
    #: the step as ``GET /api/orders/{id}`` shows it
    view: dict[str, Any]


class Run:
    """An order run by the kit, read live: after ``resubmit``, ``cancel`` or ``decide``
    it shows the order as it stands then."""

    def __init__(self, world: World) -> None:
        self._world = world

    def __repr__(self) -> str:
        """The order's status and each step's state, what a failed assert shows."""
        steps = ", ".join(f"{s.name} {s.state}" for s in self.steps.values())
        return f"<Run {self.order_id} {self.status}: {steps}>"

    @property
    def order_id(self) -> str:
        return self._world.order_id

    @property
    def status(self) -> str:
        """``completed``, ``compensated``, ``cancelled``, ``error``; or ``processing`` /
        ``pending`` for an order the run left waiting (``waiting_for`` says for what)."""
        return str(self._world.order().status)

    @property
    def steps(self) -> dict[str, Step]:
        """Each step's latest record, by name (compensations by their own name)."""
        order = self._world.order()
        view = order_view(order)
        shown = {s["step"]: s for s in view["steps"]}
        out: dict[str, Step] = {}
        for record in sorted(order.steps, key=lambda s: s.seq):
            out[record.step] = Step(
                record.step,
                str(record.process_state).lower(),
                record.result,
                record.last_error,
                record.attempt,
                record.input,
                record.continued,
                shown.get(record.step, {}),
            )
        return out

    def step(self, name: str) -> Step:
        """The step ``name``; a ``KitError`` naming those the order has if it has none."""
        steps = self.steps
        if name not in steps:
            raise KitError(
                f"order {self.order_id} has no record of {name!r} (never reached, or no such "
                f"step): it has {', '.join(steps) or 'none'}"
            )
        return steps[name]

    @property
    def results(self) -> dict[str, Any]:
        """What each step that succeeded returned, by name: ``ctx.results`` as the
        declarations' functions see it (a step undone since keeps its result; a
        ForEach's, the list of its items' results)."""
        return dict(self._world.order().context().results)

    @property
    def calls(self) -> list[Call]:
        """Every call of a remote or a Python agent, in order: body, key, attempt, time."""
        return list(self._world.player.calls)

    @property
    def received(self) -> dict[str, list[dict[str, Any]]]:
        """The bodies each remote received, by step (or compensation), one per call."""
        out: dict[str, list[dict[str, Any]]] = {}
        for call in self._world.player.calls:
            out.setdefault(call.step, []).append(call.body)
        return out

    def keys(self, step: str) -> list[str]:
        """The ``Idempotency-Key`` of each call of ``step``."""
        return [c.key for c in self._world.player.calls if c.step == step]

    @property
    def alerts(self) -> list[dict[str, Any]]:
        """The operator alerts about the order (``operator-alerts``: ``step``, ``reason``,
        ``failureCount`` ...), in order."""
        queue = self._world.app.names.operator_alerts
        return [a for a in self._world.queues.on(queue) if a.get("orderId") == self.order_id]

    @property
    def statuses(self) -> list[str]:
        """The status messages the order's ``replyTo`` received, in order."""
        return [
            m["status"]
            for m in self._world.queues.on(STATUS_QUEUE)
            if m.get("orderId") == self.order_id
        ]

    @property
    def history(self) -> list[dict[str, Any]]:
        """The order's history (what happened, who did it, why)."""
        return list(self._world.order().history)

    @property
    def waiting_for(self) -> list[dict[str, Any]]:
        """What the order waits for now (an event, a callback, a delay's end)."""
        return list(order_view(self._world.order())["waitingFor"])

    @property
    def view(self) -> dict[str, Any]:
        """The order as ``GET /api/orders/{id}`` shows it."""
        return order_view(self._world.order())

    @property
    def elapsed(self) -> timedelta:
        """How far the kit moved the clock."""
        return self._world.clock() - START

    @property
    def now(self) -> datetime:
        return self._world.clock()

    # --- an operator's moves, then the run goes on ------------------------------------

    def resubmit(
        self, patch: Mapping[str, Any] | None = None, *, reason: str = "fixed (testkit)"
    ) -> Run:
        """Fix and resubmit the order (``patch``: a JSON merge patch of its data), as an
        operator does, then run on."""
        with self._world.using():
            self._world.app.admin.resubmit(
                self.order_id, OPERATOR, reason, dict(patch) if patch is not None else None
            )
        self._world.drive()
        return self

    def cancel(
        self, *, reason: str = "cancelled (testkit)", not_applied: Sequence[str] = ()
    ) -> Run:
        """Cancel the order as an operator does (what applied is undone), then run on;
        ``not_applied``: the steps in doubt the operator states did not happen."""
        with self._world.using():
            self._world.app.admin.cancel(self.order_id, OPERATOR, reason, list(not_applied) or None)
        self._world.drive()
        return self

    def decide(self, event: str, decision: Decision) -> Run:
        """Deliver a decision for an event the run stopped at (``undecided()``), then run on."""
        self._world.decide(event, decision)
        self._world.drive()
        return self

    def advance(self, seconds: float) -> Run:
        """Let ``seconds`` pass on the kit's clock, with all that happens in them (an
        ``undecided()`` event's timeout too), then stop there."""
        self._world.drive(until=self._world.clock() + timedelta(seconds=seconds))
        return self


def run_workflow(
    workflow: str,
    order: Mapping[str, Any] | None = None,
    remotes: Mapping[str, RemoteSpec] | None = None,
    *,
    events: Mapping[str, Decision] | None = None,
    declarations: str | ModuleType | None = None,
    order_id: str = "order-1",
    settings: Mapping[str, str] | None = None,
) -> Run:
    """Submit one order of ``workflow`` with the business data ``order`` and run it in
    process until it ends (or waits for an ``undecided()`` event, or for nothing that can
    come): the app's own scheduler, supervisor and admin, on the in-memory state store and
    a fake clock that jumps to each next deadline, delay or decision (milliseconds a run).

    ``remotes``: how each step's remote answers (``testkit.remotes``), by step or
    compensation name; a step on a Python agent runs its declared handler unless given
    one. ``events``: what a person decides for each ``Event``. ``declarations``: the
    module (or its name) that declares the workflow; default ``ORDERS_DECLARATIONS``, else
    ``declarations``. ``settings``: app settings (``STEP_TIMEOUT_SECONDS``,
    ``MAX_FAILURE_COUNT`` ...)."""
    if isinstance(declarations, ModuleType):
        declarations = declarations.__name__
    world = World(
        declarations or declarations_of(os.environ),
        workflow,
        remotes or {},
        events or {},
        settings or {},
    )
    world.submit(order_id, workflow, order or {})
    world.drive()
    return Run(world)
