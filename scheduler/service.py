"""The scheduler's use cases: submit, dispatch (claim + send), apply replies, sweep.

Each one loads the order aggregate, asks the pure model for the transition,
and saves it conditionally. A ``ConcurrencyConflict`` means another instance
moved the order first: reload and decide again (a claim that lost simply
moves on: the winner sends the request).

An agent an operator paused (``core.controls``, as this instance last read them:
``core.control_cache``) gets no claim: its due step stays Pending, held for the pause
(``Order.hold_for_pause``: no attempt, nothing counted, no alert), and is looked at
again by the sweep; once the resume has reached every instance, the sweep releases
the held steps of that agent (``StateStore.held_pending``) and they go on.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from functools import partial

from core import turns
from core.control_cache import ControlView, hold_until
from core.controls import Pause
from core.errors import (
    ConcurrencyConflict,
    InvalidOrder,
    OrderAlreadyExists,
    OrderError,
    StorageUnavailable,
    TransitionRefused,
    UnboundMessage,
)
from core.history import Happened
from core.messages import AgentReply, AgentRequest, alert_message
from core.model import Order, ReplyEffect, StepRecord
from core.names import Names
from core.order_message import OrderMessage, decode_order
from core.policy import RetryPolicy
from core.ports import AgentTransport, Clock, IndexEntry, QueueSender, StateStore
from core.reply_queues import ReplyQueues
from core.states import StepState
from core.timefmt import iso
from core.turn_keeper import TurnKeeper
from core.turns import Slot, TurnKeyRefused, TurnRule, decide_key
from core.unit_of_work import Crowded, OrderChanges
from core.workflows import WORKFLOWS, Plan
from messaging import bound
from messaging.dispatch import DispatchQueue
from messaging.outbox import NoticeSender
from messaging.quarantine import quarantine, record_of
from messaging.resilience import ride_out
from observability import failpoints, telemetry
from observability.logs import get_logger, order_context
from observability.metrics import METRICS, order_ended
from scheduler.together import Together
from stores.kept import Keeper

log = get_logger(__name__)

#: A Pending step the in-process dispatch should have claimed by now; older
#: ones were lost (a process died between save and claim) and the sweep takes them.
SWEEP_GRACE = timedelta(seconds=10)
OUTBOX_GRACE = timedelta(seconds=30)
#: How long recording an unsent request rides out a storage outage (within the invocation).
UNSENT_RECORD_SECONDS = 30.0
#: The most replies one save applies (``scheduler/together.py``). A reply that ends a
#: line writes its record and index row, and the line that starts in its place two
#: more: eight replies stay far within a transaction's 100 operations, with the order's
#: own rows and notices (tests/unit/test_replies_together.py saves the widest batch).
REPLIES_TOGETHER = 8


class Handled(StrEnum):
    """What a scheduler use case did with the message it was given."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    DISPATCHED = "dispatched"
    NOT_DUE = "not-due"
    NOTHING_TO_DO = "nothing-to-do"
    APPLIED = "applied"
    NOTED = "noted"  # late evidence recorded (a success that came late, a late report)
    STALE = "stale"
    #: no claim speaks for it (forged, or for an attempt never claimed): quarantined
    UNBOUND = "unbound"
    HELD = "held"  # its agent is paused: not claimed, waits for the resume


@dataclass
class SweepReport:
    dispatched: int = 0
    notices: int = 0
    held: int = 0  # due steps of a paused agent, held again
    released: int = 0  # steps that waited for a pause, claimed after the resume
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SchedulerConfig:
    instance_id: str
    step_timeout_seconds: int
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    #: the queues an order's replyTo may name (``REPLY_QUEUES``; empty: none)
    reply_queues: ReplyQueues = field(default_factory=ReplyQueues)


