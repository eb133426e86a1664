"""Agents at runtime (docs/contracts.md §3.7): what an operator sets for a declared agent
while the app runs, and the audit entry each change leaves.

An agent is *paused* (its remote is not called: its steps wait, ``Pending``, uncounted,
without an alert, and go on after the resume) or not, and its *limits* — at most
``concurrency`` calls at once and ``rate`` calls a second, per instance — are those of
its declaration (``core.workflows.Agent``) unless an operator overrode them; an explicit
change back to ``declared`` ends an override. Every change is an ``AuditEntry``: when,
which agent, what, who, why, and the agent's state before and after.

Pure: ``now`` is an argument and nothing is stored here. ``stores/control_rows.py`` keeps
one row per agent (written with If-Match) and the audit beside it, in one transaction;
``core.control_cache`` is what each instance reads of them, at most every few seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, Literal

from core.errors import TransitionRefused
from core.timefmt import iso
from core.workflows import MAX_CONCURRENCY, MAX_RATE, MIN_CONCURRENCY, MIN_RATE, Agent

__all__ = [
    "DECLARED",
    "MAX_CONCURRENCY",
    "MAX_RATE",
    "MIN_CONCURRENCY",
    "MIN_RATE",
    "Action",
    "AgentControl",
    "AuditEntry",
    "Limits",
    "Pause",
    "declared_limits",
    "parse_concurrency",
    "parse_rate",
    "parse_reason",
    "pause",
    "resume",
    "set_limits",
]

#: A limit set back to what the agent's declaration says (the override ends).
DECLARED: Final = "declared"
Declared = Literal["declared"]
MAX_REASON_CHARS: Final = 500
MAX_BY_CHARS: Final = 200


class Action(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    LIMITS = "limits"


@dataclass(frozen=True)
class Limits:
    """What an instance applies to one agent: at most ``concurrency`` calls at once and
    ``rate`` calls a second (None: no rate limit)."""

    concurrency: int
    rate: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "rate": self.rate}


def declared_limits(agent: Agent) -> Limits:
    return Limits(agent.concurrency, agent.rate)


@dataclass(frozen=True)
class Pause:
    since: datetime
    by: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"since": iso(self.since), "by": self.by, "reason": self.reason}


@dataclass(frozen=True)
class AgentControl:
    """One agent's runtime state as stored. An agent nobody ever changed has none: it
    is ``AgentControl(name)``, running with its declared limits."""

    agent: str
    pause: Pause | None = None
    #: overrides of the declaration (None: the declared value)
    concurrency: int | None = None
    rate: float | None = None
    #: the last resume (instances release the steps that waited for it, see
    #: ``core.control_cache``)
    resumed_at: datetime | None = None
    changed_at: datetime | None = None
    changed_by: str = ""
    version: int = 0
    #: the stored row's ETag (None: no row yet); every write is conditional on it
    etag: str | None = None

    @property
    def paused(self) -> bool:
        return self.pause is not None

    def limits(self, declared: Limits) -> Limits:
        return Limits(
            declared.concurrency if self.concurrency is None else self.concurrency,
            declared.rate if self.rate is None else self.rate,
        )

    def state(self, declared: Limits) -> dict[str, Any]:
        """What an audit entry records before and after a change."""
        return {"paused": self.paused, **self.limits(declared).to_json()}

    def overrides(self) -> dict[str, Any]:
        """The limits set at runtime (only those)."""
        out: dict[str, Any] = {}
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        if self.rate is not None:
            out["rate"] = self.rate
        return out

    def view(self, declared: Limits) -> dict[str, Any]:
        """The agent as the operator API lists it (``GET /api/agents``)."""
        return {
            "name": self.agent,
            "paused": self.paused,
            "pause": self.pause.to_json() if self.pause else None,
            "limits": self.limits(declared).to_json(),
            "declared": declared.to_json(),
            "overrides": self.overrides(),
            "changedAt": iso(self.changed_at) if self.changed_at else None,
            "changedBy": self.changed_by or None,
        }


@dataclass(frozen=True)
class AuditEntry:
    at: datetime
    agent: str
    action: Action
    by: str
    reason: str
    before: dict[str, Any]
    after: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "at": iso(self.at),
            "agent": self.agent,
            "action": str(self.action),
            "by": self.by,
            "reason": self.reason,
            "before": self.before,
            "after": self.after,
        }


# --- the changes -------------------------------------------------------------------------


def _changed(
    control: AgentControl,
    after: AgentControl,
    declared: Limits,
    action: Action,
    by: str,
    reason: str,
    now: datetime,
) -> tuple[AgentControl, AuditEntry]:
    stored = replace(after, changed_at=now, changed_by=by, version=control.version + 1)
    entry = AuditEntry(
        now, control.agent, action, by, reason, control.state(declared), stored.state(declared)
    )
    return stored, entry


def pause(
    control: AgentControl, declared: Limits, by: str, reason: str, now: datetime
) -> tuple[AgentControl, AuditEntry]:
    """Stop calling the agent's remote: its steps wait until ``resume``."""
    if not reason.strip():
        raise TransitionRefused("no-reason", "a pause needs a reason (it goes into the audit)")
    if control.pause is not None:
        raise TransitionRefused(
            "already-paused",
            f"agent {control.agent} is already paused (since {iso(control.pause.since)} by "
            f"{control.pause.by}: {control.pause.reason})",
        )
    after = replace(control, pause=Pause(now, by, reason))
    return _changed(control, after, declared, Action.PAUSE, by, reason, now)


