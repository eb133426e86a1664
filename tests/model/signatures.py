"""What the model reports: a failure's signature, its exception, and what a runner records.

A signature is ``<invariant>`` or ``<invariant>@<where>`` (``I3-effect-stands@no-undo``,
``I2-evidence-discarded@callback:compensating``, ``EXC@reply:KeyError``): stable words
a runner keys on. The part before ``@`` is one of ``SIGNATURES``; the part after tells
apart ways of breaking one invariant that are different bugs as often as not (the
channel, the rule, the step's state as the contract names it). Each signature raises an
exception class of its own, so Hypothesis tells the failures apart and shrinks each to
its own shortest sequence.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Final

#: Every invariant the model checks, by the first part of its signature.
SIGNATURES: Final = {
    "I1-undo-while-may-apply": "a compensation was requested while an attempt of its step "
    "may still apply (before that attempt's deadline plus the allowed skew)",
    "I1-undo-around-doubt": "a compensation was requested while a step without one may have "
    "applied and nothing settled it",
    "I2-evidence-discarded": "a success report (2xx, callback result) for the current run "
    "was answered dropped/409 while the record does not know the step applied",
    "I3-effect-stands": "the order ended compensated/cancelled with an effect that truly "
    "applied and was never undone",
    "I4-error-without-alert": "the order is in error and no alert was raised since it entered it",
    "I4-operator-alert": "an operator action by itself raised an alert",
    "I5-second-key": "a step was requested under a new key while an earlier key of it "
    "applied or may still apply",
    "I5-item-key": "an item of a ForEach (or its compensation) was requested under a key "
    "other than its own, <orderId>:<name>:<i>",
    "I6-no-next-look": "an unfinished order has nothing that will look at it again",
    "I7-status-sequence": "the status messages of one transition repeat a status (one "
    "message per transition, no flapping)",
    "I7-status-missed": "the order's status changed and the last status message says otherwise",
    "I7-error-left": "error was left by something other than an operator or evidence "
    "(a deferral, a timer)",
    "I7-kept-unreachable": "an event was answered kept although its step had started or the "
    "order can no longer reach it",
    "I8-hold-unwound": 'something was undone while a step declared on_failure="hold" had '
    "failed and no operator had cancelled",
    "I9-items-over-cap": "more items of one ForEach were in flight at once than its "
    "max_concurrency",
    "I10-item-after-halt": "an item of a ForEach was started after its group halted (a sibling "
    "failed for good, or a cancel)",
    "I11-results-unlisted": "the order completed and ctx.results[<ForEach>] is not the list of "
    "its items' results in item order",
    "T1-over-limit": "more orders of one key held its slot, or ran steps, at once than its limit",
    "T1-running-without-slot": "an order ran a step (Processing, or an attempt claimed) "
    "without holding its key's slot",
    "T2-turn-out-of-order": "an order took its first turn while one of its key accepted "
    "before it still waited in line",
    "T3-slot-leaked": "once settled after a supervisor sweep, a slot is held by an order that "
    "ended (or is in error without hold_on_error)",
    "T4-waiting-with-steps": "an order waiting in line for its key's slot has a step record",
    "T5-waiting-stuck": "once settled (the world calm, every holder in error cancelled), an "
    "order still waits for its turn",
    "RELOAD-lost": "the order loaded from the store differs from the order as saved",
    "LIVENESS": "with the world calm the order did not reach a terminal status",
    "EXC": "an exception the API does not map to a 4xx escaped a service (EXC@<where>:<type>)",
}


#: Found, reported, and not fixed yet: recorded (a runner's table lists them) but failing
#: no example, so the search looks for others. Each has a test that shows it
#: (``tests/model/test_turn_checks.py``); remove it here once fixed.
KNOWN: Final = frozenset[str]()


@dataclass(frozen=True)
class Finding:
    """One violation a check found."""

    invariant: str  # a key of SIGNATURES
    message: str
    at: str = ""

    @property
    def signature(self) -> str:
        return f"{self.invariant}@{self.at}" if self.at else self.invariant


def invariant_of(signature: str) -> str:
    return signature.split("@", maxsplit=1)[0]


class Violation(AssertionError):
    """A contract violation the model found; each signature has a subclass of its own."""

    signature = "?"


_CLASSES: dict[str, type[Violation]] = {}


def violation(signature: str) -> type[Violation]:
    """The exception class of ``signature``."""
    found = _CLASSES.get(signature)
    if found is None:
        name = re.sub(r"\W", "_", signature)
        found = _CLASSES[signature] = type(name, (Violation,), {"signature": signature})
    return found


@dataclass
class Recorder:
    """What a runner wants across examples: when each signature was first seen (seconds
    since ``started``), and which to record without failing on (found already, or not
    among ``only``)."""

    started: float = field(default_factory=time.monotonic)
    suppressed: set[str] = field(default_factory=lambda: set(KNOWN))
    first_seen: dict[str, float] = field(default_factory=dict)
    #: if any: only signatures that start with one of these fail an example
    only: tuple[str, ...] = ()

    #: the first message of each signature
    first_message: dict[str, str] = field(default_factory=dict)
    #: failures found at teardown after the example ran out of input (Hypothesis drops
    #: those: a runner fails on them itself): (signature, "<signature>: <message> (<flow>)")
    lost: list[tuple[str, str]] = field(default_factory=list)

    def seen(self, signature: str, message: str = "") -> bool:
        """Record ``signature``; whether it should fail the example."""
        self.first_seen.setdefault(signature, time.monotonic() - self.started)
        self.first_message.setdefault(signature, message)
        if self.only and not signature.startswith(self.only):
            return False
        return signature not in self.suppressed


#: The recorder every machine reports to (a runner puts its own here).
RECORDER = Recorder()


def no_failure_lost(since: int = 0) -> None:
    """Fail (``AssertionError``) if a failure was found at teardown after the example's
    input ran out (``Recorder.lost``, from entry ``since``): Hypothesis drops it."""
    lost = RECORDER.lost[since:]
    if lost:
        raise AssertionError(
            f"{len(lost)} failure(s) found at teardown after the example ran out of input "
            "(Hypothesis drops them; replay the flow with the steps it needs): "
            + "; ".join(text for _signature, text in lost)[:2000]
        )
