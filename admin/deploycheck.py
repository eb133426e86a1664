"""The deploy guard (``python -m admin deploy-check``): may these declarations replace the
deployed ones while orders are in flight?

An order runs from the plan it stored when it was accepted (``core.workflows.Plan``): each
step's agent and remote path come from there, never from the declarations. What the
declarations still decide for an order in flight:

- **Its agents.** Each declared agent gets a function (``run_agent_<agent>``, registered
  from the declarations) and, through ``infra/agents.json``, a request queue, roles and
  its URL setting. A request for an agent that is no longer declared waits on a queue
  nobody reads until its deadline: counted as a failure that may have applied, retried,
  then ``error`` or compensation, which may need the same agent. So an agent that an order
  in flight still needs (``core.needs``) may not be removed, from the declarations or from
  ``infra/agents.json``.
- **Its steps' functions.** A step's ``input``, ``when`` and ``until`` (and a
  compensation's ``input``, and a ``ForEach``'s ``items``) are called when it starts, from
  today's declarations, by workflow and step name (docs/contracts.md §3.13, §3.16). A
  function that an order in flight will still call (a step it has not started, or one
  whose function raised; a ForEach whose list it has not decided; the step of a
  ForEach's items not started yet) may not be removed, and neither may its workflow or
  step (a ForEach).
- **Steps of plans stored before agents.** Such a plan names no agent; when the order is
  read, each step gets the agent today's declarations give a step of that name. A step
  no workflow declares any more makes the order unreadable. So for those plans, a step
  may not be removed.

Anything else — a step dropped, renamed, moved to another agent or path, a workflow
removed, a ForEach's ``max_concurrency`` changed — leaves orders in flight running as
planned (reported as a note: the remote must keep serving the paths their plans name).
Orders accepted while the deploy is under way still follow the deployed declarations,
which the check cannot read; the newest order of each workflow (in flight or among the
newest finished) stands for them: an agent it planned may not be removed while its
workflow stays declared.

``DeployCheck`` is the comparison (pure: orders in, a report out); ``admin.inflight.read``
feeds it from a ``StateStore``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from admin.plans import describe_step, differences, fingerprint
from core.item_names import template_of
from core.model import Order
from core.needs import Need, still_needed
from core.states import OrderStatus
from core.timefmt import iso
from core.workflows import Agent, Plan, UndeclaredStep, Workflow
from stores.layout import SHARDS

IN_FLIGHT: Final = (
    OrderStatus.PENDING,
    OrderStatus.PROCESSING,
    OrderStatus.COMPENSATING,
    OrderStatus.ERROR,
)
FINISHED: Final = (OrderStatus.COMPLETED, OrderStatus.COMPENSATED, OrderStatus.CANCELLED)
SAMPLE: Final = 10
MAX_SAMPLE: Final = 100
#: How to deploy anyway; read by the azd hook only (infra/hooks/deploy-check.*).
OVERRIDE: Final = "SKIP_DEPLOY_CHECK=true"


@dataclass(frozen=True)
class Target:
    """The declarations about to deploy."""

    module: str
    agents: Mapping[str, Agent]
    workflows: Mapping[str, Workflow]
    #: the agents ``infra/agents.json`` deploys (queue, roles, URL setting); None: unchecked
    infra_agents: frozenset[str] | None = None
    #: whether ``infra/agents.json`` is what these declarations generate
    infra_current: bool = True


@dataclass
class _Group:
    """Orders in flight with one plan."""

    plan: Plan
    orders: int = 0
    by_status: Counter[str] = field(default_factory=Counter)
    sample: list[str] = field(default_factory=list)


@dataclass
class _Missing:
    """Orders in flight that need one agent the target does not deploy."""

    orders: int = 0
    steps: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    sample: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Newest:
    created_at: datetime
    order_id: str
    agents: frozenset[str]


class DeployCheck:
    """Orders in (``in_flight``, ``stranded``, ``unreadable``, ``finished``), a report out.
    Memory is bounded by the plans, agents and workflows met, not by the orders: every
    list of order ids is a sample of ``sample`` at most, with its count."""

    def __init__(self, target: Target, sample: int = SAMPLE):
        self.target = target
        self.sample = max(1, min(sample, MAX_SAMPLE))
        self.complete = True
        self.list_pages = 0
        self.order_loads = 0
        self._groups: dict[tuple[str, str], _Group] = {}
        self._missing: dict[str, _Missing] = {}
        self._stranded: dict[tuple[str, str], _Group] = {}
        self._unreadable: list[dict[str, str]] = []
        self._unreadable_count = 0
        self._by_status: Counter[str] = Counter()
        self._needed_by: Counter[str] = Counter()  # agent -> orders in flight needing it
        self._workflows: Counter[str] = Counter()  # in flight
        self._finished: Counter[str] = Counter()  # the newest finished, by workflow
        self._newest: dict[str, _Newest] = {}
        #: (workflow, step, function) -> orders in flight that will still call it
        self._functions: dict[tuple[str, str, str], _Group] = {}

    # --- orders in ------------------------------------------------------------------

    def in_flight(self, order: Order) -> None:
        status = str(order.status)
        self._by_status[status] += 1
        self._workflows[order.workflow] += 1
        self._seen(order)
        group = self._groups.setdefault(
            (order.workflow, fingerprint(order.plan)), _Group(order.plan)
        )
        self._add(group, order.order_id, status)
        needs = still_needed(order)
        missing: dict[str, list[Need]] = {}
        for need in needs:
            if need.agent and self._problem(need.agent) is not None:
                missing.setdefault(need.agent, []).append(need)
            for function in need.functions:
                if not self._declares(order.workflow, need.step, function):
                    key = (order.workflow, need.step, function)
                    self._add(
                        self._functions.setdefault(key, _Group(order.plan)), order.order_id, status
                    )
        for agent in {n.agent for n in needs if n.agent}:
            self._needed_by[agent] += 1
        for agent, wanted in missing.items():
            entry = self._missing.setdefault(agent, _Missing())
            entry.orders += 1
            for need in wanted:
                entry.steps[(order.workflow, need.step, str(need.why), need.undoes or "")] += 1
            if len(entry.sample) < self.sample:
                entry.sample.append(
                    {
                        "orderId": order.order_id,
                        "status": status,
                        "workflow": order.workflow,
                        "steps": [n.step for n in wanted],
                    }
                )

    def stranded(self, order_id: str, status: OrderStatus, cause: UndeclaredStep) -> None:
        """An order whose plan (from before agents) names a step the target declares
        nowhere: it could not be read after this deploy (nor by this check)."""
        self._by_status[str(status)] += 1
        group = self._stranded.setdefault(
            (cause.workflow, cause.step), _Group(Plan(cause.workflow))
        )
        self._add(group, order_id, str(status))

    def unreadable(self, order_id: str, status: OrderStatus, error: str) -> None:
        """Records that cannot be read whatever is deployed (a person must repair them)."""
        self._by_status[str(status)] += 1
        self._unreadable_count += 1
        if len(self._unreadable) < self.sample:
            self._unreadable.append({"orderId": order_id, "status": str(status), "error": error})

    def finished(self, order: Order) -> None:
        """One of the newest finished orders: what the deployed version has been planning."""
        self._finished[order.workflow] += 1
        self._seen(order)

    def _seen(self, order: Order) -> None:
        newest = self._newest.get(order.workflow)
        if newest is None or order.created_at > newest.created_at:
            agents = {s.agent for s in order.plan.steps if s.agent}
            agents |= {s.compensation_agent or s.agent for s in order.plan.steps if s.compensation}
            self._newest[order.workflow] = _Newest(
                order.created_at, order.order_id, frozenset(agents)
            )

    def _declares(self, workflow: str, step: str, function: str) -> bool:
        """Whether the target declares ``function`` for ``step`` of ``workflow`` (a
        compensation's by its own step name; an item of a ForEach's, ``<name>[<i>]``, or
        its compensation's, by its ForEach's step, ``<name>[]``; the ForEach's own
        ``items`` by its name)."""
        declared = self.target.workflows.get(workflow)
        if declared is None:
            return False
        step = template_of(step)
        for leaf, _ in declared.leaves():
            if leaf.name == step:
                return getattr(leaf, function, None) is not None
            compensation = getattr(leaf, "compensation", None)
            if compensation is not None and compensation.step == step:
                return function == "input" and compensation.input is not None
        return False

    def _add(self, group: _Group, order_id: str, status: str) -> None:
        group.orders += 1
        group.by_status[status] += 1
        if len(group.sample) < self.sample:
            group.sample.append(order_id)

    def _problem(self, agent: str) -> str | None:
        if agent not in self.target.agents:
            return "agent-removed"
        infra = self.target.infra_agents
        if infra is not None and agent not in infra:
            return "agent-not-deployed"
        return None

    # --- the report -----------------------------------------------------------------

    @property
    def refused(self) -> bool:
        return bool(self._refusals())

    def report(self) -> dict[str, Any]:
        refusals = self._refusals()
        out: dict[str, Any] = {
            "verdict": "refused" if refusals else "safe",
            "declarations": self.target.module,
            "read": {
                "inFlight": sum(self._by_status.values()),
                "byStatus": {str(s): self._by_status[str(s)] for s in IN_FLIGHT},
                "newestFinished": sum(self._finished.values()),
                "complete": self.complete,
                "listPages": self.list_pages,
                "orderLoads": self.order_loads,
                "storageQueries": self.list_pages * SHARDS + self.order_loads,
            },
            "plans": self._plans(),
            "refusals": refusals,
            "notes": self._notes(),
        }
        if refusals:
            out["override"] = (
                f"to deploy anyway (the orders named may be stranded): {OVERRIDE} azd deploy "
                "(or azd up, azd provision), or azd env set SKIP_DEPLOY_CHECK true and unset "
                "it afterwards"
            )
        return out

    def _plans(self) -> list[dict[str, Any]]:
        out = []
        for (workflow, print_), group in sorted(
            self._groups.items(), key=lambda kv: (kv[0][0], -kv[1].orders, kv[0][1])
        ):
            changes = differences(group.plan, self.target.workflows.get(workflow))
            out.append(
                {
                    "workflow": workflow,
                    "fingerprint": print_,
                    "steps": [describe_step(s) for s in group.plan.steps],
                    "orders": group.orders,
                    "byStatus": dict(sorted(group.by_status.items())),
                    "sample": group.sample,
                    "declared": "differs" if changes else "as planned",
                    "differences": changes,
                }
            )
        return out

    def _refusals(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        planned_by: dict[str, list[dict[str, str]]] = {}
        for workflow, newest in sorted(self._newest.items()):
            if workflow not in self.target.workflows:
                continue  # no new order of it after this deploy: a note
            for agent in sorted(newest.agents):
                if agent not in self.target.agents:
                    planned_by.setdefault(agent, []).append(
                        {
                            "workflow": workflow,
                            "newestOrder": newest.order_id,
                            "acceptedAt": iso(newest.created_at),
                        }
                    )
        for agent in sorted(set(self._missing) | set(planned_by)):
            problem = self._problem(agent)
            entry = self._missing.get(agent, _Missing())
            refusal: dict[str, Any] = {
                "problem": problem,
                "agent": agent,
                "orders": entry.orders,
                "steps": [
                    {
                        "workflow": w,
                        "step": s,
                        "why": why,
                        **({"undoes": u} if u else {}),
                        "orders": n,
                    }
                    for (w, s, why, u), n in sorted(entry.steps.items())
                ],
                "sample": entry.sample,
            }
            refusal["detail"], refusal["fix"] = self._why(agent, problem, entry.orders)
            if agent in planned_by:
                refusal["plannedBy"] = planned_by[agent]
                refusal["detail"] += (
                    "; and the deployed version still plans it for new orders (the newest "
                    "order of each workflow in plannedBy did): orders accepted until this "
                    "deploy is live would need it too. Deploy the workflow change first, "
                    "keeping the agent, and remove the agent in a later deploy (if that change "
                    "is live already and no order of the workflow has come since, this "
                    "evidence is stale: use the override)"
                )
            out.append(refusal)
        for (workflow, step, function), group in sorted(self._functions.items()):
            out.append(
                {
                    "problem": "function-removed",
                    "workflow": workflow,
                    "step": step,
                    "function": function,
                    "orders": group.orders,
                    "byStatus": dict(sorted(group.by_status.items())),
                    "sample": group.sample,
                    "detail": (
                        f"these orders will still call the {function} of step {step} "
                        f"(workflow {workflow}) when it starts, and {self.target.module} "
                        "does not declare it: the step would fail for good"
                    ),
                    "fix": (
                        f"keep {step}'s {function}= in workflow {workflow} until deploy-check "
                        "shows no order needing it (let them reach or pass the step)"
                    ),
                }
            )
        for (workflow, step), group in sorted(self._stranded.items()):
            out.append(
                {
                    "problem": "step-removed",
                    "workflow": workflow,
                    "step": step,
                    "orders": group.orders,
                    "byStatus": dict(sorted(group.by_status.items())),
                    "sample": group.sample,
                    "detail": (
                        "these orders' plans were stored before agents and name none: a step's "
                        "agent is the one today's declarations give a step of that name, and "
                        f"{self.target.module} declares {step} in no workflow, so the orders "
                        "could not be read"
                    ),
                    "fix": (
                        f"keep a step {step} declared (in any workflow) until these orders are "
                        "saved with their agents (any change saves the plan: the running app "
                        "does so as they move; resubmit or cancel an error order) or finish"
                    ),
                }
            )
        if not self.complete:
            out.append(
                {
                    "problem": "incomplete",
                    "detail": "more orders are in flight than the check reads (--max-orders): "
                    "the others were not checked",
                    "fix": "run it again with a larger --max-orders",
                }
            )
        return out

    def _why(self, agent: str, problem: str | None, orders: int) -> tuple[str, str]:
        if problem == "agent-not-deployed":
            return (
                f"agent {agent} is declared but not in infra/agents.json, from which Bicep "
                "deploys its queue, roles and URL setting",
                "python -m admin agents-json --write, commit it, then azd up",
            )
        detail = (
            f"agent {agent} is not declared in {self.target.module}: its function "
            f"run_agent_{agent.replace('-', '_')} would be gone"
        )
        if orders:
            detail += (
                ", and the requests these orders still send it would wait unread until "
                "their deadlines, then fail (as may have applied)"
            )
        fix = (
            f"keep Agent({agent!r}) in AGENTS (no workflow needs to use it) until "
            "deploy-check shows no order needing it: let them finish, or cancel those that "
            "have not reached it yet (python -m admin cancel ORDER_ID: a step already "
            "running still needs its agent to report)"
        )
        return detail, fix

    def _notes(self) -> list[dict[str, Any]]:
        notes: list[dict[str, Any]] = []
        for (workflow, print_), group in sorted(self._groups.items()):
            changes = differences(group.plan, self.target.workflows.get(workflow))
            if changes and workflow in self.target.workflows:
                notes.append(
                    {
                        "note": "plan-differs",
                        "workflow": workflow,
                        "fingerprint": print_,
                        "orders": group.orders,
                        "differences": changes,
                        "detail": "these orders keep the plan they were accepted with: each "
                        "step runs on the agent and remote path the plan names, so those remotes "
                        "must keep serving those paths until the orders finish",
                    }
                )
        for workflow in sorted(
            (set(self._workflows) | set(self._finished)) - set(self.target.workflows)
        ):
            newest = self._newest[workflow]
            notes.append(
                {
                    "note": "workflow-removed",
                    "workflow": workflow,
                    "inFlight": self._workflows[workflow],
                    "newestFinished": self._finished[workflow],
                    "newestOrder": newest.order_id,
                    "acceptedAt": iso(newest.created_at),
                    "agentsRemoved": sorted(
                        a for a in newest.agents if a not in self.target.agents
                    ),
                    "detail": "new orders naming it will be rejected (orders-rejected); the "
                    "orders in flight finish from their stored plans. Orders accepted before "
                    "this deploy is live still plan it, and need agentsRemoved",
                }
            )
        used = {a for w in self.target.workflows.values() for a in w.agents()}
        for agent in sorted(set(self.target.agents) - used):
            needed = self._needed_by[agent]
            notes.append(
                {
                    "note": "agent-unused",
                    "agent": agent,
                    "ordersNeedingIt": needed,
                    "detail": (
                        f"no workflow uses it; {needed} order(s) in flight still need it: remove "
                        "it once deploy-check shows none"
                        if needed
                        else "no workflow uses it and no order in flight needs it: it can be "
                        "removed (check again then: orders accepted meanwhile may plan it)"
                    ),
                }
            )
        if self._unreadable_count:
            notes.append(
                {
                    "note": "unreadable",
                    "orders": self._unreadable_count,
                    "sample": self._unreadable,
                    "detail": "these orders' records cannot be read, whatever is deployed: "
                    "repair them by hand (docs/operating.md)",
                }
            )
        if not self.target.infra_current:
            notes.append(
                {
                    "note": "agents-json-stale",
                    "detail": "infra/agents.json is not what these declarations generate: run "
                    "python -m admin agents-json --write, commit it, and azd up (Bicep deploys "
                    "each agent's queue, roles and settings from it)",
                }
            )
        return notes
