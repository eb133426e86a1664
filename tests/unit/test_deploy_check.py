"""The deploy guard's logic, pure: what an unfinished order may still run
(``core.needs``), and the comparison of those needs with the declarations about to
deploy (``admin.deploycheck.DeployCheck``); then its reading (``admin.inflight``) of the in-memory store."""

from __future__ import annotations

import json
import random
import types
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Literal, TypedDict

import pytest

from admin import deploycheck, inflight
from admin.deploycheck import DeployCheck, Target
from admin.plans import differences, fingerprint
from core import workflows
from core.errors import TransitionRefused
from core.model import Order
from core.needs import Need, Why, still_needed
from core.order_message import decode_order
from core.outcome import Outcome
from core.states import OrderStatus
from core.workflows import Agent, Compensation, Plan, StepSpec, Workflow, validate
from stores import layout
from stores.memory import InMemoryStateStore
from tests import SUITE_DECLARATIONS
from tests.support import declarations
from tests.unit.test_model import POLICY, T0, drive, new_order, random_reply, reply

# --- what an unfinished order still needs -------------------------------------------------


def accepted(workflow: str, order_id: str = "o-1") -> Order:
    """Accepted under the suite's declarations (whatever the registry holds)."""
    message = decode_order(json.dumps({"orderId": order_id, "workflow": workflow}))
    return Order.accept(
        message, Plan.of({"order": ORDER, "fulfilment": FULFILMENT}[workflow], 30), T0
    )


def at(step: str, workflow: str = "fulfilment", order_id: str = "o-1") -> Order:
    """An order whose active step is ``step``, every step before it done."""
    order = accepted(workflow, order_id)
    now = T0
    while (active := order.active_step()) is not None and active.step != step:
        order.claim("i", now)
        order.apply_reply(reply(order), now + timedelta(seconds=1))
        now += timedelta(seconds=2)
    assert order.active_step() is not None, f"{workflow} has no step {step}"
    return order


def needs(order: Order) -> list[tuple[str, str, str, str | None]]:
    return [(n.step, n.agent, str(n.why), n.undoes) for n in still_needed(order)]


RESERVE = ("reserve-stock", "inventory")
CHARGE = ("charge-payment", "payments")
SHIP = ("ship", "carrier")
RELEASE = ("release-stock", "inventory", "undo", "reserve-stock")
REFUND = ("refund-payment", "payments", "undo", "charge-payment")


def test_an_order_going_forward_needs_its_step_the_later_ones_and_every_undo() -> None:
    assert needs(new_order("order")) == [("process", "orders", "running", None)]
    assert needs(at("reserve-stock")) == [
        (*RESERVE, "running", None),
        (*CHARGE, "later", None),
        (*SHIP, "later", None),
        REFUND,
        RELEASE,
    ]
    assert needs(at("charge-payment")) == [
        (*CHARGE, "running", None),
        (*SHIP, "later", None),
        REFUND,
        RELEASE,
    ]
    order = at("ship")
    order.claim("i", T0 + timedelta(minutes=1))  # in flight: the same
    assert needs(order) == [(*SHIP, "running", None), REFUND, RELEASE]


def test_an_order_unwinding_needs_only_the_compensations_still_to_run() -> None:
    order = new_order("fulfilment")
    drive(order, {"ship": Outcome.REFUSED, "refund-payment": Outcome.REFUSED})
    # the refund failed for good: resubmit retries it. Ship, refused, ran: a report that
    # it may have applied after all would put the order in error, and a resubmit would ask
    # it again with its key (docs/contracts.md §3.15)
    ship_again = ("ship", "carrier", "retry", None)
    assert (order.status, needs(order)) == (
        OrderStatus.ERROR,
        [("refund-payment", "payments", "retry", "charge-payment"), RELEASE, ship_again],
    )
    order.resubmit(T0 + timedelta(hours=1), "op")
    assert order.status is OrderStatus.COMPENSATING
    assert needs(order) == [
        ("refund-payment", "payments", "running", "charge-payment"),
        RELEASE,
        ship_again,
    ]
    order = new_order("fulfilment")
    # the refund done: undone
    drive(order, {"ship": Outcome.REFUSED, "release-stock": Outcome.REFUSED})
    assert needs(order) == [("release-stock", "inventory", "retry", "reserve-stock"), ship_again]


