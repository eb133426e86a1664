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

A flow with ``turns`` (per-key concurrency, §3.16) runs 2-3 orders sharing a key (or two
keys): the model's own ``m-1``, checked as above, and its companions, each with a ledger
of its own, moved by their own rules (reports of their requests, callbacks, cancels
whose wake-ups may be lost, resubmits), plus a release lost with its instance and the
wake-ups of waiting orders lost. The turn invariants T1-T5 (``tests.model.turn_checks``)
are checked over all of them after every transition and once the example settled; in
the calm rounds an operator frees a key held in error (a cancel, or a resubmit) when
someone waits behind it.

The model plays every remote, so it knows what really applied (``tests.model.truth``);
the checks (``tests.model.checks``) compare the engine's decisions with that truth, and
the invariants raise what they found, each signature its own exception
(``tests.model.signatures``). At teardown the world calms down and the order must end.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from hypothesis import currently_in_test_context, target
from hypothesis import strategies as st
from hypothesis.errors import StopTest
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from core.turn_keeper import FRESH, IDLE_RECHECK
from core.turns import Slot
from tests.model import checks, signatures, turn_checks
from tests.model.flows import WORKFLOW, Flow, flows, installed
from tests.model.signatures import Finding, invariant_of, violation
from tests.model.truth import REPORTS, Call, CallbackBody, Ledger, Report
from tests.model.turn_checks import Keyed
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


def _has_others(machine: EngineModel) -> bool:
    return machine.snap is not None and bool(machine.others)


