"""Messages on the app's own queues that no claim speaks for (docs/contracts.md §3.3), end to
end on both agent transports: a forged success, a forged request for an order that does
not exist, and a genuine request put on another agent's queue (a confused deputy). None
is applied or run; each is quarantined and an operator is alerted. Anyone who can write
to a queue (a deploying principal with Data Sender on the namespace, queue rights on the
account) could do this before: complete a refused order, make an agent refund a
stranger with its own credentials, or make the orders agent ship.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from core.messages import AgentReply, AgentRequest
from core.outcome import Outcome
from demo.stack import LocalStack
from demo.verify import drain_alerts
from tests.e2e.test_processes import TRANSPORTS, log_tail, wait_terminal

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_messages_no_claim_speaks_for_are_quarantined_never_applied_or_run(
    stack: LocalStack,
) -> None:
    ctx = stack.context
    refused, shipped = "forged-refused", "forged-shipped"
    stack.submit({"orderId": refused, "simulate": {"process": "permanent"}})
    stack.submit({"orderId": shipped, "workflow": "fulfilment"})
    orders = wait_terminal(stack, [refused, shipped], 90)
    assert (str(orders[refused].status), str(orders[shipped].status)) == ("error", "completed")
    drain_alerts(ctx)  # the refusal's own alert
    calls_before = len(stack.remote_calls())
    soon = datetime.now(UTC) + timedelta(seconds=60)

    # 1. a success the remote never gave, for the order it refused
    ctx.transport.send_reply(
        AgentReply(refused, "process", 1, soon, Outcome.SUCCEEDED, {}, token="f" * 32)
    )
    # 2. a refund for an order that does not exist, with the sender's body
    ghost = {"orderId": "ghost-1", "amount": 1_000_000}
    ctx.transport.send_request(
        AgentRequest(
            "ghost-1", "refund-payment", 1, soon, "refund-payment", ghost, agent="payments"
        )
    )
    # 3. the ship request of a real order, with its genuine token, on the orders agent
    order = ctx.store.load(shipped)
    assert order is not None
    ship = order.find("ship")
    assert ship is not None
    ctx.transport.send_request(
        AgentRequest(
            shipped,
            "ship",
            ship.attempt,
            soon,
            "ship",
            order.body,
            agent="orders",
            token=ship.token_for(ship.attempt),
        )
    )

    alerts: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(alerts) < 3:
        alerts += drain_alerts(ctx)
        time.sleep(0.5)
    reasons = sorted(str(a["reason"]) for a in alerts)
    assert len(alerts) == 3, (reasons, log_tail(stack))
    assert any("its token is not that attempt's" in r for r in reasons), reasons
    assert any("order ghost-1, which does not exist" in r for r in reasons), reasons
    assert any("runs on agent 'carrier', not on 'orders'" in r for r in reasons), reasons
    # nothing was called, nothing changed
    assert len(stack.remote_calls()) == calls_before
    reread = ctx.store.load(refused)
    assert reread is not None and str(reread.status) == "error"
