"""Operator use cases: show, list by status, resubmit, cancel, repair an index.

Used by the HTTP triggers (``admin/triggers.py``) and the CLI
(``python -m admin``). Changes go through the same pure transitions and
conditional saves as everything else; the work they start is handed to the
scheduler through the ``order-dispatch`` queue, so the CLI needs nothing but
storage access.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from admin.item_views import item_fields
from core import turns
from core.control_cache import ControlSource
from core.controls import AgentControl
from core.errors import (
    ConcurrencyConflict,
    CorruptOrder,
    Forbidden,
    OrderChanged,
    OrderNotFound,
    StorageUnavailable,
    TransitionRefused,
)
from core.history import ATTEMPT_ENDINGS
from core.inbox import RECORDED_REFUSALS, check_event, run_of_capability
from core.model import CancelPreview, Order, StepRecord
from core.outcome import Applied, Outcome
from core.plans import PlannedStep
from core.ports import Clock, ListFilter, StateStore
from core.redact import shown
from core.states import OrderStatus, StepKind, StepState
from core.timefmt import iso
from core.turn_keeper import TurnKeeper
from core.unit_of_work import Dispatcher, OrderChanges
from messaging.outbox import NoticeSender
from observability.logs import get_logger, order_context
from observability.metrics import METRICS, order_ended
from stores import listing

log = get_logger(__name__)

MAX_PAGE = 100
DEFAULT_PAGE = 50
#: A bulk action changes at most this many orders (one after the other, each its own save).
MAX_BULK = 500
BULK_ACTIONS = ("resubmit", "cancel")
#: How many reads of search rows one page of a search makes at most, to fill the page when
#: rows name orders that do not match (another status asked for, a value fixed since).
SEARCH_READS = 5
#: A count of orders (``counts``, ``waiting_counts``) stops here: a page says "1000+".
COUNT_CAP = listing.COUNT_CAP


def attempts_of(step: StepRecord) -> list[dict[str, Any]]:
    """One entry per attempt kept (``core.attempts``): when, who, how it ended, what it may
    have done; the history adds the longer error text and a retry's ``notBefore``."""
    detail: dict[int, dict[str, Any]] = {}
    for event in step.history:
        number = event.get("attempt")
        if isinstance(number, int) and event.get("event") in ATTEMPT_ENDINGS:
            extra = detail.setdefault(number, {})
            for name in ("error", "reason", "notBefore", "late"):
                if event.get(name) is not None:
                    extra["error" if name == "reason" else name] = event[name]
    out: list[dict[str, Any]] = []
    for attempt in step.attempts.items:
        entry: dict[str, Any] = {
            "attempt": attempt.number,
            "claimedAt": iso(attempt.claimed_at),
            "completeBy": iso(attempt.deadline),
            "instance": attempt.instance or None,
            "applied": str(attempt.applied),
        }
        if attempt.ending is not None:
            entry["outcome"] = str(attempt.ending)
        if attempt.ended_at is not None:
            entry["endedAt"] = iso(attempt.ended_at)
        if attempt.error:
            entry["error"] = attempt.error
        entry.update(detail.get(attempt.number, {}))
        if attempt.applied is Applied.YES and attempt.ending not in (None, Outcome.SUCCEEDED):
            # a success that came after the attempt was given up on: it wins
            entry["before"], entry["outcome"], entry["late"] = (
                str(attempt.ending),
                "succeeded",
                True,
            )
        if attempt.reports > 1:
            entry["reports"] = attempt.reports
        if attempt.counted:
            entry["counted"] = True
        if not attempt.sent:
            entry["sent"] = False
        if attempt.settled_by:
            entry["settledBy"] = attempt.settled_by
        if attempt.running_until is not None:
            entry["runningUntil"] = iso(attempt.running_until)
        if attempt.accepted:  # a remote that calls back accepted it (``completes_on``)
            entry["accepted"] = True
        out.append(entry)
    return out


def preview_view(preview: CancelPreview) -> dict[str, Any]:
    return {
        "allowed": preview.allowed,
        "refusal": preview.refusal,
        "undo": [{"step": step, "by": by} for step, by in preview.undo],
        "leftAsIs": list(preview.left_as_is),
        "inFlight": list(preview.in_flight),
        "doubtful": list(preview.doubtful),
        "doubtfulAttempts": {d.step: list(d.attempts) for d in preview.doubts},
        "notStarted": list(preview.not_started),
    }