def _has_turns(machine: EngineModel) -> bool:
    return machine.snap is not None and machine.keyed is not None


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
        #: per-key concurrency (the flow's ``turns``): the companions' truths, by order id
        self.others: dict[str, Ledger] = {}
        self.keyed: Keyed | None = None
        self._n_requests = 0  # requests of every order filed so far
        #: orders in error the calm operator resubmitted to free their slot
        self.calm_resubmitted: set[str] = set()

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
        turns = flow.turns
        if turns is None:
            data = flow.order_data()
            self._after("start", self.world.submit(ORDER, WORKFLOW, data), leaves_error=True)
            return
        # 2-3 orders sharing a key, accepted a second apart (acceptance order is time order)
        accepted = turns.accepted(ORDER)
        keys = {o: turns.key(o) for o in accepted}
        self.keyed = Keyed(turns.limit, turns.hold, keys, accepted)
        self.others = {o: Ledger(flow) for o in accepted if o != ORDER}
        for n, order_id in enumerate(accepted):
            if n:
                self.world.advance(1.0)
            answer = self.world.submit(order_id, WORKFLOW, flow.order_data(order_id))
            own = order_id == ORDER
            self._after("start" if own else "submit-other", answer, leaves_error=own)

    def close(self) -> None:
        """Put back the declarations in use before ``start`` (``teardown`` does)."""
        self._declared.close()

    def teardown(self) -> None:
        # Hypothesis calls this in a ``finally``: StopTest on its way if the input ran out
        ran_out = isinstance(sys.exc_info()[1], StopTest)
        try:
            if self._world is not None and self.snap is not None and not self.failed:
                # Steer the search towards orders that went far: new keys (fixes), and
                # many different statuses.
                if currently_in_test_context():  # not in a replayed script
                    rounds = max((c.req.key_round for c in self.ledger.calls), default=1)
                    target(float(rounds), label="key rounds")
                    target(float(len(self.coverage)), label="coverage")
                self._liveness()
        except signatures.Violation as exc:
            # Called in Hypothesis's ``finally``: if the example ran out of input
            # (``StopTest``), Hypothesis drops what this raises; the runner fails on it.
            if ran_out:
                signatures.RECORDER.lost.append((exc.signature, f"{exc} ({self.flow!r})"))
            raise
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

    # --- rules: the other orders of the key, and what a dying instance loses -----------

    @precondition(_has_others)
    @rule(which=PICK, pick=PICK, report=st.sampled_from(["success", *REPORTS]))
    def other_reply(self, which: int, pick: int, report: Report) -> None:
        """An agent's report of a request of another order of the key."""
        order_id = self._other(which)
        ledger, now = self.others[order_id], self.world.now()
        calls = [c for c in ledger.calls if ledger.possible(c, report, now)]
        if calls:
            self._other_reply(order_id, calls[-1 - pick % len(calls)], report)

    @precondition(_has_others)
    @rule(which=PICK, pick=PICK)
    def other_callback(self, which: int, pick: int) -> None:
        """A remote's callback with its result, for a run of another order's step."""
        order_id = self._other(which)
        ledger = self.others[order_id]
        keys = [k for k in ledger.callback_keys() if ledger.can_call_back(k, "result")]
        if keys:
            self._other_callback(order_id, keys[-1 - pick % len(keys)])

    @precondition(_has_others)
    @rule(which=PICK, then=st.sampled_from(["dispatched", "later", "wake-lost"]))
    def other_cancel(self, which: int, then: str) -> None:
        """An operator cancels another order of the key (waiting, running or in error);
        the wake-ups it queues (the next in line) are picked up at once, later, or lost
        with its instance."""
        order_id = self._other(which)
        self._after("other-cancel", self.world.cancel(order_id), leaves_error=False)
        if then == "dispatched":
            self._after("dispatch", self.world.dispatch_due(), leaves_error=False)
        elif then == "wake-lost":
            self.lose_wakes()

    @precondition(_has_others)
    @rule(which=PICK)
    def other_resubmit(self, which: int) -> None:
        """An operator resubmits another order of the key in error (it takes a slot at
        once, or is refused naming who holds it)."""
        order_id = self._other(which)
        snap = self.world.snapshot(order_id)
        if snap is not None and snap.status == "error":
            self._after("other-resubmit", self.world.resubmit(order_id), leaves_error=False)

    @precondition(_has_turns)
    @rule()
    def lose_release(self) -> None:
        """The next release of a slot is lost: its instance dies after the order's save."""
        self.world.lose_next_release()

    @precondition(_has_turns)
    @rule()
    def lose_wakes(self) -> None:
        """The wake-ups not delivered yet of the orders waiting for their turn are lost."""
        snaps, _slots = self._turns_seen()
        waiting = {o for o, s in snaps.items() if s is not None and s.status == "pending"}
        self.world.lose_wakes(waiting)

    def _other(self, which: int) -> str:
        names = sorted(self.others)
        return names[which % len(names)]

    def _other_reply(self, order_id: str, call: Call, report: Report) -> None:
        now = self.world.now()
        wire = self.others[order_id].report(call, report, now)
        if wire is None:
            return
        answered = call.called_at or now
        not_before = now + timedelta(seconds=5)
        answer = self.world.reply(call.req, wire, not_before=not_before, answered_at=answered)
        self._after(f"other-{wire}", answer, leaves_error=False)

    def _other_callback(self, order_id: str, key: str) -> None:
        ledger = self.others[order_id]
        payload = ledger.call_back(key, "result")
        if payload is None:
            return
        task = self.flow.task(ledger.effects[key].step)
        assert task is not None and task.event is not None
        req = next(c.req for c in reversed(ledger.calls) if c.req.key == key)
        self._after(
            "other-callback", self.world.callback(req, task.event, payload), leaves_error=False
        )

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
    def t1_within_the_limit_of_a_key(self) -> None:
        self._raise("T1-over-limit", "T1-running-without-slot")

    @invariant()
    def t2_turns_in_acceptance_order(self) -> None:
        self._raise("T2-turn-out-of-order")

    @invariant()
    def t4_a_waiting_order_has_no_step(self) -> None:
        self._raise("T4-waiting-with-steps")

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

    def _operator(self, rule: str, act: Callable[[], Answer], dispatched: bool) -> Answer:
        alerts = self.n_alerts
        answer = act()
        after = self._after(rule, answer, leaves_error=True)
        raised = self.world.alerts(ORDER)[alerts:]
        self._report(checks.operator_alerts(rule, after, raised))
        if dispatched:
            self._after("dispatch", self.world.dispatch_due(), leaves_error=False)
        return answer

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
        every = world.requests()
        fresh, self._n_requests = every[self._n_requests :], len(every)
        for req in fresh:
            if req.order_id != ORDER:
                self.others[req.order_id].add(req)
                continue
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
        if self.keyed is not None:
            self._report(turn_checks.after_transition(self.keyed, *self._turns_seen()))
        return after

    def _turns_seen(
        self,
    ) -> tuple[dict[str, OrderSnap | None], dict[str, Slot]]:
        """Every order of the example as stored, and the slots of their keys."""
        assert self.keyed is not None
        snaps = {o: self.world.snapshot(o) for o in self.keyed.accepted}
        slots = {k: self.world.slot(WORKFLOW, k) for k in sorted(set(self.keyed.keys.values()))}
        return snaps, slots

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

    def _calm_others(self) -> bool:
        """A calm round for the other orders of the key: every open request of theirs
        answered with success, every accepted callback step of the current run called
        back; an order in error that holds a slot others wait for cancelled by its
        operator. Whether any order of the key is still to settle."""
        if self.keyed is None:
            return False
        now = self.world.now()
        for order_id, ledger in self.others.items():
            snap = self.world.snapshot(order_id)
            if snap is None or terminal(snap.status):
                continue
            for call in [c for c in ledger.calls if c.open(now)]:
                self._other_reply(order_id, call, "success")
            for key in ledger.callback_keys():
                effect = ledger.effects[key]
                if effect.state == "accepted" and ledger.current(effect.step, effect.key_round):
                    self._other_callback(order_id, key)
        snaps, slots = self._turns_seen()
        for key, slot in slots.items():
            line = [w.order_id for w in slot.waiting if not slot.holds(w.order_id)]
            if not any(o in snaps and not self._ended(snaps[o]) for o in line):
                continue
            for holder in slot.holder_ids:
                held = snaps.get(holder)
                if held is None or held.status != "error":
                    continue
                acted = self._unblock(holder)
                if acted is None:  # resubmitted once and failed again: give up the line
                    for waiter in [w.order_id for w in slot.waiting]:
                        self._cancel_any(waiter)
                if acted is not False or not self._held_after_a_sweep(key, holder):
                    continue
                self._report(
                    [
                        Finding(
                            "T5-waiting-stuck",
                            f"{holder} is in error and holds the slot of {key} "
                            "(hold_on_error); the operator can neither cancel nor resubmit "
                            f"it, so {[w.order_id for w in slot.waiting]} wait for ever",
                            "held-for-good",
                        )
                    ]
                )
                for waiter in [w.order_id for w in slot.waiting]:
                    self._cancel_any(waiter)
        snaps, slots = self._turns_seen()
        waiting = any(
            slot.position(o) and not self._ended(snaps.get(o))
            for slot in slots.values()
            for o in self.keyed.accepted
        )
        return waiting or any(
            s is not None and not terminal(s.status) for o, s in snaps.items() if o != ORDER
        )

    @staticmethod
    def _ended(snap: OrderSnap | None) -> bool:
        return snap is None or finished(snap.status)

    def _held_after_a_sweep(self, key: str, holder: str) -> bool:
        """Whether ``holder`` still holds ``key``'s slot after the next supervisor run: an
        order in error that nobody can act on must give its slot back (its release, if
        lost, is the sweep's to repair: contract 3.16, within one supervisor period), and
        a check made before that run would blame what the sweep is there to repair."""
        self.world.advance(FRESH.total_seconds() + 1.0)
        self._after("calm-supervise", self.world.supervise(), leaves_error=False)
        self._after("calm-dispatch", self.world.dispatch_due(), leaves_error=False)
        return holder in self.world.slot(WORKFLOW, key).holder_ids

    def _unblock(self, holder: str) -> bool | None:
        """The operator acts on an order in error that holds a slot others wait for
        (``hold_on_error``): a cancel, or where that is refused, a resubmit (once: None
        if it was resubmitted before). Whether either was taken."""
        if self._cancel_any(holder):
            return True
        if holder in self.calm_resubmitted:
            return None
        self.calm_resubmitted.add(holder)
        if holder == ORDER:
            rule: Callable[[], Answer] = lambda: self.world.resubmit(ORDER)  # noqa: E731
            return self._operator("resubmit", rule, True).kind != "refused"
        answer = self.world.resubmit(holder)
        self._after("calm-resubmit", answer, leaves_error=False)
        self._after("calm-dispatch", self.world.dispatch_due(), leaves_error=False)
        return answer.kind != "refused"

    def _cancel_any(self, order_id: str) -> bool:
        """An operator's cancel of any order of the example: whether it was taken."""
        if order_id == ORDER:
            return (
                self._operator("cancel", lambda: self.world.cancel(ORDER), True).kind != "refused"
            )
        answer = self.world.cancel(order_id)
        self._after("calm-cancel", answer, leaves_error=False)
        self._after("calm-dispatch", self.world.dispatch_due(), leaves_error=False)
        return answer.kind != "refused"

    def _settled(self) -> None:
        """After the calm rounds: supervisor runs, each once the sweep reads every holder
        again (``IDLE_RECHECK`` later), one per order and one more (a line row left by an
        order that ended is promoted, then released, in turn); then no slot leaked (T3)
        and no order still waits (T5)."""
        if self.keyed is None:
            return
        for _ in range(len(self.keyed.accepted) + 1):
            self.world.advance(IDLE_RECHECK.total_seconds() + 1.0)
            self._after("calm-supervise", self.world.supervise(), leaves_error=False)
            self._after("calm-dispatch", self.world.dispatch_due(), leaves_error=False)
        self._report(turn_checks.settled(self.keyed, *self._turns_seen()))

    def _liveness(self) -> None:
        """With the world calm (every open request answered with success, every accepted
        callback step of the current run called back with its result, time moving on,
        the timers running), the order reaches a terminal status within
        ``LIVENESS_ROUNDS`` rounds."""
        ledger = self.ledger
        for _ in range(LIVENESS_ROUNDS * (1 + len(self.others))):
            assert self.snap is not None
            now = self.world.now()
            said = self._calm_others()
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
        self._settled()
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
