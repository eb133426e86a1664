"""The scheduler, the supervisor and the operator's admin on the in-memory state store and a
fake clock: no Azurite, no queues, no remote; milliseconds a test.

The store passes the same contract suite as the Table store
(``tests/integration/test_store_contract.py``); the queues and the agent transport
here only record what they are given.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from admin.service import OrderAdmin
from agents.binding import RequestBinding
from bootstrap import bootstrap
from core.errors import (
    ConcurrencyConflict,
    DuplicateRequest,
    StorageUnavailable,
    TransitionRefused,
    UnboundMessage,
)
from core.messages import AgentReply, AgentRequest
from core.model import Order
from core.names import Names
from core.order_message import decode_order
from core.outcome import Outcome
from core.ports import StateStore
from core.states import OrderStatus, StepState
from core.unit_of_work import CONFLICT_ATTEMPTS
from core.workflows import WORKFLOWS, Plan
from messaging import bound
from scheduler.service import OUTBOX_GRACE, SWEEP_GRACE, Handled, Scheduler
from stores.memory import InMemoryStateStore
from supervisor.service import SKEW_GRACE, Supervisor

# The fakes live in the test kit; the suite's tests import them from here, as before.
from testkit.fakes import RecordingKeeper as RecordingKeeper  # noqa: PLC0414
from testkit.fakes import RecordingQueues as RecordingQueues  # noqa: PLC0414
from testkit.fakes import RecordingTransport as RecordingTransport  # noqa: PLC0414
from testkit.fakes import Sent as Sent  # noqa: PLC0414
from tests.support import FakeClock, settings_from

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
TIMEOUT = 30


@dataclass
class Services:
    store: InMemoryStateStore
    clock: FakeClock
    queues: RecordingQueues
    transport: RecordingTransport
    keeper: RecordingKeeper
    names: Names
    scheduler: Scheduler
    supervisor: Supervisor
    admin: OrderAdmin
    #: the admin the HTTP API delivers events through (the next step claimed in process)
    events: OrderAdmin


def build(
    *,
    store: StateStore | None = None,
    like: Services | None = None,
    instance: str = "scheduler-1",
    max_failures: int = 3,
    reply_queues: str = "app-status",
    host: str = "",
) -> Services:
    """Every service on one store, clock, set of queues and transport (``like``'s, to build a
    second instance beside it; ``store`` to put something in front of the store), wired by
    the app's own ``bootstrap`` with in-memory twins and fakes passed in."""
    memory = like.store if like else InMemoryStateStore()
    clock = like.clock if like else FakeClock(T0)
    queues = like.queues if like else RecordingQueues()
    transport = like.transport if like else RecordingTransport()
    keeper = like.keeper if like else RecordingKeeper()
    names = Names()
    settings = settings_from(
        {
            "AzureWebJobsStorage": "UseDevelopmentStorage=true",  # never reached
            "AGENT_TRANSPORT": "storage",
            "STEP_TIMEOUT_SECONDS": str(TIMEOUT),
            "MAX_FAILURE_COUNT": str(max_failures),
            "REPLY_QUEUES": reply_queues,
            "WEBSITE_HOSTNAME": host,  # the app's own, as Azure and devhost set it
        }
    )
    app = bootstrap(
        replace(settings, instance_id=instance),
        names=names,
        clock=clock,
        store=store or memory,
        queues=queues,
        transport=transport,
        kept=keeper,
    )
    return Services(
        store=memory,
        clock=clock,
        queues=queues,
        transport=transport,
        keeper=keeper,
        names=names,
        scheduler=app.scheduler,
        supervisor=app.supervisor,
        admin=app.admin,
        events=app.events,
    )


@pytest.fixture
def s() -> Services:
    return build()


def submit(s: Services, order_id: str, **extra: Any) -> Handled:
    body = {"orderId": order_id, "replyTo": "app-status", **extra}
    return s.scheduler.submit(json.dumps(body).encode())


