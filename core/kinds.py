"""The kinds of record, each one small object with its transitions (docs/contracts.md §3.13):

- ``Call``: a remote call (or a Python handler) through an agent, attempt by attempt; a
  compensation is a call too;
- ``Callback``: a call whose 2xx is only the remote's acceptance; the step ends when its
  event comes (``completes_on``), or the supervisor asks again after its deadline;
- ``Wait``: an ``Event`` step, waiting for an event delivered to the order;
- ``Timer``: a ``Delay``, waiting until its time;
- ``Items``: the head of a ``ForEach``: decides its list of items once, and is done (its
  items are records of their own, each a ``Call``: ``core.course`` starts them).

A kind says what happened to its record when the record starts, when its attempt is
reported or expires, and when its event comes; it never decides what the order does next
(``core.course.advance`` does, over every record). What a step's functions decide when it
starts (``when``, ``input``, ``until``) is recorded and never decided again; a function
that raises, or returns what its step cannot use, fails the step for good, not applied,
with the exception named: a bug in a declaration never reaches a remote.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from core import moves
from core.attempts import Attempt, GaveUp
from core.flow import MAX_WAIT_SECONDS
from core.history import Happened
from core.item_names import MAX_ITEMS
from core.messages import AgentReply
from core.order_message import MAX_MESSAGE_CHARS, MAX_NESTING, strict_json, utf16_units
from core.outcome import Applied, Outcome
from core.plans import PlannedStep
from core.policy import RetryPolicy
from core.states import StepKind, StepState
from core.steps import StepRecord
from core.timefmt import ensure_utc, iso, iso_exact, parse_iso

if TYPE_CHECKING:
    from core.model import Order

#: An event's ``result`` or a step's ``input``: a JSON object of at most this many
#: characters of JSON (an order's limit: it travels as a request's body).
MAX_EVENT_CHARS: Final = MAX_MESSAGE_CHARS
#: ``GaveUp.kind`` of a step whose declaration's function raised (docs/contracts.md §3.17:
#: always told, whatever the order does next).
DECLARATION_BUG: Final = "declaration"


class StepFunctionFailed(Exception):
    """A step's ``input``, ``when`` or ``until`` raised, returned what the step cannot use,
    or is no longer declared: the step fails for good, not applied, with this reason."""


def json_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a JSON object the app can store and send (the limits of an order);
    ``StepFunctionFailed`` otherwise."""
    if not isinstance(value, dict):
        raise StepFunctionFailed(f"{what} returned {type(value).__name__}, not a JSON object")
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
        strict_json(text)
    except (TypeError, ValueError, RecursionError) as exc:
        raise StepFunctionFailed(f"{what} returned what JSON cannot carry: {exc}") from None
    if utf16_units(text) > MAX_EVENT_CHARS:
        raise StepFunctionFailed(
            f"{what} returned {utf16_units(text):,} characters of JSON; at most "
            f"{MAX_EVENT_CHARS:,} (nesting at most {MAX_NESTING})"
        )
    copied: dict[str, Any] = json.loads(text)
    return copied


def declaration_failed(record: StepRecord, now: datetime, reason: str) -> None:
    """A function of the step's declaration raised: the step fails for good, not applied,
    and the failure is marked so that it is always told (docs/contracts.md §3.17)."""
    record.process_state = StepState.ERROR
    record.locked_by = ""
    record.waiting_for = None
    record.gave_up = GaveUp(now, False, reason=reason, kind=DECLARATION_BUG)
    record.last_error = reason
    record.record(now, Happened.ERROR, reason=reason, applied="no")


def start_waiting(order: Order, record: StepRecord, what: dict[str, str], now: datetime) -> None:
    record.process_state = StepState.PROCESSING
    record.locked_by = ""
    record.waiting_for = what
    record.record(now, Happened.WAITING, waitingFor=dict(what), deadline=iso(record.complete_by))
    order.started(now)