def test_an_error_order_at_an_action_needs_it_and_every_undo() -> None:
    """ship may have applied and cannot be undone: a resubmit retries it, a cancel (with
    the operator's statement) undoes the steps before it."""
    order = new_order("fulfilment")
    drive(order, {"ship": "expire"})
    assert order.status is OrderStatus.ERROR
    assert needs(order) == [(*SHIP, "retry", None), REFUND, RELEASE]
    order = new_order("order")
    drive(order, {"process": Outcome.REFUSED})
    assert needs(order) == [("process", "orders", "retry", None)]


def test_a_cancel_drops_the_later_steps_once_the_running_one_will_be_undone() -> None:
    order = at("charge-payment")
    order.claim("i", T0 + timedelta(minutes=1))
    order.cancel(T0 + timedelta(minutes=1), "op")
    # it succeeds: undone with the rest; it fails: the rest is undone. Never ship.
    assert needs(order) == [(*CHARGE, "running", None), REFUND, RELEASE]
    order = at("ship")
    order.claim("i", T0 + timedelta(minutes=1))
    order.cancel(T0 + timedelta(minutes=1), "op")
    assert needs(order) == [(*SHIP, "running", None), REFUND, RELEASE]  # too late if it succeeds


def test_a_finished_order_needs_nothing_but_what_late_evidence_may_ask_again() -> None:
    order = new_order("fulfilment")
    drive(order, {})
    assert order.status is OrderStatus.COMPLETED and still_needed(order) == ()
    # compensated after ship was refused: a report that ship may have applied after all
    # would put the order in error, and a resubmit would ask it again (§3.15)
    order = new_order("fulfilment")
    drive(order, {"ship": Outcome.REFUSED})
    assert order.status is OrderStatus.COMPENSATED
    assert needs(order) == [("ship", "carrier", "retry", None)]


@pytest.mark.parametrize("seed", [7, 2026, 99])
def test_every_step_an_order_runs_was_needed_at_every_moment_before(seed: int) -> None:
    """A seeded random walk over every transition, operator actions included (resubmit,
    cancel, cancel stating a step did not happen) and every kind of report (on time, late,
    old attempts): each claim (a request sent to an agent) names a step that every
    earlier ``still_needed`` listed, with that agent. So the check never lets an agent go
    that an order could still call."""
    rng = random.Random(seed)
    outcomes = list(Outcome)
    claims: Counter[str] = Counter()
    for _ in range(300):
        order = new_order(rng.choice(["order", "fulfilment"]))
        now = T0
        history: list[set[tuple[str, str]]] = []
        was_error = False
        for _ in range(80):
            history.append({(n.step, n.agent) for n in still_needed(order)})
            was_error |= order.status is OrderStatus.ERROR
            now += timedelta(seconds=rng.choice([1, 5, 40]))
            move = rng.choice(["claim", "claim", "reply", "late", "expire", "resubmit", "cancel"])
            active = order.active_step()
            try:
                if move == "claim":
                    claimed = order.claim("i", now)
                    claims[f"{claimed.kind}{' after an error' if was_error else ''}"] += 1
                    wanted = (claimed.step, order.plan.agent_of(claimed.step))
                    missed = [i for i, h in enumerate(history) if wanted not in h]
                    assert not missed, (
                        wanted,
                        missed,
                        [(s.step, str(s.process_state)) for s in order.steps],
                    )
                elif move in ("reply", "late"):
                    target = active or rng.choice(order.steps)
                    if not target.attempt:
                        continue
                    number = target.attempt if move == "reply" else rng.randint(1, target.attempt)
                    outcome = rng.choice(outcomes)
                    reply = random_reply(order, target.step, number, outcome, rng, now)
                    order.apply_reply(reply, now, POLICY)
                elif move == "expire":
                    order.expire(now, POLICY)
                elif move == "resubmit":
                    order.resubmit(now, "op")
                elif move == "cancel" and rng.random() < 0.2:
                    stated = order.active_step() or rng.choice(order.steps)
                    order.cancel(now, "op", not_applied=stated.step if rng.random() < 0.5 else None)
            except TransitionRefused:
                pass
    # the walk reached far: compensations, and steps run after the order was in error
    assert min(claims.values()) > 20 and len(claims) == 4, claims


# --- the comparison ------------------------------------------------------------------------

ORDERS, INVENTORY, PAYMENTS, CARRIER = (
    Agent("orders"),
    Agent("inventory"),
    Agent("payments"),
    Agent("carrier"),
)
ORDER = Workflow("order", (StepSpec("process", agent="orders"),))
RESERVE_SPEC = StepSpec(
    "reserve-stock", agent="inventory", compensation=Compensation("release-stock")
)
CHARGE_SPEC = StepSpec(
    "charge-payment", agent="payments", compensation=Compensation("refund-payment")
)
FULFILMENT = Workflow("fulfilment", (RESERVE_SPEC, CHARGE_SPEC, StepSpec("ship", agent="carrier")))


