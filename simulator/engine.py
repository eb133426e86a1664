"""The simulated remote services without HTTP: one call in, one outcome out.

Thread-safe; the HTTP server calls ``Simulator.handle`` from one thread per
connection. The no-fault path takes a few short, uncontended locks (stats, the
key, the ledger, the call log) and does no scan and no sleep. While the outage
switch is on, every call is answered by it before anything else (no validation,
no per-key call counting, nothing applied); then a step that requires a bearer token
(``simulator.identity``) refuses a call without a valid one (401, nothing applied).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from simulator.calllog import CallLog, now_us
from simulator.faults import (
    Fault,
    RandomFaults,
    RequestError,
    directive_for,
    validate_call,
)
from simulator.ledger import Effect, Ledger
from simulator.outage import OutageSwitch

if TYPE_CHECKING:
    from simulator.identity import IdentityEndpoint

#: compensation step -> the step whose effect it undoes.
DEFAULT_COMPENSATIONS: Final[Mapping[str, str]] = {
    "release-stock": "reserve-stock",
    "refund-payment": "charge-payment",
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


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def confirmation(step: str, key: str) -> str:
    """``<step>-<8 hex>``, a pure function of the key: the same for every retry."""
    return f"{step}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


@dataclass(frozen=True, slots=True)
class _Call:
    state: _KeyState
    order_id: str
    step: str
    key: str
    number: int  # 1-based, per key, over the server's life


class _KeyState:
    """Per idempotency key: its lock, how often it was called, its stored answer."""

    __slots__ = ("calls", "first_call", "lock", "random_faults", "response")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
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
    ) -> None:
        self._random = random_faults or RandomFaults()
        self._compensations = dict(
            DEFAULT_COMPENSATIONS if compensations is None else compensations
        )
        self.ledger = ledger or Ledger()
        self.call_log = CallLog() if call_log is None else call_log
        self.outage = OutageSwitch() if outage is None else outage
        self.identity = identity
        self._keys: dict[str, _KeyState] = {}
        self._keys_lock = threading.Lock()
        self._stats = _Stats()
        # Set on shutdown: every sleeping call (hang, latency) wakes and drops.
        self._stopping = threading.Event()

    @property
    def compensations(self) -> dict[str, str]:
        return dict(self._compensations)

    def handle(
        self, step: str, key: str | None, body: bytes, authorization: str | None = None
    ) -> Answer:
        """Serve ``POST /{step}`` with header ``Idempotency-Key: key`` and ``body``
        (``authorization``: its ``Authorization`` header, if any)."""
        at = now_us()
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
            directive = directive_for(step, order)
        except RequestError as exc:
            self._stats.begin(None)
            self.call_log.record(at, step, key, 400, False, "invalid")
            return self._end(json_answer(400, {"error": str(exc)}))
        key = f"{order_id}:{step}"
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
        call = _Call(state, order_id, step, key, call_no)
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
            answer, applied = self._apply(call)
            return Answer(200, answer), applied
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
            stored, applied = self._apply(call)
        if fault.kind == "drop":
            return DROP, applied
        # The key's lock is not held while hanging, so a retry is served meanwhile;
        # a hang without applyFirst applies late (a slow service), deduplicated.
        if not self._sleep(fault.seconds):
            return DROP, applied
        if stored is None:
            stored, applied = self._apply(call)
        return Answer(200, stored), applied

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
            response = {
                "orderId": order_id,
                "step": step,
                "confirmation": confirmation(step, key),
                "appliedAt": at,
            }
            self.ledger.append(
                at=at,
                order_id=order_id,
                step=step,
                key=key,
                response=response,
                compensates=self._compensations.get(step),
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
        snapshot["effects"], snapshot["compensations"] = self.ledger.counts()
        return snapshot
