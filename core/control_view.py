"""What one instance knows of the agents' runtime controls (``core.controls``).

Each instance reads the controls (one small range query: a row per agent that was ever
changed) at most once every ``PERIOD`` seconds, whoever asks — the scheduler before a
claim, an agent before a call, the sweep — never once per order. So a pause or a limit
reaches every instance within ``PERIOD`` seconds, and costs each instance at most one
read per period (17,280 a day at 5 s; none while idle: the read happens when asked).

When the read fails, the last controls read stay in force (logged through ``warn``), and
the next read is tried a period later; an instance that never read them runs every
agent as declared (it does not stop work it cannot know is paused).

A resume must not make a step ping-pong between an instance that has seen it and one
that has not (claimed here, deferred as paused there, claimed again...): a step that
waits for a pause is released early only once the resume is ``SETTLE`` old, when every
instance has read it; until ``RELEASE_WINDOW`` after a resume the scheduler's sweep
looks for such steps (``StateStore.held_pending``), so they go on within seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Final, Protocol

from core.controls import AgentControl, Limits, Pause, declared_limits
from core.workflows import Agent

#: How long an instance uses the controls it read before reading them again.
PERIOD: Final = timedelta(seconds=5)
#: After a resume, how long before every instance has read it (a period, plus clock
#: skew between instances).
SETTLE: Final = PERIOD + timedelta(seconds=2)
#: After a resume, how long the sweep looks for the steps that waited for it.
RELEASE_WINDOW: Final = timedelta(minutes=5)
#: A step that waits for a pause is looked at again after as long as it has waited, at
#: least this, at most ``HOLD_MAX`` (a safety net: a resume releases it at once).
HOLD_MIN: Final = timedelta(seconds=30)
HOLD_MAX: Final = timedelta(minutes=10)


def hold_until(now: datetime, since: datetime | None) -> datetime:
    """When a step waiting for a pause (since ``since``) is looked at again."""
    waited = now - since if since is not None else timedelta(0)
    return now + min(max(waited, HOLD_MIN), HOLD_MAX)


class ControlSource(Protocol):
    def read_controls(self) -> Mapping[str, AgentControl]: ...


@dataclass(frozen=True)
class AgentRuntime:
    """What this instance applies to one agent now."""

    agent: str
    pause: Pause | None
    limits: Limits


_NONE: Mapping[str, AgentControl] = MappingProxyType({})


class ControlView:
    def __init__(
        self,
        source: ControlSource,
        clock: Callable[[], datetime],
        *,
        period: timedelta = PERIOD,
        warn: Callable[[str], None] | None = None,
    ):
        self._source = source
        self._clock = clock
        self._period = period
        self._warn = warn
        self._lock = threading.Lock()
        self._controls: Mapping[str, AgentControl] | None = None
        self._fresh_until: datetime | None = None
        self._reading = False

    def controls(self) -> Mapping[str, AgentControl]:
        """Every agent's controls (an agent without a row has none), read at most once
        a period; while one thread reads, the others use what was read before."""
        now = self._clock()
        with self._lock:
            known = self._controls
            if known is not None and (
                self._reading or (self._fresh_until is not None and now < self._fresh_until)
            ):
                return known
            self._reading = True
        try:
            fresh: Mapping[str, AgentControl] | None = MappingProxyType(
                dict(self._source.read_controls())
            )
        except Exception as exc:  # noqa: BLE001 - keep what is known; try again a period later
            fresh = None
            if self._warn is not None:
                self._warn(
                    f"the agents' runtime controls could not be read ({type(exc).__name__}: "
                    f"{exc}); {'keeping the last ones read' if known else 'running as declared'}"
                )
        with self._lock:
            self._reading = False
            self._fresh_until = now + self._period
            if fresh is not None:
                self._controls = fresh
            elif self._controls is None:
                self._controls = _NONE
            return self._controls

    def forget(self) -> None:
        """Read again at the next question (this process changed them)."""
        with self._lock:
            self._fresh_until = None

    def control(self, agent: str) -> AgentControl:
        return self.controls().get(agent) or AgentControl(agent)

    def pause_of(self, agent: str) -> Pause | None:
        return self.control(agent).pause

    def runtime(self, agent: Agent) -> AgentRuntime:
        control = self.control(agent.name)
        return AgentRuntime(agent.name, control.pause, control.limits(declared_limits(agent)))

    def released(self, agent: str, now: datetime) -> bool:
        """Not paused, and any resume is old enough that every instance has read it: a
        step that waited for the pause may go now."""
        control = self.control(agent)
        if control.pause is not None:
            return False
        return control.resumed_at is None or now >= control.resumed_at + SETTLE

    def resumed_recently(self, now: datetime) -> list[str]:
        """The agents whose resume every instance has read, within ``RELEASE_WINDOW``."""
        return sorted(
            name
            for name, control in self.controls().items()
            if control.pause is None
            and control.resumed_at is not None
            and control.resumed_at + SETTLE <= now <= control.resumed_at + RELEASE_WINDOW
        )
