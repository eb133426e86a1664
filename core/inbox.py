"""Events delivered to an order (docs/contracts.md §3.13, §3.15): a person's decision for an
``Event`` step, or a remote's callback for a step that ``completes_on`` an event.

- **An answer belongs to its run.** A callback answers the run of its step's key (the key
  round: a fix that changes what a step sends runs it under a new key, a new run). What
  arrives for an earlier run is recorded as such and refused ``stale``; it never settles,
  completes or fails the new run. A callback names its run by the token of its URL
  (``core.links``); one that names none is taken for the current run, unless it repeats
  word for word what an earlier run was answered (a webhook's retry).
- **Evidence by callback is evidence.** A callback's ``result`` is a success report like a
  2xx, whenever it arrives (``core.evidence.success``): after its step's undo began, it is
  a success after its undo, never a refusal dropped. Its ``refused`` settles the run's
  doubt: the remote says the effect will not happen.
- **Too late is said.** An event for an ``Event`` step that has failed (timed out) or been
  stopped, or whose order is unwinding or being cancelled, is refused ``too-late``,
  recorded; only an event whose step has not started yet, on an order still going
  forward, is kept for it.

Refusals raise ``TransitionRefused`` (409 at the API) after writing what was refused in the
order's history; the services save that history before answering.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from core import evidence
from core.course import halting
from core.errors import InvalidEvent, TransitionRefused
from core.history import Happened
from core.kinds import CALLBACK, WAIT, StepFunctionFailed, json_object
from core.order_message import utf16_units
from core.plans import PlannedStep
from core.states import OrderStatus, StepState
from core.steps import StepRecord
from core.telling import in_doubt
from core.timefmt import iso

if TYPE_CHECKING:
    from core.model import Order

#: A refusal's reason, and an operator's note with an event.
MAX_EVENT_REASON_CHARS: Final = 1000
#: Events kept for steps that have not started, all together (they live in the order
#: record, beside its body: a Table entity holds 1 MiB).
MAX_KEPT_EVENT_CHARS: Final = 2 * 64 * 1024
#: Answers of earlier runs kept per event, to tell a webhook's retry of one (the latest).
MAX_PAST_RUNS: Final = 10
#: Reasons of the refusals that are recorded in the order's history before they are raised.
RECORDED_REFUSALS: Final = frozenset({"stale", "too-late"})


def deliver(
    order: Order,
    name: str,
    payload: dict[str, Any],
    now: datetime,
    by: str,
    reason: str = "",
    *,
    run: int | None = None,
) -> str:
    """The event ``name`` with ``payload`` (``{"result": {...}}`` or ``{"refused": "..."}``,
    checked by ``check_event``), from ``by``; ``run``: the run its capability names (None:
    a person's delivery, or one that names no run). Returns ``"taken"`` (its step took it),
    ``"kept"`` (its step has not started: kept for it), ``"same"`` (the same event again:
    nothing changes) or ``"noted"`` (evidence for a step that had moved on)."""
    planned = order.plan.step_for_event(name)
    if planned is None:
        declared = ", ".join(order.plan.event_names()) or "none"
        raise InvalidEvent(
            f"workflow {order.plan.workflow} declares no event {name!r} (its events: {declared})",
            order_id=order.order_id,
        )
    record = order.find(planned.name)
    callback = planned.kind == "task"
    current = record.key_round if record is not None and callback else 1
    sent = digest(payload)
    entry = order.events.get(name)
    if callback:
        run = _run_of(entry, sent, run, current)
        if run < current:
            _refuse_recorded(
                order,
                now,
                "stale",
                name,
                by,
                f"event {name} answers run {run} of {planned.name}, which a fix replaced (it "
                f"runs under key round {current} now): recorded, not applied",
                planned.name,
            )
        if run > current:
            raise order.refuse(
                "no-such-run", f"event {name} names run {run}; step {planned.name} has not run it"
            )
    if entry is not None and entry.get("run", 1) == current:
        if entry.get("digest") == sent:
            return "same"
        raise order.refuse(
            "event-delivered",
            f"event {name} was delivered before ({_at(entry.get('at'))}) with another body; an "
            "event is delivered once",
            planned.name,
        )
    if callback and record is not None and not record.is_active:
        return _evidence(order, record, planned, name, payload, sent, now, by, reason)
    if order.status.finished:
        raise order.refuse(
            "finished", f"the order is already {order.status}: it takes no event", name
        )
    if record is not None and not _takes(record, callback):
        if record.process_state in (StepState.ERROR, StepState.COMPENSATED) or _unwinding(order):
            _refuse_recorded(
                order,
                now,
                "too-late",
                name,
                by,
                f"event {name} came too late: step {planned.name} is "
                f"{_state_word(record)} and takes no event",
                planned.name,
            )
        raise order.refuse(
            "not-waiting",
            f"step {planned.name} is {record.process_state}: it no longer takes event {name}",
            planned.name,
        )
    failing = order.status in (OrderStatus.PENDING, OrderStatus.PROCESSING) and halting(order)
    if record is None and (_unwinding(order) or order.cancel_requested or failing):
        why = (
            "being cancelled"
            if order.cancel_requested
            else "being undone"
            if _unwinding(order)
            else "failing (a step of its current group failed for good)"
        )
        _refuse_recorded(
            order,
            now,
            "too-late",
            name,
            by,
            f"event {name} came too late: the order is {why}, and step {planned.name} will "
            "not start",
            planned.name,
        )
    new = _entry(payload, sent, now, by, reason, current)
    _check_room(order, payload, planned.name)
    order.events[name] = new
    if record is not None:
        take(order, record, planned, name, new, now)
        return "taken"
    order.note(now, Happened.EVENT_KEPT, name=name, by=by, reason=reason or None)
    return "kept"


def take(
    order: Order,
    record: StepRecord,
    planned: PlannedStep,
    name: str,
    entry: dict[str, Any],
    now: datetime,
) -> None:
    """An active ``record`` takes the event ``name`` (delivered now, or kept for it)."""
    entry["taken"] = record.step
    payload = entry.pop("payload")  # the step keeps its result; the digest stays
    entry["kind"] = "result" if "result" in payload else "refused"
    record.record(
        now, Happened.EVENT_TAKEN, name=name, by=entry.get("by"), reason=entry.get("reason")
    )
    if planned.kind == "event":
        WAIT.take(order, record, name, payload, now)
    else:
        CALLBACK.take(order, record, name, payload, now)


def take_kept(order: Order, record: StepRecord, name: str, now: datetime) -> None:
    """When ``record`` starts waiting: the event kept for it, if one came first."""
    kept = order.events.get(name)
    if kept is not None and not kept.get("taken") and "payload" in kept:
        take(order, record, order.planned(record.step), name, kept, now)


def forget_run(order: Order, record: StepRecord) -> None:
    """``record`` runs again (a resubmit): the event its last run took is that run's, kept
    among the past answers (a retry of it is told apart); the new run takes a new one."""
    planned = order.planned(record.step)
    for name in (planned.name if planned.kind == "event" else None, planned.completes_on):
        entry = order.events.get(name) if name else None
        if name and entry is not None and entry.get("taken"):
            past = [*entry.get("past", []), _past(entry)][-MAX_PAST_RUNS:]
            order.events[name] = {"past": past}


def _evidence(
    order: Order,
    record: StepRecord,
    planned: PlannedStep,
    name: str,
    payload: dict[str, Any],
    sent: str,
    now: datetime,
    by: str,
    reason: str,
) -> str:
    """A callback for the current run of a step that is no longer active: what it says of
    the key is evidence, whatever the step and the order are doing now."""
    entry = _entry(payload, sent, now, by, reason, record.key_round)
    entry.pop("payload")
    entry["taken"] = record.step
    entry["kind"] = "result" if "result" in payload else "refused"
    if "result" in payload:
        try:
            evidence.success(
                order,
                record,
                None,
                dict(payload["result"]),
                now,
                number=None,
                answered_at=None,
                by_callback=True,
            )
        except TransitionRefused:
            raise order.refuse(
                "event-delivered",
                f"event {name}: step {planned.name} is {record.process_state}; its result was "
                "taken before",
                planned.name,
            ) from None
        _keep_entry(order, name, entry)
        record.record(now, Happened.EVENT_TAKEN, name=name, by=by, reason=reason or None, late=True)
        return "noted"
    was = in_doubt(record)
    settled = record.attempts.settle(
        f"event {name} refused: {str(payload['refused'])[:120]}", now, key_round=record.key_round
    )
    _keep_entry(order, name, entry)
    record.record(
        now, Happened.EVENT_TAKEN, name=name, by=by, reason=reason or None, settled=settled or None
    )
    if was and not in_doubt(record) and order.status is OrderStatus.ERROR:
        if record.gave_up is not None:
            record.gave_up.ambiguous = False
        order.alert(
            record,
            f"update: {record.step} was not applied after all (its service refused it by event "
            f"{name}); cancel to undo the completed steps, or resubmit to run it again",
            now,
        )
    return "noted"


def _keep_entry(order: Order, name: str, entry: dict[str, Any]) -> None:
    before = order.events.get(name)
    if before is not None and before.get("past"):
        entry["past"] = before["past"]
    order.events[name] = entry


def _run_of(entry: dict[str, Any] | None, sent: str, run: int | None, current: int) -> int:
    """The run a callback answers: the one its capability names; for one that names none,
    an earlier run whose answer it repeats word for word (a webhook's retry), else the
    current run."""
    if run is not None:
        return run
    for past in (entry or {}).get("past", []):
        if past.get("digest") == sent and int(past.get("run", 1)) < current:
            return int(past.get("run", 1))
    return current


def _takes(record: StepRecord, callback: bool) -> bool:
    """A callback is taken by its step while the step is at work, whatever it is doing (in
    flight, accepted and waiting, or waiting for its next attempt: the remote may answer
    at any time); an ``Event`` while its step waits for it."""
    if callback:
        return record.is_active
    return record.waiting_for is not None and record.process_state is StepState.PROCESSING


def _unwinding(order: Order) -> bool:
    return order.status is OrderStatus.COMPENSATING or (
        order.status is OrderStatus.ERROR and evidence.unwinding_began(order)
    )


def _state_word(record: StepRecord) -> str:
    if record.process_state is StepState.COMPENSATED and record.undone_by is None:
        return "stopped"
    return "failed" if record.process_state is StepState.ERROR else str(record.process_state)


def _refuse_recorded(
    order: Order, now: datetime, why: str, name: str, by: str, message: str, step: str
) -> None:
    """Write the refusal in the order's history (the services save it), then raise it.
    What the order records moves its ``updatedAt``, a refusal too."""
    order.note(now, Happened.EVENT_REFUSED, name=name, by=by, why=why, note=message)
    order.touch(now)
    raise order.refuse(why, message, step)


def _entry(
    payload: dict[str, Any], sent: str, now: datetime, by: str, reason: str, run: int
) -> dict[str, Any]:
    entry: dict[str, Any] = {"payload": payload, "digest": sent, "at": iso(now), "by": by}
    if run != 1:
        entry["run"] = run
    if reason:
        entry["reason"] = reason[:MAX_EVENT_REASON_CHARS]
    return entry


def _past(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry[k] for k in ("digest", "at", "by", "kind", "taken") if k in entry} | {
        "run": int(entry.get("run", 1))
    }


def _check_room(order: Order, payload: dict[str, Any], step: str) -> None:
    kept = sum(utf16_units(_text(e.get("payload", ""))) for e in order.events.values())
    if kept + utf16_units(_text(payload)) > MAX_KEPT_EVENT_CHARS:
        raise order.refuse(
            "too-many-events",
            f"the order keeps {kept:,} characters of events its steps have not taken yet; "
            f"at most {MAX_KEPT_EVENT_CHARS:,}: deliver this one when its step waits",
            step,
        )


def _text(value: Any) -> str:
    """JSON as the store keeps it (characters as they are, not escaped)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _at(value: object) -> str:
    return value if isinstance(value, str) else "earlier"


def digest(payload: dict[str, Any]) -> str:
    """The same event body, the same digest (key order and spacing aside)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- capabilities: who may deliver a machine's event (docs/contracts.md §3.15) -------------------


def new_event_key() -> str:
    """An order's key for the capability tokens of its events (never shown or logged)."""
    return secrets.token_hex(32)


def capability(key: str, order_id: str, name: str, run: int) -> str:
    """The token of the URL a remote calls back on for run ``run`` of event ``name``:
    ``r<run>.<mac>``, bound to the order, the event and the run."""
    mac = hmac.new(bytes.fromhex(key), f"{order_id}:{name}:{run}".encode(), "sha256")
    return f"r{run}.{mac.hexdigest()[:40]}"


def run_of_capability(key: str, order_id: str, name: str, token: str) -> int | None:
    """The run ``token`` was issued for (``capability``), or None: not this order's or this
    event's, or forged."""
    head, _, _ = token.partition(".")
    if not key or not head.startswith("r") or not head[1:].isdigit() or len(token) > 64:
        return None
    run = int(head[1:])
    if not 1 <= run <= 99:
        return None
    return run if hmac.compare_digest(capability(key, order_id, name, run), token) else None


# --- an event's body as the API and the CLI take it -----------------------------------------------


def check_event(body: Any) -> tuple[dict[str, Any], str]:
    """``{"result": {...}}`` or ``{"refused": "<reason>"}`` (and an optional ``reason``, a
    note for the history). Returns the payload and the note; ``InvalidEvent`` with a
    sentence otherwise."""
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