def reply_to(request: AgentRequest, outcome: Outcome = Outcome.SUCCEEDED, **kw: Any) -> AgentReply:
    if outcome is Outcome.SUCCEEDED:
        kw.setdefault("result", {"ok": True})
    kw.setdefault("token", request.token)  # carried back, as an agent does
    return AgentReply(
        request.order_id, request.step, request.attempt, request.complete_by, outcome, **kw
    )


def stored(s: Services, order_id: str) -> Order:
    order = s.store.load(order_id)
    assert order is not None
    return order


def statuses(s: Services, queue: str = "app-status") -> list[str]:
    return [m["status"] for m in s.queues.on(queue)]


def dispatches(s: Services) -> list[str]:
    return [m["orderId"] for m in s.queues.on(s.names.order_dispatch)]


def expire(s: Services) -> Any:
    """Move the clock past the active attempt's deadline (and the skew grace); supervise."""
    s.clock.advance(TIMEOUT + SKEW_GRACE.total_seconds() + 1)
    return s.supervisor.run()


# --- the happy path ----------------------------------------------------------------------


def test_submit_stores_claims_and_sends_the_agent_request(s: Services) -> None:
    assert submit(s, "o-1", sku="X") is Handled.ACCEPTED

    [request] = s.transport.requests
    assert (request.order_id, request.step, request.attempt) == ("o-1", "process", 1)
    assert request.complete_by == T0 + timedelta(seconds=TIMEOUT)
    assert request.order is not None and request.order["sku"] == "X"
    order = stored(s, "o-1")
    assert order.status is OrderStatus.PROCESSING
    assert order.steps[0].locked_by == "scheduler-1" and order.steps[0].attempt == 1
    assert statuses(s) == ["received", "processing"]
    # delivered notices leave the outbox
    assert list(s.store.stale_outbox(T0 + timedelta(days=1))) == []


def test_a_success_reply_completes_the_order(s: Services) -> None:
    submit(s, "o-ok")
    [request] = s.transport.requests
    s.clock.advance(3)

    assert s.scheduler.apply_reply(reply_to(request, result={"id": 7})) is Handled.APPLIED

    order = stored(s, "o-ok")
    assert order.status is OrderStatus.COMPLETED
    assert order.steps[0].process_state is StepState.PROCESSED
    assert order.steps[0].result == {"id": 7}
    assert statuses(s) == ["received", "processing", "completed"]
    assert list(s.store.expired_processing(T0 + timedelta(days=1))) == []
    assert list(s.store.due_pending(T0 + timedelta(days=1))) == []
    # the same reply again changes nothing
    assert s.scheduler.apply_reply(reply_to(request)) is not Handled.APPLIED
    assert stored(s, "o-ok") == order and len(s.transport.requests) == 1


def test_a_workflow_runs_step_after_step(s: Services) -> None:
    submit(s, "o-flow", workflow="fulfilment")
    for _ in range(3):
        s.scheduler.apply_reply(reply_to(s.transport.requests[-1]))
    steps = [(r.step, r.attempt) for r in s.transport.requests]
    assert steps == [("reserve-stock", 1), ("charge-payment", 1), ("ship", 1)]
    assert stored(s, "o-flow").status is OrderStatus.COMPLETED


# --- the supervisor -----------------------------------------------------------------------


