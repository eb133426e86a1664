"""The ports the services depend on; adapters live in stores/ and messaging/."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from core.messages import AgentReply, AgentRequest


class Clock(Protocol):
    def __call__(self) -> datetime: ...


class QueueSender(Protocol):
    """Storage queues: orders-rejected, operator-alerts, order-dispatch, replyTo queues."""

    def send(
        self, queue: str, body: str, *, delay_seconds: float = 0, ttl_seconds: int | None = None
    ) -> None: ...


class AgentTransport(Protocol):
    """The agent request/reply queues: Service Bus, or Storage queues on Azurite."""

    def send_request(self, request: AgentRequest) -> bool:
        """Send; False if the deadline has already passed (nothing sent)."""
        ...

    def send_reply(self, reply: AgentReply, reply_to: str | None = None) -> bool:
        """Send to ``reply_to`` (the request's reply queue) or the default reply queue."""
        ...