class Declared(TypedDict):
    agents: list[Agent]
    workflows: list[Workflow]


PRODUCT: Declared = {
    "agents": [ORDERS, INVENTORY, PAYMENTS, CARRIER],
    "workflows": [ORDER, FULFILMENT],
}


def target(
    agents: list[Agent], flows: list[Workflow], infra: set[str] | None = None, current: bool = True
) -> Target:
    declared = validate(types.SimpleNamespace(AGENTS=agents, WORKFLOWS=flows))
    infra_agents = frozenset(infra) if infra is not None else None
    return Target("next", declared["AGENTS"], declared["WORKFLOWS"], infra_agents, current)


def checked(target_: Target, *orders: Order, finished: tuple[Order, ...] = ()) -> DeployCheck:
    check = DeployCheck(target_, sample=5)
    for order in orders:
        check.in_flight(order)
    for order in finished:
        check.finished(order)
    return check


def done(
    workflow: str,
    order_id: str,
    outcomes: dict[str, Outcome | Literal["expire"]] | None = None,
) -> Order:
    order = accepted(workflow, order_id)
    drive(order, outcomes or {})
    assert order.status.finished
    return order


def test_removing_an_agent_orders_in_flight_need_is_refused_naming_them() -> None:
    shipping, charging = at("ship", order_id="o-ship"), at("charge-payment", order_id="o-charge")
    reserving, single = at("reserve-stock", order_id="o-reserve"), new_order("order")
    unwinding = accepted("fulfilment", "o-unwinding")
    drive(
        unwinding, {"ship": Outcome.REFUSED, "refund-payment": Outcome.REFUSED}
    )  # error; ship ran and was refused: a late "maybe" would have it asked again
    without_carrier = target(
        [ORDERS, INVENTORY, PAYMENTS], [ORDER, Workflow("fulfilment", (RESERVE_SPEC, CHARGE_SPEC))]
    )
    check = checked(without_carrier, shipping, charging, reserving, single, unwinding)
    assert check.refused
    report = check.report()
    assert report["verdict"] == "refused"
    assert report["refusals"] == [
        {
            "problem": "agent-removed",
            "agent": "carrier",
            "orders": 4,
            "steps": [
                {"workflow": "fulfilment", "step": "ship", "why": "later", "orders": 2},
                {"workflow": "fulfilment", "step": "ship", "why": "retry", "orders": 1},
                {"workflow": "fulfilment", "step": "ship", "why": "running", "orders": 1},
            ],
            "sample": [
                {
                    "orderId": "o-ship",
                    "status": "processing",
                    "workflow": "fulfilment",
                    "steps": ["ship"],
                },
                {
                    "orderId": "o-charge",
                    "status": "processing",
                    "workflow": "fulfilment",
                    "steps": ["ship"],
                },
                {
                    "orderId": "o-reserve",
                    "status": "pending",
                    "workflow": "fulfilment",
                    "steps": ["ship"],
                },
                {
                    "orderId": "o-unwinding",
                    "status": "error",
                    "workflow": "fulfilment",
                    "steps": ["ship"],
                },
            ],
            "detail": report["refusals"][0]["detail"],
            "fix": report["refusals"][0]["fix"],
            # the newest fulfilment order planned carrier: so does the deployed version
            "plannedBy": [
                {
                    "workflow": "fulfilment",
                    "newestOrder": "o-ship",
                    "acceptedAt": "2026-11-22T10:00:00.000Z",
                }
            ],
        }
    ]
    assert "run_agent_carrier" in report["refusals"][0]["detail"]
    assert "keep Agent('carrier') in AGENTS" in report["refusals"][0]["fix"]
    assert report["override"].startswith("to deploy anyway")
    assert deploycheck.OVERRIDE in report["override"]
    # the plans in flight: one per fingerprint, with counts and samples
    [fulfilment_plan, order_plan] = report["plans"]  # by workflow
    assert fulfilment_plan["workflow"] == "fulfilment" and fulfilment_plan["orders"] == 4
    assert fulfilment_plan["byStatus"] == {"error": 1, "pending": 1, "processing": 2}
    assert fulfilment_plan["steps"] == [
        "reserve-stock@inventory, undone by release-stock@inventory",
        "charge-payment@payments, undone by refund-payment@payments",
        "ship@carrier",
    ]
    assert fulfilment_plan["declared"] == "differs"
    assert fulfilment_plan["differences"] == ["step ship (carrier) is no longer declared"]
    assert order_plan == {
        "workflow": "order",
        "fingerprint": fingerprint(single.plan),
        "steps": ["process@orders"],
        "orders": 1,
        "byStatus": {"pending": 1},
        "sample": ["o-1"],
        "declared": "as planned",
        "differences": [],
    }
    assert report["read"]["inFlight"] == 5


