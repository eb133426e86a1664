"""Workflows: named, ordered steps, declared here and nowhere else (docs/contracts.md §3.8).

Adding a workflow is a few lines in ``WORKFLOWS``: a name, its steps in order,
and for each step its agent (the remote service path), its timeout and,
optionally, the step that compensates it. Compensations are steps too: they
get deadlines, retries, supervision and the idempotency key
``<orderId>:<compensation step>``.

An order keeps a copy of its plan (``Plan``) from the moment it is accepted,
so changing a definition never changes an order already in flight.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

from core.settings import MAX_STEP_TIMEOUT_SECONDS

_STEP_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
#: A step name's longest: the Service Bus message id ``<orderId>:<step>:<attempt>`` must
#: fit 128 characters with a 64-character order id and an attempt of up to 6 digits
#: (64 + 1 + 48 + 1 + 6 = 120, leaving room).
MAX_STEP_NAME: Final = 48


@dataclass(frozen=True)
class Compensation:
    step: str
    agent: str | None = None  # remote path; defaults to the step name
    timeout_seconds: int | None = None  # None: STEP_TIMEOUT_SECONDS

    @property
    def path(self) -> str:
        return self.agent or self.step


@dataclass(frozen=True)
class StepSpec:
    name: str
    agent: str | None = None  # remote path; defaults to the step name
    timeout_seconds: int | None = None  # None: STEP_TIMEOUT_SECONDS
    compensation: Compensation | None = None

    @property
    def path(self) -> str:
        return self.agent or self.name


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[StepSpec, ...]

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError(f"workflow {self.name!r} has no steps")
        names = [s.name for s in self.steps] + [
            s.compensation.step for s in self.steps if s.compensation
        ]
        if len(set(names)) != len(names):
            raise ValueError(f"workflow {self.name!r} repeats a step name: {names}")
        for name in names:
            if not _STEP_NAME.fullmatch(name):
                raise ValueError(f"workflow {self.name!r}: step name {name!r} is not kebab-case")
            if len(name) > MAX_STEP_NAME:
                raise ValueError(
                    f"workflow {self.name!r}: step name {name!r} has {len(name)} characters; "
                    f"at most {MAX_STEP_NAME}, so that the Service Bus message id "
                    "<orderId>:<step>:<attempt> always fits its 128 characters"
                )
        timeouts = [(s.name, s.timeout_seconds) for s in self.steps] + [
            (s.compensation.step, s.compensation.timeout_seconds)
            for s in self.steps
            if s.compensation
        ]
        for name, timeout in timeouts:
            if timeout is not None and not 1 <= timeout <= MAX_STEP_TIMEOUT_SECONDS:
                raise ValueError(
                    f"workflow {self.name!r}: step {name!r} has a timeout of {timeout} s; it "
                    f"must be 1-{MAX_STEP_TIMEOUT_SECONDS} s, what the host can honour (an "
                    "agent invocation lasts up to it; see core/settings.py)"
                )


WORKFLOWS: Final[dict[str, Workflow]] = {
    w.name: w
    for w in (
        Workflow("order", (StepSpec("process"),)),
        Workflow(
            "fulfilment",
            (
                StepSpec("reserve-stock", compensation=Compensation("release-stock")),
                StepSpec("charge-payment", compensation=Compensation("refund-payment")),
                StepSpec("ship"),
            ),
        ),
    )
}
DEFAULT_WORKFLOW: Final = "order"


@dataclass(frozen=True)
class PlannedStep:
    """A step as an order will run it: timeouts resolved, compensation named."""

    name: str
    path: str
    timeout_seconds: int
    compensation: str | None = None
    compensation_path: str | None = None
    compensation_timeout_seconds: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "path": self.path,
            "timeout": self.timeout_seconds,
        }
        if self.compensation:
            out["compensation"] = {
                "name": self.compensation,
                "path": self.compensation_path,
                "timeout": self.compensation_timeout_seconds,
            }
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PlannedStep:
        comp = raw.get("compensation") or {}
        return cls(
            name=raw["name"],
            path=raw["path"],
            timeout_seconds=int(raw["timeout"]),
            compensation=comp.get("name"),
            compensation_path=comp.get("path"),
            compensation_timeout_seconds=comp.get("timeout"),
        )


@dataclass(frozen=True)
class Plan:
    workflow: str
    steps: tuple[PlannedStep, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, workflow: Workflow, default_timeout_seconds: int) -> Plan:
        return cls(
            workflow.name,
            tuple(
                PlannedStep(
                    name=s.name,
                    path=s.path,
                    timeout_seconds=s.timeout_seconds or default_timeout_seconds,
                    compensation=s.compensation.step if s.compensation else None,
                    compensation_path=s.compensation.path if s.compensation else None,
                    compensation_timeout_seconds=(
                        (s.compensation.timeout_seconds or default_timeout_seconds)
                        if s.compensation
                        else None
                    ),
                )
                for s in workflow.steps
            ),
        )

    @property
    def compensates(self) -> bool:
        """Whether a failure unwinds (some step declares a compensation)."""
        return any(s.compensation for s in self.steps)

    def index_of(self, step: str) -> int:
        for i, s in enumerate(self.steps):
            if s.name == step:
                return i
        raise KeyError(step)

    def to_json(self) -> dict[str, Any]:
        return {"workflow": self.workflow, "steps": [s.to_json() for s in self.steps]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Plan:
        return cls(raw["workflow"], tuple(PlannedStep.from_json(s) for s in raw["steps"]))