def step_view(
    step: StepRecord, agent: str | None = None, order: Order | None = None
) -> dict[str, Any]:
    planned = _planned(order, step)
    return {
        "step": step.step,
        "agent": agent or None,
        # task (a remote call), event or delay (docs/contracts.md §3.13); the steps of one
        # Parallel share a group
        "type": order.kind_of(step) if order is not None else "task",
        "group": planned.group if planned is not None else None,
        "waitingFor": step.waiting_for if step.is_active else None,
        "completesOn": planned.completes_on if planned is not None else None,
        "input": shown(step.input),
        # the state fields of docs/contracts.md §3.2, named as in the table
        "OrderID": step.order_id,
        "Step": step.step,
        "kind": str(step.kind),
        "compensates": step.compensates,
        "path": step.path,
        "ProcessState": str(step.process_state),
        "LockedBy": step.locked_by,
        "CompleteBy": iso(step.complete_by),
        "FailureCount": step.failure_count,
        "Attempt": step.attempt,
        "result": shown(step.result),
        "lastError": step.last_error,
        # failed for good, and the order went on (on_failure="continue", §3.17)
        "continued": step.continued,
        "onFailure": planned.on_failure if planned is not None else None,
        "attempts": attempts_of(step),
        "attemptsCompacted": step.attempts.compacted,
        "mayHaveApplied": step.maybe_applied,
        "history": step.history,
        "historyDropped": step.history_dropped,
        # waiting (Pending) because an operator paused its agent, since then
        "pausedFor": step.paused_for or None,
        "pausedSince": iso(step.paused_since) if step.paused_since else None,
        # a ForEach (docs/contracts.md §3.16): its head, its items and their compensations
        # say which (forEach, index); the head also how many items and where they stand
        **item_fields(order, step),
    }


def _planned(order: Order | None, step: StepRecord) -> PlannedStep | None:
    if order is None or step.kind is not StepKind.ACTION:
        return None
    try:
        return order.plan.planned(step.step)
    except KeyError:  # pragma: no cover - a record its plan does not name
        return None


def waiting_view(order: Order) -> list[dict[str, Any]]:
    """What the order waits for from outside or from time: each active step's event (an
    ``Event``, a callback of a remote that accepted) or delay."""
    if turns.waits(order):  # its key's slot (docs/contracts.md §3.16)
        return [{"turn": turns.key_of(order)}]
    out: list[dict[str, Any]] = []
    for step in order.active_steps():
        if step.waiting_for and step.process_state is StepState.PROCESSING:
            entry: dict[str, Any] = {"step": step.step, **step.waiting_for}
            if "event" in step.waiting_for:
                # who delivers it (docs/contracts.md §3.15): a person, or a remote on its URL
                planned = order.plan.step_for_event(step.waiting_for["event"])
                machine = planned is None or planned.by_machine
                entry["by"] = "machine" if machine else "person"
            out.append(entry)
    return out


def events_view(order: Order) -> dict[str, Any]:
    """Events delivered to the order: when, by whom, and the step that took each (none:
    kept for a step that has not started)."""
    out: dict[str, Any] = {}
    for name, entry in sorted(order.events.items()):
        view = {k: v for k, v in entry.items() if k in ("at", "by", "reason", "taken", "kind")}
        payload = entry.get("payload")
        if isinstance(payload, dict):
            view["kind"] = "result" if "result" in payload else "refused"
            view["payload"] = payload
        out[name] = view
    return out


def paused_view(order: Order, pauses: Mapping[str, AgentControl]) -> dict[str, Any] | None:
    """Whether the order waits for a paused agent: an active step's agent is paused
    (``core.controls``) — who paused it, since when, why — or None."""
    if order.status.terminal:
        return None
    for step in order.active_steps():
        agent = _agent(order, step.step)
        control = pauses.get(agent) if agent else None
        if control is not None and control.pause is not None:
            return {"agent": agent, "step": step.step, "held": bool(step.paused_for)} | (
                control.pause.to_json()
            )
    return None