def test_a_compensation_agent_still_needed_is_refused_too() -> None:
    """An order unwinding, or one that may unwind, needs its compensations' agents."""
    with declarations():  # the tests' own fulfilment: no functions, only agents to need
        unwinding = new_order("fulfilment")
    drive(unwinding, {"ship": Outcome.REFUSED, "refund-payment": Outcome.REFUSED})
    no_inventory = [
        ORDERS,
        PAYMENTS,
        CARRIER,
    ]
    check = checked(target(no_inventory, [ORDER]), unwinding)
    [refusal] = check.report()["refusals"]
    assert (refusal["agent"], refusal["orders"]) == ("inventory", 1)
    assert refusal["steps"] == [
        {
            "workflow": "fulfilment",
            "step": "release-stock",
            "why": "undo",
            "undoes": "reserve-stock",
            "orders": 1,
        }
    ]


def test_dropping_a_step_but_keeping_its_agent_is_safe_and_noted() -> None:
    """Nothing at runtime reads a step's declaration for an order whose plan names its
    agent: the orders at or before ship still ship, on the carrier agent kept."""
    shipping = at("ship", order_id="o-ship")
    keep_carrier = target(
        [ORDERS, INVENTORY, PAYMENTS, CARRIER],
        [ORDER, Workflow("fulfilment", (RESERVE_SPEC, CHARGE_SPEC))],
    )
    check = checked(keep_carrier, shipping, finished=(done("fulfilment", "o-old"),))
    report = check.report()
    assert not check.refused and report["verdict"] == "safe" and report["refusals"] == []
    assert "override" not in report
    notes = {n["note"]: n for n in report["notes"]}
    assert notes["plan-differs"]["differences"] == ["step ship (carrier) is no longer declared"]
    assert notes["plan-differs"]["orders"] == 1
    assert notes["agent-unused"]["agent"] == "carrier"
    assert notes["agent-unused"]["ordersNeedingIt"] == 1
    assert set(notes) == {"plan-differs", "agent-unused"}


def test_an_unrelated_change_passes_with_nothing_to_note() -> None:
    express = Workflow("express", (StepSpec("process", agent="orders"),))
    more = target([*PRODUCT["agents"], Agent("gifts")], [*PRODUCT["workflows"], express])
    orders = (at("ship", order_id="a"), at("reserve-stock", order_id="b"), new_order("order"))
    check = checked(more, *orders, finished=(done("order", "old"),))
    report = check.report()
    assert report["verdict"] == "safe"
    assert report["refusals"] == []
    assert [n["note"] for n in report["notes"]] == ["agent-unused"]  # gifts: nothing uses it
    assert all(p["declared"] == "as planned" for p in report["plans"])


def test_an_agent_the_deployed_version_still_plans_may_not_go() -> None:
    """No order in flight needs carrier, but the newest fulfilment order planned it: the
    deployed version does, and orders it accepts until this deploy is live would need it."""
    without_carrier = target(
        [ORDERS, INVENTORY, PAYMENTS], [ORDER, Workflow("fulfilment", (RESERVE_SPEC, CHARGE_SPEC))]
    )
    newest = done("fulfilment", "o-newest")
    check = checked(without_carrier, new_order("order"), finished=(newest,))
    [refusal] = check.report()["refusals"]
    assert (refusal["agent"], refusal["orders"], refusal["sample"]) == ("carrier", 0, [])
    assert refusal["plannedBy"] == [
        {
            "workflow": "fulfilment",
            "newestOrder": "o-newest",
            "acceptedAt": "2026-11-22T10:00:00.000Z",
        }
    ]
    assert "later deploy" in refusal["detail"]
    # The same with the workflow removed too: no new order of it after the deploy; a note.
    gone = checked(target([ORDERS], [ORDER]), new_order("order"), finished=(newest,))
    report = gone.report()
    assert report["verdict"] == "safe"
    [note] = [n for n in report["notes"] if n["note"] == "workflow-removed"]
    assert note["workflow"] == "fulfilment" and note["inFlight"] == 0
    assert note["newestFinished"] == 1 and note["newestOrder"] == "o-newest"
    assert note["agentsRemoved"] == ["carrier", "inventory", "payments"]


