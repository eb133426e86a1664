"""One step's state record (docs/contracts.md §3.2) and its typed decision state.

The contract's fields (``LockedBy``, ``CompleteBy``, ``ProcessState``, ``FailureCount``,
``Attempt``) and what decisions need besides them: the attempts (``core.attempts``),
the deferral streak, the start of the failure budget, and the final failure's verdict.
The history is for people (``record``): bounded, and never read by a decision.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from core.attempts import Attempt, AttemptLog, GaveUp
from core.history import Happened
from core.messages import idempotency_key
from core.states import StepKind, StepState
from core.text import visible, visible_details
from core.timefmt import iso, iso_exact, parse_iso

MAX_HISTORY: Final = 100
SINGLED_OUT_MIN_SECONDS: Final = 60


@dataclass
class StepRecord:
    order_id: str
    step: str
    seq: int
    kind: StepKind
    path: str
    timeout_seconds: int
    process_state: StepState
    locked_by: str
    complete_by: datetime
    failure_count: int = 0
    attempt: int = 0
    compensates: str | None = None
    result: dict[str, Any] | None = None
    last_error: str | None = None
    attempts: AttemptLog = field(default_factory=AttemptLog)
    #: Deferrals in a row (the remote not called or down for everyone) and since when.
    deferrals: int = 0
    deferred_since: datetime | None = None
    #: An attempt failed while the remote served other orders: its failures are its own.
    singled_out: bool = False
    #: ... when that was last seen: evidence ages (``singled_out_now``).
    singled_out_at: datetime | None = None
    #: When the first attempt since the failure count was last reset began (the time
    #: budget of docs/contracts.md §3.11 counts from it).
    budget_since: datetime | None = None
    #: Set when the step failed for good (cleared by a resubmit or a resolution).
    gave_up: GaveUp | None = None
    #: For an action: the compensation that undid it (it is then Compensated).
    undone_by: str | None = None
    #: It failed for good and, declared ``on_failure="continue"``, the order went on past
    #: it (docs/contracts.md §3.17): its failure stands recorded, undone by nothing.
    continued: bool = False
    #: Pending because an operator paused this agent (``core.controls``), since then: the
    #: wait is not a deferral (no window spent) and a resume ends it at once.
    paused_for: str = ""
    paused_since: datetime | None = None
    #: The key every attempt's token is derived from (``token_for``): only the state store
    #: and the messages of this step's own attempts know a token, so a request or reply
    #: nobody claimed cannot pass for one (docs/contracts.md §3.3). Never shown or logged.
    secret: str = field(default="", repr=False)
    #: The first attempt claimed with a secret (attempts before it are from before tokens).
    secret_since: int = 0
    #: Which run of the idempotency key this is: 1 is ``<orderId>:<step>``; a compensation
    #: run again after its step applied behind it (``core.evidence``) is a new effect, with
    #: the key ``<orderId>:<step>:<round>``.
    key_round: int = 1
    #: For an action: evidence that it applied after its compensation began (when that
    #: evidence came, and the report's own time): the worst news; the order waits for an
    #: operator to run the compensation again (``core.evidence``).
    applied_after_undo: datetime | None = None
    #: When the first attempt of this key round was claimed (what an undo's "began" means).
    round_began_at: datetime | None = None
    #: The body its calls send, as its ``input`` decided when it started (None: the
    #: order's JSON); what every attempt and every agent sends (docs/contracts.md §3.13).
    input: dict[str, Any] | None = None
    #: An event or a delay: what it waits for (``{"event": name}`` or ``{"until": time}``).
    waiting_for: dict[str, str] | None = None
    #: What its functions decided when it started (``when``, ``input``, ``until``): never
    #: decided again, not even when it runs again (a resubmit); one that raised decided
    #: nothing, and is called again then.
    decided: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    history_dropped: int = 0
    etag: str | None = None
    changed: bool = False

    def __setattr__(self, name: str, value: Any) -> None:
        # The last error is outside text (a remote's answer, a handler's exception):
        # shown in the API, the console and alerts, so made visible (core.text).
        if name == "last_error" and isinstance(value, str):
            value = visible(value)
        super().__setattr__(name, value)

    def record(self, now: datetime, event: Happened, **details: Any) -> None:
        entry: dict[str, Any] = {"at": iso(now), "event": str(event)}
        # Outside text (a remote's error, an operator's reason) shown as it is: visible.
        entry.update({k: visible_details(v) for k, v in details.items() if v is not None})
        self.history.append(entry)
        if len(self.history) > MAX_HISTORY:
            # Keep the first entry (how it began) and the most recent ones.
            drop = len(self.history) - MAX_HISTORY
            self.history = self.history[:1] + self.history[1 + drop :]
            self.history_dropped += drop
        self.changed = True

    @property
    def not_before(self) -> datetime:
        """For a Pending step: the time it may run. The state record keeps it in
        ``CompleteBy`` (docs/contracts.md §3.2 has one time field: the deadline while
        Processing, the earliest start while Pending)."""
        return self.complete_by

    @property
    def is_active(self) -> bool:
        return self.process_state in (StepState.PENDING, StepState.PROCESSING)

    def singled_out_now(self, now: datetime) -> bool:
        """Whether its failures are still its own: it failed while others were served, and
        that was recently (within three of its timeouts, a minute at least). An order
        singled out long ago is not blamed for what fails in an outage that came later."""
        if not self.singled_out:
            return False
        if self.singled_out_at is None:  # a row from before the flag aged: as it was
            return True
        horizon = timedelta(seconds=max(SINGLED_OUT_MIN_SECONDS, 3 * self.timeout_seconds))
        return now - self.singled_out_at <= horizon

    def single_out(self, seen: datetime | None, now: datetime) -> None:
        """An attempt's failure was counted as its own: the agent blamed it. ``seen``:
        when the agent saw the evidence that did (another order served on its endpoint,
        its host answering others, its health probe answering healthy: the reply's
        ``evidenceAt``); the flag ages from that, never from the order's own failures.
        None: no new evidence (the request's flag alone blamed it), so the flag keeps its
        age; a step not singled out yet (or a row from before the flag aged) takes
        ``now``, as an agent that does not date its evidence meant. An agent's time is not
        trusted to lengthen the flag: later than ``now`` is ``now``, and evidence older
        than what the step holds changes nothing."""
        if seen is not None:
            seen = min(seen, now)
            if self.singled_out and self.singled_out_at is not None:
                seen = max(seen, self.singled_out_at)
            self.singled_out_at = seen
        elif not self.singled_out or self.singled_out_at is None:
            self.singled_out_at = now
        self.singled_out = True

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.order_id, self.step, self.key_round)

    def round_began(self) -> datetime | None:
        """When the first attempt of the current key round was claimed (None: not yet)."""
        if self.round_began_at is not None:
            return self.round_began_at
        first = self.attempts.items[0] if self.attempts.items else None
        return first.claimed_at if first is not None else None  # rows from before rounds

    def ensure_secret(self, attempt: int) -> None:
        """Give the step its token key before attempt ``attempt`` is claimed (once)."""
        if not self.secret:
            self.secret = secrets.token_hex(32)
            self.secret_since = attempt

    def token_for(self, attempt: int) -> str:
        """The token of attempt ``attempt``: what its request carries and every report of it
        must carry back. An HMAC under the step's secret of the order, the step, the run
        (the key round the attempt ran under) and the attempt (docs/contracts.md §3.15, "an
        answer belongs to its run"); an attempt claimed before runs were bound, of the
        step and the attempt alone."""
        if not self.secret:
            return ""
        found = self.attempts.get(attempt)
        if found is not None and not found.bound:
            message = f"{self.step}:{attempt}"
        else:
            key_round = found.key_round if found is not None else self.key_round
            message = f"{self.order_id}:{self.step}:{key_round}:{attempt}"
        mac = hmac.new(bytes.fromhex(self.secret), message.encode(), "sha256")
        return mac.hexdigest()[:32]

    def binds(self, attempt: int, token: str) -> bool:
        """Whether a message carrying ``token`` speaks for attempt ``attempt`` of this step:
        an attempt that was claimed, with its own token. An attempt claimed before tokens
        existed (``secret_since``) is taken at its word, as it was then."""
        if attempt < 1 or attempt > self.attempt:
            return False
        if not self.secret or attempt < self.secret_since:
            return True
        return hmac.compare_digest(self.token_for(attempt), token)

    @property
    def current(self) -> Attempt | None:
        """The latest attempt, if it is still kept."""
        return self.attempts.get(self.attempt) if self.attempt else None

    @property
    def applied(self) -> bool:
        """Its current run (key round) is known to have applied: one key, one effect."""
        return self.attempts.applied_in(self.key_round)

    @property
    def may_have_applied(self) -> bool:
        """Some attempt may have applied and nothing settled it (docs/contracts.md §3.11)."""
        return self.attempts.in_doubt

    @property
    def maybe_applied(self) -> list[int]:
        """The attempts that may have applied, unsettled (for people and tests)."""
        return self.attempts.doubtful()

    @property
    def held(self) -> bool:
        """Processing with its latest attempt already decided: the last counted failure
        came before the step's time budget was spent; the supervisor makes it final."""
        current = self.current
        return (
            self.process_state is StepState.PROCESSING
            and current is not None
            and not current.in_flight
        )

    def last_deadline(self) -> datetime:
        """After this none of its calls can be running, as far as is known: the latest
        deadline, or a Python handler's reported run, whichever is later."""
        return self.attempts.last_deadline() or self.complete_by

    def end_pause(self, now: datetime, why: str) -> None:
        """The wait for the agent's pause is over: a deferral streak that it interrupted
        goes on as if the pause had not been (the pause spends none of its window)."""
        if not self.paused_for:
            return
        since = self.paused_since or now
        if self.deferred_since is not None and since >= self.deferred_since:
            self.deferred_since = min(self.deferred_since + (now - since), now)
        self.record(now, Happened.PAUSE_OVER, agent=self.paused_for, since=iso(since), why=why)
        self.paused_for, self.paused_since = "", None

    @property
    def failure_reason(self) -> str:
        """Why it failed for good (its verdict's reason, else its last error)."""
        return (self.gave_up.reason if self.gave_up is not None else "") or self.last_error or ""

    def reset_for_retry(self) -> None:
        self.continued = False
        self.failure_count = 0
        self.deferrals = 0
        self.deferred_since = None
        self.singled_out = False
        self.singled_out_at = None
        self.budget_since = None
        self.gave_up = None
        self.locked_by = ""

    # --- storage of the typed state ---------------------------------------------------

    def decision_state(self) -> dict[str, Any]:
        """What decisions read besides the contract's fields, as one JSON object."""
        out: dict[str, Any] = {"attempts": self.attempts.to_json()}
        if self.budget_since is not None:
            out["budgetSince"] = iso_exact(self.budget_since)
        if self.gave_up is not None:
            out["gaveUp"] = self.gave_up.to_json()
        if self.undone_by:
            out["undoneBy"] = self.undone_by
        if self.continued:
            out["continued"] = True
        if self.paused_for:
            out["pausedFor"] = self.paused_for
            if self.paused_since is not None:
                out["pausedSince"] = iso_exact(self.paused_since)
        if self.secret:
            out["secret"] = self.secret
            out["secretSince"] = self.secret_since
        if self.key_round != 1:
            out["keyRound"] = self.key_round
        if self.applied_after_undo is not None:
            out["appliedAfterUndo"] = iso_exact(self.applied_after_undo)
        if self.round_began_at is not None:
            out["roundBegan"] = iso_exact(self.round_began_at)
        if self.waiting_for is not None:
            out["waitingFor"] = self.waiting_for
        if self.decided:
            out["decided"] = self.decided
        if self.singled_out_at is not None:
            out["singledOutAt"] = iso_exact(self.singled_out_at)
        return out

    def load_decision_state(self, value: dict[str, Any]) -> None:
        """The inverse of ``decision_state`` (the store reads it back)."""
        self.attempts = AttemptLog.from_json(value.get("attempts", {}))
        since = value.get("budgetSince")
        self.budget_since = parse_iso(since) if since else None
        gave_up = value.get("gaveUp")
        self.gave_up = GaveUp.from_json(gave_up) if gave_up else None
        self.undone_by = value.get("undoneBy") or None
        self.continued = value.get("continued") is True
        self.paused_for = str(value.get("pausedFor") or "")
        since = value.get("pausedSince")
        self.paused_since = parse_iso(since) if since else None
        self.secret = str(value.get("secret") or "")
        self.secret_since = int(value.get("secretSince", 0))
        self.key_round = int(value.get("keyRound", 1))
        late = value.get("appliedAfterUndo")
        self.applied_after_undo = parse_iso(late) if late else None
        began = value.get("roundBegan")
        self.round_began_at = parse_iso(began) if began else None
        waiting = value.get("waitingFor")
        self.waiting_for = dict(waiting) if isinstance(waiting, dict) else None
        decided = value.get("decided")
        self.decided = dict(decided) if isinstance(decided, dict) else {}
        singled = value.get("singledOutAt")
        self.singled_out_at = parse_iso(singled) if singled else None
