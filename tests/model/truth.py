"""The truth the model knows and the engine does not: what every remote really did.

The model plays every remote. Each idempotency key is one ``Effect``: whether it really
applied (and when, as a tick of the model's own logical time), or, for a step answered
by callback, whether the remote accepted the work, applied it or declined it for good.
Each request the engine sent is one ``Call``: whether the remote has been called with it
yet (a call happens before the request's deadline, or never), and whether that call
applied (or found applied) its key. Every report the model sends is checked against
this: a success only for a call that applied, a refusal "after looking the key up"
(settled) only for a key that has not applied and cannot apply any more, and so on. So
whatever the engine concludes, the ledger says whether it was right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from tests.model.flows import Flow
from tests.model.vocabulary import ReplyKind, Req

EffectState = Literal["none", "accepted", "applied", "declined"]

#: What an agent can report, as the model names it (``maybe-*``: a transient failure with
#: "applied: maybe", whether or not the call truly applied).
Report = Literal[
    "success",
    "refused",
    "refused-settled",
    "transient-no",
    "maybe-applied",
    "maybe-not",
    "deferred",
]
#: What each report is on the wire.
WIRE: Final[dict[Report, ReplyKind]] = {
    "success": "success",
    "refused": "refused",
    "refused-settled": "refused-settled",
    "transient-no": "transient-no",
    "maybe-applied": "transient-maybe",
    "maybe-not": "transient-maybe",
    "deferred": "deferred",
}
REPORTS: Final[list[Report]] = list(WIRE)
#: A remote's callback bodies (the same for every run: a webhook retry repeats its body).
RESULT: Final[dict[str, Any]] = {"result": {"done": True}}
DECLINED: Final[dict[str, Any]] = {"refused": "declined"}
CallbackBody = Literal["result", "refused", "again"]


@dataclass
class Effect:
    """One idempotency key at its remote."""

    key: str
    step: str  # the step (or compensation) whose key it is
    key_round: int
    #: the step it undoes, for a compensation's key
    undoes: str | None
    state: EffectState = "none"
    #: when it applied (the model's tick), for "applied"
    applied_at: int | None = None


@dataclass
class Call:
    """One request the engine sent (an attempt), and what its remote did with it."""

    req: Req
    called: bool = False
    #: when its remote answered it (what its agent reports as ``answeredAt``)
    called_at: datetime | None = None
    #: its call applied its key, or found it applied (or, for a callback step, accepted)
    applied: bool = False
    #: reports the model delivered for it
    reports: int = 0

    def open(self, now: datetime) -> bool:
        """Its remote may still be called with it (the agent calls before the deadline)."""
        return not self.called and now < self.req.deadline


@dataclass
class Ledger:
    flow: Flow
    effects: dict[str, Effect] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    tick: int = 0
    #: the last callback body sent for each key (what a webhook retry sends again)
    callbacks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, req: Req) -> Call:
        call = Call(req)
        self.calls.append(call)
        if req.key not in self.effects:
            task = self.flow.compensated(req.step)
            self.effects[req.key] = Effect(
                req.key, req.step, req.key_round, task.name if task is not None else None
            )
        return call

    def effect(self, call: Call) -> Effect:
        return self.effects[call.req.key]

    def is_callback(self, step: str) -> bool:
        task = self.flow.task(step)
        return task is not None and task.callback

    def apply(self, effect: Effect) -> None:
        """The remote applies the key's effect now (no-op if it had)."""
        if effect.state != "applied":
            self.tick += 1
            effect.state = "applied"
            effect.applied_at = self.tick

    def take(self, call: Call, now: datetime) -> None:
        """The remote takes ``call`` and applies it (or, answered by callback, accepts the
        work, which may apply from then on)."""
        call.called, call.called_at = True, now
        call.applied = True
        effect = self.effect(call)
        if not self.is_callback(call.req.step):
            self.apply(effect)
        elif effect.state == "none":
            effect.state = "accepted"

    # --- what is true of a step ---------------------------------------------------------

    def effects_of(self, step: str) -> list[Effect]:
        return [e for e in self.effects.values() if e.step == step]

    def may_apply(self, step: str, now: datetime) -> bool:
        """The step may have applied, or may still: a key applied or accepted, or a
        request of it whose remote may still be called."""
        if any(e.state in ("applied", "accepted") for e in self.effects_of(step)):
            return True
        return any(
            c.open(now) and self.effects[c.req.key].state != "declined"
            for c in self.calls
            if c.req.step == step
        )

    def undone(self, effect: Effect) -> bool:
        """A compensation of its step truly applied after it did."""
        assert effect.applied_at is not None
        return any(
            u.undoes == effect.step
            and u.applied_at is not None
            and u.applied_at > effect.applied_at
            for u in self.effects.values()
        )

    def settleable(self, call: Call, now: datetime) -> bool:
        """The service may truthfully refuse ``call`` after looking its key up: the key has
        not applied (nor been accepted) and no other request of it may still reach it."""
        effect = self.effect(call)
        if effect.state != "none":
            return False
        return not any(
            c is not call and c.req.key == call.req.key and c.open(now) for c in self.calls
        )

    def truth_of(self, step: str) -> str:
        """The truth about ``step``'s keys, for a message."""
        return ", ".join(f"{e.key}: {e.state}" for e in self.effects_of(step)) or (
            "a request of it may still reach its remote"
        )

    def current(self, step: str, key_round: int) -> bool:
        """``key_round`` is the step's current run (its latest request's)."""
        rounds = [c.req.key_round for c in self.calls if c.req.step == step]
        return not rounds or key_round >= max(rounds)

    # --- what the remotes can truthfully say -----------------------------------------

    def possible(self, call: Call, report: Report, now: datetime) -> bool:
        """Whether the agent can truthfully report ``call`` as ``report`` now."""
        if not call.called and not call.open(now):
            return report == "deferred"  # its deadline passed unread: it calls nothing
        applies = report in ("success", "maybe-applied")
        if call.called and applies != call.applied:
            return False
        return report != "refused-settled" or self.settleable(call, now)

    def report(self, call: Call, report: Report, now: datetime) -> ReplyKind | None:
        """The reply that says ``report`` of ``call``, the truth updated (the remote is
        called now if it has not been), or None if it cannot truthfully be said."""
        if not self.possible(call, report, now):
            return None
        if not call.called:
            if report in ("success", "maybe-applied"):
                self.take(call, now)
            else:
                call.called, call.called_at = True, now
        return WIRE[report]

    def callback_keys(self) -> list[str]:
        """The keys of ``completes_on`` steps their remote took (any run)."""
        return [
            e.key
            for e in self.effects.values()
            if e.state != "none" and self.is_callback(e.step) and e.undoes is None
        ]

    def can_call_back(self, key: str, body: CallbackBody) -> bool:
        state = self.effects[key].state
        if body == "result":
            return state != "declined"
        if body == "refused":
            return state != "applied"
        return key in self.callbacks

    def call_back(self, key: str, body: CallbackBody) -> dict[str, Any] | None:
        """The callback body the remote sends for ``key`` as ``body``, the truth updated
        (a result: it applied now; a refusal: it never will), or None if it cannot."""
        if not self.can_call_back(key, body):
            return None
        effect = self.effects[key]
        if body == "result":
            self.apply(effect)
            payload = RESULT
        elif body == "refused":
            effect.state = "declined"
            payload = DECLINED
        else:
            payload = self.callbacks[key]
        self.callbacks[key] = payload
        return payload
