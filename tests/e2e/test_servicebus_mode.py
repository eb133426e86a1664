"""The app with ``AGENT_TRANSPORT=servicebus``, end to end: the agent queues on ``localbus``
(the local Service Bus double, tests/localbus/test_contract.py), reached through the real
azure-servicebus SDK by the app's transport and devhost's Service Bus listener.

What only Service Bus does, checked from outside (the table, the alerts, the simulator's
ledger and call log): a request whose agent dies on every delivery (redelivered, then
dead-lettered, then an operator alert); requests that expire before any agent runs
(never delivered, reported as not called). The pipeline and an agent killed mid-call run
on both transports from one body (test_processes.py, ``TRANSPORTS``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from demo.stack import LocalStack
from demo.verify import drain_alerts
from simulator import effects_by_order, load_ledger
from tests.e2e.test_processes import AGENT_FUNCTIONS, log_tail, wait_terminal
from tests.support import wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.parametrize("transport", ["servicebus"])]


@pytest.mark.parametrize(
    "stack",
    [
        {
            "settings": {"STEP_TIMEOUT_SECONDS": "90"},  # the request outlives it all
            "bus_options": {"lock-duration": "2"},
            "devhost_args": [["--only", AGENT_FUNCTIONS], ["--exclude", AGENT_FUNCTIONS]],
            "devhost_env": [{"ORDERS_FAILPOINTS": "agent-after-call"}, {}],
        }
    ],
    indirect=True,
)
def test_a_request_whose_agent_always_dies_is_redelivered_then_dead_lettered(
    stack: LocalStack,
) -> None:
    """The agent process dies in every invocation (after the remote call, before its
    reply): Service Bus redelivers the request once each lock lapses, up to the max
    delivery count (5), then dead-letters it; the dead-letter trigger raises an alert."""
    order_id = "sb-always-dies"
    stack.submit({"orderId": order_id})
    deadline = time.monotonic() + 120
    alerts: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not alerts:
        if not stack.hosts[0].alive:
            stack.restart(0)  # a new process, as the host would start one
        alerts = [a for a in drain_alerts(stack.context) if a.get("orderId") == order_id]
        time.sleep(0.5)
    assert alerts, log_tail(stack)
    [alert] = alerts
    assert str(alert["poisonQueue"]).endswith("/$DeadLetterQueue"), alert
    assert str(alert["queue"]).startswith("agent-requests"), alert
    assert "MaxDeliveryCountExceeded" in alert["reason"], alert
    # Each of the 5 deliveries reached the remote (the agent died after its call), and
    # the remote applied the effect once: the idempotency key held across redeliveries.
    key = f"{order_id}:process"
    calls = [c for c in stack.remote_calls() if c["idempotencyKey"] == key]
    assert len(calls) == 5, calls
    assert effects_by_order(load_ledger(stack.ledger_path))[order_id] == ["process"]
    order = stack.context.store.load(order_id)
    assert order is not None and order.steps[0].attempt == 1  # all on one request


@pytest.mark.parametrize(
    "stack",
    [
        {
            "settings": {"STEP_TIMEOUT_SECONDS": "6", "MAX_FAILURE_COUNT": "5"},
            "devhost_args": [["--only", AGENT_FUNCTIONS], ["--exclude", AGENT_FUNCTIONS]],
            "autostart": False,
        }
    ],
    indirect=True,
)
def test_requests_that_expire_before_any_agent_runs_are_no_tries(stack: LocalStack) -> None:
    """A request's time to live is the time left before its deadline: while no agent
    runs, each attempt's request expires on the queue. When an agent starts, it gets only
    the live one (an expired request delivered would be a remote call for it: the agent
    calls before it looks at the deadline). The expired ones are dead-lettered and
    reported as not called (docs/contracts.md §3.11: a request never read is no try): no
    failure counted, no doubt, and no alert."""
    order_id = "sb-ttl"
    stack.hosts[1].start()  # everything but the agents
    stack.submit({"orderId": order_id})

    def third_attempt_claimed() -> bool:
        order = stack.context.store.load(order_id)
        return order is not None and order.steps[0].attempt >= 3

    wait_for(third_attempt_claimed, 60, what="two attempts to expire unanswered")
    assert stack.remote_calls() == []
    stack.hosts[0].start()
    [order] = wait_terminal(stack, [order_id], 60).values()
    assert str(order.status) == "completed", log_tail(stack)
    calls = [c for c in stack.remote_calls() if c["idempotencyKey"] == f"{order_id}:process"]
    assert len(calls) == 1, (calls, order.steps[0].history)
    assert order.steps[0].attempt >= 3

    def reported_as_not_called() -> bool:
        # The broker moves a request that expired when a receiver next looks at its queue;
        # the report may come after the order completed: the attempt is then "applied no".
        reread = stack.context.store.load(order_id)
        assert reread is not None
        earlier = reread.steps[0].attempts.items[:-1]
        return len(earlier) >= 2 and all(a.applied == "no" for a in earlier)

    wait_for(reported_as_not_called, 30, what="the expired requests reported as not called")
    assert drain_alerts(stack.context) == []
    assert effects_by_order(load_ledger(stack.ledger_path))[order_id] == ["process"]