def test_expiry_retries_then_fails_for_good_with_an_operator_alert(s: Services) -> None:
    submit(s, "o-slow")
    for attempt in (1, 2):
        report = expire(s)
        assert (report.examined, report.retried, report.failed) == (1, 1, 0)
        assert dispatches(s) == ["o-slow"] * attempt  # a re-dispatch, due at once
        assert s.scheduler.dispatch("o-slow") is Handled.DISPATCHED
        assert s.transport.requests[-1].attempt == attempt + 1
    assert s.queues.on(s.names.operator_alerts) == []

    report = expire(s)

    assert (report.examined, report.retried, report.failed) == (1, 0, 1)
    order = stored(s, "o-slow")
    assert order.status is OrderStatus.ERROR
    assert order.steps[0].process_state is StepState.ERROR
    assert order.steps[0].failure_count == 3
    [alert] = s.queues.on(s.names.operator_alerts)
    assert (alert["orderId"], alert["step"], alert["failureCount"]) == ("o-slow", "process", 3)
    assert "may have been applied" in alert["reason"]
    assert statuses(s)[-1] == "error"
    assert len(s.transport.requests) == 3
    # nothing left to supervise
    assert expire(s).examined == 0


def test_the_supervisor_leaves_a_step_alone_until_its_deadline_and_grace(s: Services) -> None:
    submit(s, "o-wait")
    s.clock.advance(TIMEOUT + SKEW_GRACE.total_seconds() - 0.5)
    assert s.supervisor.run().examined == 0
    s.clock.advance(1)
    assert s.supervisor.run().retried == 1


def test_a_late_success_after_the_expiry_still_completes(s: Services) -> None:
    submit(s, "o-late")
    [first] = s.transport.requests
    expire(s)
    assert s.scheduler.apply_reply(reply_to(first)) is Handled.NOTED
    assert stored(s, "o-late").status is OrderStatus.COMPLETED


# --- the operator -------------------------------------------------------------------------


def test_resubmit_puts_a_failed_order_back_to_work(s: Services) -> None:
    submit(s, "o-again")
    for _ in range(2):
        expire(s)
        s.scheduler.dispatch("o-again")
    expire(s)
    assert stored(s, "o-again").status is OrderStatus.ERROR

    s.clock.advance(60)
    view = s.admin.resubmit("o-again", "ops (test)", "fixed the remote")

    assert view["status"] == "processing"
    assert dispatches(s)[-1] == "o-again"
    assert s.scheduler.dispatch("o-again") is Handled.DISPATCHED
    request = s.transport.requests[-1]
    assert request.attempt == 4 and request.complete_by == s.clock() + timedelta(seconds=30)
    s.scheduler.apply_reply(reply_to(request))
    order = stored(s, "o-again")
    assert order.status is OrderStatus.COMPLETED
    assert [h["by"] for h in order.history if h["event"] == "resubmitted"] == ["ops (test)"]
    with pytest.raises(TransitionRefused):
        s.admin.resubmit("o-again", "ops")


def test_listing_and_counts_through_the_admin(s: Services) -> None:
    for n in range(5):
        submit(s, f"o-l{n}")
        s.clock.advance(1)
    s.scheduler.apply_reply(reply_to(s.transport.requests[2]))
    page = s.admin.page(OrderStatus.PROCESSING, page_size=3)
    assert [o["orderId"] for o in page["orders"]] == ["o-l4", "o-l3", "o-l1"]
    assert page["continuationToken"] is not None
    rest = s.admin.page(OrderStatus.PROCESSING, page_size=3, token=page["continuationToken"])
    assert [o["orderId"] for o in rest["orders"]] == ["o-l0"]
    counts = s.admin.counts()
    assert (counts["processing"], counts["completed"], counts["pending"]) == (4, 1, 0)


# --- races, duplicates, outages -----------------------------------------------------------


class SaveHook:
    """A store that runs ``before`` once, just before its next save (another instance
    moving the order in between this one's read and its write)."""

    def __init__(self, store: InMemoryStateStore, before: Any) -> None:
        self._store = store
        self._before = before

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def save(self, order: Order) -> Any:
        before, self._before = self._before, None
        if before is not None:
            before()
        return self._store.save(order)


