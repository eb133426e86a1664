"""A stored plan as the deploy guard shows it: a fingerprint (plans that are the same have
the same one), a line per step, and how a workflow's declaration differs from it.

A ``ForEach`` (docs/contracts.md §3.16) is two steps of a plan: its head (kind ``items``,
named as the ForEach, with ``max_concurrency``) and the step each item runs, ``<name>[]``;
a difference names it as the ForEach, and its items' step as "each item's step"."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from core.turns import TurnRule
from core.workflows import ForEach, Plan, PlannedStep, StepSpec, Workflow


def fingerprint(plan: Plan) -> str:
    """The same for the same plan, whatever key each order took its turn by (§3.16)."""
    rule = plan.concurrency
    if rule is not None and rule.order_key:
        plan = replace(plan, concurrency=replace(rule, order_key=""))
    text = json.dumps(plan.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def describe_step(step: PlannedStep) -> str:
    if step.kind == "items":
        return (
            f"{step.name}: for each of its items, at most {step.max_concurrency} at once, "
            f"each running {step.template}"
        )
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
    # a ForEach gone (or now another kind of step): its items' step goes with it, unsaid
    gone = {
        f"{s.name}[]"
        for s in plan.steps
        if s.kind == "items" and (s.name not in specs or specs[s.name][0].kind != "items")
    }
    for step in plan.steps:
        if step.name in gone:
            continue
        what = _what(step.name)
        found = specs.get(step.name)
        if found is None:
            if step.kind == "items":
                out.append(f"ForEach {step.name} is no longer declared")
            else:
                out.append(f"{what} ({step.agent or step.kind}) is no longer declared")
            continue
        leaf, group = found
        if leaf.kind != step.kind:
            out.append(f"{what}: {step.kind} -> {leaf.kind}")
            continue
        beside = sorted(s.name for s in plan.group(step.group) if s.name != step.name)
        beside_now = sorted(s.name for s, g in leaves if g == group and s.name != step.name)
        if beside != beside_now:
            out.append(
                f"{what}: in parallel with {', '.join(beside) or 'nothing'} -> "
                f"{', '.join(beside_now) or 'nothing'}"
            )
        if isinstance(leaf, ForEach) and leaf.max_concurrency != step.max_concurrency:
            out.append(
                f"ForEach {step.name}: max_concurrency {step.max_concurrency} -> "
                f"{leaf.max_concurrency}"
            )
        if not isinstance(leaf, StepSpec):
            continue
        spec = leaf
        if spec.agent != step.agent:
            out.append(f"{what}: agent {step.agent} -> {spec.agent}")
        if spec.remote_path != step.path:
            out.append(f"{what}: path {step.path} -> {spec.remote_path}")
        if spec.on_failure != step.on_failure:
            out.append(f"{what}: on_failure {step.on_failure} -> {spec.on_failure}")
        if spec.timeout_seconds not in (None, step.timeout_seconds):
            out.append(f"{what}: timeout {step.timeout_seconds} -> {spec.timeout_seconds}")
        comp = spec.compensation
        then = (step.compensation, step.compensation_agent, step.compensation_path)
        now = (comp.step, comp.agent or spec.agent, comp.remote_path) if comp else (None,) * 3
        if then != now:
            out.append(f"{what}: undone by {_undo(*then)} -> {_undo(*now)}")
    planned = [s.name for s in plan.steps]
    new = [s for s, _ in leaves if s.name not in planned]
    heads = {f"{s.name}[]" for s in new if s.kind == "items"}
    out += [
        f"ForEach {s.name} is new" if s.kind == "items" else f"{_what(s.name)} is new"
        for s in new
        if s.name not in heads
    ]
    common = [s.name for s, _ in leaves if s.name in planned]
    if common != [n for n in planned if n in common]:
        out.append("the steps are in another order")
    out += _turn_rule_changed(plan, declared)
    return out


def _turn_rule_changed(plan: Plan, declared: Workflow) -> list[str]:
    """Per-key concurrency declared otherwise (orders in flight keep their slot's rule,
    docs/contracts.md §3.16)."""
    then = plan.concurrency.to_json() if plan.concurrency else None
    if then is not None:
        then.pop("orderKey", None)
    now = TurnRule.of(declared.concurrency).to_json() if declared.concurrency else None
    return [] if then == now else [f"concurrency: {then or 'none'} -> {now or 'none'}"]


def _what(name: str) -> str:
    """How a difference names a step of a plan: a ForEach's items' step (``<name>[]``) as
    the ForEach's."""
    if name.endswith("[]"):
        return f"ForEach {name[:-2]}, each item's step"
    return f"step {name}"


def _undo(step: str | None, agent: str | None, path: str | None) -> str:
    if step is None:
        return "nothing"
    name = step.removesuffix("[]")  # an item's compensation, as its ForEach declares it
    return f"{name}@{agent}" + ("" if path in (None, step, name) else f" /{path}")