def claimable(
    order: Order, now: datetime, name: str | None = None, *, resumed: bool = False
) -> StepRecord:
    """The Pending call (``name``, or the first) a claim may take now; ``TransitionRefused``
    saying why not (``resumed``: its agent's pause is over, so it may go early)."""
    if order.status.terminal:
        raise order.refuse("order-not-running", f"the order is {order.status}")
    tasks = [s for s in order.active_steps() if not order.waits(s)]
    if name is not None:
        tasks = [s for s in tasks if s.step == name]
    pending = [s for s in tasks if s.process_state is StepState.PENDING]
    if not tasks:
        raise order.refuse("no-active-step", "the order has no step waiting to run", name)
    record = (pending or tasks)[0]
    if record.process_state is StepState.PROCESSING:
        raise order.refuse(
            "already-claimed",
            f"step {record.step} is held by {record.locked_by} until {iso(record.complete_by)}",
            record.step,
        )
    if record.complete_by > now and not (resumed and record.paused_for):
        raise order.refuse(
            "not-due", f"step {record.step} may run again at {iso(record.complete_by)}", record.step
        )
    return record


class Call:
    """A call to a remote (or a Python handler) through an agent, attempt by attempt."""

    name: ClassVar[str] = "task"
    waits: ClassVar[bool] = False

    def claim(
        self, order: Order, record: StepRecord, instance: str, now: datetime, skew: timedelta
    ) -> None:
        """A new attempt: Processing, locked by ``instance``, with a deadline and its token;
        ``skew`` (how far other instances' clocks may be) kept with it, so that no instance
        undoes the step while this attempt may still reach its remote."""
        record.end_pause(now, "claimed")
        record.process_state = StepState.PROCESSING
        record.locked_by = instance
        record.attempt += 1
        record.ensure_secret(record.attempt)
        if record.round_began_at is None:
            record.round_began_at = now
        record.complete_by = now + timedelta(seconds=record.timeout_seconds)
        record.attempts.add(
            Attempt(
                record.attempt,
                now,
                record.complete_by,
                instance,
                skew_seconds=skew.total_seconds(),
                key_round=record.key_round,
                bound=True,
            )
        )
        if record.budget_since is None:
            record.budget_since = now
        record.record(
            now,
            Happened.CLAIMED,
            attempt=record.attempt,
            instance=instance,
            completeBy=iso(record.complete_by),
        )
        if record.kind is StepKind.ACTION:
            order.started(now)

    def take_copy(
        self, order: Order, name: str, attempt: int, copy: str
    ) -> Literal["took", "held", "other"]:
        """An agent takes attempt ``attempt`` of step ``name`` with one copy of its request
        (``copy``: the Storage queue message's id; that transport has no duplicate
        detection, and a redelivered order sends attempt 1's request again while it may
        be in flight). ``took``: the first copy, recorded (save it before calling);
        ``held``: this copy took it before (a redelivery of the same message: it may call
        again, as after a crash); ``other``: another copy holds it, and calls nothing."""
        record = order.find(name)
        found = record.attempts.get(attempt) if record is not None else None
        if record is None or found is None:
            return "other"  # compacted: long ended, so no copy of it is to call
        if found.taken_by == copy:
            return "held"
        if found.taken_by:
            return "other"
        found.taken_by = copy
        record.changed = True
        return "took"

    def unsent(
        self,
        order: Order,
        step: str,
        number: int,
        reason: str,
        now: datetime,
        policy: RetryPolicy,
    ) -> StepRecord:
        """The request of a claim never left (the send failed, or the transport refused
        it): no try, so no failure and no doubt; the step waits a little and runs again."""
        record = order.find(step)
        attempt = record.attempts.get(number) if record is not None else None
        if (
            record is None
            or attempt is None
            or not attempt.in_flight
            or attempt.reports
            or record.process_state is not StepState.PROCESSING
            or record.attempt != number
        ):
            raise order.refuse(
                "not-in-flight",
                f"attempt {number} of step {step} is not in flight with no report",
                step,
            )
        attempt.end(Outcome.NOT_SENT, now, reason)
        attempt.sent = False
        attempt.applied = Applied.NO
        record.last_error = reason
        record.locked_by = ""
        record.record(now, Happened.NOT_SENT, attempt=number, reason=reason)
        moves.defer(order, record, now, policy, None, reason, cause="could not send its request")
        return record

    def start(self, order: Order, record: StepRecord, planned: PlannedStep, now: datetime) -> None:
        if "input" in planned.uses and "input" not in record.decided:
            record.input = json_object(
                order.call_function(record, "input"), f"input of {planned.name}"
            )
            record.decided["input"] = True
            record.record(now, Happened.DECIDED, input=True)

    def decide(
        self,
        order: Order,
        record: StepRecord,
        attempt: Attempt,
        reply: AgentReply,
        now: datetime,
        policy: RetryPolicy,
    ) -> None:
        """The first report of the attempt in flight (not a success: ``core.evidence``
        takes those, on time or not): it decides how the attempt ended."""
        instance = record.locked_by
        attempt.report(
            Applied.MAYBE if reply.may_have_applied else Applied.NO,
            reply.running_until,
            reply.runner or "",
            reply.run_ended,
        )
        if reply.running_until is not None:
            record.record(
                now,
                Happened.HANDLER_RUNNING,
                attempt=attempt.number,
                until=iso(reply.running_until),
            )
        if reply.outcome is Outcome.REFUSED:
            attempt.end(Outcome.REFUSED, now, reply.error)
            attempt.counted = True
            record.failure_count += 1
            record.last_error = reply.error
            record.locked_by = ""
            settled: list[int] = []
            if reply.settled:
                # The service looked the key up and holds no effect for it: that settles
                # earlier attempts' doubt; not that of a try in this same attempt, whose
                # call may still be running at the service.
                settled = record.attempts.settle(
                    f"the service refused attempt {attempt.number} after looking the key up "
                    f"({(reply.error or '')[:120]})",
                    now,
                    before=attempt.number,
                )
            record.record(
                now,
                Happened.REFUSED,
                attempt=attempt.number,
                instance=instance,
                error=reply.error,
                applied=str(attempt.applied),
                settled=settled or None,
                failureCount=record.failure_count,
            )
            moves.fail(
                record,
                now,
                f"{record.step} was refused by its service: {reply.error}",
                record.may_have_applied,
            )
        elif reply.outcome is Outcome.TRANSIENT:
            attempt.end(Outcome.TRANSIENT, now, reply.error)
            moves.count_failure(
                order,
                record,
                attempt,
                now,
                policy,
                event=Happened.TRANSIENT,
                instance=instance,
                error=reply.error or "transient failure",
                reported=True,
                blamed=True,
                seen=reply.evidence_at,
            )
        else:
            attempt.end(Outcome.DEFERRED, now, reply.error)
            record.last_error = reply.error
            record.locked_by = ""
            record.record(
                now,
                Happened.DEFERRED,
                attempt=attempt.number,
                instance=instance or None,
                reason=reply.error,
                notBefore=iso(reply.not_before) if reply.not_before else None,
                applied=str(attempt.applied),
                paused=True if reply.paused else None,
            )
            if reply.paused:
                moves.hold_paused(order, record, now, reply.not_before)
            else:
                moves.defer(order, record, now, policy, reply.not_before, reply.error or "deferred")

    def expire(self, order: Order, record: StepRecord, now: datetime, policy: RetryPolicy) -> None:
        """No report by the deadline: a failure that may have applied (a late report may
        still correct that). A step held at its last counted failure gives up now: its
        time budget is spent."""
        attempt = record.current
        if attempt is not None and not attempt.in_flight:
            record.locked_by = ""
            if not policy.gives_up(record.failure_count):  # pragma: no cover - an unhold
                moves.retry_at(order, record, now, now)
                return
            spent = int((now - (record.budget_since or attempt.claimed_at)).total_seconds())
            moves.fail(
                record,
                now,
                f"{record.step} failed in {record.failure_count} attempts over {spent} s "
                f"(last: {record.last_error})",
                record.may_have_applied,
            )
            return
        if attempt is None:  # pragma: no cover - the latest attempt is always kept
            attempt = Attempt(
                record.attempt,
                record.complete_by - timedelta(seconds=record.timeout_seconds),
                record.complete_by,
                record.locked_by,
            )
            record.attempts.add(attempt)
        error = f"no reply within {record.timeout_seconds} s (attempt {record.attempt})"
        attempt.end(Outcome.EXPIRED, now, error)
        moves.count_failure(
            order,
            record,
            attempt,
            now,
            policy,
            event=Happened.EXPIRED,
            instance=record.locked_by,
            error=error,
            reported=False,
        )

    def succeeded(
        self, order: Order, record: StepRecord, reply: AgentReply, now: datetime, *, late: bool
    ) -> None:
        """A success for its active record (the remote's 2xx, a handler's return)."""
        moves.complete(
            record,
            reply.result or {},
            now,
            attempt=reply.attempt,
            instance=record.locked_by,
            late=late,
        )