def test_a_workflow_removed_with_orders_in_flight_is_noted_not_refused() -> None:
    """The orders finish from their stored plans, as long as their agents stay."""
    check = checked(target(PRODUCT["agents"], [ORDER]), at("ship", order_id="a"))
    report = check.report()
    assert report["verdict"] == "safe"
    [note] = [n for n in report["notes"] if n["note"] == "workflow-removed"]
    assert (note["inFlight"], note["agentsRemoved"]) == (1, [])
    assert report["plans"][0]["differences"] == ["workflow fulfilment is not declared"]


def test_an_agent_missing_from_infra_agents_json_is_refused() -> None:
    """Declared, but Bicep would not deploy its queue, roles and URL setting."""
    stale = target(
        PRODUCT["agents"], PRODUCT["workflows"], {"orders", "inventory", "payments"}, False
    )
    check = checked(stale, at("charge-payment", order_id="a"))
    report = check.report()
    [refusal] = report["refusals"]
    assert (refusal["problem"], refusal["agent"], refusal["orders"]) == (
        "agent-not-deployed",
        "carrier",
        1,
    )
    assert "agents-json --write" in refusal["fix"]
    assert [n["note"] for n in report["notes"]] == ["agents-json-stale"]
    fresh = target(PRODUCT["agents"], PRODUCT["workflows"], {a.name for a in PRODUCT["agents"]})
    assert not checked(fresh, at("charge-payment")).refused


def test_an_order_stranded_by_a_step_removed_from_a_plan_before_agents_is_refused() -> None:
    check = DeployCheck(target(PRODUCT["agents"], [ORDER]))
    check.stranded("o-old", OrderStatus.ERROR, workflows.UndeclaredStep("fulfilment", "ship"))
    check.unreadable("o-bad", OrderStatus.PROCESSING, "corrupt")
    report = check.report()
    [refusal] = report["refusals"]
    assert refusal["problem"] == "step-removed"
    assert (refusal["workflow"], refusal["step"], refusal["sample"]) == (
        "fulfilment",
        "ship",
        ["o-old"],
    )
    assert refusal["byStatus"] == {"error": 1}
    [note] = [n for n in report["notes"] if n["note"] == "unreadable"]
    assert note["sample"] == [{"orderId": "o-bad", "status": "processing", "error": "corrupt"}]
    assert report["read"]["inFlight"] == 2


def test_samples_are_bounded_and_counts_are_not() -> None:
    without_carrier = target([ORDERS, INVENTORY, PAYMENTS], [ORDER])
    check = DeployCheck(without_carrier, sample=2)
    for n in range(7):
        check.in_flight(at("ship", order_id=f"o-{n}"))
    report = check.report()
    [refusal] = report["refusals"]
    assert refusal["orders"] == 7 and len(refusal["sample"]) == 2
    assert report["plans"][0]["orders"] == 7 and report["plans"][0]["sample"] == ["o-0", "o-1"]


def test_differences_name_every_kind_of_change() -> None:
    plan = Plan.of(FULFILMENT, 30)
    changed = Workflow(
        "fulfilment",
        (
            StepSpec("charge-payment", agent="payments", path="pay", timeout_seconds=9),
            StepSpec(
                "reserve-stock",
                agent="payments",
                compensation=Compensation("release-stock", agent="inventory"),
            ),
            StepSpec("gift-wrap", agent="orders"),
        ),
    )
    assert differences(plan, changed) == [
        "step reserve-stock: agent inventory -> payments",
        "step charge-payment: path charge-payment -> pay",
        "step charge-payment: timeout 30 -> 9",
        "step charge-payment: undone by refund-payment@payments -> nothing",
        "step ship (carrier) is no longer declared",
        "step gift-wrap is new",
        "the steps are in another order",
    ]
    assert differences(plan, FULFILMENT) == []


# --- reading the store ---------------------------------------------------------------------


def stored(store: InMemoryStateStore, *orders: Order) -> None:
    for order in orders:
        store.create(order)


def product_target() -> Target:
    return target(PRODUCT["agents"], PRODUCT["workflows"])


