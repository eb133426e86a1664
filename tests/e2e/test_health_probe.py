"""An agent's health probe end to end (docs/contracts.md §3.11, 18: "a probe settles a lone
order"), in real processes (Azurite, the simulator, a devhost), on the tests' own
declarations (``tests/fixtures/probed.py``: the ``orders`` agent declares
``health="/health"``).

A lone order whose remote fails it (503, forever) while the service's health says healthy
ends ``error`` within its failure budget, with the usual alert (without the probe nothing
else is served, and it would wait the 30-minute deferral window). Then the remote is down
for all and its health says failing: the orders ride the outage out, uncounted, and
complete once it is back. Checked from outside: the orders in the table, the alerts on
their queue, what the simulator was asked.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from core.history import Happened
from core.states import OrderStatus
from demo.stack import LocalStack
from demo.verify import drain_alerts, drain_alerts_for
from tests.e2e.test_failure_semantics import assert_the_last_word_is_true
from tests.e2e.test_processes import log_tail, wait_terminal
from tests.support import declarations

pytestmark = pytest.mark.timeout(240)

PROBED = "tests.fixtures.probed"
SETTINGS = {
    "STEP_TIMEOUT_SECONDS": "3",
    "MAX_FAILURE_COUNT": "3",
    "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
    "ORDERS_DECLARATIONS": PROBED,
}
DEAD = {"fail": "transient", "times": 100000, "status": 503}
DOWN_FOR = 20  # seconds of 503 to every call


@pytest.fixture
def probed_stack() -> Iterator[LocalStack]:
    with (
        declarations(PROBED),  # the queues the stack creates are these declarations' agents
        LocalStack(devhosts=1, settings=SETTINGS) as stack,
    ):
        yield stack


def probes(stack: LocalStack) -> int:
    response = httpx.get(f"{stack.simulator_url}/_healthcheck", timeout=10)
    response.raise_for_status()
    count: int = response.json()["probes"]
    return count


def test_the_probe_tells_a_lone_failing_order_from_an_outage(probed_stack: LocalStack) -> None:
    stack = probed_stack

    # 1. A lone order the remote fails, the service healthy: its own failure, counted.
    stack.submit({"orderId": "lone-dead", "simulate": {"process": DEAD}})
    dead = wait_terminal(stack, ["lone-dead"], 90)["lone-dead"]
    step = dead.steps[0]
    assert dead.status is OrderStatus.ERROR, (step.history, log_tail(stack))
    assert step.failure_count == 3, step.history
    assert any(h["event"] == Happened.TRANSIENT for h in step.history), step.history  # blamed
    alerts = drain_alerts_for(stack.context, ["lone-dead"])  # it leaves after the save
    assert {a["orderId"] for a in alerts} == {"lone-dead"}, alerts
    assert_the_last_word_is_true(dead, alerts, stack.remote_calls())  # "not applied", mostly
    assert probes(stack) >= 1

    # 2. Down for all, the service saying so: an outage, ridden out.
    stack.outage({"mode": "error", "status": 503, "seconds": DOWN_FOR})
    stack.health({"healthy": False, "seconds": DOWN_FOR + 2})  # failing until after it
    asked = probes(stack)
    riders = [f"rider-{n}" for n in range(3)]
    for order_id in riders:
        stack.submit({"orderId": order_id})
    orders = wait_terminal(stack, riders, DOWN_FOR + 90)

    for order_id, order in orders.items():
        step = order.steps[0]
        assert order.status is OrderStatus.COMPLETED, (order_id, step.history, log_tail(stack))
        assert step.failure_count == 0, (order_id, step.history)
        assert any(h["event"] == Happened.DEFERRED for h in step.history), (order_id, step.history)
        assert not any(h["event"] == Happened.TRANSIENT for h in step.history), step.history
    assert drain_alerts(stack.context) == []
    # Whether it asked again here depends on timing (a verdict holds for an interval, and
    # an attempt with too little time left does not start one): with or without a fresh
    # "failing", nothing was counted, which is the promise.
    print(f"\nhealth probes during the outage: {probes(stack) - asked}")
