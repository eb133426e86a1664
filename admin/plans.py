"""A stored plan as the deploy guard shows it: a fingerprint (plans that are the same have
the same one), a line per step, and how a workflow's declaration differs from it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from core.turns import TurnRule
from core.workflows import Plan, PlannedStep, StepSpec, Workflow


def fingerprint(plan: Plan) -> str:
    """The same for the same plan, whatever key each order took its turn by (§3.16)."""
    rule = plan.concurrency
    if rule is not None and rule.order_key:
        plan = replace(plan, concurrency=replace(rule, order_key=""))
    text = json.dumps(plan.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def describe_step(step: PlannedStep) -> str:
    text = f"{step.name}@{step.agent}" + ("" if step.path == step.name else f" /{step.path}")
    if step.compensation:
        text += f", undone by {step.compensation}@{step.compensation_agent or step.agent}"
    if step.on_failure != "unwind":
        text += f", on failure: {step.on_failure}"
    return text


def differences(plan: Plan, declared: Workflow | None) -> list[str]:
    """How the declaration of ``plan``'s workflow differs from the plan (timeouts only
    where the declaration names one: else the plan holds the setting's value then)."""
    if declared is None:
        return [f"workflow {plan.workflow} is not declared"]
    leaves = list(declared.leaves())
    specs = {s.name: (s, group) for s, group in leaves}
    out: list[str] = []
    for step in plan.steps:
        found = specs.get(step.name)
        if found is None:
            out.append(f"step {step.name} ({step.agent or step.kind}) is no longer declared")
            continue
        leaf, group = found
        if leaf.kind != step.kind:
            out.append(f"step {step.name}: {step.kind} -> {leaf.kind}")
            continue
        beside = sorted(s.name for s in plan.group(step.group) if s.name != step.name)
        beside_now = sorted(s.name for s, g in leaves if g == group and s.name != step.name)
        if beside != beside_now:
            out.append(
                f"step {step.name}: in parallel with {', '.join(beside) or 'nothing'} -> "
                f"{', '.join(beside_now) or 'nothing'}"
            )
        if not isinstance(leaf, StepSpec):
            continue
        spec = leaf
        if spec.agent != step.agent:
            out.append(f"step {step.name}: agent {step.agent} -> {spec.agent}")
        if spec.remote_path != step.path:
            out.append(f"step {step.name}: path {step.path} -> {spec.remote_path}")
        if spec.on_failure != step.on_failure:
            out.append(f"step {step.name}: on_failure {step.on_failure} -> {spec.on_failure}")
        if spec.timeout_seconds not in (None, step.timeout_seconds):
            out.append(
                f"step {step.name}: timeout {step.timeout_seconds} -> {spec.timeout_seconds}"
            )
        comp = spec.compensation
        then = (step.compensation, step.compensation_agent, step.compensation_path)
        now = (comp.step, comp.agent or spec.agent, comp.remote_path) if comp else (None,) * 3
        if then != now:
            out.append(f"step {step.name}: undone by {_undo(*then)} -> {_undo(*now)}")
    planned = [s.name for s in plan.steps]
    out += [f"step {s.name} is new" for s, _ in leaves if s.name not in planned]
    common = [s.name for s, _ in leaves if s.name in planned]
    if common != [n for n in planned if n in common]:
        out.append("the steps are in another order")
    then_turns = plan.concurrency.to_json() if plan.concurrency else None
    if then_turns is not None:
        then_turns.pop("orderKey", None)
    now_turns = TurnRule.of(declared.concurrency).to_json() if declared.concurrency else None
    if then_turns != now_turns:  # orders in flight keep their slot's rule (§3.16)
        out.append(f"concurrency: {then_turns or 'none'} -> {now_turns or 'none'}")
    return out


def _undo(step: str | None, agent: str | None, path: str | None) -> str:
    if step is None:
        return "nothing"
    return f"{step}@{agent}" + ("" if path in (None, step) else f" /{path}")
