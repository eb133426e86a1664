"""Replies applied in process (messaging/inline.py), and the reply queue as the fallback."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from config.settings import function_disabled
from core.errors import ConcurrencyConflict, StorageUnavailable
from core.messages import AgentReply, AgentRequest
from core.states import OrderStatus
from messaging.inline import InlineReplies
from scheduler.service import Handled
from tests.unit.test_services_in_memory import (
    RecordingTransport,
    Services,
    build,
    reply_to,
    stored,
    submit,
)

OWN = "agent-replies"


class Applying:
    """``apply``: the scheduler's, or one that fails as told."""

    def __init__(self, s: Services, fail: BaseException | None = None) -> None:
        self.s, self.fail = s, fail
        self.seen: list[AgentReply] = []

    def __call__(self, reply: AgentReply) -> Handled:
        self.seen.append(reply)
        if self.fail is not None:
            raise self.fail
        return self.s.scheduler.apply_reply(reply)


@pytest.fixture
def s() -> Services:
    return build()


def first_request(s: Services, order_id: str, **extra: Any) -> AgentRequest:
    submit(s, order_id, **extra)
    return s.transport.requests[-1]


@pytest.mark.parametrize("reply_queue", [None, OWN])
def test_a_reply_for_the_apps_own_queue_is_applied_in_process(
    s: Services, reply_queue: str | None
) -> None:
    request = first_request(s, "o-inline")
    below = RecordingTransport()
    inline = InlineReplies(below, Applying(s), OWN)
    assert inline.send_reply(reply_to(request), reply_queue) is True
    assert stored(s, "o-inline").status is OrderStatus.COMPLETED
    assert below.replies == []  # nothing went through the queue


def test_a_stale_reply_applied_in_process_is_dropped_as_the_handler_would(s: Services) -> None:
    request = first_request(s, "o-twice")
    below = RecordingTransport()
    inline = InlineReplies(below, Applying(s), OWN)
    inline.send_reply(reply_to(request))
    version = stored(s, "o-twice").version
    assert inline.send_reply(reply_to(request)) is True  # a redelivered request's reply
    assert stored(s, "o-twice").version == version and below.replies == []


@pytest.mark.parametrize(
    "error",
    [
        StorageUnavailable("the table does not answer"),
        ConcurrencyConflict("kept changing", order_id="o-fallback"),
        RuntimeError("a bug"),
    ],
    ids=["storage", "conflict", "bug"],
)
def test_a_reply_that_cannot_be_applied_in_process_goes_to_the_reply_queue(
    s: Services, error: BaseException
) -> None:
    request = first_request(s, "o-fallback")
    below = RecordingTransport()
    applying = Applying(s, fail=error)
    inline = InlineReplies(below, applying, OWN)
    reply = reply_to(request)
    assert inline.send_reply(reply) is True
    assert len(applying.seen) == 1 and below.replies == [reply]
    assert stored(s, "o-fallback").status is OrderStatus.PROCESSING
    # ... where the reply handler applies it
    assert s.scheduler.apply_reply(below.replies[0]) is Handled.APPLIED


def test_a_reply_to_another_queue_is_sent_and_never_applied_here(s: Services) -> None:
    request = first_request(s, "o-elsewhere")
    below = RecordingTransport()
    applying = Applying(s)
    inline = InlineReplies(below, applying, OWN)
    inline.send_reply(reply_to(request), "someone-elses-replies")
    assert applying.seen == [] and len(below.replies) == 1
    assert stored(s, "o-elsewhere").status is OrderStatus.PROCESSING


def test_requests_pass_through(s: Services) -> None:
    request = first_request(s, "o-request")
    below = RecordingTransport()
    InlineReplies(below, Applying(s), OWN).send_request(request)
    assert below.requests == [request]


def test_a_late_success_applied_in_process_is_still_evidence(s: Services) -> None:
    request = first_request(s, "o-late-inline")
    s.clock.advance((request.complete_by - s.clock()).total_seconds() + 1)
    below = RecordingTransport()
    InlineReplies(below, Applying(s), OWN).send_reply(reply_to(request))
    order = stored(s, "o-late-inline")
    assert order.status is OrderStatus.COMPLETED and s.clock() > request.complete_by
    assert "succeeded" in json.dumps(order.steps[0].history)


@pytest.mark.parametrize(
    ("value", "disabled"), [("true", True), ("1", True), ("True", True), ("false", False)]
)
def test_a_function_is_disabled_by_the_hosts_setting(
    monkeypatch: pytest.MonkeyPatch, value: str, disabled: bool
) -> None:
    monkeypatch.setenv("AzureWebJobs.handle_agent_reply.Disabled", value)
    assert function_disabled(os.environ, "handle_agent_reply") is disabled
    monkeypatch.delenv("AzureWebJobs.handle_agent_reply.Disabled")
    assert function_disabled(os.environ, "handle_agent_reply") is False
