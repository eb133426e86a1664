"""The model's own vocabulary: what the adapter (``tests.model.world``) hands back.

Nothing here knows the engine: a request as the model sees it (``Req``), the answer of a
call into the app (``Answer``), and the order as the model reads it (``OrderSnap``, one
``StepSnap`` per step). When the engine changes, the adapter maps the new engine onto
these, and the model does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

#: The reports an agent sends, as the adapter builds them.
ReplyKind = Literal[
    "success", "refused", "refused-settled", "transient-no", "transient-maybe", "deferred"
]
AnswerKind = Literal[
    # agent replies (the reply handler's verdict)
    "applied",
    "noted",
    "stale",
    "unbound",
    # events and callbacks (the HTTP answers: 200/202 taken, kept, same; 409; 400; 404)
    "taken",
    "kept",
    "same",
    # operator actions and everything else
    "ok",
    "refused",
    "invalid",
    "not-found",
    # anything the API would not map to a 4xx: a bug, whatever it says
    "unexpected",
]


@dataclass(frozen=True)
class Answer:
    kind: AnswerKind
    detail: str = ""
    #: what a duplicate of this report needs (``World.redeliver``): opaque to the model
    handle: object = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Req:
    """A request an agent was sent (one attempt of a step or compensation)."""

    index: int
    order_id: str
    step: str
    attempt: int
    key_round: int
    key: str
    deadline: datetime
    #: the engine's own message, handed back to ``reply`` and ``callback``; opaque here
    raw: object = field(repr=False, compare=False)


@dataclass(frozen=True)
class StepSnap:
    """One step record as the model reads it (the latest record of that name)."""

    name: str
    action: bool
    compensates: str | None
    state: str  # pending processing processed error compensating compensated skipped
    key_round: int
    attempt: int
    deadline: datetime  # CompleteBy: the deadline while processing, the due time pending
    #: the record knows the step applied (a success, a callback's result)
    known_applied: bool
    #: an attempt of it was accepted by its remote (completes_on: it may apply)
    accepted: bool
    #: it may have applied and nothing settled it (3.11)
    in_doubt: bool
    #: it failed for good and the workflow went on past it (``on_failure="continue"``)
    continued: bool = False
    #: an attempt of it was claimed and has not ended (its call may be running)
    in_flight: bool = False

    @property
    def active(self) -> bool:
        return self.state in ("pending", "processing")


@dataclass(frozen=True)
class OrderSnap:
    order_id: str
    status: str
    cancel_requested: bool
    steps: tuple[StepSnap, ...]

    def step(self, name: str) -> StepSnap | None:
        return next((s for s in self.steps if s.name == name), None)

    @property
    def active(self) -> list[StepSnap]:
        return [s for s in self.steps if s.active]


#: The order statuses of contract 3.7 after which nothing happens without a person.
TERMINAL = frozenset({"completed", "compensated", "cancelled", "error"})
FINISHED = frozenset({"completed", "compensated", "cancelled"})


def terminal(status: str) -> bool:
    return status in TERMINAL


def finished(status: str) -> bool:
    return status in FINISHED
