"""What happened, as the history names it: ``Happened``, one enum of the names of its
entries, for the model that writes them and for every reader (the admin view, the
console, the verifier, the benchmarks). Not ``core.flow.Event``, a step that waits for
an event delivered to an order (docs/design.md, "Words").

The history is for people: it may be truncated (``core.steps.MAX_HISTORY``) and no
decision reads it (docs/contracts.md §3.11, "decisions read state, not the log"); the
typed per-attempt state in ``core.attempts`` is what decisions read. The values are the
strings stored in ``History``; the one word that changed (a transient ending was
stored as ``"failed"`` before 2026-11, the wire's word for a refusal) reads as its new
word (``read_history``), so old rows read the same.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

#: How rows written before 2026-11 named a transient ending (``Happened.TRANSIENT``,
#: ``core.attempts.Outcome.TRANSIENT``).
LEGACY_TRANSIENT = "failed"


class Happened(StrEnum):
    # --- the order's own history ---------------------------------------------------
    RECEIVED = "received"
    STATUS = "status"
    ALERTED = "alerted"
    #: a step that failed for good turned out otherwise (a success, a deferral)
    RESOLVED = "resolved"
    #: a final failure's verdict changed ("not applied after all", "may have applied")
    RECLASSIFIED = "reclassified"
    CANCEL_REQUESTED = "cancel-requested"
    CANCEL_WITHDRAWN = "cancel-withdrawn"
    CANCEL_TOO_LATE = "cancel-too-late"
    #: an operator stated that a doubtful step did not happen (with a cancel)
    STATED_NOT_APPLIED = "stated-not-applied"
    #: a step applied after its compensation began: the compensation may have missed it
    OVERTAKEN = "overtaken"
    #: an operator changed the order's data when resubmitting it (docs/contracts.md §3.14)
    PATCHED = "patched"

    # --- a step's history -------------------------------------------------------------
    CREATED = "created"
    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    REFUSED = "refused"  # the remote refused: nothing applied by that try
    TRANSIENT = "transient"  # transient failures until the agent's time ran out (counted)
    DEFERRED = "deferred"  # not called, or the remote down for everyone (not counted)
    EXPIRED = "expired"  # no report by the deadline (counted)
    NOT_SENT = "not-sent"  # the request never left (not counted)
    RETRY_SCHEDULED = "retry-scheduled"
    #: the last counted failure came before the step's time budget was spent: the
    #: final decision waits for the attempt's deadline
    GIVE_UP_HELD = "give-up-held"
    ERROR = "error"  # failed for good
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    CANCELLED = "cancelled"
    RESUBMITTED = "resubmitted"
    LATE_REPORT = "late-report"  # a report for an attempt already decided
    LATE_SUCCESS = "late-success"  # a success after the step or order had moved on
    HANDLER_RUNNING = "handler-running"  # a Python agent's handler still runs
    #: the step waits because an operator paused its agent (not counted, no alert)
    AGENT_PAUSED = "agent-paused"
    #: that wait is over (the agent was resumed, or another wait took over)
    PAUSE_OVER = "pause-over"
    #: a compensation runs again as a new effect, under a new idempotency key
    NEW_KEY = "new-key"
    #: an operator stated a step did not happen, so the compensation that failed to undo
    #: it is not needed: the unwinding goes on past it
    NOT_NEEDED = "not-needed"
    #: what a step's functions decided when it started (``input``, ``when``, ``until``)
    DECIDED = "decided"
    #: its ``when`` said no: never called, never compensated
    SKIPPED = "skipped"
    #: an event or a delay began: the step waits (``waitingFor``)
    WAITING = "waiting"
    #: an event the step waited for was taken (its result, or a refusal)
    EVENT_TAKEN = "event-taken"
    #: a remote's 2xx for a step that completes on an event: accepted, it may apply
    ACCEPTED = "accepted"
    #: a step of a group that failed for good stopped the others that had not started
    HALTED = "halted"
    #: a step declared ``on_failure="continue"`` failed for good: the workflow went on
    CONTINUED = "continued"
    #: its undo, begun but never sent, was withdrawn when a doubt came back (§3.15): the
    #: step is back where it stood (``back``: Processed, or Error)
    UNDO_WITHDRAWN = "undo-withdrawn"

    # --- the order's own history: events delivered ----------------------------------
    #: an event arrived before the step that takes it started: kept for it
    EVENT_KEPT = "event-kept"
    #: an event refused and recorded: for an earlier run (``stale``), or too late
    EVENT_REFUSED = "event-refused"
    #: an effect that cannot be undone stands, as its step's ``may_stand`` declares
    EFFECT_STANDS = "effect-stands"
    #: an order that waited for its key's slot took it: its first steps start (§3.16)
    TURN_TAKEN = "turn-taken"

    @classmethod
    def _missing_(cls, value: object) -> Happened | None:
        return cls.TRANSIENT if value == LEGACY_TRANSIENT else None


#: How an attempt can end, as the history names it (``Outcome`` in ``core.attempts``).
ATTEMPT_ENDINGS = frozenset(
    {
        Happened.SUCCEEDED,
        Happened.REFUSED,
        Happened.TRANSIENT,
        Happened.DEFERRED,
        Happened.EXPIRED,
        Happened.NOT_SENT,
    }
)


def read_history(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stored history as today's words (an old row's ``"failed"`` is ``"transient"``)."""
    for entry in entries:
        if entry.get("event") == LEGACY_TRANSIENT:
            entry["event"] = Happened.TRANSIENT.value
    return entries