def test_two_schedulers_claiming_one_step_have_one_winner() -> None:
    first = build(instance="scheduler-1")
    order = Order.accept(
        decode_order(json.dumps({"orderId": "o-race"})), Plan.of(WORKFLOWS["order"], 30), T0
    )
    first.store.create(order)  # stored, and its dispatch lost
    outcomes: list[Handled] = []
    second = build(
        like=first,
        instance="scheduler-2",
        store=SaveHook(first.store, lambda: outcomes.append(first.scheduler.dispatch("o-race"))),
    )

    outcomes.append(second.scheduler.dispatch("o-race"))

    assert outcomes == [Handled.DISPATCHED, Handled.NOTHING_TO_DO]  # first's, then second's
    [request] = first.transport.requests
    assert request.attempt == 1
    assert stored(first, "o-race").steps[0].locked_by == "scheduler-1"


def test_a_reply_racing_the_supervisor_is_applied_on_a_fresh_read(s: Services) -> None:
    submit(s, "o-both")
    [request] = s.transport.requests
    s.clock.advance(TIMEOUT + SKEW_GRACE.total_seconds() + 1)
    racing = build(like=s, store=SaveHook(s.store, s.supervisor.run))

    # the supervisor expires the attempt between the reply's read and its write; the
    # reply's save conflicts, it reads again, and the success still counts
    assert racing.scheduler.apply_reply(reply_to(request)) is Handled.NOTED
    order = stored(s, "o-both")
    assert order.status is OrderStatus.COMPLETED
    events = [h["event"] for h in order.steps[0].history]
    assert "expired" in events and events[-1] == "succeeded"


def test_a_duplicate_submit_stores_once_and_resends_the_same_attempt(s: Services) -> None:
    assert submit(s, "o-dup", sku="A") is Handled.ACCEPTED
    assert submit(s, "o-dup", sku="A") is Handled.DUPLICATE
    # The first delivery may have died before its send: the duplicate sends attempt 1's
    # request again (the same attempt and key: a second copy only adds its report).
    assert [(r.order_id, r.attempt) for r in s.transport.requests] == [("o-dup", 1)] * 2
    assert stored(s, "o-dup").version == 1  # created and claimed in one write: nothing more
    assert statuses(s) == ["received", "processing"]
    s.scheduler.apply_reply(reply_to(s.transport.requests[0]))
    assert submit(s, "o-dup", sku="A") is Handled.DUPLICATE  # reported: nothing to resend
    assert len(s.transport.requests) == 2


def test_the_same_id_with_other_content_is_rejected(s: Services) -> None:
    submit(s, "o-same", sku="A")
    assert submit(s, "o-same", sku="B") is Handled.REJECTED
    [record] = s.queues.on(s.names.orders_rejected)
    assert "already exists" in record["reason"] and '"sku": "B"' in record["message"]
    assert stored(s, "o-same").body["sku"] == "A" and len(s.transport.requests) == 1


def test_a_request_that_could_not_be_sent_is_no_try(s: Services) -> None:
    """docs/contracts.md §3.11: a claim whose request could not be sent is not counted and
    never "may have applied"; the step runs again soon."""
    s.transport.fail_next = 1
    assert submit(s, "o-lost") is Handled.ACCEPTED
    assert s.transport.requests == []
    step = stored(s, "o-lost").steps[0]
    assert step.process_state is StepState.PENDING and step.failure_count == 0
    [attempt] = step.attempts.items
    assert (attempt.ending, attempt.sent, str(attempt.applied)) == ("not-sent", False, "no")
    assert not step.may_have_applied and step.deferrals == 1
    assert dispatches(s) == ["o-lost"]  # queued for when it is due (a second or so)
    s.clock.advance((step.not_before - s.clock()).total_seconds())
    assert s.scheduler.dispatch("o-lost") is Handled.DISPATCHED
    assert [(r.order_id, r.attempt) for r in s.transport.requests] == [("o-lost", 2)]


