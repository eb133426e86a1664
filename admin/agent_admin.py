"""Operator use cases for agents at runtime (docs/contracts.md §3.7): list the declared
agents with their state, pause and resume one, change its limits, read the audit.

Used by the operator API (``admin/triggers.py``), the CLI (``python -m admin agents``)
and the console, so the three cannot disagree. A change is decided by the pure rules of
``core.controls`` on what was read and stored with If-Match on it, with its audit entry
in the same transaction; when another operator changed the agent in between, it is
read again and decided again. Every instance applies it within
``core.control_cache.PERIOD`` seconds, with no redeploy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core import controls
from core.controls import AgentControl, AuditEntry, Declared, Limits, declared_limits
from core.errors import AgentNotFound, ConcurrencyConflict
from core.ports import AgentControlStore, Clock
from core.unit_of_work import CONFLICT_ATTEMPTS
from core.workflows import Agent
from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)

MAX_AUDIT_PAGE = 100
DEFAULT_AUDIT_PAGE = 50
MAX_BY_CHARS = controls.MAX_BY_CHARS

Decision = Callable[[AgentControl, Limits, datetime], tuple[AgentControl, AuditEntry]]


class AgentAdmin:
    def __init__(
        self,
        store: AgentControlStore,
        clock: Clock,
        agents: Mapping[str, Agent],
        *,
        changed: Callable[[], None] | None = None,
    ):
        """``agents``: the declared agents; ``changed`` is called after each change (this
        process's own view of the controls reads them again)."""
        self._store = store
        self._clock = clock
        self._agents = agents
        self._changed = changed

    def spec(self, agent: str) -> Agent:
        found = self._agents.get(agent)
        if found is None:
            known = ", ".join(sorted(self._agents)) or "none"
            raise AgentNotFound(f"no agent {agent[:64]!r} is declared (the agents: {known})")
        return found

    def list(self) -> list[dict[str, Any]]:
        """Every declared agent: paused or not (by whom, since, why), its limits in force,
        what it declares, what was overridden."""
        stored = self._store.read_controls()
        return [
            _view(stored.get(name) or AgentControl(name), self._agents[name])
            for name in sorted(self._agents)
        ]

    def show(self, agent: str) -> dict[str, Any]:
        spec = self.spec(agent)
        control = self._store.read_controls().get(agent) or AgentControl(agent)
        return _view(control, spec)

    def pause(self, agent: str, by: str, reason: str) -> dict[str, Any]:
        return self.change(agent, Change("pause", reason), by)

    def resume(self, agent: str, by: str, reason: str = "") -> dict[str, Any]:
        return self.change(agent, Change("resume", reason), by)

    def limits(
        self,
        agent: str,
        by: str,
        reason: str = "",
        *,
        concurrency: int | Declared | None = None,
        rate: float | Declared | None = None,
    ) -> dict[str, Any]:
        """Override the limits (``controls.DECLARED``: back to the declaration)."""
        return self.change(agent, Change("limits", reason, concurrency, rate), by)

    def change(self, agent: str, change: Change, by: str) -> dict[str, Any]:
        """Make a change (``parse_change`` checked it); the agent's view after it."""
        return self._change(agent, _decision(change, by[:MAX_BY_CHARS]))

    def audit(
        self,
        page_size: int = DEFAULT_AUDIT_PAGE,
        token: str | None = None,
        agent: str | None = None,
    ) -> dict[str, Any]:
        """The changes, newest first, a page at a time (of one agent, or of all)."""
        if agent is not None:
            self.spec(agent)
        size = max(1, min(page_size, MAX_AUDIT_PAGE))
        entries, next_token = self._store.audit_page(size, token, agent)
        return {"entries": [e.to_json() for e in entries], "continuationToken": next_token}

    def preview(self, agent: str, change: Change, by: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """What ``change`` would do now, nothing written: the agent's state before and
        after (``TransitionRefused`` if it would be refused)."""
        spec = self.spec(agent)
        current = self._store.read_controls().get(agent) or AgentControl(agent)
        _, entry = _decision(change, by)(current, declared_limits(spec), self._clock())
        return entry.before, entry.after

    def _change(self, agent: str, decide: Decision) -> dict[str, Any]:
        spec = self.spec(agent)
        declared = declared_limits(spec)
        for _ in range(CONFLICT_ATTEMPTS):
            current = self._store.read_controls().get(agent) or AgentControl(agent)
            control, entry = decide(current, declared, self._clock())  # TransitionRefused
            try:
                stored = self._store.write_control(control, entry)
            except ConcurrencyConflict:
                continue  # another operator changed it first: decide again on theirs
            METRICS.inc("agent_changes", action=str(entry.action))
            log.warning(
                "agent %s: %s by %s (%s): %s -> %s",
                agent,
                entry.action,
                entry.by,
                entry.reason or "no reason given",
                entry.before,
                entry.after,
            )
            if self._changed is not None:
                self._changed()
            return _view(stored, spec)
        raise ConcurrencyConflict(f"agent {agent} kept changing; try again")


#: The fields each change takes (anything else is a mistake: a 400 that says so).
CHANGE_FIELDS: Mapping[str, frozenset[str]] = {
    "pause": frozenset({"reason"}),
    "resume": frozenset({"reason"}),
    "limits": frozenset({"reason", "concurrency", "rate"}),
}


def _view(control: AgentControl, spec: Agent) -> dict[str, Any]:
    """An agent's state at runtime, with its health probe's path if it declares one."""
    view = control.view(declared_limits(spec))
    if spec.health is not None:
        view["health"] = spec.health
    return view


@dataclass(frozen=True)
class Change:
    """A change as an operator asked for it (API body, CLI, console form), checked."""

    action: str
    reason: str = ""
    concurrency: int | Declared | None = None
    rate: float | Declared | None = None


def parse_change(action: str, fields: Mapping[str, object]) -> Change:
    """``ValueError`` with a sentence for anything a person must send otherwise: unknown
    fields, a pause without a reason, limits out of range, nothing to change."""
    allowed = CHANGE_FIELDS.get(action)
    if allowed is None:
        raise ValueError(f"the change must be one of {', '.join(CHANGE_FIELDS)}")
    unknown = sorted(str(k) for k in fields if k not in allowed)
    if unknown:
        raise ValueError(
            f"{action} takes {', '.join(sorted(allowed))}; not {', '.join(unknown)[:200]}"
        )
    reason = controls.parse_reason(fields.get("reason"), required=action == "pause")
    if action != "limits":
        return Change(action, reason)
    concurrency = fields.get("concurrency")
    rate = fields.get("rate")
    if concurrency in (None, "") and rate in (None, ""):
        raise ValueError(
            'limits needs "concurrency", "rate" or both (a value, or "declared" to go back '
            "to the agent's declaration)"
        )
    return Change(
        action,
        reason,
        concurrency=controls.parse_concurrency(concurrency)
        if concurrency not in (None, "")
        else None,
        rate=controls.parse_rate(rate) if rate not in (None, "") else None,
    )


def _decision(change: Change, by: str) -> Decision:
    if change.action == "pause":
        return lambda c, d, now: controls.pause(c, d, by, change.reason, now)
    if change.action == "resume":
        return lambda c, d, now: controls.resume(c, d, by, change.reason, now)
    return lambda c, d, now: controls.set_limits(
        c, d, by, change.reason, now, concurrency=change.concurrency, rate=change.rate
    )


def apply_change(admin: AgentAdmin, agent: str, change: Change, by: str) -> dict[str, Any]:
    """Run a checked change (the agent's view after it)."""
    return admin.change(agent, change, by)
