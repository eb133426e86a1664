"""An order's plan: its workflow as the order runs it, kept with the order from submission
(docs/contracts.md §3.13, "pinned plans").

What the plan pins: every step's kind (``task``, ``event``, ``delay``), its group (the
steps of one ``Parallel`` share one; the others have one each, in order), its agent,
remote path and timeout, its compensation, what its failure means (``on_failure``), the
event a ``completes_on`` step waits for, a delay's seconds, and which functions
(``input``, ``when``, ``until``) the step calls; and the fields the order is searched
by (``search``, docs/contracts.md §3.14: its own, and ``"<step>.<field>"`` of a step's
result, §3.17).
The functions themselves are not pinned (code cannot be stored): they are taken from
today's declarations by workflow and step name when the step starts
(``core.workflows.function_of``). Changing a definition never changes an order already
in flight, but for those functions: ``python -m admin deploy-check`` refuses a
deployment that drops one that an order in flight still needs.

A plan stored before groups and kinds existed reads as a line of tasks, one per group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.flow import (
    ON_FAILURE,
    Delay,
    Event,
    ForEach,
    OnFailure,
    StepKindName,
    StepSpec,
    Workflow,
)
from core.item_names import template_of
from core.turns import TurnRule


@dataclass(frozen=True)
class PlannedStep:
    """A step as an order will run it: timeouts resolved, compensation named."""

    name: str
    path: str
    timeout_seconds: int
    compensation: str | None = None
    compensation_path: str | None = None
    compensation_timeout_seconds: int | None = None
    #: the agent that runs it (plans stored before agents existed get it when read; "" for
    #: an event or a delay, which no agent runs)
    agent: str = ""
    compensation_agent: str | None = None
    kind: StepKindName = "task"
    #: the element of the workflow it belongs to: steps of one ``Parallel`` share it
    group: int = 0
    #: for a task: the event that completes it (its 2xx is only the remote's acceptance)
    completes_on: str | None = None
    #: for a delay: how long it lasts from its start (None: ``until`` decides)
    delay_seconds: int | None = None
    #: the functions it calls when it starts, and those of its compensation
    uses: tuple[str, ...] = ()
    compensation_uses: tuple[str, ...] = ()
    #: its effect may stand when the order is undone (``StepSpec.may_stand``)
    may_stand: bool = False
    #: for an event: who delivers it, a "person" or a "machine" (``Event.by``)
    event_by: str = "person"
    #: what its failure for good means (``StepSpec.on_failure``, §3.17)
    on_failure: OnFailure = "unwind"
    #: for a ``ForEach``'s head (kind ``items``): how many of its items run at once
    #: (§3.16); its items' step is the planned step named ``<name>[]``
    max_concurrency: int | None = None

    @property
    def by_machine(self) -> bool:
        """Its event comes from a remote, only on its capability URL: a callback
        (``completes_on``) or an ``Event(..., by="machine")``."""
        return self.kind == "task" or self.event_by == "machine"

    @property
    def waits(self) -> bool:
        """An event, a delay or a ForEach's head: no agent, no remote, no attempt."""
        return self.kind != "task"

    @property
    def template(self) -> str | None:
        """For a ForEach's head: the name of the step each of its items runs."""
        return f"{self.name}[]" if self.kind == "items" else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "path": self.path,
            "timeout": self.timeout_seconds,
        }
        if self.agent:
            out["agent"] = self.agent
        if self.kind != "task":
            out["kind"] = self.kind
        out["group"] = self.group
        if self.completes_on:
            out["completesOn"] = self.completes_on
        if self.delay_seconds is not None:
            out["seconds"] = self.delay_seconds
        if self.uses:
            out["uses"] = list(self.uses)
        if self.may_stand:
            out["mayStand"] = True
        if self.on_failure != "unwind":
            out["onFailure"] = self.on_failure
        if self.kind == "event" and self.event_by != "person":
            out["by"] = self.event_by
        if self.max_concurrency is not None:
            out["maxConcurrency"] = self.max_concurrency
        if self.compensation:
            out["compensation"] = {
                "name": self.compensation,
                "path": self.compensation_path,
                "timeout": self.compensation_timeout_seconds,
            }
            if self.compensation_agent:
                out["compensation"]["agent"] = self.compensation_agent
            if self.compensation_uses:
                out["compensation"]["uses"] = list(self.compensation_uses)
        return out

    @classmethod
    def from_json(
        cls, raw: dict[str, Any], workflow: str, index: int, agent_of: Callable[[str, str], str]
    ) -> PlannedStep:
        """``index``: its position (the group of a plan from before groups); ``agent_of``:
        the agent of a task stored before agents existed (``core.workflows.legacy_agent``)."""
        comp = raw.get("compensation") or {}
        kind = raw.get("kind", "task")
        if kind not in ("task", "event", "delay", "items"):
            raise ValueError(f"step {raw.get('name')!r} has an unknown kind {kind!r}")
        agent = raw.get("agent") or (agent_of(workflow, raw["name"]) if kind == "task" else "")
        seconds = raw.get("seconds")
        return cls(
            name=raw["name"],
            path=raw["path"],
            timeout_seconds=int(raw["timeout"]),
            compensation=comp.get("name"),
            compensation_path=comp.get("path"),
            compensation_timeout_seconds=comp.get("timeout"),
            agent=agent,
            compensation_agent=comp.get("agent") or (agent if comp.get("name") else None),
            kind=kind,
            group=int(raw.get("group", index)),
            completes_on=raw.get("completesOn") or None,
            delay_seconds=int(seconds) if seconds is not None else None,
            uses=tuple(str(u) for u in raw.get("uses", ())),
            compensation_uses=tuple(str(u) for u in comp.get("uses", ())),
            may_stand=bool(raw.get("mayStand", False)),
            event_by="machine" if raw.get("by") == "machine" else "person",
            on_failure=_on_failure(raw.get("onFailure", "unwind")),
            max_concurrency=(
                int(raw["maxConcurrency"]) if raw.get("maxConcurrency") is not None else None
            ),
        )


