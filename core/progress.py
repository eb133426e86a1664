"""How an order goes forward, group by group (docs/contracts.md §3.13).

A plan is a line of groups: a group is one step, or the steps of one ``Parallel``. A
group starts all its steps at once, each with its own state record:

- its ``when`` (if any) decides whether it runs at all: no, and it is ``Skipped``;
- a task's ``input`` (if any) decides the body its calls send, recorded with the step;
- an ``Event`` waits (``Processing``) for its event, or takes one that came early;
- a ``Delay`` waits (``Processing``) until its time (``seconds`` after it started, or
  ``until``); then it is ``Processed`` with the result ``{}``.

What a function decides is recorded and never decided again; a function that raises,
or returns what its step cannot use, fails the step for good, not applied, with the
exception named: a bug in a declaration never reaches a remote.

The workflow goes on when every step of the group has succeeded or been skipped. When one
fails for good (or the order is cancelled), the group halts: what has not started yet
(a step waiting for its next attempt, an event, a delay) stops at once, and what is in
flight finishes its attempt first (docs/contracts.md §3.11). Once nothing of the group is
active, the group is settled as one step was before groups: a step that may have applied
and cannot be undone leaves the order in ``error`` (nothing undone around a doubt);
otherwise the steps that succeeded, in the group and before it, are compensated (the
group's in any order: latest first), or, with nothing to compensate, the order is
``error`` with "safe to resubmit" (``_settle``).

Events (``deliver_event``) are the order's input from outside: an ``Event`` step takes
its event when it waits for it, a ``completes_on`` step when it is active; one that
comes before its step starts is kept for it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Final

from core.attempts import Applied, GaveUp
from core.errors import InvalidEvent, TransitionRefused
from core.events import Event
from core.flow import MAX_WAIT_SECONDS, Context
from core.order_message import MAX_MESSAGE_CHARS, MAX_NESTING, strict_json, utf16_units
from core.plans import Plan, PlannedStep
from core.states import OrderStatus, StepKind, StepState
from core.steps import StepRecord
from core.timefmt import ensure_utc, iso, iso_exact, parse_iso

#: An event's ``result`` or a step's ``input``: a JSON object of at most this many
#: characters of JSON (an order's limit: it travels as a request's body).
MAX_EVENT_CHARS: Final = MAX_MESSAGE_CHARS
#: A refusal's reason, and an operator's note with an event.
MAX_EVENT_REASON_CHARS: Final = 1000
#: Events kept for steps that have not started, all together (they live in the order
#: record, beside its body: a Table entity holds 1 MiB).
MAX_KEPT_EVENT_CHARS: Final = 2 * MAX_MESSAGE_CHARS


#: The states of an action that succeeded (and may be being undone since).
_SUCCEEDED: Final = frozenset({StepState.PROCESSED, StepState.COMPENSATING, StepState.COMPENSATED})


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


class Progress:
    """Forward progress and events of ``core.model.Order`` (its fields are declared there;
    the unwinding it hands over to is ``core.unwinding``)."""

    order_id: str
    plan: Plan
    body: dict[str, Any]
    status: OrderStatus
    steps: list[StepRecord]
    cancel_requested: bool
    events: dict[str, dict[str, Any]]
    wakeups: list[datetime]

    # --- implemented by the order's other parts -----------------------------------------

    def _add_record(
        self,
        *,
        step: str,
        path: str,
        timeout: int,
        kind: StepKind,
        compensates: str | None,
        now: datetime,
        due: datetime | None = None,
    ) -> StepRecord:
        raise NotImplementedError

    def _start_unwinding(self, now: datetime, ambiguous: StepRecord | None) -> None:
        raise NotImplementedError

    def _set_status(self, status: OrderStatus, now: datetime) -> None:
        raise NotImplementedError

    def _event(self, now: datetime, event: Event, **details: Any) -> None:
        raise NotImplementedError

    def _alert(self, step: StepRecord, reason: str, now: datetime) -> None:
        raise NotImplementedError

    def _refuse(self, reason: str, message: str, step: str | None = None) -> TransitionRefused:
        raise NotImplementedError

    def _complete_with(
        self,
        step: StepRecord,
        result: dict[str, Any],
        now: datetime,
        *,
        attempt: int | None,
        instance: str,
        late: bool,
    ) -> None:
        raise NotImplementedError

    def _fail_for_good(
        self,
        step: StepRecord,
        now: datetime,
        reason: str,
        ambiguous: bool,
        by_expiry_of: int | None = None,
    ) -> None:
        raise NotImplementedError

    def planned(self, step: str) -> PlannedStep:
        raise NotImplementedError

    def find(self, step: str) -> StepRecord | None:
        raise NotImplementedError

    # --- queries ---------------------------------------------------------------------

    def active_steps(self) -> list[StepRecord]:
        """The steps Pending or Processing: one, or several of one group."""
        return [s for s in self.steps if s.is_active]

    def active_step(self) -> StepRecord | None:
        """The active step when there is one; the first (by record) of a group's."""
        active = self.active_steps()
        return active[0] if active else None

    def awaited_events(self) -> list[str]:
        """The events the order waits for now (for the inbox: ``waitingFor`` events)."""
        return [
            s.waiting_for["event"]
            for s in self.active_steps()
            if s.waiting_for and "event" in s.waiting_for
        ]

    def next_due(self) -> datetime | None:
        """When the scheduler should look at the order next: the earliest due time of a
        Pending step, or the end of a delay that waits."""
        times = [s.not_before for s in self.active_steps() if s.process_state is StepState.PENDING]
        times += [
            s.complete_by
            for s in self.active_steps()
            if s.process_state is StepState.PROCESSING and self.kind_of(s) == "delay"
        ]
        times += self.wakeups
        return min(times) if times else None

    def context(self) -> Context:
        """What a step's functions see: the order, and every succeeded step's result."""
        results: dict[str, dict[str, Any]] = {}
        for record in sorted(self.steps, key=lambda s: s.seq):
            if (
                record.kind is StepKind.ACTION
                and record.result is not None
                and record.process_state in _SUCCEEDED
            ):
                results[record.step] = copy.deepcopy(record.result)
        return Context(self.order_id, copy.deepcopy(self.body), MappingProxyType(results))

    def current_group(self) -> int | None:
        """The group the order is at going forward: that of its latest action record."""
        actions = [s for s in self.steps if s.kind is StepKind.ACTION]
        if not actions:
            return None
        latest = max(actions, key=lambda s: s.seq)
        try:
            return self.planned(latest.step).group
        except KeyError:  # pragma: no cover - a record its plan does not name
            return None

    def group_records(self, group: int | None = None) -> list[StepRecord]:
        """The latest record of each action of ``group`` (default: the current one)."""
        group = self.current_group() if group is None else group
        if group is None:
            return []
        out: list[StepRecord] = []
        for planned in self.plan.group(group):
            record = self.find(planned.name)
            if record is not None:
                out.append(record)
        return out

    def kind_of(self, step: StepRecord) -> str:
        """``task``, ``event`` or ``delay`` for an action; ``task`` for a compensation."""
        if step.kind is StepKind.COMPENSATION:
            return "task"
        try:
            return self.planned(step.step).kind
        except KeyError:  # pragma: no cover - a record its plan does not name
            return "task"

    def waits(self, step: StepRecord) -> bool:
        """An event or a delay: no agent, no attempt."""
        return self.kind_of(step) != "task"

    # --- starting a group ---------------------------------------------------------------

    def _start_group(self, group: int, now: datetime) -> None:
        """Start every step of ``group``: records first, then what each decides, then the
        group's progress (a group whose steps all finish at once moves on at once)."""
        records = [(self._new_action(p, now), p) for p in self.plan.group(group)]
        for record, planned in records:
            self._begin(record, planned, now)
        self._group_progress(now)

    def _new_action(self, planned: PlannedStep, now: datetime) -> StepRecord:
        return self._add_record(
            step=planned.name,
            path=planned.path,
            timeout=planned.timeout_seconds,
            kind=StepKind.ACTION,
            compensates=None,
            now=now,
        )

    def _call(self, step: str, name: str) -> Any:
        """Call ``step``'s function ``name`` with the order's context."""
        from core.workflows import function_of  # the registry: today's declarations

        fn = function_of(self.plan.workflow, step, name)
        if fn is None:
            raise StepFunctionFailed(
                f"the declarations no longer give step {step} of workflow "
                f"{self.plan.workflow} its {name} function (python -m admin deploy-check "
                "refuses such a deployment)"
            )
        try:
            return fn(self.context())
        except Exception as exc:  # noqa: BLE001 - a bug in a declaration fails its step only
            text = f"{type(exc).__name__}: {exc}"
            raise StepFunctionFailed(f"{name} of {step} raised {text[:500]}") from None

    def _begin(self, record: StepRecord, planned: PlannedStep, now: datetime) -> None:
        """What ``record`` does when it starts (``when``, ``input``, a wait)."""
        try:
            if "when" in planned.uses and "when" not in record.decided:
                record.decided["when"] = bool(self._call(planned.name, "when"))
                record.record(now, Event.DECIDED, when=record.decided["when"])
            if record.decided.get("when") is False:
                record.process_state = StepState.SKIPPED
                record.record(now, Event.SKIPPED, note="its when said no")
                return
            if planned.kind == "task":
                if "input" in planned.uses and "input" not in record.decided:
                    record.input = json_object(
                        self._call(planned.name, "input"), f"input of {planned.name}"
                    )
                    record.decided["input"] = True
                    record.record(now, Event.DECIDED, input=True)
                return
            if planned.kind == "event":
                record.complete_by = now + timedelta(seconds=planned.timeout_seconds)
                self._start_waiting(record, {"event": planned.name}, now)
                kept = self.events.get(planned.name)
                if kept is not None and not kept.get("taken"):
                    self._take_event(record, planned.name, kept, now)
                return
            until = self._until(record, planned, now)
            record.complete_by = until
            self._start_waiting(record, {"until": iso(until)}, now)
            if until <= now:
                self._end_delay(record, now)
            else:
                self.wakeups.append(until)
        except StepFunctionFailed as exc:
            record.process_state = StepState.ERROR
            record.gave_up = GaveUp(now, False, reason=str(exc))
            record.last_error = str(exc)
            record.record(now, Event.ERROR, reason=str(exc), applied="no")

    def _until(self, record: StepRecord, planned: PlannedStep, now: datetime) -> datetime:
        """The delay's end, decided once (``record.decided``)."""
        if "until" in record.decided:
            return parse_iso(str(record.decided["until"]))
        until = self._decide_until(planned, now)
        record.decided["until"] = iso_exact(until)
        return until

    def _decide_until(self, planned: PlannedStep, now: datetime) -> datetime:
        if planned.delay_seconds is not None:
            return now + timedelta(seconds=planned.delay_seconds)
        value = self._call(planned.name, "until")
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise StepFunctionFailed(
                f"until of {planned.name} returned {value!r}, not a timezone-aware datetime"
            )
        value = ensure_utc(value)
        if value > now + timedelta(seconds=MAX_WAIT_SECONDS):
            raise StepFunctionFailed(
                f"until of {planned.name} returned {iso(value)}, more than a year away"
            )
        return value

    def _start_waiting(self, record: StepRecord, what: dict[str, str], now: datetime) -> None:
        record.process_state = StepState.PROCESSING
        record.locked_by = ""
        record.waiting_for = what
        record.record(now, Event.WAITING, waitingFor=dict(what), deadline=iso(record.complete_by))
        if self.status is OrderStatus.PENDING:
            self._set_status(OrderStatus.PROCESSING, now)

    def _end_delay(self, record: StepRecord, now: datetime) -> None:
        record.waiting_for = None
        self._complete_with(record, {}, now, attempt=None, instance="", late=False)

    # --- the group's progress -------------------------------------------------------------

    def _halting(self) -> bool:
        """The current group stops what has not started: a step of it failed for good, or
        the order is being cancelled."""
        if self.cancel_requested:
            return True
        return any(s.process_state is StepState.ERROR for s in self.group_records())

    def _group_progress(self, now: datetime) -> None:
        """After a step of the current group changed: halt what has not started if the
        group failed; once nothing of it is active, settle it or start the next group."""
        if self.status.finished or self.status is OrderStatus.COMPENSATING:
            return
        records = self.group_records()
        if self._halting():
            for record in [r for r in records if r.is_active]:
                self._halt(record, now)
        if any(r.is_active for r in records):
            return
        failed = any(r.process_state is StepState.ERROR for r in records)
        if failed or self.cancel_requested:
            self._settle(now)
            return
        group = self.current_group()
        following = self.plan.next_group(group) if group is not None else None
        if following is None:
            self._set_status(OrderStatus.COMPLETED, now)
        else:
            self._start_group(following, now)

    def _halt(self, record: StepRecord, now: datetime) -> None:
        """A step of a halting group that has not started (or only waits) stops now; one
        in flight finishes its attempt first (its report or its deadline)."""
        why = (
            "the order was cancelled"
            if self.cancel_requested
            else "another step of its group failed for good"
        )
        if self.waits(record):
            record.waiting_for = None
            self._stopped(record, now, f"{record.step} waited; stopped: {why}")
        elif record.process_state is StepState.PENDING or record.held:
            record.locked_by = ""
            if record.attempt == 0 or not record.may_have_applied:
                self._stopped(record, now, f"{record.step} had not applied; stopped: {why}")
            else:
                self._fail_for_good(
                    record,
                    now,
                    f"{record.step} had not succeeded when stopped ({why}); an attempt may "
                    "have applied it",
                    True,
                )

    def _stopped(self, record: StepRecord, now: datetime, note: str) -> None:
        """Stopped before it applied anything: nothing to undo (``Compensated``, as a step
        a cancel stopped always was)."""
        record.process_state = StepState.COMPENSATED
        record.locked_by = ""
        record.record(
            now,
            Event.CANCELLED if self.cancel_requested else Event.HALTED,
            note=note,
        )

    def _settle(self, now: datetime) -> None:
        """Nothing of the current group is active and it failed (or the order is being
        cancelled): the group's verdict, as one step's was before groups."""
        records = self.group_records()
        failed = [r for r in records if r.process_state is StepState.ERROR]
        if not failed:
            done = [r for r in records if r.process_state is StepState.PROCESSED]
            last = [r for r in done if self.planned(r.step).compensation is None and r.attempt]
            if self.cancel_requested and last:
                self._cancel_too_late(last[0], now)
                return
            self._start_unwinding(now, None)
            return
        blocking = [
            f
            for f in failed
            if f.gave_up is not None
            and f.gave_up.ambiguous
            and not self.planned(f.step).compensation
        ]
        if blocking:
            for step in blocking:
                self._tell_ambiguous(step, now)
            self._set_status(OrderStatus.ERROR, now)
            return
        undoable = [
            f
            for f in failed
            if f.gave_up is not None and f.gave_up.ambiguous and self.planned(f.step).compensation
        ]
        if undoable or self.cancel_requested or self.plan.compensates:
            self._start_unwinding(now, max(undoable, key=lambda s: s.seq) if undoable else None)
            return
        for step in failed:
            reason = step.gave_up.reason if step.gave_up is not None else step.last_error or ""
            self._alert(
                step,
                f"{reason}; it was not applied: it is safe to resubmit once the cause is fixed",
                now,
            )
        self._set_status(OrderStatus.ERROR, now)

    def _tell_ambiguous(self, step: StepRecord, now: datetime) -> None:
        raise NotImplementedError

    def _cancel_too_late(self, step: StepRecord, now: datetime) -> None:
        """A step that cannot be undone succeeded after the cancel: nothing is undone and
        the order goes on; the steps of its group the cancel stopped run after all."""
        self.cancel_requested = False
        note = f"{step.step} succeeded after the cancel and cannot be undone: the order goes on"
        step.record(now, Event.CANCEL_TOO_LATE, note=note)
        self._event(now, Event.CANCEL_TOO_LATE, step=step.step, note=note)
        for record in self.group_records():
            if record.process_state is StepState.COMPENSATED and record.undone_by is None:
                self._start_again(record, now)
        self._group_progress(now)

    def _start_again(self, record: StepRecord, now: datetime) -> None:
        """A stopped (or failed) step of the current group goes back to work: a task is
        Pending, a wait starts over (an event waits its whole timeout again; a delay keeps
        its end). What its functions decided stands; one that raised is called again."""
        record.reset_for_retry()
        record.process_state = StepState.PENDING
        record.complete_by = now
        record.waiting_for = None
        self._begin(record, self.planned(record.step), now)

    # --- events (docs/contracts.md §3.13) -------------------------------------------------

    def deliver_event(
        self,
        name: str,
        payload: dict[str, Any],
        now: datetime,
        by: str,
        reason: str = "",
    ) -> str:
        """The event ``name`` with ``payload`` (``{"result": {...}}`` or ``{"refused":
        "<reason>"}``, checked by ``check_event``). Returns ``"taken"`` (a waiting step
        took it), ``"kept"`` (its step has not started: kept for it) or ``"same"`` (the
        same event again: nothing changes). ``InvalidEvent`` for a name the order's
        workflow does not declare; ``TransitionRefused`` for another body of an event
        already delivered, or an order already finished."""
        planned = self.plan.step_for_event(name)
        if planned is None:
            declared = ", ".join(self.plan.event_names()) or "none"
            raise InvalidEvent(
                f"workflow {self.plan.workflow} declares no event {name!r} (its events: "
                f"{declared})",
                order_id=self.order_id,
            )
        before = self.events.get(name)
        if before is not None:
            if before.get("digest") == digest(payload):
                return "same"
            raise self._refuse(
                "event-delivered",
                f"event {name} was delivered before ({iso_or(before.get('at'))}) with another "
                "body; an event is delivered once",
                planned.name,
            )
        if self.status.finished:
            raise self._refuse(
                "finished", f"the order is already {self.status}: it takes no event", name
            )
        entry: dict[str, Any] = {
            "payload": payload,
            "digest": digest(payload),
            "at": iso(now),
            "by": by,
        }
        if reason:
            entry["reason"] = reason[:MAX_EVENT_REASON_CHARS]
        kept = sum(utf16_units(_text(e.get("payload", ""))) for e in self.events.values())
        if kept + utf16_units(_text(payload)) > MAX_KEPT_EVENT_CHARS:
            raise self._refuse(
                "too-many-events",
                f"the order keeps {kept:,} characters of events its steps have not taken yet; "
                f"at most {MAX_KEPT_EVENT_CHARS:,}: deliver this one when its step waits",
                planned.name,
            )
        self.events[name] = entry
        record = self.find(planned.name)
        if record is not None and self._takes(record, planned, name):
            self._take_event(record, name, entry, now)
            return "taken"
        if record is not None and record.process_state in (
            StepState.SKIPPED,
            StepState.PROCESSED,
            StepState.COMPENSATING,
            StepState.COMPENSATED,
        ):
            del self.events[name]
            raise self._refuse(
                "not-waiting",
                f"step {planned.name} is {record.process_state}: it no longer takes event {name}",
                planned.name,
            )
        self._event(now, Event.EVENT_KEPT, name=name, by=by, reason=reason or None)
        return "kept"

    def _takes(self, record: StepRecord, planned: PlannedStep, name: str) -> bool:
        if planned.kind == "event":
            return record.process_state is StepState.PROCESSING and record.waiting_for is not None
        # completes_on: an active step (accepted or not: the remote may call back before
        # it answers), or one that failed for good that the event settles
        return record.is_active or (
            record.process_state is StepState.ERROR and self.status is OrderStatus.ERROR
        )

    def _take_event(
        self, record: StepRecord, name: str, entry: dict[str, Any], now: datetime
    ) -> None:
        entry["taken"] = record.step
        payload = entry.pop("payload")  # the step keeps its result; the digest stays
        entry["kind"] = "result" if "result" in payload else "refused"
        by, reason = entry.get("by"), entry.get("reason")
        record.record(now, Event.EVENT_TAKEN, name=name, by=by, reason=reason)
        record.waiting_for = None
        waits = self.planned(record.step).kind == "event"
        if "result" in payload:
            if not waits:
                # The remote's own word that the effect happened: it applied.
                for attempt in record.attempts.items:
                    if attempt.accepted:
                        attempt.report(Applied.YES)
                if record.process_state is StepState.ERROR:
                    record.gave_up = None
                    self._set_status(OrderStatus.PROCESSING, now)
            self._complete_with(
                record, dict(payload["result"]), now, attempt=None, instance="", late=False
            )
            return
        refusal = f"{record.step}: event {name} refused: {payload['refused']}"
        if not waits:
            # The remote says the effect will not happen: that settles its doubt.
            record.attempts.settle(f"event {name} refused: {str(payload['refused'])[:120]}", now)
        if record.process_state is StepState.ERROR:
            return  # already failed for good; the refusal only settled its doubt
        record.locked_by = ""
        self._fail_for_good(record, now, refusal, False)