def resume(
    control: AgentControl, declared: Limits, by: str, reason: str, now: datetime
) -> tuple[AgentControl, AuditEntry]:
    """Call the agent's remote again; the steps that waited go on."""
    if control.pause is None:
        raise TransitionRefused("not-paused", f"agent {control.agent} is not paused")
    after = replace(control, pause=None, resumed_at=now)
    return _changed(control, after, declared, Action.RESUME, by, reason, now)


def set_limits(
    control: AgentControl,
    declared: Limits,
    by: str,
    reason: str,
    now: datetime,
    *,
    concurrency: int | Declared | None = None,
    rate: float | Declared | None = None,
) -> tuple[AgentControl, AuditEntry]:
    """Override the agent's limits (``DECLARED``: back to its declaration; None: leave
    it as it is). The values are checked here too (``parse_concurrency``, ``parse_rate``)."""
    if concurrency is None and rate is None:
        raise TransitionRefused("no-change", "give a concurrency, a rate, or both")
    after = control
    if concurrency is not None:
        value = parse_concurrency(concurrency)
        after = replace(after, concurrency=None if value == DECLARED else int(value))
    if rate is not None:
        value_rate = parse_rate(rate)
        after = replace(after, rate=None if value_rate == DECLARED else float(value_rate))
    if (after.concurrency, after.rate) == (control.concurrency, control.rate):
        raise TransitionRefused(
            "no-change", f"agent {control.agent}'s limits are already that: nothing to change"
        )
    return _changed(control, after, declared, Action.LIMITS, by, reason, now)


# --- the operator's input (API, CLI, console) ---------------------------------------------


def parse_concurrency(raw: object) -> int | Declared:
    """A concurrency as JSON (a whole number), a form or a command line gives it, or
    ``declared``; ``ValueError`` with a sentence a person can act on."""
    rule = (
        f"concurrency must be a whole number from {MIN_CONCURRENCY} to {MAX_CONCURRENCY} "
        f"(calls at once, per instance), or {DECLARED!r}"
    )
    if isinstance(raw, str):
        text = raw.strip()
        if text.lower() == DECLARED:
            return DECLARED
        if not text.isascii() or not text.isdigit() or len(text) > 6:
            raise ValueError(f"{rule}; got {raw[:40]!r}")
        raw = int(text)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"{rule}; got {_shown(raw)}")
    if not MIN_CONCURRENCY <= raw <= MAX_CONCURRENCY:
        raise ValueError(f"{rule}; got {raw}")
    return raw


def parse_rate(raw: object) -> float | Declared:
    """A call rate (calls a second, per instance) from JSON, a form or a command line, or
    ``declared``; ``ValueError`` with a sentence."""
    rule = (
        f"rate must be a number of calls a second (per instance) from {MIN_RATE:g} to "
        f"{MAX_RATE:g}, or {DECLARED!r}"
    )
    if isinstance(raw, str):
        text = raw.strip()
        if text.lower() == DECLARED:
            return DECLARED
        try:
            number = float(text) if len(text) <= 20 else math.nan
        except ValueError:
            raise ValueError(f"{rule}; got {raw[:40]!r}") from None
        raw = number
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"{rule}; got {_shown(raw)}")
    value = float(raw)
    if not math.isfinite(value) or not MIN_RATE <= value <= MAX_RATE:
        raise ValueError(f"{rule}; got {raw!r}")
    return value


def parse_reason(raw: object, *, required: bool) -> str:
    """Why, for the audit: text of at most ``MAX_REASON_CHARS`` characters."""
    if raw is None:
        raw = ""
    if not isinstance(raw, str):
        raise ValueError(f"reason must be text, got {_shown(raw)}")
    text = " ".join(raw.split())
    if required and not text:
        raise ValueError("give a reason: it goes into the audit with your name")
    if len(text) > MAX_REASON_CHARS:
        raise ValueError(f"reason is {len(text)} characters; at most {MAX_REASON_CHARS}")
    return text


def _shown(value: object) -> str:
    return f"{type(value).__name__} {str(value)[:40]!r}"
