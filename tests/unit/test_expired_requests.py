"""An expired Service Bus request, end to end on a fake clock: localbus's queue rules
(``localbus.entities``) give the delivery count, the host adds 1 as its .NET SDK does,
``ExpiredRequests`` reports or leaves the request alone, and the order applies what was
reported as the scheduler would (a stale report is dropped).

The rules (supervisor/expired.py): a count of exactly 1 proves that no delivery ended
unsettled, whether to an agent or to the dead-letter trigger, so the request was never
read. It is reported "not called", once, even when the trigger runs again. A higher count
may be an agent's delivery, so the attempt keeps its doubt and no report claims otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from datetime import datetime, timedelta

import pytest

from core.errors import StorageUnavailable, TransitionRefused
from core.messages import AgentRequest
from core.outcome import Applied
from core.policy import RetryPolicy
from core.states import OrderStatus, StepState
from localbus.entities import TTL_EXPIRED_REASON, Entity, QueueConfig, Stored, make_queue
from supervisor.expired import UNREAD, ExpiredRequests, maybe_read, unsent_report
from tests.unit.test_model import T0, new_order
from tests.unit.test_remote_client import FakeClock, RecordingTransport

POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=600)
LOCK = 10.0  # seconds; the step's timeout is 30 s (new_order)


class Expiry:
    """One claimed attempt whose request waits on a queue, and the supervisor's side."""

    def __init__(self) -> None:
        self.order = new_order()
        self.step = self.order.claim("i-1", T0)
        self.deadline = self.step.complete_by
        self.request = AgentRequest(
            self.order.order_id,
            self.step.step,
            self.step.attempt,
            self.deadline,
            self.step.path,
            self.order.body,
            agent="orders",
            token=self.step.token_for(self.step.attempt),
        )
        self.queue: Entity = make_queue(QueueConfig("agent-requests-orders", lock_duration=LOCK))
        ttl = (self.deadline - T0).total_seconds()  # contract 3.3: the time left
        self.queue.enqueue(self.request.encode().encode(), "o-1:process:1", ttl, 0.0, 1)
        self.transport = RecordingTransport()
        self.clock = FakeClock(T0)  # the orders' clock, moved to each trigger's time
        self.expired = ExpiredRequests(self.transport, self.clock)
        self.applied = 0

    def at(self, seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    def agent_takes(self, now: float) -> Stored:
        taken = self.queue.take(now, lock=True)
        assert taken is not None and taken.lock_token is not None
        return taken

    def sweep(self, now: float) -> None:
        """The supervisor's expiry of the attempt (no report yet: it may have applied)."""
        self.order.expire(self.at(now), POLICY)

    def dead_letter(self, now: float) -> tuple[Stored, int]:
        """The trigger's delivery: the message and the count the host gives it."""
        assert self.queue.dead_letters is not None
        self.queue.expire(now)  # the broker moves what expired (when a receiver looks)
        dead = self.queue.dead_letters.take(now, lock=True)
        assert dead is not None and dead.dead_letter_reason == TTL_EXPIRED_REASON
        return dead, dead.delivery_count + 1  # the host's .NET SDK adds 1

    def trigger(self, now: float, *, fails: bool = False, sends: bool = True) -> str:
        """One run of the dead-letter trigger: report (if the transport takes it), then
        complete; or fail after its report (``fails``) and be abandoned, so the message
        comes back to it."""
        assert self.queue.dead_letters is not None
        dead, deliveries = self.dead_letter(now)
        self.clock.now = self.at(now)
        self.transport.failures = 0 if sends else 10**6
        verdict: str
        try:
            verdict = self.expired.report(dead.payload, deliveries)
        except StorageUnavailable:  # the send failed: the invocation fails
            verdict, fails = "failed", True
        self.apply_reports(now)
        assert dead.lock_token is not None
        if fails:
            self.queue.dead_letters.abandon(dead.lock_token, now)
        else:
            self.queue.dead_letters.complete(dead.lock_token, now)
        return verdict

    def apply_reports(self, now: float) -> None:
        for reply, _ in self.transport.replies[self.applied :]:
            self.applied += 1
            with suppress(TransitionRefused):  # a stale report: the scheduler drops it
                self.order.apply_reply(reply, self.at(now), POLICY)

    def in_doubt(self) -> bool:
        return self.step.maybe_applied == [1]

    def not_called_reports(self) -> int:
        return sum(r.applied is Applied.NO for r, _ in self.transport.replies)


def test_a_request_never_delivered_is_reported_not_called_and_its_failure_given_back() -> None:
    case = Expiry()
    case.sweep(31)
    assert case.in_doubt() and case.step.failure_count == 1  # what the expiry assumed
    assert case.trigger(40) == "reported"
    assert not case.in_doubt() and case.step.failure_count == 0
    assert case.not_called_reports() == 1


def test_a_report_that_comes_before_the_supervisors_sweep_frees_the_step_uncounted() -> None:
    """The request expires at its deadline and the trigger may run before the supervisor's
    next sweep: the step learns first that the attempt was not called, waits as a deferred
    step does (Pending, uncounted), and the sweep then finds nothing of it to expire."""
    case = Expiry()
    assert case.trigger(31) == "reported"
    assert not case.in_doubt() and case.step.failure_count == 0
    assert case.step.process_state is StepState.PENDING
    with suppress(TransitionRefused):
        case.sweep(40)
    assert not case.in_doubt() and case.step.failure_count == 0
    assert case.order.status is OrderStatus.PROCESSING  # waits to run again, never Error


def died_before_its_deadline(case: Expiry) -> None:
    case.agent_takes(1.0)  # its lock lapses at 11 s, counted; nobody takes it again


def died_holding_it_past_its_deadline(case: Expiry) -> None:
    case.agent_takes(25.0)  # mid-call at the deadline (30 s); its lock lapses at 35 s


def failed_and_was_abandoned(case: Expiry) -> None:
    token = case.agent_takes(1.0).lock_token
    assert token is not None
    case.queue.abandon(token, 2.0)  # the host abandons what its function failed on


@pytest.mark.parametrize(
    "delivered",
    [died_before_its_deadline, died_holding_it_past_its_deadline, failed_and_was_abandoned],
)
def test_a_request_delivered_before_it_expired_keeps_its_doubt(
    delivered: Callable[[Expiry], None],
) -> None:
    case = Expiry()
    delivered(case)
    case.sweep(31)
    assert case.trigger(40) == "maybe read"
    assert case.in_doubt() and case.transport.replies == []


def test_the_triggers_own_retry_of_a_never_delivered_request_adds_no_doubt() -> None:
    """The first run reported "not called" and then failed (say, it could not complete the
    message): the broker counts that delivery, so the retry sees 2. Before, it reported
    "may have applied" then, and the order believed it."""
    case = Expiry()
    case.sweep(31)
    assert case.trigger(40, fails=True) == "reported"
    assert case.trigger(41) == "maybe read"  # the count says 2: proves nothing, says nothing
    assert not case.in_doubt() and case.step.failure_count == 0
    assert len(case.transport.replies) == 1


def test_where_the_dead_letter_queue_counts_no_failed_delivery_a_retry_reports_again() -> None:
    """One report says a lapsed lock on a dead-letter queue is not counted
    (Azure/azure-sdk-for-net#53437): then a retry sees 1 again, reports "not called"
    again, and the order drops the copy."""
    case = Expiry()
    case.sweep(31)
    body = case.request.encode().encode()
    assert case.expired.report(body, UNREAD) == "reported"
    case.apply_reports(40)
    assert case.expired.report(body, UNREAD) == "reported"
    case.apply_reports(41)
    assert not case.in_doubt() and case.step.failure_count == 0


def test_the_triggers_own_retry_of_a_delivered_request_keeps_the_doubt() -> None:
    case = Expiry()
    died_before_its_deadline(case)
    case.sweep(31)
    assert case.trigger(40, fails=True) == "maybe read"
    assert case.trigger(41) == "maybe read"
    assert case.in_doubt() and case.transport.replies == []


def test_a_first_report_that_could_not_be_sent_leaves_the_doubt_not_a_false_not_called() -> None:
    """The price of never guessing: the first run could not send its report at all, so the
    retry (count 2) cannot prove it unread. The attempt stays in doubt, as if its report
    had been lost, and a WARNING says why."""
    case = Expiry()
    case.sweep(31)
    assert case.trigger(40, sends=False) == "failed"
    assert case.trigger(41) == "maybe read"
    assert case.in_doubt() and case.transport.replies == []


@pytest.mark.parametrize("deliveries", [None, 0, 2, 7])
def test_only_the_hosts_first_count_proves_a_request_unread(deliveries: int | None) -> None:
    case = Expiry()
    body = case.request.encode().encode()
    assert case.expired.report(body, deliveries) == "maybe read"
    assert case.transport.replies == []
    why = maybe_read(deliveries)
    assert "may have read it" in why and "stays in doubt" in why
    assert ("no delivery count" if deliveries is None else f"count {deliveries}") in why


def test_a_message_that_is_no_request_is_left_to_the_alert() -> None:
    case = Expiry()
    assert case.expired.report(b"not a request", UNREAD) == "no request"
    assert case.transport.replies == []


def test_the_report_is_the_late_agents_not_called() -> None:
    case = Expiry()
    assert case.expired.report(case.request.encode().encode(), UNREAD) == "reported"
    [(sent, reply_to)] = case.transport.replies
    assert reply_to is None and (sent.outcome, sent.applied) == ("deferred", "no")
    assert (sent.order_id, sent.step, sent.attempt) == ("o-1", "process", 1)
    assert sent.error is not None and "expired unread" in sent.error


def test_an_unsent_report_is_told_as_unread_and_safe_to_state() -> None:
    """The trigger alerts with these words when the report of a request proven unread
    could not be sent (supervisor/triggers.py), instead of retrying a report that may never
    go out on a dead-letter queue with no delivery limit."""
    why = unsent_report(StorageUnavailable("the reply queue did not answer"))
    assert "no agent read it" in why and "could not be sent" in why
    assert "StorageUnavailable: the reply queue did not answer" in why
    assert "stays counted and in doubt" in why and "safe" in why