def test_read_feeds_every_order_in_flight_once_and_a_few_finished() -> None:
    store = InMemoryStateStore()
    in_flight = [at("ship", order_id=f"f-{n}") for n in range(23)]
    stored(store, *in_flight, *(done("order", f"d-{n}") for n in range(5)))
    check = inflight.read(store, DeployCheck(product_target()), page=10, recent=3)
    report = check.report()
    assert report["read"]["inFlight"] == 23 and report["read"]["complete"]
    assert report["read"]["newestFinished"] == 3
    # pages: pending 10+10+3, processing, compensating, error (1 each), 3 finished statuses
    assert report["read"]["listPages"] == 3 + 3 + 3
    assert report["read"]["orderLoads"] == 23 + 3
    assert report["read"]["storageQueries"] == 9 * layout.SHARDS + 26


def test_read_stops_at_max_orders_and_refuses_as_incomplete() -> None:
    store = InMemoryStateStore()
    stored(store, *(at("ship", order_id=f"f-{n}") for n in range(12)))
    check = inflight.read(store, DeployCheck(product_target()), max_orders=10, page=4)
    report = check.report()
    assert report["read"]["inFlight"] == 10 and not report["read"]["complete"]
    assert [r["problem"] for r in report["refusals"]] == ["incomplete"]
    exact = inflight.read(store, DeployCheck(product_target()), max_orders=12, page=4)
    assert exact.report()["read"]["complete"] and not exact.refused


@pytest.fixture
def declared_without_ship(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The registry switched to declarations in which no workflow has ship (what the app
    reads a plan from before agents with, after such a deploy)."""
    module = types.ModuleType("declarations_without_ship")
    module.AGENTS = PRODUCT["agents"]  # type: ignore[attr-defined]
    module.WORKFLOWS = [ORDER, Workflow("fulfilment", (RESERVE_SPEC, CHARGE_SPEC))]  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, module.__name__, module)
    workflows.use(module.__name__)
    try:
        yield module.__name__
    finally:
        workflows.use(SUITE_DECLARATIONS)


def before_agents(store: InMemoryStateStore, order_id: str) -> None:
    """Rewrite the stored plan as versions before agents stored it: no agent anywhere."""
    shard = layout.shard_of(order_id)
    [row] = [r for r in store.rows(shard) if r["RowKey"] == layout.order_row(order_id)]
    plan = json.loads(row["Plan"])
    for step in plan["steps"]:
        step.pop("agent", None)
        (step.get("compensation") or {}).pop("agent", None)
    store.put_row({**row, "Plan": json.dumps(plan)})


def test_a_plan_from_before_agents_strands_its_order_when_its_step_goes(
    declared_without_ship: str,
) -> None:
    store = InMemoryStateStore()
    old, new = at("charge-payment", order_id="o-old"), at("charge-payment", order_id="o-new")
    stored(store, old, new)
    before_agents(store, "o-old")
    check = inflight.read(store, DeployCheck(target(PRODUCT["agents"], [ORDER])))
    refusals = check.report()["refusals"]
    assert [(r["problem"], r.get("step"), r["sample"]) for r in refusals] == [
        ("step-removed", "ship", ["o-old"])
    ]
    # The order that stored its agents runs on: ship still has its agent.
    assert check.report()["read"]["inFlight"] == 2


def test_a_plan_from_before_agents_is_fine_while_its_steps_stay_declared() -> None:
    store = InMemoryStateStore()
    stored(store, at("charge-payment", order_id="o-old"))
    before_agents(store, "o-old")
    check = inflight.read(store, DeployCheck(product_target()))
    assert not check.refused
    assert [n.agent for n in still_needed(store.load("o-old"))] == [  # type: ignore[arg-type]
        "payments",
        "carrier",
        "payments",
        "inventory",
    ]


def test_need_is_hashable_and_names_its_reason() -> None:
    assert Need("ship", "carrier", "ship", Why.LATER) in {
        Need("ship", "carrier", "ship", Why.LATER)
    }
    assert str(Why.UNDO) == "undo"


def test_records_that_name_no_step_to_go_on_from_need_the_whole_plan() -> None:
    """Edited by hand (no active or failed step, or a step its plan does not name): every
    step and compensation of the plan, rather than a guess."""
    everything = [
        (*RESERVE, "later", None),
        (*CHARGE, "later", None),
        (*SHIP, "later", None),
        REFUND,
        RELEASE,
    ]
    order = at("charge-payment")
    order.steps[-1].step = "teleport"
    assert needs(order) == everything
    order = at("charge-payment")
    order.steps.pop()  # charge-payment's record gone: nothing active
    assert needs(order) == everything
