"""The model: a Hypothesis rule-based state machine that generates a workflow, submits one
order of it, and plays everything the world can do to that order, checking contract
3.15's invariants I1-I7 (3.17's I8, and 3.16's I9-I11 for a ``ForEach``) after every
transition.

Rules are what the world can do, every one through the adapter (``tests.model.world``):
an agent's report of any request ever sent (success, refused, refused after the service
looked the key up, transient with "no" or "maybe", deferred), a duplicate of any report
sent, the remote applying a request and saying nothing, a remote's callback for any run
of a ``completes_on`` step (result, refusal, the webhook's retry of the same body), a
person's decision for an ``Event`` step (early, late, twice, another body), time passing
(a second to twenty minutes, or to just past the next deadline), the supervisor (also
one on a clock a few seconds off), the scheduler's sweep, the due ``order-dispatch``
messages, an operator's cancel (with a statement only where the truth allows one),
resubmit (with or without a patch), "not needed", and a reload from the store.

The model plays every remote, so it knows what really applied (``tests.model.truth``);
the checks (``tests.model.checks``) compare the engine's decisions with that truth, and
the invariants raise what they found, each signature its own exception
(``tests.model.signatures``). At teardown the world calms down and the order must end.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from hypothesis import currently_in_test_context, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.model import checks, signatures
from tests.model.flows import WORKFLOW, Flow, flows, installed
from tests.model.signatures import Finding, invariant_of, violation
from tests.model.truth import REPORTS, Call, CallbackBody, Ledger, Report
from tests.model.vocabulary import Answer, OrderSnap, ReplyKind, finished, terminal
from tests.model.world import World

ORDER: Final = "m-1"
#: As drawn: a success is the commonest answer (and what moves an order on).
DRAWN: Final[list[Report]] = ["success", "success", *REPORTS]
#: Which request, report or key a rule picks: counted from the latest (0: the latest).
PICK = st.integers(min_value=0, max_value=7)
DECISIONS: Final[dict[str, dict[str, Any]]] = {
    "approve": {"result": {"approved": True}},
    "refuse": {"refused": "no"},
    "other": {"result": {"approved": False}},
}
#: Supervisor clocks: its own, or an instance's a few seconds off (under the allowed skew).
SKEWS: Final = {"same": 0.0, "ahead": 3.0, "behind": -3.0}
#: Calm rounds the order gets to reach a terminal status at teardown.
LIVENESS_ROUNDS: Final = 40


def _ready(machine: EngineModel) -> bool:
    return machine.snap is not None


def _has_calls(machine: EngineModel) -> bool:
    return machine.snap is not None and bool(machine.ledger.calls)


def _has_reports(machine: EngineModel) -> bool:
    return bool(machine.reports)


def _has_callbacks(machine: EngineModel) -> bool:
    return machine.snap is not None and bool(machine.ledger.callback_keys())


def _has_events(machine: EngineModel) -> bool:
    return machine.snap is not None and bool(machine.flow.events())


def _unfinished(machine: EngineModel) -> bool:
    return machine.snap is not None and not finished(machine.snap.status)


def _in_error(machine: EngineModel) -> bool:
    return machine.snap is not None and machine.snap.status == "error"


def _undo_failed(machine: EngineModel) -> bool:
    snap = machine.snap
    return (
        snap is not None
        and snap.status == "error"
        and any(not s.action and s.state == "error" for s in snap.steps)
    )


@dataclass
class _Sent:
    """A report the model delivered, to deliver again (a duplicate)."""

    handle: object
    wire: ReplyKind
    call: Call


class EngineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.flow = Flow()
        self.ledger = Ledger(self.flow)
        self.snap: OrderSnap | None = None
        self._world: World | None = None
        self._declared = contextlib.ExitStack()
        self.reports: list[_Sent] = []
        #: per request index: the reports delivered for it
        self.reported: dict[int, list[ReplyKind]] = {}
        #: keys whose success (a task's 2xx, a callback's result) the model delivered
        self.successes: set[str] = set()
        #: what the checks found since the invariants last ran, by signature
        self.found: dict[str, list[str]] = {}
        self.failed = False
        self.n_status = 0
        self.n_alerts = 0
        #: the alert count when the order last entered error
        self.episode_alerts = 0
        self.patches = 0
        #: (what happened, the engine's answer, the status it left): kinds of transitions
        #: this example went through, which the search steers to have many of
        self.coverage: set[tuple[str, str, str]] = set()

    @property
    def world(self) -> World:
        assert self._world is not None, "the world is built by start()"
        return self._world

    # --- setup and teardown ------------------------------------------------------------

    @initialize(flow=flows())
    def start(self, flow: Flow) -> None:
        """Declare ``flow`` and submit one order of it."""
        self.flow = flow
        self.ledger = Ledger(flow)
        self._world = World(self._declared.enter_context(installed(flow)))
        data = flow.order_data()
        self._after("start", self.world.submit(ORDER, WORKFLOW, data), leaves_error=True)

    def close(self) -> None:
        """Put back the declarations in use before ``start`` (``teardown`` does)."""
        self._declared.close()

    def teardown(self) -> None:
        try:
            if self._world is not None and self.snap is not None and not self.failed:
                # Steer the search towards orders that went far: new keys (fixes), and
                # many different statuses.
                if currently_in_test_context():  # not in a replayed script
                    rounds = max((c.req.key_round for c in self.ledger.calls), default=1)
                    target(float(rounds), label="key rounds")
                    target(float(len(self.coverage)), label="coverage")
                self._liveness()
        finally:
            self.close()

    # --- rules: agents and remotes ------------------------------------------------------

    @precondition(_has_calls)
    @rule(pick=PICK, report=st.sampled_from(DRAWN))
    def reply(self, pick: int, report: Report) -> None:
        """An agent's report of a request ever sent: the ``pick``-th latest of those of
        which it can truthfully report that."""
        now = self.world.now()
        calls = [c for c in self.ledger.calls if self.ledger.possible(c, report, now)]
        if calls:
            self._reply(calls[-1 - pick % len(calls)], report)

    @precondition(_has_reports)
    @rule(pick=PICK)
    def redeliver(self, pick: int) -> None:
        """A report delivered again: a duplicate, late or out of order."""
        sent = self.reports[-1 - pick % len(self.reports)]
        self._deliver(sent.call, sent.wire, lambda: self.world.redeliver(sent.handle))

    @precondition(_has_calls)
    @rule(pick=PICK)
    def execute(self, pick: int) -> None:
        """The remote applies a request (a callback step's remote: accepts it, or applies
        what it accepted) and nobody reports it (yet)."""
        now = self.world.now()
        ledger = self.ledger
        calls = [
            c
            for c in ledger.calls
            if c.open(now)
            or (ledger.is_callback(c.req.step) and ledger.effect(c).state == "accepted")
        ]
        if not calls:
            return
        call = calls[-1 - pick % len(calls)]
        if call.open(now):
            ledger.take(call, now)
        else:
            ledger.apply(ledger.effect(call))
        self._after("execute", Answer("ok"), leaves_error=False)

    @precondition(_has_callbacks)
    @rule(pick=PICK, body=st.sampled_from(["result", "refused", "again"]))
    def callback(self, pick: int, body: CallbackBody) -> None:
        """A remote's callback for any run of a ``completes_on`` step it took: its result,
        its refusal, or the webhook's retry of what it sent before."""
        keys = [k for k in self.ledger.callback_keys() if self.ledger.can_call_back(k, body)]
        if keys:
            self._callback(keys[-1 - pick % len(keys)], body)

    @precondition(_has_events)
    @rule(pick=PICK, decision=st.sampled_from(list(DECISIONS)))
    def decide(self, pick: int, decision: str) -> None:
        """A person's decision for an ``Event`` step: whenever (early, late, again)."""
        events = self.flow.events()
        name = events[pick % len(events)]
        before = self.snap
        answer = self.world.decide(ORDER, name, DECISIONS[decision])
        self._after("decide", answer, leaves_error=True)
        self._report(checks.kept_event(name, before, answer, self.flow))

    # --- rules: time and the app's timers ----------------------------------------------

    @precondition(_ready)
    @rule(by=st.sampled_from(["1s", "5s", "deadline", "2min", "20min"]))
    def advance(self, by: str) -> None:
        """Time passes: a little, to just past the next deadline or due time, or a lot."""
        seconds = {"1s": 1.0, "5s": 5.0, "2min": 120.0, "20min": 1200.0}.get(by)
        self.world.advance(seconds if seconds is not None else self._to_next())
        self._after("advance", Answer("ok"), leaves_error=False)

    @precondition(_ready)
    @rule()
    def tick(self) -> None:
        """Time passes to just past the next deadline or due time, and the app's timers
        run: the supervisor, then the due ``order-dispatch`` messages."""
        self.world.advance(self._to_next())
        self._after("advance", Answer("ok"), leaves_error=False)
        self._after("supervise", self.world.supervise(), leaves_error=False)
        self._after("dispatch", self.world.dispatch_due(), leaves_error=False)

    @precondition(_ready)
    @rule(clock=st.sampled_from(list(SKEWS)))
    def supervise(self, clock: str) -> None:
        """A supervisor run (``ahead``/``behind``: another instance's, its clock off)."""
        self._after("supervise", self.world.supervise(SKEWS[clock]), leaves_error=False)

    @precondition(_ready)
    @rule()
    def sweep(self) -> None:
        """The scheduler's safety sweep (lost dispatches, notices left in the outbox)."""
        self._after("sweep", self.world.sweep(), leaves_error=False)

    @precondition(_ready)
    @rule()
    def dispatch(self) -> None:
        """The ``order-dispatch`` messages whose time has come are delivered."""
        self._after("dispatch", self.world.dispatch_due(), leaves_error=False)

    # --- rules: operators --------------------------------------------------------------

    @precondition(_unfinished)
    @rule(statement=st.booleans(), dispatched=st.booleans())
    def cancel(self, statement: bool, dispatched: bool) -> None:
        """Cancel; with a statement that the step in doubt did not happen only where the
        truth says so (an operator asks the service first). ``dispatched``: the work it
        queues is picked up at once (else it waits for a ``dispatch``)."""
        not_applied: list[str] | None = None
        if statement:
            doubtful = self.world.doubtful(ORDER)
            now = self.world.now()
            if not doubtful or any(self.ledger.may_apply(d, now) for d in doubtful):
                return
            not_applied = doubtful
        self._operator("cancel", lambda: self.world.cancel(ORDER, not_applied), dispatched)

    @precondition(_in_error)
    @rule(patch=st.booleans(), dispatched=st.booleans())
    def resubmit(self, patch: bool, dispatched: bool) -> None:
        """Resubmit an order in error; with a patch of its data (a fix)."""
        data = None
        if patch:
            self.patches += 1
            data = {"note": self.patches}
        self._operator("resubmit", lambda: self.world.resubmit(ORDER, data), dispatched)

    @precondition(_undo_failed)
    @rule(dispatched=st.booleans())
    def not_needed(self, dispatched: bool) -> None:
        """A compensation failed for good; the operator states its step did not happen
        (only where the truth says so), so the undo is not needed."""
        assert self.snap is not None
        undo = next(s for s in self.snap.steps if not s.action and s.state == "error")
        step = undo.compensates or ""
        if self.ledger.may_apply(step, self.world.now()):
            return
        self._operator("not_needed", lambda: self.world.not_needed(ORDER, step), dispatched)

    @precondition(_ready)
    @rule()
    def reload(self) -> None:
        """Load the order from the store: nothing of it may be lost on the way."""
        differences = self.world.reload_differences(ORDER)
        self._report([Finding("RELOAD-lost", d) for d in differences[:3]])

    # --- invariants: each raises what the checks found, by signature ------------------

    def check_invariants(self, settings: Any, output: Any, runtimes: Any) -> None:
        # Hypothesis prints each invariant it checks in a failing example's steps; they
        # run after every step anyway, so the printed steps leave them out (a failure
        # names its signature).
        super().check_invariants(settings, lambda _line: None, runtimes)

    def check(self) -> None:
        """Every invariant, as Hypothesis runs them after each step (a replayed script)."""
        for each in self.invariants:
            each.function(self)

    @invariant()
    def i1_never_undone_around_a_doubt(self) -> None:
        self._raise("I1-undo-while-may-apply", "I1-undo-around-doubt")

    @invariant()
    def i2_no_evidence_discarded(self) -> None:
        self._raise("I2-evidence-discarded")

    @invariant()
    def i3_ends_with_its_effects_undone(self) -> None:
        self._raise("I3-effect-stands")

    @invariant()
    def i4_a_person_is_told_once(self) -> None:
        self._raise("I4-error-without-alert", "I4-operator-alert")

    @invariant()
    def i5_one_effect_one_key(self) -> None:
        self._raise("I5-second-key", "I5-item-key")

    @invariant()
    def i6_always_looked_at_again(self) -> None:
        self._raise("I6-no-next-look")

    @invariant()
    def i7_status_follows_transitions(self) -> None:
        self._raise(
            "I7-status-sequence", "I7-status-missed", "I7-error-left", "I7-kept-unreachable"
        )

    @invariant()
    def i8_a_held_failure_waits_for_an_operator(self) -> None:
        self._raise("I8-hold-unwound")

    @invariant()
    def i9_items_in_flight_within_the_cap(self) -> None:
        self._raise("I9-items-over-cap")

    @invariant()
    def i10_no_item_started_after_a_halt(self) -> None:
        self._raise("I10-item-after-halt")

    @invariant()
    def i11_items_results_listed_in_order(self) -> None:
        self._raise("I11-results-unlisted")

    @invariant()
    def no_unexpected_exception_and_nothing_lost(self) -> None:
        self._raise("EXC", "RELOAD-lost")

    # --- the world's moves, shared by the rules and the calm rounds -------------------

    def _reply(self, call: Call, report: Report) -> None:
        wire = self.ledger.report(call, report, self.world.now())
        if wire is None:
            return
        now = self.world.now()
        not_before = now + timedelta(seconds=5)
        # The agent got its answer when the remote answered the call (the report may
        # come much later: a slow queue), not when the report is delivered.
        answered = call.called_at or now
        self._deliver(
            call,
            wire,
            lambda: self.world.reply(call.req, wire, not_before=not_before, answered_at=answered),
        )

    def _deliver(self, call: Call, wire: ReplyKind, send: Callable[[], Answer]) -> None:
        if wire == "success" and not self.ledger.is_callback(call.req.step):
            self.successes.add(call.req.key)
        answer = send()
        call.reports += 1
        self.reported.setdefault(call.req.index, []).append(wire)
        known = any(s.handle is answer.handle for s in self.reports)
        if answer.handle is not None and answer.kind != "unexpected" and not known:
            self.reports.append(_Sent(answer.handle, wire, call))
        after = self._after(f"reply-{wire}", answer, leaves_error=wire != "deferred")
        self._report(checks.discarded_reply(call, wire, answer, after, self.ledger))

    def _callback(self, key: str, body: CallbackBody) -> None:
        payload = self.ledger.call_back(key, body)
        if payload is None:
            return
        if "result" in payload:
            self.successes.add(key)
        effect = self.ledger.effects[key]
        task = self.flow.task(effect.step)
        assert task is not None and task.event is not None
        req = next(c.req for c in reversed(self.ledger.calls) if c.req.key == key)
        answer = self.world.callback(req, task.event, payload)
        after = self._after("callback", answer, leaves_error=True)
        self._report(checks.discarded_callback(effect, payload, answer, after, self.ledger))

    def _operator(self, rule: str, act: Callable[[], Answer], dispatched: bool) -> None:
        alerts = self.n_alerts
        after = self._after(rule, act(), leaves_error=True)
        raised = self.world.alerts(ORDER)[alerts:]
        self._report(checks.operator_alerts(rule, after, raised))
        if dispatched:
            self._after("dispatch", self.world.dispatch_due(), leaves_error=False)

    def _to_next(self) -> float:
        """Seconds to just past the next time something is due: a deadline (and the
        supervisor's grace), a Pending step's time, a wake-up."""
        now = self.world.now()
        times = [s.deadline for s in self.snap.active] if self.snap is not None else []
        wakeup = self.world.next_wakeup()
        if wakeup is not None:
            times.append(wakeup)
        later = [t for t in times if t > now]
        if not later:
            return 31.0
        return (min(later) - now).total_seconds() + 1.0

    # --- observing a transition --------------------------------------------------------

    def _after(self, rule: str, answer: Answer, *, leaves_error: bool) -> OrderSnap | None:
        """What the transition just made did: the requests it sent, its status messages,
        its alerts, the order it left; every check that needs the moment runs here.
        ``leaves_error``: the transition may take the order out of error (an operator's
        action, or evidence: a report other than a deferral, a callback)."""
        if answer.kind == "unexpected":
            if answer.error is not None:
                name = type(answer.error).__name__
            else:  # a timer's report: "<orderId>: <type>: <message>"
                match = re.search(r": (\w+): ", answer.detail)
                name = match.group(1) if match else "error"
            where = rule.split("-", maxsplit=1)[0]
            self._report([Finding("EXC", answer.detail, f"{where}:{name}")])
        world = self.world
        before = self.snap
        after = world.snapshot(ORDER)
        now = world.now()
        requested: list[str] = []
        for req in world.requests()[len(self.ledger.calls) :]:
            requested.append(req.step)
            call = self.ledger.add(req)
            self._report(
                checks.requested(
                    call, self.flow, self.ledger, self.successes, self.reported, after, now
                )
            )
        statuses = world.statuses(ORDER)
        new = statuses[self.n_status :]
        sequence = statuses[max(self.n_status - 1, 0) :]
        alerts = len(world.alerts(ORDER))
        if after is not None:
            self._report(checks.told(rule, before, after, sequence, new, leaves_error))
            entered = before is None or before.status != "error" or "error" in new
            if after.status == "error" and entered:
                self.episode_alerts = self.n_alerts
        self.n_status, self.n_alerts = len(statuses), alerts
        self.snap = after
        self.coverage.add((rule, answer.kind, after.status if after is not None else "-"))
        if after is not None:
            alerted = self.n_alerts > self.episode_alerts
            self._report(checks.standing(self.flow, self.ledger, after, alerted))
            self._items(before, after, requested)
        return after

    def _items(self, before: OrderSnap | None, after: OrderSnap, requested: list[str]) -> None:
        """The checks a ``ForEach`` adds (3.16): its cap, no item after a halt, and its
        results listed once the order completed."""
        flow = self.flow
        if not flow.items():
            return
        self._report(checks.in_flight(flow, after))
        self._report(checks.started_after_halt(flow, before, after, requested))
        completed = after.status == "completed"
        if completed and (before is None or before.status != "completed"):
            results = self.world.results(ORDER) or {}
            self._report(checks.listed(flow, after, results))

    # --- raising -------------------------------------------------------------------------

    def _report(self, findings: list[Finding]) -> None:
        for finding in findings:
            self.found.setdefault(finding.signature, []).append(finding.message)

    def _raise(self, *invariants: str) -> None:
        """Raise the first violation found of these invariants (any ``@where``)."""
        for signature in [f for f in self.found if invariant_of(f) in invariants]:
            messages = self.found.pop(signature)
            if signatures.RECORDER.seen(signature, messages[0]):
                self.failed = True
                raise violation(signature)(f"{signature}: {messages[0]}")

    def _raise_all(self) -> None:
        self._raise(*{invariant_of(f) for f in self.found})

    # --- liveness ---------------------------------------------------------------------

    def _liveness(self) -> None:
        """With the world calm (every open request answered with success, every accepted
        callback step of the current run called back with its result, time moving on,
        the timers running), the order reaches a terminal status within
        ``LIVENESS_ROUNDS`` rounds."""
        ledger = self.ledger
        for _ in range(LIVENESS_ROUNDS):
            assert self.snap is not None
            now = self.world.now()
            said = False
            if not terminal(self.snap.status):
                for call in [c for c in ledger.calls if c.open(now)]:
                    self._reply(call, "success")
            for key in ledger.callback_keys():
                effect = ledger.effects[key]
                if terminal(self.snap.status) and effect.state != "applied":
                    continue
                if effect.state == "accepted" and ledger.current(effect.step, effect.key_round):
                    self._callback(key, "result")
                    said = True
                elif effect.state == "applied" and key not in self.successes:
                    # applied and never said (even to an order that has ended): its
                    # remote calls back now, on its run's URL
                    self._callback(key, "result")
                    said = True
            if terminal(self.snap.status) and not said:
                break
            self.world.advance(self._to_next())
            self._after("calm-advance", Answer("ok"), leaves_error=False)
            self._after("calm-supervise", self.world.supervise(), leaves_error=False)
            self._after("calm-dispatch", self.world.dispatch_due(), leaves_error=False)
            self._after("calm-sweep", self.world.sweep(), leaves_error=False)
            self._raise_all()
        assert self.snap is not None
        self._report(checks.standing(self.flow, self.ledger, self.snap, True, final=True))
        if not terminal(self.snap.status):
            active = [f"{s.name}:{s.state}" for s in self.snap.active]
            self._report(
                [
                    Finding(
                        "LIVENESS",
                        f"after {LIVENESS_ROUNDS} calm rounds the order is {self.snap.status} "
                        f"(active: {active})",
                    )
                ]
            )
        self._raise_all()
