"""Per-key concurrency (docs/contracts.md §3.16) end to end: real processes (Azurite, the
simulator, two devhosts) on the tests' declarations with keyed workflows
(``tests/fixtures/turns.py``). Orders of one key run one after the other, in order of
acceptance, across both instances; another key's order does not wait for them; the
API shows the key, and finds the orders by it. On both agent transports (Storage queues
and Service Bus, ``test_processes.TRANSPORTS``), as the other e2e tests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.states import OrderStatus
from demo.stack import LocalStack
from tests.e2e.conftest import FAST
from tests.e2e.test_processes import TRANSPORTS, log_tail, wait_terminal
from tests.support import declarations

pytestmark = pytest.mark.timeout(240)
TURNS = "tests.fixtures.turns"


@pytest.fixture(params=TRANSPORTS)
def turns_stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    """The stack on each agent transport (Storage queues, then Service Bus on localbus)."""
    with (
        declarations(TURNS),
        LocalStack(settings={**FAST, "ORDERS_DECLARATIONS": TURNS}, transport=request.param) as s,
    ):
        yield s


def api(stack: LocalStack, path: str, **params: str) -> Any:
    response = httpx.get(f"{stack.http_url}/api/{path}", params=params, timeout=10)
    response.raise_for_status()
    return response.json()


def test_orders_of_one_key_take_turns_across_instances(turns_stack: LocalStack) -> None:
    stack = turns_stack
    serial = [f"tk-acme-{n}" for n in range(4)]
    for order_id in serial:
        stack.submit({"orderId": order_id, "workflow": "serial", "account": "acme"})
    stack.submit({"orderId": "tk-globex", "workflow": "serial", "account": "globex"})

    ended = wait_terminal(stack, [*serial, "tk-globex"], quiet=60)

    assert all(o.status is OrderStatus.COMPLETED for o in ended.values()), log_tail(stack)
    # one at a time (two instances took the messages: the order of acceptance is theirs):
    # each began after the one before it ended
    runs = []
    for order_id in serial:
        order = ended[order_id]
        first = order.steps[0].attempts.get(1)
        assert first is not None
        runs.append((first.claimed_at, order.updated_at, order_id))
    runs.sort()
    for before, after in itertools.pairwise(runs):
        assert after[0] >= before[1], f"{after[2]} began before {before[2]} ended"
    shown = api(stack, f"orders/{serial[-1]}")
    assert shown["turn"]["key"] == "acme" and shown["turn"]["holders"] == []
    found = api(stack, "orders", turn="acme")
    assert sorted(o["orderId"] for o in found["orders"]) == serial