class Callback(Call):
    """A call whose 2xx is the remote's acceptance (``completes_on``): it may apply from
    then on, and the step ends when its event comes (``result``: succeeded with it;
    ``refused``: a definite failure) or its deadline passes: then the supervisor calls
    again with the same key, so a lost callback is asked for again."""

    def accepted(
        self, order: Order, record: StepRecord, attempt: Attempt, reply: AgentReply, now: datetime
    ) -> bool:
        """The remote accepted attempt ``attempt``; True if the attempt was in flight (the
        step now waits for its event), False for a late acceptance (only evidence)."""
        name = order.plan.planned(record.step).completes_on
        assert name is not None
        attempt.accepted = True
        attempt.report(Applied.MAYBE, None, reply.runner or "", reply.run_ended)
        on_time = (
            record.process_state is StepState.PROCESSING
            and record.attempt == reply.attempt
            and attempt.in_flight
        )
        record.record(
            now,
            Happened.ACCEPTED,
            attempt=reply.attempt,
            waitingFor={"event": name},
            late=None if on_time else True,
        )
        if on_time:
            record.waiting_for = {"event": name}
        return on_time

    def take(
        self, order: Order, record: StepRecord, name: str, payload: dict[str, Any], now: datetime
    ) -> None:
        """Its event ``name``, for this run, on an active record."""
        record.waiting_for = None
        current = record.current
        if "result" in payload:
            # The remote's own word that the effect happened: this run applied.
            for attempt in record.attempts.items:
                if attempt.accepted and attempt.key_round == record.key_round:
                    attempt.report(Applied.YES)
            if current is not None and current.in_flight:
                current.end(Outcome.SUCCEEDED, now)
            moves.complete(record, dict(payload["result"]), now)
            return
        refusal = str(payload["refused"])
        if current is not None and current.in_flight:
            current.end(Outcome.REFUSED, now, refusal)
        # The remote says the effect will not happen: that settles this run's doubt.
        record.attempts.settle(
            f"event {name} refused: {refusal[:120]}", now, key_round=record.key_round
        )
        record.locked_by = ""
        moves.fail(record, now, f"{record.step}: event {name} refused: {refusal}", False)