def _text(value: Any) -> str:
    """JSON as the store keeps it (characters as they are, not escaped)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def digest(payload: dict[str, Any]) -> str:
    """The same event body, the same digest (key order and spacing aside)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def iso_or(value: object) -> str:
    return value if isinstance(value, str) else "earlier"


def check_event(body: Any) -> tuple[dict[str, Any], str]:
    """An event's body as the API and the CLI take it: ``{"result": {...}}`` or
    ``{"refused": "<reason>"}`` (and an optional ``reason``, a note for the history).
    Returns the payload and the note; ``InvalidEvent`` with a sentence otherwise."""
    if not isinstance(body, dict):
        raise InvalidEvent('an event is a JSON object: {"result": {...}} or {"refused": "..."}')
    note = body.get("reason", "")
    if not isinstance(note, str) or len(note) > MAX_EVENT_REASON_CHARS:
        raise InvalidEvent(f"reason must be text of at most {MAX_EVENT_REASON_CHARS} characters")
    extra = sorted(set(body) - {"result", "refused", "reason"})
    if extra:
        raise InvalidEvent(f"an event has result or refused (and a reason), not {extra}")
    if ("result" in body) == ("refused" in body):
        raise InvalidEvent('an event has exactly one of "result" (an object) or "refused"')
    if "result" in body:
        try:
            result = json_object(body["result"], "result")
        except StepFunctionFailed as exc:
            raise InvalidEvent(str(exc).replace("result returned", "result is")) from None
        return {"result": result}, note
    refused = body["refused"]
    if not isinstance(refused, str) or not refused.strip():
        raise InvalidEvent("refused must say why, as text")
    if len(refused) > MAX_EVENT_REASON_CHARS:
        raise InvalidEvent(f"refused is at most {MAX_EVENT_REASON_CHARS} characters")
    return {"refused": refused}, note