class Scheduler:
    def __init__(
        self,
        store: StateStore,
        queues: QueueSender,
        transport: AgentTransport,
        names: Names,
        config: SchedulerConfig,
        clock: Clock,
        keeper: Keeper,
        notices: NoticeSender,
        later: DispatchQueue,
        *,
        controls: ControlView | None = None,
        turns: TurnKeeper | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        """``notices`` delivers what a change committed (the process's one sender, so an
        order that cannot be handled alerts once per process); ``later`` queues an order
        whose step is not due yet for when it is; ``controls``: the agents' runtime
        controls as this instance knows them (None: every agent runs as declared);
        ``sleep``: the short waits between a reply's attempts on a crowded order
        (``core.unit_of_work.Crowded``)."""
        self._store = store
        self._queues = queues
        self._transport = transport
        self._names = names
        self._config = config
        self._clock = clock
        self._keeper = keeper
        self._notices = notices
        self._later = later
        self._controls = controls
        self._turns = turns
        self._crowded = Crowded(sleep)
        self._together: Together[AgentReply, Handled] = Together(REPLIES_TOGETHER)
        release = self._release_turn if turns is not None else None
        self._changes = OrderChanges(
            store, notices, self._dispatch_now, ended=order_ended, released=release
        )

    # --- submit --------------------------------------------------------------------

    def submit(self, raw: bytes) -> Handled:
        """The submitter: validate, store order + first step in one transaction, dispatch."""
        try:
            message = decode_order(raw, names=self._names, reply_queues=self._config.reply_queues)
            self._check_reply_queue(message)
        except InvalidOrder as exc:
            self.reject(raw, exc.message)
            return Handled.REJECTED
        with (
            order_context(order_id=message.order_id),
            telemetry.span("order.submit", orderId=message.order_id, workflow=message.workflow),
        ):
            plan = Plan.of(WORKFLOWS[message.workflow], self._config.step_timeout_seconds)
            try:
                turn = self._turn_of(message, plan)
            except TurnKeyRefused as refused:
                self.reject(raw, refused.reason)
                # a declaration's function that raised (or returned what it must not) is
                # always told (docs/contracts.md §3.17), besides the kept rejection (§3.1)
                self._queues.send(
                    self._names.operator_alerts,
                    alert_message(message.order_id, "", refused.reason, 0, self._clock()),
                )
                return Handled.REJECTED
            now = self._clock()
            if turn is not None:  # its key, kept with its plan: it waits for its slot
                plan = replace(plan, concurrency=turn[0])
            order = Order.accept(message, plan, now)
            if turn is not None:
                order.note(now, Happened.WAITING, turn=turns.key_of(order))
                if turn[1].holds(message.order_id):  # it holds a slot already: it starts now
                    turns.take_turn(order, now)
            order.trace = telemetry.carrier()
            # Accept and claim in one transaction: the first steps are due now, and nobody
            # else can hold a claim on an order that does not exist yet. A process that
            # dies after this save leaves a claimed step whose request was never sent:
            # the supervisor retries it at its deadline, as after any claim. (Its agent
            # paused: accepted with the step held for the resume, nothing claimed.)
            try:
                claims = self._claim_due(order, now)
            except TransitionRefused:  # nothing to claim: it starts with a wait
                claims = []
            try:
                saved = self._store.create(order)
            except OrderAlreadyExists:
                # Not ours: a store's create that applied but was retried is adopted by
                # the store itself (its WriteId), and lands below as accepted.
                if turn is not None:  # a redelivery's place in line is not kept
                    self._leave_line(message, turn[0])
                return self._duplicate(raw, message.order_id, message.content_hash)
            METRICS.inc("orders_accepted", workflow=message.workflow)
            log.info("order accepted (workflow %s)", message.workflow)
            failpoints.hit("after-submit-save")
            if any(s.paused_for for s in order.active_steps()):
                METRICS.inc("paused_holds")
                log.info("accepted while an agent is paused: its step waits")
            self._claimed(order, claims)
            self._changes.created(order, saved)
            for claimed in claims:
                self._send_request(order, claimed)
            if turn is not None and turns.waits(order) and _next_in_line(turn[1], order):
                self._check_turn(order)
            return Handled.ACCEPTED

    def _turn_of(self, message: OrderMessage, plan: Plan) -> tuple[TurnRule, Slot] | None:
        """Per-key concurrency (docs/contracts.md §3.16): None, the order has no key (or
        its workflow no limit); else its plan's rule with its key, and the slot as its
        entry left it (it was put in line, then the slot filled: ``core.turn_keeper``;
        ``holds``: it starts now). ``TurnKeyRefused``: the key function failed.

        A redelivered order is not looked for first (a read per order): its create
        fails, and ``_leave_line`` takes back the place it took here."""
        declared = WORKFLOWS[message.workflow].concurrency
        if declared is None or plan.concurrency is None or self._turns is None:
            return None
        key = decide_key(declared, message.order_id, message.body)
        if key is None:
            return None
        rule = replace(plan.concurrency, order_key=key)
        return rule, self._turns.enter(message.workflow, key, rule, message.order_id)

    def _leave_line(self, message: OrderMessage, rule: TurnRule) -> None:
        """A redelivery (or another order under the same id) took a place in line (or a
        slot) for an order that exists: it gives back what the order as stored does not
        hold. The order in its turn, or waiting under that key, keeps its own place (the
        entry added no row for it: ``settle`` drops a waiting row of a holder)."""
        assert self._turns is not None
        key = rule.order_key or ""
        existing = self._store.load(message.order_id)
        same = (
            existing is not None
            and existing.workflow == message.workflow
            and existing.plan.concurrency is not None
            and turns.key_of(existing) == key
        )
        if same and existing is not None and not turns.gives_back(existing):
            return
        try:
            self._turns.settle(message.workflow, key, rule.limit, (message.order_id,))
        except OrderError as exc:  # the sweep releases a holder whose order is not its
            log.warning("a redelivery's place in line was not given back: %s", exc)

    def _check_turn(self, order: Order) -> None:
        """An order saved as waiting may have been promoted between its place in line and
        its save (the wake found no order then): look once more."""
        assert self._turns is not None
        try:
            if self._turns.holds(order):
                self._take_turn(order.order_id)
        except OrderError as exc:  # the supervisor's sweep wakes it
            log.warning("the order's turn could not be checked after its save: %s", exc)

    def _release_turn(self, order: Order) -> None:
        """The order freed its slot: the next in line start in this invocation (their
        requests sent now, not after a queue's poll); one that cannot is woken by a
        message instead."""
        assert self._turns is not None
        self._turns.release(order, wake=self._start_now)

    def _start_now(self, order_id: str) -> None:
        """An order this invocation's release just made a holder (its own If-Match write of
        the slot says so: no need to read the slot again, nor the order twice) starts
        here; if it does not, its wake-up message starts it."""
        try:
            with order_context(order_id=order_id):
                self._take_turn(order_id)
        except Exception as exc:  # noqa: BLE001 - its wake-up message starts it instead
            log.warning("order %s took its turn but did not start here (%s)", order_id, exc)
            self._later.send(order_id)

    def _take_turn(self, order_id: str) -> Handled:
        """The order's turn came (the slot lists it): its first steps start and are claimed
        now. The slot, not the message that woke it, says so."""
        now = self._clock()

        def take(o: Order) -> list[StepRecord]:
            turns.take_turn(o, now)
            try:
                return self._claim_due(o, now)
            except TransitionRefused:
                return []

        try:
            changed = self._changes.change(order_id, take, after_save=self._claimed)
        except TransitionRefused:
            # taken already, cancelled meanwhile, or an order that runs again after giving
            # its slot back (its steps wait for it): what is due is claimed now
            order = self._store.load(order_id)
            if order is None or turns.waits(order):
                return Handled.NOTHING_TO_DO
            return self._dispatch(order)
        if changed is None:
            return Handled.NOTHING_TO_DO
        METRICS.inc("turns_taken")
        log.info("the order took its turn for key %r", turns.key_of(changed.order))
        for claimed in changed.result:
            self._send_request(changed.order, claimed)
        return Handled.DISPATCHED if changed.result else Handled.NOT_DUE

    def _check_reply_queue(self, message: OrderMessage) -> None:
        """An order's replyTo must exist: the app never creates it (``REPLY_QUEUES``). An
        order already accepted is not refused for it (a redelivery after the queue went:
        its notices are not sent, and a WARNING says so)."""
        queue = message.reply_to
        if queue is None or self._queues.exists(queue):
            return
        if self._store.load(message.order_id) is not None:
            return
        raise InvalidOrder(
            f"replyTo {queue!r} names a queue that does not exist; the app sends status "
            "messages only to a queue that is there and never creates one: create the queue, "
            "then send the order again",
            order_id=message.order_id,
        )

    def _claim_due(self, order: Order, now: datetime) -> list[StepRecord]:
        """Claim every due Pending step of the order (a ``Parallel``'s all at once); hold
        those whose agent is paused; end the delays whose time has come (a group that then
        starts is claimed too). The claims to send; ``TransitionRefused`` if nothing was due."""
        changed = False
        for _ in range(len(order.plan.steps) + 1):  # each round may start the next group
            due = [
                s
                for s in order.active_steps()
                if s.process_state is StepState.PROCESSING
                and order.kind_of(s) == "delay"
                and s.complete_by <= now
            ]
            for wait in due:
                order.expire(now, self._config.policy, step=wait.step)
            changed = changed or bool(due)
            if not due:
                break
        claims: list[StepRecord] = []
        for step in [s for s in order.active_steps() if s.process_state is StepState.PENDING]:
            agent = order.plan.agent_of(step.step)
            resumed = bool(step.paused_for) and (
                self._controls is None or self._controls.released(agent, now)
            )
            if step.not_before > now and not resumed:
                continue
            if self._pause_of(agent) is not None:
                # Paused: not claimed; it waits for the resume (nothing counted, no alert).
                with contextlib.suppress(TransitionRefused):  # not due: it waits anyway
                    order.hold_for_pause(
                        agent, now, hold_until(now, step.paused_since), step=step.step
                    )
                    changed = True
                continue
            claims.append(
                order.claim(
                    self._config.instance_id,
                    now,
                    step=step.step,
                    resumed=resumed,
                    skew=self._config.policy.skew,
                )
            )
        if not claims and not changed:
            raise TransitionRefused(
                "not-due", "no step of the order is due", order_id=order.order_id
            )
        return claims

    def _duplicate(self, raw: bytes, order_id: str, content_hash: str) -> Handled:
        existing = self._store.load(order_id)
        if existing is None:  # pragma: no cover - it existed a moment ago; let the host retry
            raise StorageUnavailable(f"order {order_id} vanished", order_id=order_id)
        if existing.content_hash != content_hash:
            self.reject(
                raw,
                f"orderId {order_id} already exists (accepted at {iso(existing.created_at)}) "
                "with different content; an order id names one order: use a new orderId for a "
                "new order",
            )
            return Handled.REJECTED
        METRICS.inc("duplicate_orders")
        log.info("duplicate delivery of order %s (status %s)", order_id, existing.status)
        # The first delivery may have died between its write and its send: its claim's
        # request may never have left. Sending it again is safe (the same attempt, the
        # same idempotency key: a second copy only adds its report); sending nothing
        # would leave an attempt that may or may not have been sent.
        # (On Storage queues the agent runs only one copy of it: ``Order.take``.)
        resend = [
            step
            for step in existing.active_steps()
            if step.process_state is StepState.PROCESSING
            and (current := step.current) is not None
            and existing.resendable(step.step, current.number)
            and current.in_flight
            and not current.reports
            and step.complete_by > self._clock()
        ]
        for step in resend:
            METRICS.inc("requests_resent")
            self._send_request(existing, step)
        if not resend:
            self._dispatch(existing)
        return Handled.DUPLICATE

    def reject(self, raw: bytes, reason: str) -> None:
        """Send ``{"reason", "message", "at"}`` to orders-rejected (docs/contracts.md §3.1),
        with the original text unchanged (and ``messageBase64``, its exact bytes, if not UTF-8).

        A record too large for a Storage queue message (measured as UTF-8, with margin:
        ``stores.kept.MAX_RECORD_BYTES``), which a message near 64 KiB makes once quoted,
        would fail to send and turn a rejection into retries and a poison message. Then
        the original (its exact bytes as base64, if not UTF-8) is kept in the state table
        (``stores/kept.py``, ``python -m admin kept show``) and the record carries
        ``messagePreview`` and ``keptAs`` instead of ``message``.
        """
        body, kept_as = record_of(
            raw, reason, self._clock(), keeper=self._keeper, kept_in=self._names.orders_rejected
        )
        if kept_as:
            log.info("rejected message kept as %s (too large for its record)", kept_as)
        self._queues.send(self._names.orders_rejected, body)
        METRICS.inc("orders_rejected")
        log.error("order message rejected: %s", reason, extra={"event": "order_rejected"})

    # --- dispatch ------------------------------------------------------------------

    def dispatch(self, order_id: str) -> Handled:
        """Claim the order's active step if it is due, and send the agent request."""
        with order_context(order_id=order_id):
            order = self._store.load(order_id)
            if order is None:
                log.warning("dispatch for an unknown order; dropped")
                return Handled.NOTHING_TO_DO
            return self._dispatch(order)

    def _dispatch_now(self, order: Order) -> None:
        self._dispatch(order)

    def dispatch_loaded(self, order: Order) -> None:
        """Claim what is due of an order just saved (by another use case: an event) and send
        its requests now, in this invocation (``Dispatcher``)."""
        self._dispatch(order)

    def _dispatch(self, order: Order) -> Handled:
        if turns.waits(order) and self._turns is not None:
            if order.cancel_requested or not self._turns.holds(order):
                return Handled.NOTHING_TO_DO  # not its turn: a message alone proves nothing
            return self._take_turn(order.order_id)
        if (
            self._turns is not None
            and turns.runs_again(order)
            and order.active_steps()
            and not self._turns.holds_again(order)
        ):
            return Handled.NOTHING_TO_DO  # in line again: woken when its turn comes
        if order.status.terminal or not order.active_steps():
            return Handled.NOTHING_TO_DO
        with telemetry.span("order.dispatch", order.trace, orderId=order.order_id):
            return self._dispatch_in_span(order)

    def _pause_of(self, agent: str) -> Pause | None:
        return self._controls.pause_of(agent) if self._controls is not None else None

    def _dispatch_in_span(self, order: Order) -> Handled:
        """Claim what is due (``_claim_due``) in one save, then send the requests; queue
        the order again for what is due later. A step held for a pause goes as soon as
        every instance knows of the resume; it is not queued for its due time: the sweep
        looks at it then (and after a resume)."""
        now = self._clock()
        try:
            changed = self._changes.change(
                order.order_id,
                lambda o: self._claim_due(o, now),
                attempts=1,  # a claim that lost moves on: the winner sends the request
                loaded=order,
                after_save=self._claimed,
            )
        except TransitionRefused:
            # Nothing due now: look again when something is (a step held for a pause
            # waits for the sweep after the resume).
            later = any(
                not s.paused_for
                for s in order.active_steps()
                if s.process_state is StepState.PENDING
            ) or any(order.kind_of(s) == "delay" for s in order.active_steps())
            if later:
                self._later(order)
            return Handled.NOT_DUE
        except ConcurrencyConflict:
            METRICS.inc("claim_conflicts")
            log.info("claim lost to another instance")
            return Handled.NOTHING_TO_DO
        if changed is None:
            return Handled.NOTHING_TO_DO
        for claimed in changed.result:
            self._send_request(changed.order, claimed)
        if changed.result:
            return Handled.DISPATCHED
        METRICS.inc("paused_holds")
        return Handled.HELD

    def _claimed(self, order: Order, claims: list[StepRecord]) -> None:
        """After claims are saved (by the submit or a dispatch), before their requests."""
        for claimed in claims:
            METRICS.inc("claims")
            log.info(
                "claimed; deadline %s",
                iso(claimed.complete_by),
                extra={"step": claimed.step, "attempt": claimed.attempt},
            )
        if claims:
            failpoints.hit("after-claim")

    def _send_request(self, order: Order, claimed: StepRecord) -> None:
        """Send the agent request of a claim just saved. A request that could not be sent
        is no try (docs/contracts.md §3.11): that is recorded (``Order.unsent``), so the
        step runs again soon, uncounted and with no doubt; if even the record cannot be
        saved, the claim stands and the supervisor retries the step at its deadline."""
        with order_context(step=claimed.step, attempt=claimed.attempt):
            request = AgentRequest(
                order.order_id,
                claimed.step,
                claimed.attempt,
                claimed.complete_by,
                claimed.path,
                # what its input decided when it started (docs/contracts.md §3.13)
                claimed.input if claimed.input is not None else order.body,
                telemetry.carrier(),
                singled_out=claimed.singled_out_now(self._clock()),
                agent=order.plan.agent_of(claimed.step),
                token=claimed.token_for(claimed.attempt),
                key_round=claimed.key_round,
            )
            # Only an order's first requests may wait for the host's output binding: a
            # redelivered order sends them again (messaging/bound.py); any other leaves now.
            first = order.resendable(claimed.step, claimed.attempt)
            try:
                with bound.recoverable(first):
                    sent = self._transport.send_request(request)
            except OrderError as exc:  # unavailable, or refused by the broker
                METRICS.inc("request_send_failures")
                log.error("agent request not sent: %s", exc)
                self._unsent(order, claimed, f"the request could not be sent: {exc.message}")
                return
            if not sent:
                self._unsent(order, claimed, "the deadline passed before the request was sent")

    def _unsent(self, order: Order, claimed: StepRecord, reason: str) -> None:
        step, number = claimed.step, claimed.attempt
        try:
            ride_out(
                lambda: self._changes.change(
                    order.order_id,
                    lambda o: o.unsent(step, number, reason, self._clock(), self._config.policy),
                ),
                what="record of an unsent request",
                seconds=UNSENT_RECORD_SECONDS,
            )
            METRICS.inc("requests_unsent")
            log.warning("attempt %d recorded as never sent: %s", number, reason)
        except TransitionRefused:
            # A report of the attempt came first: it was delivered after all.
            log.info("attempt %d was reported meanwhile: it was sent after all", number)
        except OrderError as exc:
            log.error(
                "attempt %d never sent, and that could not be recorded (%s): the supervisor "
                "retries it at its deadline, counted as an attempt with no report",
                number,
                exc,
            )

    # --- replies -------------------------------------------------------------------

    def apply_reply(self, reply: AgentReply) -> Handled:
        """Apply an agent reply (``Order.apply_reply`` says which count, and how); a reply
        that changes nothing (a duplicate, a stale report) is logged, counted and dropped.
        Replies for one order that this process is given at once are applied together,
        in one save (``scheduler/together.py``; ``_apply_replies``)."""
        with (
            order_context(order_id=reply.order_id, step=reply.step, attempt=reply.attempt),
            telemetry.span(
                "order.reply",
                reply.trace,
                orderId=reply.order_id,
                step=reply.step,
                attempt=reply.attempt,
                outcome=reply.outcome.wire,
            ),
        ):
            return self._together.run(reply.order_id, reply, self._apply_replies)

    def _apply_replies(self, replies: list[AgentReply]) -> list[Handled | BaseException]:
        """Replies for one order, in the order they came: one load, each decided in turn on
        what those before it left, one save (If-Match; ``Crowded`` on a conflict), as if
        each had been applied alone one after the other. Where the order refuses one
        (stale, unbound), those before it go together, it goes alone (as it would have),
        then those after it; for an order that does not exist, each alone (quarantined)."""
        results: dict[int, Handled | BaseException] = {}
        groups = deque([list(range(len(replies)))])
        while groups:
            group = groups.popleft()
            if len(group) == 1:
                results[group[0]] = _outcome(partial(self._apply_one, replies[group[0]]))
                continue
            try:
                effects = self._apply_together([replies[n] for n in group])
            except _Refused as refused:
                k = refused.index
                split = [group[:k], [group[k]], group[k + 1 :]]
                groups.extendleft(reversed([part for part in split if part]))
                continue
            except ConcurrencyConflict as exc:
                for n in group:
                    results[n] = self._kept_changing(replies[n], exc)
                continue
            if effects is None:  # no such order: each is told so alone
                groups.extendleft(reversed([[n] for n in group]))
                continue
            for n, effect in zip(group, effects, strict=True):
                results[n] = Handled.APPLIED if effect is ReplyEffect.APPLIED else Handled.NOTED
        return [results[n] for n in range(len(replies))]

    def _apply_together(self, batch: list[AgentReply]) -> list[ReplyEffect] | None:
        """``batch`` in one change; ``_Refused`` names the one the order refused."""
        deciding = [0]

        def decide(order: Order) -> list[ReplyEffect]:
            effects = []
            for n, reply in enumerate(batch):
                deciding[0] = n
                effects.append(order.apply_reply(reply, self._clock(), self._config.policy))
            return effects

        def applied(order: Order, effects: list[ReplyEffect]) -> None:
            for reply, effect in zip(batch, effects, strict=True):
                _told_applied(reply, order, effect)

        try:
            changed = self._changes.change(
                batch[0].order_id,
                decide,
                on_conflict=self._crowded,
                loaded=self._recent_for(batch[0]),
                after_save=applied,
            )
        except (TransitionRefused, UnboundMessage) as exc:
            raise _Refused(deciding[0]) from exc
        return None if changed is None else changed.result

    def _apply_one(self, reply: AgentReply) -> Handled:
        """One reply alone (``_apply_together`` of one): stale, unbound or kept changing
        are its own answers here."""
        try:
            effects = self._apply_together([reply])
        except _Refused as refused:
            cause = refused.__cause__
            if isinstance(cause, UnboundMessage):
                self._quarantine_reply(reply, cause.message)
                return Handled.UNBOUND
            assert isinstance(cause, TransitionRefused)
            METRICS.inc("stale_replies", reason=cause.reason)
            log.warning("stale reply dropped (%s): %s", cause.reason, cause.message)
            return Handled.STALE
        except ConcurrencyConflict as exc:
            raise self._kept_changing(reply, exc) from exc
        if effects is None:
            why = f"a reply for order {reply.order_id}, which does not exist"
            self._quarantine_reply(reply, why)
            return Handled.UNBOUND
        return Handled.APPLIED if effects[0] is ReplyEffect.APPLIED else Handled.NOTED

    def _kept_changing(self, reply: AgentReply, exc: ConcurrencyConflict) -> ConcurrencyConflict:
        METRICS.inc("reply_conflicts")
        error = ConcurrencyConflict(
            f"order {reply.order_id} kept changing; the reply will be retried",
            order_id=reply.order_id,
            step=reply.step,
        )
        error.__cause__ = exc
        return error

    def _quarantine_reply(self, reply: AgentReply, why: str) -> None:
        """A report no claim speaks for is never applied: it goes to the reply queue's
        poison queue with the reason, whose trigger alerts an operator."""
        METRICS.inc("unbound_replies")
        quarantine(
            self._queues,
            self._names.agent_replies,
            reply.encode().encode("utf-8"),
            f"not applied: {why}",
            self._clock,
            keeper=self._keeper,
        )

    def _recent_for(self, reply: AgentReply) -> Order | None:
        """The order as this process last wrote it, when that is the claim this reply
        reports on (its step Processing on the reply's attempt, still in flight): then the
        read would return it, unless another instance changed the order since, which the
        save's If-Match catches (read again, decide again). Anything else: read it."""
        order = self._store.recent(reply.order_id)
        step = order.find(reply.step) if order is not None else None
        current = step.current if step is not None else None
        if (
            step is None
            or step.process_state is not StepState.PROCESSING
            or step.attempt != reply.attempt
            or current is None
            or not current.in_flight
        ):
            return None
        return order

    # --- safety sweep ------------------------------------------------------------------

    def sweep(self) -> SweepReport:
        """Dispatch Pending steps whose dispatch was lost; resend notices left in the outbox.

        One bad row never ends the sweep: its error is counted in ``report.errors`` and
        logged with the order id; an order that cannot be handled at all (records that
        cannot be read, a bug) also gets ONE operator alert per process (not one per
        sweep), and the sweep goes on with the next row."""
        report = SweepReport()
        now = self._clock()
        # Notices first: an order's older notices go out before the ones its dispatch adds.
        try:
            report.notices = self._notices.deliver(self._store.stale_outbox(now - OUTBOX_GRACE))
        except StorageUnavailable as exc:
            report.errors.append(f"outbox: {exc}")
        except Exception as exc:  # the outbox must not keep the dispatches below from running
            report.errors.append(f"outbox: {type(exc).__name__}: {exc}")
            log.error("sweep: the outbox could not be delivered: %s", exc, exc_info=exc)
        for entry in self._store.due_pending(now - SWEEP_GRACE):
            handled = self._sweep_dispatch(entry, now, report)
            if handled is Handled.DISPATCHED:
                report.dispatched += 1
                METRICS.inc("sweep_dispatches")
            elif handled is Handled.HELD:
                report.held += 1
        # After a resume (once every instance has read it), the steps that waited for it.
        resumed = self._controls.resumed_recently(now) if self._controls is not None else []
        for agent in resumed:
            for entry in self._store.held_pending(agent):
                if self._sweep_dispatch(entry, now, report) is Handled.DISPATCHED:
                    report.released += 1
                    METRICS.inc("pause_releases")
        if report.dispatched or report.notices or report.errors or report.released:
            log.info(
                "sweep: %d lost dispatches sent, %d notices resent, %d released after a "
                "resume, %d errors",
                report.dispatched,
                report.notices,
                report.released,
                len(report.errors),
            )
        return report

    def _sweep_dispatch(self, entry: IndexEntry, now: datetime, report: SweepReport) -> Handled:
        try:
            return self.dispatch(entry.order_id)
        except Exception as exc:  # noqa: BLE001 - one bad order must not stop the rest
            report.errors.append(f"{entry.order_id}: {type(exc).__name__}: {exc}")
            METRICS.inc("sweep_errors")
            self._notices.contain_failure(
                entry.order_id, entry.step, exc, now, who="scheduler's sweep"
            )
            return Handled.NOTHING_TO_DO


class _Refused(Exception):
    """The order refused the ``index``-th reply of a batch (``Scheduler._apply_together``)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


def _told_applied(reply: AgentReply, order: Order, effect: ReplyEffect) -> None:
    """After the save that applied ``reply``: the failpoint, the metric and the log line."""
    with order_context(order_id=reply.order_id, step=reply.step, attempt=reply.attempt):
        failpoints.hit("after-reply-save")
        METRICS.inc("replies_applied", outcome=reply.outcome.wire, effect=str(effect))
        # The workbook's step durations (infra/app/workbook.json) read these dimensions:
        # percentiles need one row per attempt, which a histogram's customMetrics rows
        # (sum, count, min, max) do not give.
        fields: dict[str, object] = {
            "event": "reply_applied",
            "workflow": order.plan.workflow,
            "agent": _agent_of(order, reply.step),
            "outcome": reply.outcome.wire,
            "effect": str(effect),
        }
        took = _attempt_ms(order, reply) if effect is ReplyEffect.APPLIED else None
        if took is not None:
            fields["durationMs"] = took
        log.info(
            "reply %s (%s); order is %s",
            "applied" if effect is ReplyEffect.APPLIED else "noted as late evidence",
            reply.outcome,
            order.status,
            extra=fields,
        )


def _outcome(act: Callable[[], Handled]) -> Handled | BaseException:
    """What ``act`` returned, or what it raised (a batch hands each its own)."""
    try:
        return act()
    except Exception as exc:  # noqa: BLE001 - raised again in its own caller (Together.run)
        return exc


def _agent_of(order: Order, step: str) -> str:
    """The agent that runs ``step`` in the order's plan ("" if the plan has no such step:
    this runs after a save, where nothing may raise)."""
    try:
        return order.plan.agent_of(step)
    except KeyError:
        return ""


def _attempt_ms(order: Order, reply: AgentReply) -> int | None:
    """How long the attempt ``reply`` ended took, from its claim to its end (the bar the
    console's timeline draws), in milliseconds; None if it is not known."""
    record = order.find(reply.step)
    attempt = record.attempts.get(reply.attempt) if record is not None else None
    if attempt is None or attempt.ended_at is None:
        return None
    return max(0, round((attempt.ended_at - attempt.claimed_at).total_seconds() * 1000))


def _next_in_line(slot: Slot, order: Order) -> bool:
    """Whether a release between the order's place in line and its save could have made
    it a holder: it was within ``limit`` of the head (those further back need more
    releases than that moment holds; the supervisor's sweep wakes them should it come).
    Only those read the slot again after the save."""
    rule = order.plan.concurrency
    position = slot.position(order.order_id)
    return rule is not None and (position is None or position <= rule.limit)