def test_only_an_orders_first_request_may_wait_for_the_hosts_output_binding(
    s: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """messaging/bound.py: a request may wait in the invocation's outbox for the host only
    when a redelivered order would send it again (attempt 1, claimed at acceptance); any
    other leaves at once, so that a send that fails is seen and recorded as no try."""
    queue = s.names.agent_queue("orders")
    offered: list[tuple[str, int, bool]] = []
    real = s.transport.send_request

    def send(request: AgentRequest) -> bool:
        sent = real(request)
        offered.append((request.order_id, request.attempt, bound.offer(queue, "request")))
        return sent

    def invocation(work: Any) -> None:
        bound.sends([queue], lambda _: work(), lambda: lambda q, b: None, str)(
            "msg", **{bound.argument_for(queue): Out()}
        )

    monkeypatch.setattr(s.transport, "send_request", send)
    invocation(lambda: submit(s, "o-first"))
    s.transport.fail_next = 1  # attempt 1 not sent: attempt 2 is a later claim
    invocation(lambda: submit(s, "o-later"))
    s.clock.advance((stored(s, "o-later").steps[0].not_before - s.clock()).total_seconds())
    invocation(lambda: s.scheduler.dispatch("o-later"))
    assert offered == [("o-first", 1, True), ("o-later", 2, False)]


class Out:
    """A ``func.Out`` as the runtime passes one."""

    def __init__(self) -> None:
        self.value: Any = None

    def set(self, value: Any) -> None:
        self.value = value


def test_a_submit_that_died_before_its_send_is_sent_by_the_redelivery(
    s: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved and claimed, then the process died before the send: the order message's
    redelivery sends attempt 1's request, so the attempt is not left with no report."""
    with monkeypatch.context() as m:
        m.setattr(s.scheduler, "_send_request", lambda order, claimed: None)
        assert submit(s, "o-died") is Handled.ACCEPTED
    assert s.transport.requests == []
    assert submit(s, "o-died") is Handled.DUPLICATE  # the queue's redelivery
    assert [(r.order_id, r.attempt) for r in s.transport.requests] == [("o-died", 1)]
    s.scheduler.apply_reply(reply_to(s.transport.requests[0]))
    assert stored(s, "o-died").status is OrderStatus.COMPLETED


def test_a_store_outage_surfaces_as_storage_unavailable_and_changes_nothing(
    s: Services,
) -> None:
    s.store.fail_next(1, only=["create"])
    with pytest.raises(StorageUnavailable):
        submit(s, "o-down")
    assert s.store.load("o-down") is None and s.queues.sent == []
    assert submit(s, "o-down") is Handled.ACCEPTED  # the host's retry

    [request] = s.transport.requests
    s.store.fail_next(1)
    with pytest.raises(StorageUnavailable):
        s.scheduler.apply_reply(reply_to(request))
    assert stored(s, "o-down").status is OrderStatus.PROCESSING
    s.store.fail_next(1, only=["save"])
    with pytest.raises(StorageUnavailable):
        s.scheduler.apply_reply(reply_to(request))
    assert stored(s, "o-down").status is OrderStatus.PROCESSING
    assert s.scheduler.apply_reply(reply_to(request)) is Handled.APPLIED


def test_the_supervisor_rides_out_an_outage(s: Services) -> None:
    submit(s, "o-sup")
    s.clock.advance(TIMEOUT + SKEW_GRACE.total_seconds() + 1)
    s.store.fail_next(1, only=["expired_processing"])
    with pytest.raises(StorageUnavailable):
        s.supervisor.run()
    s.store.fail_next(1, only=["save"])
    report = s.supervisor.run()
    assert report.examined == 1 and report.retried == 0
    assert "StorageUnavailable" in report.errors[0]
    assert s.queues.on(s.names.operator_alerts) == []  # the next run retries: no alert
    assert s.supervisor.run().retried == 1


def test_notices_not_cleared_from_the_outbox_are_resent_by_the_sweep(s: Services) -> None:
    s.store.fail_next(1, only=["delete_outbox"])
    submit(s, "o-again-notice")
    assert statuses(s) == ["received", "processing"]  # sent; their rows stay
    assert s.scheduler.sweep().notices == 0  # not stale yet
    s.clock.advance(OUTBOX_GRACE.total_seconds() + 1)
    report = s.scheduler.sweep()
    assert report.notices == 2 and report.errors == []
    assert statuses(s) == ["received", "processing", "received", "processing"]  # at least once
    assert s.scheduler.sweep().notices == 0


def test_a_reply_queue_no_longer_listed_gets_no_notices_and_they_leave_the_outbox(
    s: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """An order accepted while REPLY_QUEUES listed its queue (or before the setting
    existed) gets no notices once it is no longer listed: they are checked when sent."""
    submit(s, "o-unlisted")
    assert statuses(s) == ["received", "processing"]
    narrower = build(like=s, instance="scheduler-2", reply_queues="")
    with caplog.at_level(logging.WARNING):
        narrower.scheduler.apply_reply(reply_to(s.transport.requests[0]))
    assert stored(s, "o-unlisted").status is OrderStatus.COMPLETED
    assert statuses(s) == ["received", "processing"]  # no "completed"
    assert any("REPLY_QUEUES is empty" in r.getMessage() for r in caplog.records)
    s.clock.advance(OUTBOX_GRACE.total_seconds() + 1)
    assert narrower.scheduler.sweep().notices == 0 and list(s.store.stale_outbox(s.clock())) == []


def test_a_reply_queue_that_does_not_exist_is_refused_unless_the_order_was_accepted(
    s: Services,
) -> None:
    s.queues.missing.add("app-status")
    assert submit(s, "o-nowhere") is Handled.REJECTED
    [record] = s.queues.on(s.names.orders_rejected)
    assert "'app-status' names a queue that does not exist" in record["reason"]
    assert s.store.load("o-nowhere") is None and s.transport.requests == []
    s.queues.missing.clear()
    assert submit(s, "o-there") is Handled.ACCEPTED
    s.queues.missing.add("app-status")  # deleted since: a redelivery is still a duplicate
    assert submit(s, "o-there") is Handled.DUPLICATE


def test_the_sweep_dispatches_a_step_whose_dispatch_was_lost(s: Services) -> None:
    submit(s, "o-swept")
    expire(s)  # back to Pending, and a dispatch message that is then lost
    assert dispatches(s) == ["o-swept"]
    assert stored(s, "o-swept").steps[0].process_state is StepState.PENDING
    assert s.scheduler.sweep().dispatched == 0  # within the grace: the dispatch may come
    s.clock.advance(SWEEP_GRACE.total_seconds() + 1)
    assert s.scheduler.sweep().dispatched == 1
    assert [(r.order_id, r.attempt) for r in s.transport.requests][-1] == ("o-swept", 2)


def test_a_conflict_that_never_ends_is_reported(s: Services) -> None:
    submit(s, "o-busy")
    [request] = s.transport.requests
    busy = ConcurrencyConflict("busy", order_id="o-busy")
    s.store.fail_next(CONFLICT_ATTEMPTS, busy, only=["save"])
    with pytest.raises(ConcurrencyConflict):
        s.scheduler.apply_reply(reply_to(request))
    assert stored(s, "o-busy").status is OrderStatus.PROCESSING
    assert s.scheduler.apply_reply(reply_to(request)) is Handled.APPLIED  # once it settles


def test_bidi_and_control_characters_from_outside_are_shown_escaped(s: Services) -> None:
    """A remote's error (or an operator's reason) with U+202E RIGHT-TO-LEFT OVERRIDE or a
    line break would reorder or split what a person reads in the history, the API, the
    console and the alert: where such text enters, it is written out as ``\\u202e``."""
    hostile = "refused \u202eexe.txt\nOPERATOR ALERT order=o-x step=ship\u0007"
    submit(s, "o-bidi")
    [request] = s.transport.requests
    s.scheduler.apply_reply(
        reply_to(request, Outcome.REFUSED, error=f"HTTP 422 {hostile}", applied="no")
    )
    order = stored(s, "o-bidi")
    assert order.status is OrderStatus.ERROR
    [alert] = s.queues.on(s.names.operator_alerts)
    step = order.steps[0]
    [attempt] = step.attempts.items
    shown = [
        alert["reason"],
        step.last_error or "",
        attempt.error or "",
        json.dumps(step.history, ensure_ascii=False),
    ]
    for text in shown:
        assert "\\u202e" in text and "\u202e" not in text and "\n" not in text, text
        assert "\u0007" not in text
    assert "\\u000aOPERATOR ALERT" in alert["reason"]

    s.admin.resubmit("o-bidi", "alice", "fixed \u202eit")
    [entry] = [h for h in stored(s, "o-bidi").history if h["event"] == "resubmitted"]
    assert entry["reason"] == "fixed \\u202eit"


def test_on_storage_queues_one_copy_of_a_resendable_request_takes_its_attempt(
    s: Services,
) -> None:
    """The same order delivered again while attempt 1 is in flight sends its request
    again; the binding lets the first copy read take the attempt (its message id, saved
    before any call) and refuses the others. A request never sent twice writes nothing."""
    submit(s, "o-copies")
    assert submit(s, "o-copies") is Handled.DUPLICATE
    first, again = s.transport.requests
    assert (first.attempt, again.attempt) == (1, 1)
    binding = RequestBinding(s.store, "orders", copies=True)
    version = stored(s, "o-copies").version

    assert binding(first, "m-1").order == stored(s, "o-copies").body
    assert stored(s, "o-copies").version == version + 1  # the take, saved
    with pytest.raises(DuplicateRequest):
        binding(again, "m-2")
    binding(first, "m-1")  # the same copy, redelivered: still its own
    [attempt] = stored(s, "o-copies").steps[0].attempts.items
    assert attempt.taken_by == "m-1"
    assert RequestBinding(s.store, "orders")(again, "m-2")  # Service Bus: no copies here

    expire(s)  # attempt 2: never resent, so nothing to take and nothing written
    step = stored(s, "o-copies").steps[0]
    s.clock.advance(max((step.not_before - s.clock()).total_seconds(), 0))
    assert s.scheduler.dispatch("o-copies") is Handled.DISPATCHED
    second = s.transport.requests[-1]
    assert second.attempt == 2
    version = stored(s, "o-copies").version
    binding(second, "m-3")
    binding(second, "m-4")
    assert stored(s, "o-copies").version == version


def test_a_claim_this_process_wrote_binds_its_request_with_no_request_to_the_store(
    s: Services,
) -> None:
    """``RequestBinding.at_hand``, which the agent asks on its event loop: the binding's
    own answer when what this process last wrote decides it; None (the binding runs, on
    the agent's threads) for an order not at hand, a request the order does not speak
    for, another agent's step, and a copy that must take its attempt (a write)."""
    submit(s, "o-hand")
    [request] = s.transport.requests
    version = stored(s, "o-hand").version
    binding = RequestBinding(s.store, "orders")
    assert binding.at_hand(request) == binding(request)
    assert binding.at_hand(replace(request, order_id="o-elsewhere")) is None
    assert binding.at_hand(replace(request, token="forged")) is None
    with pytest.raises(UnboundMessage):
        binding(replace(request, token="forged"))
    assert RequestBinding(s.store, "payments").at_hand(request) is None
    copies = RequestBinding(s.store, "orders", copies=True)
    assert copies.at_hand(request, "m-1") is None  # attempt 1 may come twice: it takes
    assert copies.at_hand(request) == binding(request)  # no message id: nothing to take
    assert stored(s, "o-hand").version == version  # nothing was written
