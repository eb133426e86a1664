"""What one instance knows of the agents' runtime controls (``core.controls``).

Each instance reads the controls (one small range query: a row per agent that was ever
changed) at most once every ``PERIOD`` seconds, whoever asks — the scheduler before a
claim, an agent before a call, the sweep — never once per order. So a pause or a limit
reaches every instance within ``PERIOD`` seconds, and costs each instance at most one
read per period (17,280 a day at 5 s; none while idle: the read happens when asked).

The same read takes the agents' shared outage records (``core.outages``: one small range
query more, the same period), so every instance knows when an outage ended and ramps the
release of the steps it held from the same time (``AgentRuntime.released_at``), and a
process that wrote a record itself uses what it wrote at once (``learn``).

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
from core.outages import Outage
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


class OutageSource(Protocol):
    def read_outages(self) -> Mapping[str, Outage]: ...


@dataclass(frozen=True)
class AgentRuntime:
    """What this instance applies to one agent now."""

    agent: str
    pause: Pause | None
    limits: Limits
    #: when the steps held for it were last released (a resume every instance has read,
    #: or the end of an outage): calls ramp up from then (``core.outages.ramp_rate``)
    released_at: datetime | None = None


_NONE: Mapping[str, AgentControl] = MappingProxyType({})
_NO_OUTAGES: Mapping[str, Outage] = MappingProxyType({})


class ControlView:
    def __init__(
        self,
        source: ControlSource,
        clock: Callable[[], datetime],
        *,
        period: timedelta = PERIOD,
        warn: Callable[[str], None] | None = None,
        outages: OutageSource | None = None,
    ):
        """``outages``: where the agents' shared outage records are read, with the
        controls (None: none known)."""
        self._source = source
        self._outage_source = outages
        self._outages: Mapping[str, Outage] = _NO_OUTAGES
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
            known = self._at_hand(now)
            if known is not None:
                return known
            known = self._controls
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
        outages = self._read_outages()
        with self._lock:
            self._reading = False
            self._fresh_until = now + self._period
            if fresh is not None:
                self._controls = fresh
            elif self._controls is None:
                self._controls = _NONE
            if outages is not None:
                self._outages = outages
            return self._controls

    def _at_hand(self, now: datetime) -> Mapping[str, AgentControl] | None:
        """What ``controls`` returns without reading (under the lock); None: a read is due."""
        known = self._controls
        if known is not None and (
            self._reading or (self._fresh_until is not None and now < self._fresh_until)
        ):
            return known
        return None

    def _read_outages(self) -> Mapping[str, Outage] | None:
        if self._outage_source is None:
            return None
        try:
            return MappingProxyType(dict(self._outage_source.read_outages()))
        except Exception as exc:  # noqa: BLE001 - keep what is known; try again a period later
            if self._warn is not None:
                self._warn(
                    f"the agents' outage records could not be read ({type(exc).__name__}: "
                    f"{exc}); keeping the last ones read"
                )
            return None

    def outage(self, agent: str) -> Outage | None:
        """The agent's shared outage record as last read or written here (None: none).
        Never reads: the agents ask it on their event loop (the controls' read, before
        each attempt, keeps it fresh)."""
        with self._lock:
            return self._outages.get(agent)

    def learn(self, outage: Outage) -> None:
        """This process wrote (or read) ``outage`` just now: use it until the next read."""
        with self._lock:
            self._outages = MappingProxyType({**self._outages, outage.agent: outage})

    def forget(self) -> None:
        """Read again at the next question (this process changed them)."""
        with self._lock:
            self._fresh_until = None

    def control(self, agent: str) -> AgentControl:
        return self.controls().get(agent) or AgentControl(agent)

    def pause_of(self, agent: str) -> Pause | None:
        return self.control(agent).pause

    def runtime(self, agent: Agent) -> AgentRuntime:
        """What is in force for ``agent`` (its controls read first when they are due)."""
        return self._runtime(agent, self.controls())

    def runtime_at_hand(self, agent: Agent) -> AgentRuntime | None:
        """``runtime(agent)`` when no read is due, with no request (the agents ask it on
        their event loop); None: call ``runtime``, which reads."""
        with self._lock:
            known = self._at_hand(self._clock())
        return None if known is None else self._runtime(agent, known)

    def _runtime(self, agent: Agent, controls: Mapping[str, AgentControl]) -> AgentRuntime:
        control = controls.get(agent.name) or AgentControl(agent.name)
        return AgentRuntime(
            agent.name,
            control.pause,
            control.limits(declared_limits(agent)),
            self._released_at(control),
        )

    def released_at(self, agent: str) -> datetime | None:
        """When the steps held for ``agent`` were last released: the resume once every
        instance has read it (``SETTLE``: when held steps start to go), or the end of its
        last outage, whichever is later. None while it is paused, or never held."""
        return self._released_at(self.control(agent))

    def _released_at(self, control: AgentControl) -> datetime | None:
        agent = control.agent
        if control.pause is not None:
            return None
        outage = self.outage(agent)
        times = [
            t
            for t in (
                control.resumed_at + SETTLE if control.resumed_at is not None else None,
                outage.ended_at if outage is not None and not outage.failing else None,
            )
            if t is not None
        ]
        return max(times, default=None)

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
