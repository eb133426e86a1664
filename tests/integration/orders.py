"""Orders as the listing, search and retention tests make and read them (and the tests
that borrow their orders): an order accepted from its message, the request a claimed
step sends, and every page of a listing."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from core.messages import AgentRequest
from core.model import Order
from core.order_message import decode_order
from core.steps import StepRecord
from core.workflows import WORKFLOWS, Plan


def accept(order_id: str, at: datetime, workflow: str = "order", **data: Any) -> Order:
    """The order ``order_id`` of ``workflow`` accepted at ``at``, with ``data`` in its body
    (not stored)."""
    message = decode_order(json.dumps({"orderId": order_id, "workflow": workflow, **data}))
    return Order.accept(message, Plan.of(WORKFLOWS[workflow], 30), at)


def request_for(step: StepRecord) -> AgentRequest:
    """The request of a claimed step's current attempt, as its agent receives it (no order
    data)."""
    return AgentRequest(
        step.order_id,
        step.step,
        step.attempt,
        step.complete_by,
        step.path,
        {},
        token=step.token_for(step.attempt),
    )


def every_page(
    read: Callable[[str | None], tuple[list[str], str | None]], most: int = 100
) -> list[list[str]]:
    """The ids of each page ``read(token)`` gives, from the first (``None``) on, each read
    with the token of the one before, up to the one that hands out none; after ``most``
    pages, ``AssertionError``."""
    pages: list[list[str]] = []
    token: str | None = None
    for _ in range(most):
        ids, token = read(token)
        pages.append(ids)
        if token is None:
            return pages
    raise AssertionError("the pages never ended")