def _check_version(order: Order, expected: int | None) -> None:
    if expected is not None and order.version != expected:
        raise OrderChanged(
            f"order {order.order_id} changed since you read it (version {expected}, now "
            f"{order.version}, {order.status}): read it again, then decide",
            order_id=order.order_id,
        )


def order_view(order: Order, pauses: Mapping[str, AgentControl] | None = None) -> dict[str, Any]:
    """``pauses``: the agents' runtime controls, to say whether the order waits for a
    paused agent (``paused``)."""
    reached = {s.step for s in order.steps}
    return {
        "orderId": order.order_id,
        "status": str(order.status),
        "paused": paused_view(order, pauses or {}),
        "workflow": order.workflow,
        "replyTo": order.reply_to,
        "createdAt": iso(order.created_at),
        "updatedAt": iso(order.updated_at),
        #: changes with every write: If-Match on a resubmit or cancel (docs/contracts.md §3.7)
        "version": order.version,
        "cancelRequested": order.cancel_requested,
        "steps": [step_view(s, _agent(order, s.step), order) for s in order.steps],
        # a ForEach's step (``<name>[]``) is not a step of its own: its items waiting are
        # counted on its head
        "notStarted": [
            p.name for p in order.plan.steps if p.name not in reached and not p.name.endswith("[]")
        ],
        "waitingFor": waiting_view(order),
        "events": events_view(order),
        "history": order.history,
        "order": order.body,
    }


def _agent(order: Order, step: str) -> str | None:
    try:
        return order.plan.agent_of(step)
    except KeyError:  # pragma: no cover - every record is a step of its plan
        return None


def order_summary(order: Order, pauses: Mapping[str, AgentControl] | None = None) -> dict[str, Any]:
    errors = [s for s in order.steps if s.process_state is StepState.ERROR]
    failed = [s for s in errors if not s.continued] or errors
    active = order.active_step()
    paused = paused_view(order, pauses or {})
    summary: dict[str, Any] = {
        "orderId": order.order_id,
        "status": str(order.status),
        "workflow": order.workflow,
        "createdAt": iso(order.created_at),
        "updatedAt": iso(order.updated_at),
        "activeStep": active.step if active else None,
        "activeSteps": [s.step for s in order.active_steps()],
        "waitingFor": waiting_view(order),
        "pausedAgent": paused["agent"] if paused else None,
    }
    if failed:
        last = max(failed, key=lambda s: s.seq)
        summary.update(
            failedStep=last.step, failureCount=last.failure_count, lastError=last.last_error
        )
    return summary


_NOT_A_CAPABILITY = (
    "the token is not a capability of this order's event: a remote delivers an event only on "
    "the URL its step gave it (events_url), for its own run"
)


def _run_of(order: Order, name: str, token: str | None) -> int | None:
    """The run a delivery answers: ``token``'s (a remote's capability), checked; None for a
    person's. ``Forbidden`` where who delivers may not (docs/contracts.md §3.15)."""
    planned = order.plan.step_for_event(name)
    if planned is None:
        return None  # the order's own refusal says which events it declares (400)
    if token is None:
        if planned.by_machine:
            raise Forbidden(
                f"event {name} is a remote's answer: it is delivered only on the URL its step "
                "gave the remote (events_url), which carries the capability of its run; not by "
                "a person, and a function key alone delivers nothing",
                order_id=order.order_id,
            )
        return None
    if not planned.by_machine:
        raise Forbidden(
            f"event {name} is a person's decision: an operator (Orders.Operator) delivers it, "
            "from the console, the API or the CLI; no capability URL delivers it",
            order_id=order.order_id,
        )
    run = run_of_capability(order.event_key, order.order_id, name, token)
    if run is None:
        raise Forbidden(_NOT_A_CAPABILITY, order_id=order.order_id)
    return run


class _Unchanged(Exception):
    """The same event again: nothing to save."""

    def __init__(self, order: Order) -> None:
        super().__init__("unchanged")
        self.order = order