def _on_failure(value: object) -> OnFailure:
    if value == "hold":
        return "hold"
    if value == "continue":
        return "continue"
    if value != "unwind":
        raise ValueError(f"onFailure {value!r} is none of {', '.join(ON_FAILURE)}")
    return "unwind"


@dataclass(frozen=True)
class Plan:
    workflow: str
    steps: tuple[PlannedStep, ...] = field(default_factory=tuple)
    #: what the order is found by (docs/contracts.md §3.14, §3.17: its data's fields, and
    #: ``"<step>.<field>"`` of its steps' results): pinned, so the search rows an order has
    #: are the ones its plan implies, whatever a redeploy declares (a plan stored before
    #: search has none)
    search: tuple[str, ...] = ()
    #: its workflow's per-key concurrency (docs/contracts.md §3.16): the limit and
    #: ``hold_on_error`` the order's slot keeps to (None: no limit)
    concurrency: TurnRule | None = None

    @classmethod
    def of(cls, workflow: Workflow, default_timeout_seconds: int) -> Plan:
        planned: list[PlannedStep] = []
        for leaf, group in workflow.leaves():
            if isinstance(leaf, ForEach):
                planned.append(
                    PlannedStep(
                        name=leaf.name,
                        path=leaf.name,
                        timeout_seconds=0,
                        kind="items",
                        group=group,
                        uses=leaf.functions(),
                        on_failure=leaf.step.on_failure,
                        max_concurrency=leaf.max_concurrency,
                    )
                )
            elif isinstance(leaf, StepSpec):
                c = leaf.compensation
                planned.append(
                    PlannedStep(
                        name=leaf.name,
                        path=leaf.remote_path,
                        timeout_seconds=leaf.timeout_seconds or default_timeout_seconds,
                        compensation=c.step if c else None,
                        compensation_path=c.remote_path if c else None,
                        compensation_timeout_seconds=(
                            (c.timeout_seconds or default_timeout_seconds) if c else None
                        ),
                        agent=leaf.agent,
                        compensation_agent=(c.agent or leaf.agent) if c else None,
                        group=group,
                        completes_on=leaf.completes_on,
                        uses=leaf.functions(),
                        compensation_uses=("input",) if c and c.input is not None else (),
                        may_stand=leaf.may_stand,
                        on_failure=leaf.on_failure,
                    )
                )
            elif isinstance(leaf, Event):
                assert leaf.timeout_seconds is not None  # checked when declared
                planned.append(
                    PlannedStep(
                        name=leaf.name,
                        path=leaf.name,
                        timeout_seconds=leaf.timeout_seconds,
                        kind="event",
                        group=group,
                        uses=leaf.functions(),
                        event_by=leaf.by,
                    )
                )
            else:
                assert isinstance(leaf, Delay)
                planned.append(
                    PlannedStep(
                        name=leaf.name,
                        path=leaf.name,
                        timeout_seconds=leaf.seconds or 0,
                        kind="delay",
                        group=group,
                        delay_seconds=leaf.seconds,
                        uses=leaf.functions(),
                    )
                )
        turns = TurnRule.of(workflow.concurrency) if workflow.concurrency else None
        return cls(workflow.name, tuple(planned), tuple(workflow.search), concurrency=turns)

    @property
    def compensates(self) -> bool:
        """Whether a failure unwinds (some step declares a compensation)."""
        return any(s.compensation for s in self.steps)

    def index_of(self, step: str) -> int:
        """The position of ``step`` (an item's record ``<name>[<i>]``: of ``<name>[]``)."""
        name = template_of(step)
        for i, s in enumerate(self.steps):
            if s.name == name:
                return i
        raise KeyError(step)

    def planned(self, step: str) -> PlannedStep:
        return self.steps[self.index_of(step)]

    def group(self, index: int) -> tuple[PlannedStep, ...]:
        """The steps of group ``index``, in declaration order."""
        return tuple(s for s in self.steps if s.group == index)

    def groups(self) -> list[int]:
        """The group indexes, in order."""
        return sorted({s.group for s in self.steps})

    def next_group(self, index: int) -> int | None:
        later = [g for g in self.groups() if g > index]
        return later[0] if later else None

    def agent_of(self, step: str) -> str:
        """The agent that runs ``step`` (an action or a compensation; "" for a wait)."""
        step = template_of(step)
        for s in self.steps:
            if s.name == step:
                return s.agent
            if s.compensation == step:
                return s.compensation_agent or s.agent
        raise KeyError(step)

    def event_names(self) -> tuple[str, ...]:
        """The events an order of this plan accepts: its ``Event`` steps' names and its
        tasks' ``completes_on``."""
        out = [s.name for s in self.steps if s.kind == "event"]
        out += [s.completes_on for s in self.steps if s.completes_on]
        return tuple(out)

    def step_for_event(self, name: str) -> PlannedStep | None:
        """The step that takes the event ``name``: an ``Event`` step, or a task that
        ``completes_on`` it."""
        for s in self.steps:
            if (s.kind == "event" and s.name == name) or s.completes_on == name:
                return s
        return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workflow": self.workflow,
            "steps": [s.to_json() for s in self.steps],
        }
        if self.search:
            out["search"] = list(self.search)
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency.to_json()
        return out

    @classmethod
    def from_json(
        cls, raw: dict[str, Any], agent_of: Callable[[str, str], str] | None = None
    ) -> Plan:
        """``agent_of``: the agent of a task stored before agents existed (default: what
        today's declarations say, ``core.workflows.legacy_agent``)."""
        if agent_of is None:
            from core.workflows import legacy_agent  # the registry imports this module

            agent_of = legacy_agent
        workflow = raw["workflow"]
        return cls(
            workflow,
            tuple(
                PlannedStep.from_json(s, workflow, n, agent_of) for n, s in enumerate(raw["steps"])
            ),
            tuple(str(f) for f in raw.get("search", ())),
            concurrency=TurnRule.from_json(raw.get("concurrency")),
        )
