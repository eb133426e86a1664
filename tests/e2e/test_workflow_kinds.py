"""What a workflow can say (docs/contracts.md §3.13) end to end, on both agent transports:
real processes (Azurite, the simulator, two devhosts; Service Bus on localbus), the tests'
own declarations (``tests/fixtures/flows.py``). A parallel group's steps are requested at
once and the order completes with each effect once; an order waits for an approval sent
over HTTP, holds for a delay, and completes when the bank's callback comes. The step
after the delay is called promptly: within 1.5 s of the delay's time on Service Bus (a
scheduled wake-up, pushed: messaging/dispatch.py), within the Storage bound (1 s of
rounding, none for ``seconds=``, plus ``maxPollingInterval``) on Storage queues."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from core.timefmt import parse_iso
from demo.stack import LocalStack
from simulator import effects_by_order, load_ledger
from tests.e2e.conftest import FAST
from tests.e2e.test_processes import TRANSPORTS, load, log_tail, wait_terminal
from tests.support import callback_token, declarations, wait_for

pytestmark = pytest.mark.timeout(240)
FLOWS = "tests.fixtures.flows"


@pytest.fixture(params=TRANSPORTS)
def flows_stack(request: pytest.FixtureRequest) -> Iterator[LocalStack]:
    with (
        declarations(FLOWS),  # the queues the stack creates are these declarations' agents
        LocalStack(settings={**FAST, "ORDERS_DECLARATIONS": FLOWS}, transport=request.param) as s,
    ):
        yield s


def view(stack: LocalStack, order_id: str) -> dict[str, Any] | None:
    """The order as the API shows it (None until it is accepted)."""
    response = httpx.get(f"{stack.http_url}/api/orders/{order_id}", timeout=10)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def waiting_for(stack: LocalStack, order_id: str, event: str) -> None:
    def waits() -> bool:
        order = view(stack, order_id)
        return order is not None and any(w.get("event") == event for w in order["waitingFor"])

    wait_for(waits, 60, interval=0.2, what=f"{order_id} to wait for {event}")


def post_event(
    stack: LocalStack, order_id: str, name: str, body: dict[str, Any], token: str | None = None
) -> int:
    """As devhost's development principal (an operator), or, with ``token``, as the remote
    on its capability URL (docs/contracts.md §3.15)."""
    response = httpx.post(
        f"{stack.http_url}/api/orders/{order_id}/events/{name}",
        params={"token": token} if token else None,
        json=body,
        timeout=10,
    )
    return response.status_code


def test_parallel_steps_events_delays_and_callbacks_end_to_end(flows_stack: LocalStack) -> None:
    stack = flows_stack
    stack.submit({"orderId": "wf-trip", "workflow": "trip"})
    stack.submit({"orderId": "wf-quick", "workflow": "quick"})
    waiting_for(stack, "wf-quick", "ok")
    assert post_event(stack, "wf-quick", "ok", {"result": {"by": "e2e"}, "reason": "fine"}) == 200
    # after the 2 s pause (not before its time: checked below on the order's own record)
    waiting_for(stack, "wf-quick", "captured")  # the bank accepted
    # the bank's callback comes on its URL (a person cannot send it: 403)
    assert post_event(stack, "wf-quick", "captured", {"result": {"ref": "C-1"}}) == 403
    accepted = load(stack, "wf-quick")
    assert accepted is not None
    token = callback_token(accepted, "captured")
    assert post_event(stack, "wf-quick", "captured", {"result": {"ref": "C-1"}}, token) == 200
    orders = wait_terminal(stack, ["wf-trip", "wf-quick"], 90)
    assert {k: str(o.status) for k, o in orders.items()} == {
        "wf-trip": "completed",
        "wf-quick": "completed",
    }, log_tail(stack)
    effects = effects_by_order(load_ledger(stack.ledger_path))
    assert sorted(effects["wf-trip"]) == ["book-flight", "book-hotel", "charge"]
    assert effects["wf-quick"] == ["capture"]
    trip = orders["wf-trip"]
    claims = {
        s.step: parse_iso(next(h["at"] for h in s.history if h["event"] == "claimed"))
        for s in trip.steps
    }
    # the two bookings were claimed together (one save), the charge after both
    assert claims["book-flight"] == claims["book-hotel"] < claims["charge"]
    quick = orders["wf-quick"]
    assert quick.find("capture").result == {"ref": "C-1"}  # type: ignore[union-attr]
    pause = quick.find("pause")
    assert pause is not None
    until = parse_iso(str(pause.decided["until"])).timestamp()
    called = min(
        parse_iso(c["at"]).timestamp()
        for c in stack.remote_calls()
        if c.get("idempotencyKey") == "wf-quick:capture"
    )
    lag = called - until
    print(f"\n{stack.transport}: the step after Delay(seconds=2) called {lag * 1000:.0f} ms late")
    # never before its time; how late is a figure (about 1 s on Service Bus, the 2 s poll
    # on Storage: docs/benchmarks.md), not a check, on a shared machine
    assert lag >= 0, lag