class OrderAdmin:
    def __init__(
        self,
        store: StateStore,
        notices: NoticeSender,
        dispatch: Dispatcher,
        clock: Clock,
        *,
        controls: ControlSource | None = None,
        turns: TurnKeeper | None = None,
    ):
        """``dispatch`` queues an order whose step is Pending (a resubmitted step, a
        compensation a cancel starts) for the scheduler, which claims it; ``controls``:
        the agents' runtime controls, read (once a view or page) to show the orders that
        wait for a paused agent; ``turns``: the slots of per-key concurrency (§3.16)."""
        self._store = store
        self._turns = turns
        release = turns.release if turns is not None else None
        self._changes = OrderChanges(store, notices, dispatch, ended=order_ended, released=release)
        self._clock = clock
        self._controls = controls

    def pauses(self) -> Mapping[str, AgentControl]:
        """The agents' runtime controls now (none known: every agent as declared)."""
        return self._controls.read_controls() if self._controls is not None else {}

    def get(self, order_id: str) -> Order:
        order = self._store.load(order_id)
        if order is None:
            raise OrderNotFound(f"no order with id {order_id!r}", order_id=order_id)
        return order

    def exists(self, order_id: str) -> bool:
        """Whether an order ``order_id`` is kept (the console's look-up by id)."""
        return self._store.load(order_id) is not None

    def show(self, order_id: str) -> dict[str, Any]:
        order = self.get(order_id)
        return {**order_view(order, self.pauses()), **self.turn_of(order)}

    def turn_of(self, order: Order) -> dict[str, Any]:
        """``{"turn": {"key", "position", "holders", "waiting"}}`` for an order with a key
        (docs/contracts.md §3.16: position 0 holds a slot); ``{}`` for one without."""
        if not turns.key_of(order) or self._turns is None:
            return {}
        turn = self._turns.view(order)
        if turn is not None and order.status.finished:
            turn["position"] = None  # over: it neither holds nor waits
        return {"turn": turn}

    def page(
        self,
        status: OrderStatus | ListFilter,
        page_size: int = DEFAULT_PAGE,
        token: str | None = None,
    ) -> dict[str, Any]:
        """A page of orders with a status (and filter), newest first. A search
        (``where.search``, docs/contracts.md §3.14) lists the orders its rows name that
        match on reading (still that value, and the status asked for, if any); when those
        leave the page short it reads on, ``SEARCH_READS`` times at most, so the page
        holds ``page_size`` orders unless the rows run out (the token then goes on from
        the last row read)."""
        where = status if isinstance(status, ListFilter) else ListFilter(status)
        page_size = max(1, min(page_size, MAX_PAGE))
        orders: list[dict[str, Any]] = []
        unreadable: list[dict[str, str]] = []
        pauses: Mapping[str, AgentControl] | None = None
        reads = 0
        while True:
            # A bad token is stores.listing.InvalidContinuationToken (a ValueError): a 400.
            ids, token = self._store.list_by_status(where, page_size - len(orders), token)
            reads += 1
            for order_id in ids:
                try:
                    order = self._store.load(order_id)
                except CorruptOrder as exc:
                    # Listed, not hidden (the operator is the one who can repair it), and
                    # not allowed to break the page for every other order.
                    unreadable.append({"orderId": order_id, "error": exc.message})
                    continue
                # The index row moves with the status in one transaction; an order that
                # moved on since this page was read is skipped, not misreported; so is one
                # a stray row names (a search row whose order is gone).
                if order is not None and where.matches(order):
                    if pauses is None:
                        pauses = self.pauses()
                    orders.append(order_summary(order, pauses))
            if (
                where.search is None
                or token is None
                or len(orders) >= page_size
                or reads >= SEARCH_READS
            ):
                break
        page: dict[str, Any] = {"orders": orders, "continuationToken": token}
        if unreadable:
            page["unreadable"] = unreadable
        return page

    def counts(self, where: ListFilter | None = None) -> dict[str, int]:
        """Orders per status (with the workflow and time filter of ``where``), each counted
        to ``COUNT_CAP`` at most."""
        return {
            str(status): self._store.count_by_status(
                ListFilter(
                    status,
                    where.workflow if where else None,
                    where.created_from if where else None,
                    where.created_to if where else None,
                )
            )
            for status in OrderStatus
        }

    def waiting_counts(self, events: Iterable[str]) -> dict[str, int]:
        """How many orders wait for each event (the operators' inbox), each counted to
        ``COUNT_CAP`` at most: one read of the index's ``waiting|<event>|`` rows per shard,
        never of the orders."""
        return {
            event: self._store.count_by_status(ListFilter(OrderStatus.PROCESSING, waiting=event))
            for event in events
        }

    def bulk_targets(self, where: ListFilter, limit: int = MAX_BULK) -> list[str]:
        """The ids of the orders a bulk action over ``where`` would be tried on (a dry run:
        nothing changes), newest first, ``limit`` at most."""
        ids: list[str] = []
        token: str | None = None
        while len(ids) < limit:
            page, token = self._store.list_by_status(where, min(MAX_PAGE, limit - len(ids)), token)
            if where.search is not None:  # a search row is checked against its order
                page = [i for i in page if self._matches(i, where)]
            ids.extend(page)
            if token is None:
                break
        return ids[:limit]

    def _matches(self, order_id: str, where: ListFilter) -> bool:
        try:
            order = self._store.load(order_id)
        except CorruptOrder:
            return False
        return order is not None and where.matches(order)

    def bulk(self, action: str, order_ids: Iterable[str], by: str, reason: str) -> dict[str, Any]:
        """``resubmit`` or ``cancel`` each order; one refusal never stops the others."""
        if action not in BULK_ACTIONS:
            raise ValueError(f"action must be one of {', '.join(BULK_ACTIONS)}")
        done: list[str] = []
        refused: list[dict[str, str]] = []
        for order_id in order_ids:
            try:
                if action == "resubmit":
                    self.resubmit(order_id, by, reason)
                else:
                    self.cancel(order_id, by, reason)
                done.append(order_id)
            except (TransitionRefused, OrderNotFound, ConcurrencyConflict) as exc:
                refused.append({"orderId": order_id, "reason": exc.message})
            except (StorageUnavailable, CorruptOrder) as exc:
                refused.append({"orderId": order_id, "reason": f"not changed: {exc.message}"})
        log.warning("bulk %s by %s: %d done, %d refused", action, by, len(done), len(refused))
        return {"action": action, "done": done, "refused": refused}

    def repair_index(self, order_id: str) -> dict[str, Any]:
        """Rebuild an order's index rows from its state (``TableStateStore.repair_index``)."""
        with order_context(order_id=order_id):
            report = self._store.repair_index(order_id)
            if report["repaired"]:  # the store logs what it changed
                METRICS.inc("index_repairs")
            return report

    def resubmit(
        self,
        order_id: str,
        by: str,
        reason: str = "",
        patch: Any = None,
        if_version: int | None = None,
    ) -> dict[str, Any]:
        """Put an ``error`` order back to work at its failed step; ``patch``, a JSON merge
        patch of its data (docs/contracts.md §3.14): ``InvalidPatch`` (400) or a refusal
        (409) where it cannot apply, and then nothing changes. ``if_version``: only if the
        order is still at that version (what the operator read), else ``OrderChanged``."""

        def resubmit(order: Order) -> object:
            _check_version(order, if_version)
            return order.resubmit(self._clock(), by, reason, patch)

        with order_context(order_id=order_id):
            took = self._take_turn_again(self.get(order_id))
            try:
                return self._change(
                    order_id, resubmit, "resubmitted" if patch is None else "fixed", by
                )
            except Exception:
                if took is not None:  # not resubmitted: the place it took goes to the next
                    self._release_turn(took)
                raise

    def _take_turn_again(self, order: Order) -> Order | None:
        """An ``error`` order that gave its key's slot back (no ``hold_on_error``, or its
        unwinding over: ``turns.gives_back``) takes one again before it is resubmitted
        (docs/contracts.md §3.16): at once, or the resubmit is refused (409 ``turn-busy``,
        naming who holds it), taking no place in line. The order if it took one now
        (released if the resubmit fails)."""
        rule = order.plan.concurrency
        if self._turns is None or rule is None or not turns.key_of(order):
            return None
        if order.status is not OrderStatus.ERROR or not turns.gives_back(order):
            return None
        slot = self._turns.enter(order.workflow, turns.key_of(order), rule, order.order_id)
        if slot.holds(order.order_id):
            return order
        self._turns.settle(order.workflow, turns.key_of(order), rule.limit, (order.order_id,))
        held = ", ".join(slot.holder_ids) or "nobody"
        raise order.refuse(
            "turn-busy",
            f"key {turns.key_of(order)!r} of workflow {order.workflow} is taken ({held} running, "
            f"{slot.view(order.order_id)['waiting'] - 1} more in line, at most {rule.limit} "
            "at once): resubmit it when one of them has ended, or cancel it",
        )

    def _release_turn(self, order: Order) -> None:
        rule = order.plan.concurrency
        if self._turns is not None and rule is not None:
            self._turns.settle(order.workflow, turns.key_of(order), rule.limit, (order.order_id,))

    def cancel(
        self,
        order_id: str,
        by: str,
        reason: str = "",
        not_applied: str | Sequence[str] | None = None,
        if_version: int | None = None,
    ) -> dict[str, Any]:
        """``not_applied``: the operator states that these steps (each one that may have
        applied and cannot be undone) did not happen; without it such a cancel is refused
        (docs/contracts.md §3.15: over every record of the order)."""

        def cancel(order: Order) -> object:
            _check_version(order, if_version)
            order.cancel(self._clock(), by, reason, not_applied)
            return None

        with order_context(order_id=order_id):
            return self._change(order_id, cancel, "cancelled", by)

    def deliver_event(
        self, order_id: str, name: str, body: Any, by: str, *, token: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Deliver the event ``name`` (``body``: ``{"result": {...}}`` or ``{"refused":
        "..."}``, with an optional ``reason``) to the order (docs/contracts.md §3.13, §3.15).
        Returns ``"taken"``, ``"kept"``, ``"same"`` or ``"noted"`` and the order as it is
        now. Who may (§3.15): a person's ``Event`` comes without ``token`` (the caller,
        ``by``, is an operator: the route checked); a remote's callback, or an
        ``Event(..., by="machine")``, comes only with the capability ``token`` of its run
        (``core.links.events_url``), else ``Forbidden``. ``InvalidEvent`` (400),
        ``Forbidden`` (403), ``OrderNotFound`` (404; a 403 for a token), and
        ``TransitionRefused`` (409; a ``stale`` or ``too-late`` one is saved in the history
        first). An event acknowledged is written first, with If-Match, as every change."""
        payload, note = check_event(body)
        with order_context(order_id=order_id):
            refused: list[TransitionRefused] = []

            def decide(order: Order) -> str:
                run = _run_of(order, name, token)
                who = by if token is None else "callback"
                try:
                    effect = order.deliver_event(name, payload, self._clock(), who, note, run=run)
                except TransitionRefused as exc:
                    if exc.reason not in RECORDED_REFUSALS:
                        raise
                    refused.append(exc)  # saved, then answered
                    return "refused"
                if effect == "same":
                    raise _Unchanged(order)
                return effect

            def done(order: Order, effect: str) -> None:
                METRICS.inc("events_delivered", effect=effect)
                log.info("event %s delivered by %s: %s; status %s", name, by, effect, order.status)

            try:
                changed = self._changes.change(order_id, decide, after_save=done)
            except _Unchanged as same:
                return "same", order_view(same.order, self.pauses())
            except ConcurrencyConflict as exc:
                raise ConcurrencyConflict(
                    f"order {order_id} kept changing; deliver the event again", order_id=order_id
                ) from exc
            if changed is None:
                if token is not None:  # a capability for no order reveals none
                    raise Forbidden(_NOT_A_CAPABILITY, order_id=order_id)
                raise OrderNotFound(f"no order with id {order_id!r}", order_id=order_id)
            if refused:
                raise refused[-1]
            return changed.result, order_view(changed.order, self.pauses())

    def cancel_preview(
        self, order_id: str, not_applied: str | Sequence[str] | None = None
    ) -> dict[str, Any]:
        """What a cancel would do now (nothing changes)."""
        return preview_view(self.get(order_id).cancel_preview(self._clock(), not_applied))

    def _change(
        self, order_id: str, change: Callable[[Order], object], what: str, by: str
    ) -> dict[str, Any]:
        def done(order: Order, _: object) -> None:
            METRICS.inc(f"orders_{what}")
            log.warning("order %s by %s; status now %s", what, by, order.status)

        try:
            changed = self._changes.change(order_id, change, after_save=done)
        except ConcurrencyConflict as exc:
            raise ConcurrencyConflict(
                f"order {order_id} kept changing; try again", order_id=order_id
            ) from exc
        if changed is None:
            raise OrderNotFound(f"no order with id {order_id!r}", order_id=order_id)
        return order_view(changed.order, self.pauses())
