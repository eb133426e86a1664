"""observability/opcount.py: requests counted by kind and by who made them."""

from __future__ import annotations

import pytest

from observability.opcount import _kind, agent_queue, origin


@pytest.mark.parametrize(
    ("service", "method", "path", "kind"),
    [
        ("table", "POST", "/devstoreaccount1/$batch", "table.batch"),
        ("table", "GET", "/devstoreaccount1/OrderState()", "table.query"),
        ("queue", "POST", "/devstoreaccount1/orders/messages", "queue.send"),
        ("queue", "GET", "/devstoreaccount1/orders/messages", "queue.receive"),
        ("queue", "DELETE", "/devstoreaccount1/orders/messages/abc", "queue.delete"),
        ("queue", "PUT", "/devstoreaccount1/orders/messages/abc", "queue.update"),
    ],
)
def test_requests_are_counted_by_kind(service: str, method: str, path: str, kind: str) -> None:
    assert _kind(service, method, path) == kind


@pytest.mark.parametrize(
    ("kind", "thread", "who"),
    [
        ("table.batch", "devhost-submit_order_0", "app"),
        ("queue.send", "devhost-run_agent_orders_3", "app"),
        ("queue.receive", "poll-submit_order", "host"),
        ("queue.delete", "devhost-submit_order_0", "host"),  # settled after the function
        ("queue.update", "renew-submit_order", "host"),
        ("table.query", "timer-supervisor_tick", "timer"),
        ("queue.receive", "timer-poison_watch", "timer"),
    ],
)
def test_requests_are_attributed_to_the_app_the_host_or_a_timer(
    kind: str, thread: str, who: str
) -> None:
    assert origin(kind, thread) == who


def test_a_request_from_a_timer_invocation_is_the_timers_on_any_thread() -> None:
    # Through the runtime every function runs on its shared pool ("ThreadPoolExecutor-0_3").
    assert origin("table.query", "ThreadPoolExecutor-0_3", "timerTrigger") == "timer"
    assert origin("table.query", "ThreadPoolExecutor-0_3", "queueTrigger") == "app"
    assert origin("queue.delete", "ThreadPoolExecutor-0_3", None) == "host"


@pytest.mark.parametrize(
    ("path", "agent"),
    [
        ("/devstoreaccount1/agent-requests-orders/messages", True),
        ("/agent-requests-inventory-t1/messages/abc", True),
        ("/devstoreaccount1/agent-replies/messages", True),
        ("/devstoreaccount1/orders/messages", False),
        ("/devstoreaccount1/order-dispatch/messages/abc", False),
        ("/devstoreaccount1/agent-requests-orders", False),  # the queue itself, not a message
    ],
)
def test_agent_queue_messages_are_told_apart(path: str, agent: bool) -> None:
    """What would be Service Bus operations with AGENT_TRANSPORT=servicebus."""
    assert agent_queue(path) is agent
