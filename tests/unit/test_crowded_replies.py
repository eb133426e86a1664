"""A crowded order (``core.unit_of_work.Crowded``): a ``ForEach``'s items that end
together all apply their replies to the one order record, If-Match, and each round
only one wins. The reply path tries again with one more attempt per rival step in
flight, each after a short random wait, so a reply that loses many races in a row is
still applied in process instead of going round through the reply queue; a step alone
keeps the usual attempts and no wait. Each attempt is still one read and one If-Match
save of one decision. The waits are a fake (``bootstrap``'s ``sleep`` part): no test
here sleeps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bootstrap import bootstrap
from bootstrap.parts import AppContext
from core.errors import ConcurrencyConflict
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.outcome import Outcome
from core.states import StepState
from core.unit_of_work import (
    CONFLICT_ATTEMPTS,
    CROWDED_ATTEMPTS_MAX,
    CROWDED_WAIT_MAX,
    CROWDED_WAIT_STEP,
    Crowded,
)
from stores.memory import InMemoryStateStore
from testkit.fakes import RecordingKeeper, RecordingQueues, RecordingTransport
from tests.fixtures.wide_items import WIDTH
from tests.support import FakeClock, declarations, settings_from
from tests.unit.test_services_in_memory import T0

WIDE = "tests.fixtures.wide_items"


class Saves(InMemoryStateStore):
    """The in-memory store, counting the saves (each one If-Match transaction)."""

    def __init__(self) -> None:
        super().__init__()
        self.saves = 0

    def save(self, order: Order) -> Any:
        self.saves += 1
        return super().save(order)


@dataclass
class Wide:
    app: AppContext
    store: Saves
    transport: RecordingTransport
    waits: list[float]


@pytest.fixture
def wide() -> Iterator[Wide]:
    waits: list[float] = []
    store, transport = Saves(), RecordingTransport()
    settings = settings_from(
        {
            "AzureWebJobsStorage": "UseDevelopmentStorage=true",  # never reached
            "AGENT_TRANSPORT": "storage",
            "ORDERS_DECLARATIONS": WIDE,
        }
    )
    with declarations(WIDE):
        app = bootstrap(
            replace(settings, instance_id="scheduler-1"),
            clock=FakeClock(T0),
            store=store,
            queues=RecordingQueues(),
            transport=transport,
            kept=RecordingKeeper(),
            sleep=waits.append,
        )
        yield Wide(app, store, transport, waits)


def submit(w: Wide, order_id: str, items: int, workflow: str = "wide") -> list[AgentRequest]:
    body = {"orderId": order_id, "workflow": workflow, "lines": [{"n": i} for i in range(items)]}
    w.app.scheduler.submit(json.dumps(body).encode())
    return list(w.transport.requests)


def reply_to(request: AgentRequest) -> AgentReply:
    return AgentReply(
        request.order_id,
        request.step,
        request.attempt,
        request.complete_by,
        Outcome.SUCCEEDED,
        result={"ok": True},
        token=request.token,
    )


def lose(w: Wide, races: int) -> None:
    w.store.fail_next(races, ConcurrencyConflict("another item saved first"), only=["save"])


def test_a_reply_that_loses_many_races_on_a_crowded_order_is_still_applied_in_process(
    wide: Wide,
) -> None:
    requests = submit(wide, "o-wide", 2 * WIDTH)
    assert len(requests) == WIDTH  # ten items in flight: each reply has nine rivals
    races = CONFLICT_ATTEMPTS + WIDTH - 2  # more than the usual attempts allow
    lose(wide, races)
    saves = wide.store.saves

    sent = wide.app.agent_transport.send_reply(reply_to(requests[0]))

    assert sent is True and wide.transport.replies == []  # not through the reply queue
    order = wide.store.load("o-wide")
    assert order is not None
    step = order.find(requests[0].step)
    assert step is not None and step.process_state is StepState.PROCESSED
    # one If-Match save per try of the reply, and the claim of the item started in its place
    assert wide.store.saves - saves == races + 1 + 1
    assert len(wide.waits) == races  # a wait before each try again...
    for lost, waited in enumerate(wide.waits, start=1):  # ...short, growing with the losses
        assert 0 <= waited <= min(CROWDED_WAIT_MAX, CROWDED_WAIT_STEP * lost)


def test_a_crowded_reply_still_gives_up_after_one_more_attempt_per_rival(wide: Wide) -> None:
    requests = submit(wide, "o-jammed", 2 * WIDTH)
    tries = CONFLICT_ATTEMPTS + WIDTH - 1  # the usual, and one per rival
    lose(wide, tries)

    with pytest.raises(ConcurrencyConflict, match="kept changing"):
        wide.app.scheduler.apply_reply(reply_to(requests[0]))

    assert len(wide.waits) == tries - 1  # none after the last
    # the jam is over: the reply queue's retry of it is applied
    assert wide.app.agent_transport.send_reply(reply_to(requests[0])) is True
    assert wide.transport.replies == []


def test_a_reply_to_a_step_alone_keeps_the_usual_attempts_and_does_not_wait(
    wide: Wide,
) -> None:
    [request] = submit(wide, "o-lone", 1)
    lose(wide, CONFLICT_ATTEMPTS)

    with pytest.raises(ConcurrencyConflict):
        wide.app.scheduler.apply_reply(reply_to(request))

    assert wide.waits == []


def _order(in_flight: int) -> Order:
    steps = [SimpleNamespace(process_state=StepState.PROCESSING)] * in_flight
    return cast(Order, SimpleNamespace(active_steps=lambda: steps))


@pytest.mark.parametrize(
    ("rivals", "attempts"),
    [(0, CONFLICT_ATTEMPTS), (3, CONFLICT_ATTEMPTS + 3), (100, CROWDED_ATTEMPTS_MAX)],
)
def test_crowded_tries_once_more_per_rival_up_to_its_bound(rivals: int, attempts: int) -> None:
    waits: list[float] = []
    crowded = Crowded(waits.append, draw=lambda: 0.5)
    order = _order(rivals)
    assert all(crowded(order, lost) for lost in range(1, attempts))
    assert not crowded(order, attempts)
    expected = [0.5 * min(CROWDED_WAIT_MAX, CROWDED_WAIT_STEP * n) for n in range(1, attempts)]
    assert waits == (expected if rivals else [])
