"""What a test may say about a workflow: its steps, events and compensations by name, and
the checks that refuse a remote or a decision it does not have, or of the wrong kind,
with what to write instead."""

from __future__ import annotations

from collections.abc import Mapping

from core import workflows
from core.item_names import template_of
from core.plans import PlannedStep
from testkit.remotes import CallsBack, Decision, Remote, RemoteSpec


class KitError(Exception):
    """A mistake in how a test uses the kit (or a declaration the kit cannot run): the
    message says what to change."""


def workflow_of(name: str, declarations: str) -> workflows.Workflow:
    """The declared workflow ``name``; a ``KitError`` naming those declared if none."""
    try:
        return workflows.WORKFLOWS[name]
    except KeyError:
        raise KitError(
            f"{declarations} declares no workflow {name!r} (it declares: "
            f"{', '.join(sorted(workflows.WORKFLOWS))})"
        ) from None


def steps_of(workflow: workflows.Workflow) -> dict[str, PlannedStep]:
    """Every step, event, delay and compensation of the workflow, by name (a
    compensation maps to the step it undoes)."""
    plan = workflows.Plan.of(workflow, 30)
    out: dict[str, PlannedStep] = {}
    for planned in plan.steps:
        if planned.kind == "items":
            continue  # a ForEach is given by its step's name: what each item calls
        out[planned.name.removesuffix("[]")] = planned
        if planned.compensation:
            out[planned.compensation.removesuffix("[]")] = planned
    return out


def given(name: str) -> str:
    """The name ``remotes=`` gives a step's remote by: an item's (``<name>[<i>]``) is its
    ForEach's ``<name>``, unless the test gives that one item its own."""
    return template_of(name).removesuffix("[]")


def check_use(
    workflow: str,
    steps: Mapping[str, PlannedStep],
    remotes: Mapping[str, RemoteSpec],
    events: Mapping[str, Decision],
) -> None:
    """Refuse a remote or event the workflow does not have, or one of the wrong kind."""
    names = ", ".join(sorted(steps)) or "none"
    for name, spec in remotes.items():
        planned = steps.get(name) or steps.get(given(name))
        if planned is None:
            raise KitError(
                f"remotes={{{name!r}: ...}}: workflow {workflow!r} has no step or "
                f"compensation {name!r} (it has: {names})"
            )
        kind = "compensation" if planned.name.removesuffix("[]") != given(name) else planned.kind
        if kind == "event":
            raise KitError(
                f"remotes={{{name!r}: ...}}: {name!r} is an Event, decided by a person "
                f"(or a remote's callback), not a remote's step: give it in "
                f"events={{{name!r}: approve(...)}} (or decline, no_decision, undecided)"
            )
        if kind == "delay":
            raise KitError(
                f"remotes={{{name!r}: ...}}: {name!r} is a Delay: it calls nothing, and "
                "the kit's clock moves past it; give it nothing"
            )
        behaviours = spec if isinstance(spec, list | tuple) else [spec]
        for behaviour in behaviours:
            if isinstance(behaviour, Decision):
                raise KitError(
                    f"remotes={{{name!r}: ...}}: a decision is for an Event: give "
                    f"{name!r} a remote's answer (answer, refuse, unavailable, crash, "
                    "no_answer, calls_back, runs)"
                )
            if not isinstance(behaviour, Remote):
                raise KitError(
                    f"remotes={{{name!r}: {behaviour!r}}}: not a remote's behaviour "
                    "(answer, refuse, unavailable, crash, no_answer, calls_back, runs)"
                )
            if isinstance(behaviour, CallsBack) and (
                kind == "compensation" or not planned.completes_on
            ):
                raise KitError(
                    f"remotes={{{name!r}: calls_back(...)}}: {name!r} declares no "
                    "completes_on, so a callback completes nothing: use answer(...), or "
                    f'declare StepSpec({name!r}, ..., completes_on="<event>")'
                )
    declared = {p.name for p in steps.values() if p.kind == "event"}
    for name, decision in events.items():
        if not isinstance(decision, Decision):
            raise KitError(
                f"events={{{name!r}: {decision!r}}}: an event takes approve(...), "
                "decline(...), no_decision() or undecided()"
            )
        if name not in declared:
            what = "a remote's step: give it in remotes=" if name in steps else "no event"
            raise KitError(
                f"events={{{name!r}: ...}}: {name!r} is {what} of workflow {workflow!r} "
                f"(its events: {', '.join(sorted(declared)) or 'none'})"
            )
