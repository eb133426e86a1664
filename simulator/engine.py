"""The simulated remote services without HTTP: one call in, one outcome out.

Thread-safe; the HTTP server calls ``Simulator.handle`` from one thread per
connection. The no-fault path takes a few short, uncontended locks (stats, the
key, the ledger, the call log) and does no scan and no sleep. While the outage
switch is on, every call is answered by it before anything else (no validation,
no per-key call counting, nothing applied); then a step that requires a bearer token
(``simulator.identity``) refuses a call without a valid one (401, nothing applied).

Ids: a step in the id map (``DEFAULT_IDS``: ``reserve-stock`` hands out a
``reservation``, ``charge-payment`` a ``charge``, ``ship`` a ``parcel``, each item of
``reserve-line`` a ``reservation``) answers with
its id, ``"<field>": "<field>-<8 hex>"``, a pure function of the idempotency key. A
compensation (``DEFAULT_COMPENSATIONS``) of such a step must name, in the same field of
its body, the id that step handed out for the order (``{"reservation": "..."}``);
otherwise it is refused, ``422`` with a JSON ``error``, nothing undone: the remote does
not know what to undo. Where the step handed out nothing (it never applied), the
compensation names nothing (the field absent or null) and undoes nothing.

Callbacks: a call whose body asks for one is answered ``202`` and called back later
(``simulator.callbacks``).

Items (docs/contracts.md §3.16): a call keyed ``<orderId>:<name>:<i>`` is item ``i`` of
the ForEach ``name``; the ledger names its effect ``<name>[<i>]``, as the order names its
record, and a ``simulate`` directive for ``<name>[<i>]`` applies to it alone (before one
for its path). A step in the id map hands out an id per item; a compensation of an item
(``undo[<i>]``) undoes ``<target>[<i>]`` and must name the id that item handed out (the
maps go by path: name a ForEach as its step's path for its undo to find its items).
``<orderId>:<step>:<n>`` (n >= 2) also reads as round ``n`` of ``step``: it is one when
the order called ``step`` under its plain key before, or ``step`` is an undo whose
target's item ``n`` was never called (``Simulator._record_name``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from simulator.callbacks import DEFAULT_CALLBACK_MS, Callback, Callbacks, callback_url
from simulator.calllog import CallLog, now_us
from simulator.faults import (
    Directive,
    Fault,
    RandomFaults,
    RequestError,
    directive_for,
    record_name,
    validate_call,
)
from simulator.ledger import Effect, Ledger, now_iso
from simulator.outage import OutageSwitch

if TYPE_CHECKING:
    from simulator.identity import IdentityEndpoint

#: compensation step -> the step whose effect it undoes.
DEFAULT_COMPENSATIONS: Final[Mapping[str, str]] = {
    "release-stock": "reserve-stock",
    "refund-payment": "charge-payment",
    "release-line": "reserve-line",  # item i of release-line undoes item i of reserve-line
}
#: step -> the field of its answer that carries the id it hands out.
DEFAULT_IDS: Final[Mapping[str, str]] = {
    "reserve-stock": "reservation",
    "charge-payment": "charge",
    "ship": "parcel",
    "reserve-line": "reservation",  # one per item (declarations' order-lines)
}


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer, or ``status == 0``: close the connection without one."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def dropped(self) -> bool:
        return self.status == 0


DROP: Final = Answer(0)


def json_answer(status: int, payload: Any, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
    return Answer(status, json.dumps(payload).encode(), headers)


def confirmation(step: str, key: str) -> str:
    """``<step>-<8 hex>``, a pure function of the key: the same for every retry."""
    return f"{step}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def handed_out(field: str, key: str) -> str:
    """The id a step hands out: ``<field>-<8 hex>``, a pure function of the key."""
    return f"{field}-{hashlib.sha256(f'{field}:{key}'.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, slots=True)
class _Call:
    state: _KeyState
    order_id: str
    step: str  # the record it is for: the path's step, or an item's <name>[<i>]
    key: str
    number: int  # 1-based, per key, over the server's life
    body: dict[str, Any]
    directive: Directive | None
    callback: str | None  # the URL to call back on
    path: str  # POST /{path}

    @property
    def refused_later(self) -> bool:
        """Accepted now, refused by its callback: nothing is applied."""
        return (
            self.callback is not None
            and self.directive is not None
            and self.directive.callback == "refuse"
        )


class _KeyState:
    """Per idempotency key: its lock, how often it was called, its stored answer."""

    __slots__ = ("callbacks", "calls", "first_call", "lock", "random_faults", "response")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.callbacks = 0  # callbacks sent (or lost) for the key
        self.first_call = 0.0  # time.monotonic() of the key's first call
        self.random_faults = 0
        self.response: bytes | None = None


class _Stats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clear()

    def clear(self) -> None:
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self.calls = 0
        self.by_status: Counter[str] = Counter()
        self.by_fault: Counter[str] = Counter()
        self.random_faults = 0
        self.no_response = 0
        self.duplicates = 0
        self.outage_answered = 0

    def begin(self, fault: Fault | None) -> None:
        with self._lock:
            self.calls += 1
            if fault is not None:
                self.by_fault[fault.kind] += 1
                if fault.random:
                    self.random_faults += 1

    def end(self, outcome: Answer) -> None:
        with self._lock:
            if outcome.dropped:
                self.no_response += 1
            else:
                self.by_status[str(outcome.status)] += 1

    def outage(self, status: int) -> None:
        with self._lock:
            self.calls += 1
            self.outage_answered += 1
            self.by_status[str(status)] += 1

    def duplicate(self) -> None:
        with self._lock:
            self.duplicates += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "calls": self.calls,
                "byStatus": dict(self.by_status),
                "noResponse": self.no_response,
                "byFault": dict(self.by_fault),
                "randomFaults": self.random_faults,
                "duplicatesSuppressed": self.duplicates,
                "outageAnswered": self.outage_answered,
            }


class Simulator:
    """Applies each idempotency key's effect at most once, with injected faults."""

    def __init__(
        self,
        *,
        random_faults: RandomFaults | None = None,
        compensations: Mapping[str, str] | None = None,
        ledger: Ledger | None = None,
        call_log: CallLog | None = None,
        outage: OutageSwitch | None = None,
        identity: IdentityEndpoint | None = None,
        ids: Mapping[str, str] | None = None,
        callback_ms: int = DEFAULT_CALLBACK_MS,
    ) -> None:
        self._random = random_faults or RandomFaults()
        self._compensations = dict(
            DEFAULT_COMPENSATIONS if compensations is None else compensations
        )
        self._ids = dict(DEFAULT_IDS if ids is None else ids)
        self._callback_ms = callback_ms
        # (orderId, step) -> the id that step handed out (an item's: <name>[<i>])
        self._handed: dict[tuple[str, str], str] = {}
        # (orderId, record) of every call: a plain step's, a round's, an item's <name>[<i>]
        self._seen: set[tuple[str, str]] = set()
        self.ledger = ledger or Ledger()
        self.call_log = CallLog() if call_log is None else call_log
        self.outage = OutageSwitch() if outage is None else outage
        self.identity = identity
        self._keys: dict[str, _KeyState] = {}
        self._keys_lock = threading.Lock()
        self._stats = _Stats()
        # Set on shutdown: every sleeping call (hang, latency) wakes and drops.
        self._stopping = threading.Event()
        self.callbacks = Callbacks(self.ledger, self._stopping)

    @property
    def compensations(self) -> dict[str, str]:
        return dict(self._compensations)

    @property
    def ids(self) -> dict[str, str]:
        return dict(self._ids)

    def handle(
        self, step: str, key: str | None, body: bytes, authorization: str | None = None
    ) -> Answer:
        """Serve ``POST /{step}`` with header ``Idempotency-Key: key`` and ``body``
        (``authorization``: its ``Authorization`` header, if any)."""
        at = now_us()
        self._note_plain(step, key)
        blocked = self.outage.current()
        if blocked is not None:
            self._stats.outage(blocked.status)
            self.call_log.record(at, step, key, blocked.status, False, "outage")
            return Answer(blocked.status, blocked.body, blocked.headers)
        if self.identity is not None:
            refused = self.identity.check(step, authorization)
            if refused is not None:
                self._stats.begin(None)
                self.call_log.record(at, step, key, refused.status, False, "unauthorized")
                return self._end(refused)
        try:
            order_id, order = validate_call(step, key, body)
            assert key is not None  # validate_call refuses a call without one
            name = self._record_name(order_id, step, key)
            # an item's own directive (<name>[<i>]) first, then its path's
            directive = directive_for(name, order) if name != step else None
            directive = directive or directive_for(step, order)
            callback = callback_url(order)
        except RequestError as exc:
            self._stats.begin(None)
            self.call_log.record(at, step, key, 400, False, "invalid")
            return self._end(json_answer(400, {"error": str(exc)}))
        unknown = self._unknown_id(order_id, step, name, order)
        if unknown is not None:
            self._stats.begin(None)
            self.call_log.record(at, step, key, 422, False, "refused")
            return self._end(json_answer(422, {"error": unknown}))
        state = self._state(key)
        fault: Fault | None = None
        latency = 0
        with state.lock:
            state.calls += 1
            call_no = state.calls
            if call_no == 1:
                state.first_call = time.monotonic()
            if directive is not None:
                since = time.monotonic() - state.first_call
                fault, latency = directive.fault_for(call_no, since), directive.latency_ms
            elif self._random.active:
                fault, latency = self._random.draw(key, call_no, state.random_faults)
                if fault is not None:
                    state.random_faults += 1
        self._stats.begin(fault)
        call = _Call(state, order_id, name, key, call_no, order, directive, callback, step)
        outcome, applied = self._run(call, fault, latency)
        self.call_log.record(
            at,
            step,
            key,
            "dropped" if outcome.dropped else outcome.status,
            applied,
            None if fault is None else fault.kind,
        )
        return self._end(outcome)

    def _run(self, call: _Call, fault: Fault | None, latency_ms: int) -> tuple[Answer, bool]:
        """The outcome, and whether this call applied the key's effect."""
        if latency_ms and not self._sleep(latency_ms / 1000):
            return DROP, False
        if fault is None:
            answer, applied = self._accept(call)
            return Answer(202 if call.callback else 200, answer), applied
        if fault.kind == "transient":
            headers: tuple[tuple[str, str], ...] = ()
            if fault.retry_after is not None:
                headers = (("Retry-After", str(fault.retry_after)),)
            message = f"Simulated transient failure of step {call.step!r} (call {call.number})."
            return json_answer(fault.status, {"error": message}, headers), False
        if fault.kind == "permanent":
            return json_answer(fault.status, {"error": fault.error}), False
        # hang or drop. applyFirst: the effect happens and the answer is lost.
        stored: bytes | None = None
        applied = False
        if fault.apply_first:
            stored, applied = self._accept(call)
        if fault.kind == "drop":
            return DROP, applied
        # The key's lock is not held while hanging, so a retry is served meanwhile;
        # a hang without applyFirst applies late (a slow service), deduplicated.
        if not self._sleep(fault.seconds):
            return DROP, applied
        if stored is None:
            stored, applied = self._accept(call)
        return Answer(202 if call.callback else 200, stored), applied

    def _accept(self, call: _Call) -> tuple[bytes, bool]:
        """The call's answer (its effect applied once), and for a call that asks for a
        callback, the callback sent. Returns the answer and whether this call applied."""
        if call.refused_later:
            answer = {"orderId": call.order_id, "step": call.step, "accepted": True}
            assert call.directive is not None
            self._call_back(call, {"refused": call.directive.callback_reason})
            return json.dumps(answer).encode(), False
        stored, applied = self._apply(call)
        if call.callback is not None:
            self._call_back(call, {"result": json.loads(stored)})
        return stored, applied

    def _call_back(self, call: _Call, body: dict[str, Any]) -> None:
        assert call.callback is not None
        directive = call.directive
        with call.state.lock:
            call.state.callbacks += 1
            number = call.state.callbacks
        after = self._callback_ms
        if directive is not None and directive.callback_ms is not None:
            after = directive.callback_ms
        lost = directive is not None and directive.callback_lost(number)
        self.callbacks.send(
            Callback(call.order_id, call.step, call.key, call.callback, body, after, lost)
        )

    def _note_plain(self, path: str, key: str | None) -> None:
        """A call under a plain key, ``<orderId>:<path>``, even one that goes no further (an
        outage answers it): a later ``<orderId>:<path>:<n>`` is its round."""
        if key and key.count(":") == 1:
            with self._keys_lock:
                self._seen.add((key.partition(":")[0], path))

    def _record_name(self, order_id: str, path: str, key: str) -> str:
        """The record the call is for (``faults.record_name``). ``<orderId>:<path>:<n>``
        (n >= 2) is a round of ``path`` if the order called ``path`` itself before, or if
        ``path`` is a compensation whose target's item ``n`` it never called (a plain
        compensation run again); otherwise item ``n`` (of a ForEach, or of the undo of
        one, whose target's item ``n`` was called: an item is undone only once called)."""
        if key.count(":") == 1:
            return path
        with self._keys_lock:
            as_round = (order_id, path) in self._seen
            target = self._compensations.get(path)
            if not as_round and target is not None:
                index = key.split(":")[2]
                as_round = (order_id, f"{target}[{index}]") not in self._seen
            name = record_name(path, key, as_round)
            self._seen.add((order_id, name))
        return name

    def _target(self, path: str, name: str) -> str | None:
        """The record a compensation on ``path`` (for record ``name``) undoes: its target's,
        or for item ``undo[<i>]``, the target's item ``<i>``."""
        target = self._compensations.get(path)
        if target is None or name == path:
            return target
        return f"{target}[{name.rpartition('[')[2]}"

    def _unknown_id(self, order_id: str, step: str, name: str, body: dict[str, Any]) -> str | None:
        """Why a compensation is refused: it does not name the id its step handed out for
        the order (None: it does, or its step hands out none)."""
        path_target = self._compensations.get(step)
        field = self._ids.get(path_target) if path_target is not None else None
        target = self._target(step, name)
        if target is None or field is None:
            return None
        handed = self._handed.get((order_id, target))
        named = body.get(field)
        if named == handed:
            return None
        if handed is None:
            return (
                f"{name} names {field} {named!r}, but {target} handed out none for order "
                f"{order_id}. Nothing was undone."
            )
        return (
            f"{name} must name the {field} that {target} handed out for order {order_id} "
            f"(the body's {field!r}); it names {named!r}. Nothing was undone: the remote does "
            "not know what to undo."
        )

    def _apply(self, call: _Call) -> tuple[bytes, bool]:
        """Apply the key's effect once; every later call gets the stored answer.

        Returns the answer and whether this call applied the effect.
        """
        state, order_id, step, key = call.state, call.order_id, call.step, call.key
        with state.lock:
            if state.response is not None:
                self._stats.duplicate()
                return state.response, False
            at = now_iso()
            response: dict[str, Any] = {
                "orderId": order_id,
                "step": step,
                "confirmation": confirmation(step, key),
                "appliedAt": at,
            }
            path = call.path
            compensates = self._target(path, step)
            ids: dict[str, str] | None = None
            field = self._ids.get(path)
            if field is not None and compensates is None:
                ids = {field: handed_out(field, key)}
                self._handed[(order_id, step)] = ids[field]
            target_path = self._compensations.get(path)
            target_field = self._ids.get(target_path) if target_path is not None else None
            if target_field is not None and call.body.get(target_field) is not None:
                ids = {target_field: call.body[target_field]}
            response.update(ids or {})
            self.ledger.append(
                at=at,
                order_id=order_id,
                step=step,
                key=key,
                response=response,
                compensates=compensates,
                request=call.body,
                ids=ids,
            )
            state.response = json.dumps(response).encode()
            return state.response, True

    def _state(self, key: str) -> _KeyState:
        state = self._keys.get(key)
        if state is None:
            with self._keys_lock:
                state = self._keys.setdefault(key, _KeyState())
        return state

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; False if the server stopped meanwhile."""
        return not self._stopping.wait(seconds) if seconds > 0 else not self.stopping

    def _end(self, outcome: Answer) -> Answer:
        self._stats.end(outcome)
        return outcome

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Wake every sleeping call; they close their connections without an answer."""
        self._stopping.set()

    def reset(self) -> None:
        """Forget keys, effects, counts and the call log (the ledger file is truncated
        too). The outage switch is left as it is."""
        with self._keys_lock:
            self._keys = {}
            self._handed = {}
            self._seen = set()
        self.ledger.clear()
        self._stats.clear()
        self.call_log.clear()

    def effects(self) -> list[Effect]:
        return self.ledger.entries()

    def calls(self, since: int | str | datetime | None = None) -> list[dict[str, Any]]:
        """The call log (see ``simulator.calllog``), from ``since`` (ISO-8601) on."""
        return self.call_log.entries(since)

    def stats(self) -> dict[str, Any]:
        snapshot = self._stats.snapshot()
        effects, compensations, callbacks = self.ledger.counts()
        snapshot["effects"], snapshot["compensations"] = effects, compensations
        snapshot["callbacks"] = callbacks
        return snapshot