class Wait:
    """An ``Event`` step: waits for its event, at most ``timeout_seconds``; then it fails
    for good, not applied (nothing to retry)."""

    name: ClassVar[str] = "event"
    waits: ClassVar[bool] = True

    def start(self, order: Order, record: StepRecord, planned: PlannedStep, now: datetime) -> None:
        record.complete_by = now + timedelta(seconds=planned.timeout_seconds)
        start_waiting(order, record, {"event": planned.name}, now)
        order.take_kept_event(record, planned.name, now)

    def expire(self, order: Order, record: StepRecord, now: datetime, policy: RetryPolicy) -> None:
        waited = record.waiting_for or {}
        moves.fail(
            record,
            now,
            f"{record.step}: no event {waited.get('event', record.step)} within "
            f"{record.timeout_seconds} s (nothing to retry)",
            False,
        )

    def take(
        self, order: Order, record: StepRecord, name: str, payload: dict[str, Any], now: datetime
    ) -> None:
        record.waiting_for = None
        if "result" in payload:
            moves.complete(record, dict(payload["result"]), now)
            return
        record.locked_by = ""
        moves.fail(record, now, f"{record.step}: event {name} refused: {payload['refused']}", False)


class Timer:
    """A ``Delay``: waits until ``seconds`` after it started, or until ``until(ctx)``; then
    it is ``Processed`` with the result ``{}``."""

    name: ClassVar[str] = "delay"
    waits: ClassVar[bool] = True

    def start(self, order: Order, record: StepRecord, planned: PlannedStep, now: datetime) -> None:
        until = self._until(order, record, planned, now)
        record.complete_by = until
        start_waiting(order, record, {"until": iso(until)}, now)
        if until <= now:
            self.expire(order, record, now, RetryPolicy())
        else:
            order.wakeups.append(until)

    def expire(self, order: Order, record: StepRecord, now: datetime, policy: RetryPolicy) -> None:
        moves.complete(record, {}, now)

    def _until(
        self, order: Order, record: StepRecord, planned: PlannedStep, now: datetime
    ) -> datetime:
        """The delay's end, decided once (``record.decided``)."""
        if "until" in record.decided:
            return parse_iso(str(record.decided["until"]))
        if planned.delay_seconds is not None:
            until = now + timedelta(seconds=planned.delay_seconds)
        else:
            value = order.call_function(record, "until")
            if not isinstance(value, datetime) or value.tzinfo is None:
                raise StepFunctionFailed(
                    f"until of {planned.name} returned {value!r}, not a timezone-aware datetime"
                )
            until = ensure_utc(value)
            if until > now + timedelta(seconds=MAX_WAIT_SECONDS):
                raise StepFunctionFailed(
                    f"until of {planned.name} returned {iso(until)}, more than a year away"
                )
        record.decided["until"] = iso_exact(until)
        return until


