"""The adapter: the ONLY place the model touches the engine.

Everything the model does to the app, and everything it reads back, goes through
``World``: build the stack, submit, list the requests the agents were sent, reply as an
agent, call back as a remote, decide as a person, cancel, resubmit (with or without a
patch), say "not needed", run the supervisor (on its own clock or a skewed one), run the
sweep, deliver the due ``order-dispatch`` messages, read the stored order. What comes
back is the model's own small vocabulary (``Req``, ``Answer``, ``OrderSnap``), never an
engine object the model would have to understand. When the engine's API changes (the
rewrite), this file changes and the model does not:

- a callback (``callback``) will need the capability URL or token bound to the run it
  answers: take it from the step's request (``Req.raw``: the ``AgentRequest`` as sent,
  or the ``events_url`` its ``input`` put in the body) and pass it along;
- an event by a person (``decide``) will need an operator principal (``Orders.Operator``)
  instead of the plain ``by`` string;
- ``snapshot`` maps the stored order to ``OrderSnap``: if the records change shape, the
  mapping changes here.

Today it wires the scheduler, the supervisor and the operator's admin through the app's
own ``bootstrap`` on the in-memory state store (``stores/memory.py``, which serializes
every save as Table entities), a fake clock, and queues and a transport that record
what they are given, as ``tests/unit/test_services_in_memory.py`` does.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from admin.service import OrderAdmin
from bootstrap import AppContext, bootstrap
from core.errors import (
    Forbidden,
    InvalidEvent,
    OrderChanged,
    OrderNotFound,
    TransitionRefused,
)
from core.inbox import capability
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.names import Names
from core.outcome import Applied
from core.patches import InvalidPatch
from core.states import StepKind, StepState
from core.turns import Slot
from scheduler.service import Handled
from stores.memory import InMemoryStateStore
from testkit.fakes import RecordingKeeper, RecordingQueues, RecordingTransport
from tests.model.vocabulary import Answer, AnswerKind, OrderSnap, ReplyKind, Req, StepSnap
from tests.support import FakeClock, settings_from

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
#: STEP_TIMEOUT_SECONDS: every task's (and compensation's) deadline after its claim.
TIMEOUT = 30
#: MAX_FAILURE_COUNT: two counted failures and a step fails for good (edges come sooner).
MAX_FAILURES = 2
#: MAX_CLOCK_SKEW_SECONDS as the app's default has it: how far apart instances' clocks may
#: be; a compensation must not be requested before its step's last deadline plus this.
ALLOWED_SKEW = 10.0
#: The order's replyTo: the app's status messages to it are what I7 reads.
STATUS_QUEUE = "app-status"
#: Who the model's people and remotes are, as the engine records them.
OPERATOR = "ops@model"
REMOTE = "remote@model"

#: What the events API answered (200 taken or same, 202 kept).
_EVENT_ANSWERS: dict[str, AnswerKind] = {"taken": "taken", "kept": "kept", "same": "same"}
#: The refusals the operator API maps to a 4xx (admin/triggers.py ``_answer``).
EXPECTED = (
    InvalidEvent,
    InvalidPatch,
    OrderNotFound,
    OrderChanged,
    TransitionRefused,
    Forbidden,
)


class _StoreTap:
    """The in-memory store, keeping each order as it was last saved: the model's snapshot
    of it (read without parsing the rows again: ``World.reload_differences`` checks that
    a load reads the same), and the saved object itself, to compare with a load."""

    def __init__(self, store: InMemoryStateStore) -> None:
        self._store = store
        self.saved: dict[str, Order] = {}
        self.snaps: dict[str, OrderSnap] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def create(self, order: Order) -> Any:
        out = self._store.create(order)
        self._keep(order)
        return out

    def save(self, order: Order) -> Any:
        out = self._store.save(order)
        self._keep(order)
        return out

    def _keep(self, order: Order) -> None:
        self.saved[order.order_id] = order
        self.snaps[order.order_id] = snapshot_of(order)


class World:
    """The app as the model drives it. One per generated example."""

    def __init__(self, declarations: str) -> None:
        self.clock = FakeClock(T0)
        self.store = InMemoryStateStore()
        self._tap = _StoreTap(self.store)
        self._queues = RecordingQueues(self.clock)
        self._transport = RecordingTransport()  # the model plays every agent
        self._declarations = declarations
        self._app = self._context("scheduler-1", self.clock)
        self._skewed: dict[float, AppContext] = {}
        self._delivered: set[int] = set()  # indexes of order-dispatch messages delivered
        self._read = 0  # messages of ``_queues.sent`` decoded into ``_told``
        self._told: dict[str, list[dict[str, Any]]] = {}
        self._lose_releases = 0  # releases to lose (their instance died after the save)

    def _context(self, instance: str, clock: Callable[[], datetime]) -> AppContext:
        settings = settings_from(
            {
                "AzureWebJobsStorage": "UseDevelopmentStorage=true",  # never reached
                "AGENT_TRANSPORT": "storage",
                "STEP_TIMEOUT_SECONDS": str(TIMEOUT),
                "MAX_FAILURE_COUNT": str(MAX_FAILURES),
                "MAX_CLOCK_SKEW_SECONDS": str(int(ALLOWED_SKEW)),
                "REPLY_QUEUES": STATUS_QUEUE,
                "ORDERS_DECLARATIONS": self._declarations,
            }
        )
        app = bootstrap(
            replace(settings, instance_id=instance),
            names=Names(),
            clock=clock,
            store=self._tap,
            queues=self._queues,
            transport=self._transport,
            kept=RecordingKeeper(),
        )
        # Before any service takes the keeper's ``release``: one may be lost on purpose.
        keeper = app.turns
        release = keeper.release

        def released(order: Order, wake: Callable[[str], None] | None = None) -> Slot | None:
            rule = order.plan.concurrency
            if self._lose_releases and rule is not None and rule.releases(order.status):
                self._lose_releases -= 1
                return None
            return release(order, wake)

        keeper.release = released  # type: ignore[method-assign]
        return app

    # --- time ------------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # --- the app's inputs ------------------------------------------------------------------

    def submit(self, order_id: str, workflow: str, data: dict[str, Any]) -> Answer:
        body = {"orderId": order_id, "workflow": workflow, "replyTo": STATUS_QUEUE, **data}
        return _call(lambda: _handled(self._app.scheduler.submit(json.dumps(body).encode())))

    def requests(self) -> list[Req]:
        """Every request the agents were sent, in order."""
        return [_req(n, r) for n, r in enumerate(self._transport.requests)]

    def reply(
        self,
        req: Req,
        kind: ReplyKind,
        *,
        not_before: datetime | None = None,
        answered_at: datetime | None = None,
    ) -> Answer:
        """The agent's report of ``req``'s attempt, as the reply queue delivers it
        (``answered_at``: when the remote answered a success, by the agent's clock)."""
        request = _request(req)
        now = self.now()
        if kind == "success":
            reply = replace(request.succeeded({"ref": req.key}), answered_at=answered_at or now)
        elif kind in ("refused", "refused-settled"):
            reply = request.refused(
                "HTTP 422 the service refused it", settled=kind == "refused-settled"
            )
        elif kind == "transient-no":
            reply = request.transient("HTTP 503 unavailable (every try)", Applied.NO)
        elif kind == "transient-maybe":
            reply = request.transient("no answer before the deadline", Applied.MAYBE)
        else:
            reply = request.deferred("not called: circuit open", not_before or now, Applied.NO)
        return self.redeliver(reply)

    def redeliver(self, handle: object) -> Answer:
        """A report delivered again (a duplicate, late, out of order)."""
        assert isinstance(handle, AgentReply)
        answer = _call(lambda: _handled(self._app.scheduler.apply_reply(handle)))
        return replace(answer, handle=handle)

    def callback(self, req: Req, event: str, body: dict[str, Any]) -> Answer:
        """The remote's callback for ``req``'s run (``completes_on``), on the events API:
        on the capability URL its step gave it, bound to the order, the event and the run
        (``req.key_round``: the run the request was sent for; docs/contracts.md §3.15)."""
        order = self._app.store.load(req.order_id)
        if order is None:
            return Answer("not-found", "no such order")
        token = capability(order.event_key, req.order_id, event, req.key_round)
        return self._event(req.order_id, event, body, REMOTE, token=token)

    def decide(self, order_id: str, event: str, body: dict[str, Any]) -> Answer:
        """A person's decision for an ``Event`` step (from the console or the API). An
        engine that asks who decides takes an operator principal here."""
        return self._event(order_id, event, body, OPERATOR)

    def _event(
        self, order_id: str, event: str, body: dict[str, Any], by: str, token: str | None = None
    ) -> Answer:
        def deliver() -> Answer:
            effect, _view = self._app.events.deliver_event(order_id, event, body, by, token=token)
            return Answer(_EVENT_ANSWERS.get(effect, "ok"), effect)

        return _call(deliver)

    def cancel(self, order_id: str, not_applied: str | list[str] | None = None) -> Answer:
        """Cancel (``not_applied``: the operator states that step did not happen)."""
        admin: OrderAdmin = self._app.admin
        return _call(
            lambda: _ok(admin.cancel(order_id, OPERATOR, "model", not_applied=not_applied))
        )

    def not_needed(self, order_id: str, step: str) -> Answer:
        """The operator states ``step`` did not happen, so its failed compensation is not
        needed (today: a cancel naming the step, contract 3.15)."""
        return self.cancel(order_id, not_applied=step)

    def doubtful(self, order_id: str) -> list[str]:
        """The steps a cancel would need a statement for now (the console's preview)."""
        try:
            preview = self._app.admin.cancel_preview(order_id)
        except EXPECTED:
            return []
        return list(preview.get("doubtful") or [])

    def resubmit(self, order_id: str, patch: dict[str, Any] | None = None) -> Answer:
        return _call(lambda: _ok(self._app.admin.resubmit(order_id, OPERATOR, "model", patch)))

    # --- the app's timers and queues --------------------------------------------------------

    def supervise(self, skew_seconds: float = 0.0) -> Answer:
        """A supervisor run; ``skew_seconds``: on an instance whose clock is that far off."""
        app = self._app
        if skew_seconds:
            app = self._skewed.get(skew_seconds) or self._skewed.setdefault(
                skew_seconds,
                self._context(
                    f"supervisor-{skew_seconds:+g}",
                    lambda: self.clock() + timedelta(seconds=skew_seconds),
                ),
            )
        return _call(lambda: _report(app.supervisor.run().errors))

    def sweep(self) -> Answer:
        return _call(lambda: _report(self._app.scheduler.sweep().errors))

    def dispatch_due(self) -> Answer:
        """Deliver every ``order-dispatch`` message whose time has come (and those they
        queue that are due at once)."""

        def deliver() -> Answer:
            done = 0
            while (due := self._due()) and done < 100:
                for n, order_id in due:
                    self._delivered.add(n)
                    self._app.scheduler.dispatch(order_id)
                    done += 1
            return Answer("ok", f"{done} delivered")

        return _call(deliver)

    def _due(self) -> list[tuple[int, str]]:
        now = self.now()
        queue = self._app.names.order_dispatch
        return [
            (n, json.loads(m.body)["orderId"])
            for n, m in enumerate(self._queues.sent)
            if m.queue == queue and n not in self._delivered and m.due is not None and m.due <= now
        ]

    def next_wakeup(self) -> datetime | None:
        """When the earliest ``order-dispatch`` message not delivered yet becomes due."""
        queue = self._app.names.order_dispatch
        times = [
            m.due
            for n, m in enumerate(self._queues.sent)
            if m.queue == queue and n not in self._delivered and m.due is not None
        ]
        return min(times) if times else None

    # --- per-key concurrency (§3.16) ------------------------------------------------------

    def slot(self, workflow: str, key: str) -> Slot:
        """The key's slot as stored: its holders and its line."""
        return self.store.read_slot(workflow, key)

    def lose_next_release(self) -> None:
        """The next release of a slot is lost: its instance dies after the order's save,
        before the slot is written."""
        self._lose_releases += 1

    def lose_wakes(self, order_ids: set[str]) -> int:
        """The ``order-dispatch`` messages not delivered yet for these orders are lost
        (their instance died before sending them, or the queue lost them): how many."""
        queue = self._app.names.order_dispatch
        lost = [
            n
            for n, m in enumerate(self._queues.sent)
            if m.queue == queue
            and n not in self._delivered
            and json.loads(m.body)["orderId"] in order_ids
        ]
        self._delivered.update(lost)
        return len(lost)

    # --- what the app tells ------------------------------------------------------------

    def statuses(self, order_id: str) -> list[str]:
        """The status messages the app's replyTo queue received for the order, in order."""
        return [m["status"] for m in self._json(STATUS_QUEUE) if m.get("orderId") == order_id]

    def alerts(self, order_id: str) -> list[str]:
        """The operator alerts about the order, in order (their reasons)."""
        queue = self._app.names.operator_alerts
        return [str(m.get("reason")) for m in self._json(queue) if m.get("orderId") == order_id]

    def _json(self, queue: str) -> list[dict[str, Any]]:
        sent = self._queues.sent
        for m in sent[self._read :]:
            self._told.setdefault(m.queue, []).append(json.loads(m.body))
        self._read = len(sent)
        return self._told.get(queue, [])

    # --- the stored order ---------------------------------------------------------------

    def snapshot(self, order_id: str) -> OrderSnap | None:
        """The order as it was last saved (None: never stored)."""
        return self._tap.snaps.get(order_id)

    def results(self, order_id: str) -> dict[str, Any] | None:
        """``ctx.results`` as a step of the stored order would see it now (None: no order):
        a ``ForEach``'s is the list of its items' results."""
        order = self.store.load(order_id)
        return dict(order.context().results) if order is not None else None

    def reload_differences(self, order_id: str) -> list[str]:
        """What a load from the store reads differently from the order as it was saved
        (the store serializes every save as Table entities: this checks the codec)."""
        saved = self._tap.saved.get(order_id)
        loaded = self.store.load(order_id)
        if saved is None or loaded is None:
            return [] if saved is loaded else [f"saved {saved is not None}, loaded {loaded}"]
        return _differences(_plain(saved), _plain(loaded), "order")


# --- helpers --------------------------------------------------------------------------------


def snapshot_of(order: Order) -> OrderSnap:
    """The model's view of a stored order: its status and the latest record of each step."""
    latest: dict[str, Any] = {}
    for record in sorted(order.steps, key=lambda s: s.seq):
        latest[record.step] = record
    steps = []
    for record in latest.values():
        state = record.process_state
        known = record.attempts.applied or state is StepState.PROCESSED
        if state in (StepState.COMPENSATING, StepState.COMPENSATED):
            known = known or record.result is not None
        steps.append(
            StepSnap(
                name=record.step,
                action=record.kind is StepKind.ACTION,
                compensates=record.compensates,
                state=str(state).lower(),
                key_round=record.key_round,
                attempt=record.attempt,
                deadline=record.complete_by,
                known_applied=known,
                accepted=any(a.accepted for a in record.attempts.items),
                in_doubt=record.may_have_applied,
                continued=record.continued,
                in_flight=record.is_active and any(a.in_flight for a in record.attempts.items),
            )
        )
    return OrderSnap(order.order_id, str(order.status), order.cancel_requested, tuple(steps))


#: Fields that are the store's bookkeeping or not stored at all, not the order's state.
_UNSTORED = frozenset({"etag", "outbox", "store_meta", "wakeups", "changed", "version"})


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.name not in _UNSTORED
        }
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _differences(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b), key=str):
            out += _differences(a.get(key), b.get(key), f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for n, (x, y) in enumerate(zip(a, b, strict=True)):
            out += _differences(x, y, f"{where}[{n}]")
        return out
    return [] if a == b else [f"{where}: saved {a!r}, loaded {b!r}"[:300]]


def _req(index: int, request: AgentRequest) -> Req:
    return Req(
        index,
        request.order_id,
        request.step,
        request.attempt,
        request.key_round,
        request.idempotency_key,
        request.complete_by,
        request,
    )


def _request(req: Req) -> AgentRequest:
    assert isinstance(req.raw, AgentRequest)
    return req.raw


def _handled(handled: Handled) -> Answer:
    kinds: dict[Handled, AnswerKind] = {
        Handled.APPLIED: "applied",
        Handled.NOTED: "noted",
        Handled.STALE: "stale",
        Handled.UNBOUND: "unbound",
    }
    return Answer(kinds.get(handled, "ok"), str(handled))


def _ok(_view: object) -> Answer:
    return Answer("ok")


def _report(errors: list[str]) -> Answer:
    if errors:
        return Answer("unexpected", "; ".join(errors)[:500])
    return Answer("ok")


def _call(action: Callable[[], Answer]) -> Answer:
    """Run one call into the app: its answer, the refusal the API would map to a 4xx, or
    anything else as ``unexpected`` (a bug: 3.7 allows no 500)."""
    try:
        return action()
    except TransitionRefused as exc:
        return Answer("refused", f"{exc.reason}: {exc.message}"[:300], error=exc)
    except (InvalidEvent, InvalidPatch) as exc:
        return Answer("invalid", exc.message[:300], error=exc)
    except (OrderNotFound, OrderChanged) as exc:
        return Answer("not-found", exc.message[:300], error=exc)
    except Exception as exc:
        return Answer("unexpected", f"{type(exc).__name__}: {exc}"[:500], error=exc)