class Items:
    """The head of a ``ForEach`` (docs/contracts.md §3.16): its ``items`` decides, once,
    the list of items (kept as its result, ``{"items": [...]}``), and it is done. An
    ``items`` that raises, gives no list, what JSON cannot carry, or more than
    ``MAX_ITEMS``, fails it for good, not applied, named (a bug in the declaration is
    always told)."""

    name: ClassVar[str] = "items"
    waits: ClassVar[bool] = True

    def start(self, order: Order, record: StepRecord, planned: PlannedStep, now: datetime) -> None:
        if "items" not in record.decided:
            record.result = {"items": item_list(order.call_function(record, "items"), planned)}
            record.decided["items"] = True
            record.record(now, Happened.DECIDED, items=len(record.result["items"]))
        items = (record.result or {}).get("items") or []
        moves.complete(record, {"items": items}, now)

    def expire(
        self, order: Order, record: StepRecord, now: datetime, policy: RetryPolicy
    ) -> None:  # pragma: no cover - a head is never Processing: it is done when it starts
        return


def item_list(value: Any, planned: PlannedStep) -> list[Any]:
    """What ``items`` of ``planned`` returned, as a list the app can store (each item a
    JSON value, the whole within an order's limit); ``StepFunctionFailed`` otherwise."""
    what = f"items of {planned.name}"
    if not isinstance(value, list | tuple):
        raise StepFunctionFailed(f"{what} returned {type(value).__name__}, not a list")
    if len(value) > MAX_ITEMS:
        raise StepFunctionFailed(
            f"{what} returned {len(value)} items; a ForEach runs at most {MAX_ITEMS} "
            "(MAX_ITEMS): split the order, or run the items elsewhere"
        )
    wrapped = json_object({"items": list(value)}, what)
    items: list[Any] = wrapped["items"]
    return items


CALL: Final = Call()
CALLBACK: Final = Callback()
WAIT: Final = Wait()
TIMER: Final = Timer()
ITEMS: Final = Items()

Kind = Call | Wait | Timer | Items


def kind_of(record: StepRecord, planned: PlannedStep | None) -> Kind:
    """The kind of ``record`` (a compensation is a call; a record its plan does not name is
    taken for a call)."""
    if record.kind is StepKind.COMPENSATION or planned is None:
        return CALL
    if planned.kind == "event":
        return WAIT
    if planned.kind == "delay":
        return TIMER
    if planned.kind == "items":
        return ITEMS
    return CALLBACK if planned.completes_on else CALL


def begin(order: Order, record: StepRecord, planned: PlannedStep, now: datetime) -> None:
    """Start ``record``: its ``when`` first (no: ``Skipped``), then its kind's start. A
    function that raises fails the step for good, not applied, and is always told."""
    try:
        if "when" in planned.uses and "when" not in record.decided:
            record.decided["when"] = bool(order.call_function(record, "when"))
            record.record(now, Happened.DECIDED, when=record.decided["when"])
        if record.decided.get("when") is False:
            record.process_state = StepState.SKIPPED
            record.record(now, Happened.SKIPPED, note="its when said no")
            return
        kind_of(record, planned).start(order, record, planned, now)
    except StepFunctionFailed as exc:
        declaration_failed(record, now, str(exc))


def decide_compensation_input(order: Order, record: StepRecord, now: datetime) -> None:
    """A compensation's ``input``, decided once (one that raised is called again when it
    runs again); a bug in a declaration never reaches a remote: the unwinding stops."""
    planned = order.plan.planned(record.compensates or "")
    if "input" not in planned.compensation_uses or "input" in record.decided:
        return
    try:
        record.input = json_object(order.call_function(record, "input"), f"input of {record.step}")
        record.decided["input"] = True
        record.record(now, Happened.DECIDED, input=True)
    except StepFunctionFailed as exc:
        declaration_failed(record, now, str(exc))
