"""The composition root: one ``AppContext`` per process, built on first use.

Settings are read once (failing fast with the missing name), clients are
created lazily and reused by every invocation. Triggers call
``app_context()`` and nothing else.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from admin.service import OrderAdmin
from agents.agent import Agent
from agents.build import build_agent
from agents.remote import RemoteServiceClient
from core.errors import OrderNotFound
from core.names import Names
from core.policy import RetryPolicy
from core.ports import AgentTransport, Clock
from core.settings import Settings, Transport, function_disabled
from core.workflows import AGENTS
from messaging.dispatch import DispatchQueue
from messaging.inline import InlineReplies
from messaging.outbox import NoticeSender
from messaging.storage_queues import StorageQueues, StorageQueueTransport
from runtime import clients, telemetry
from scheduler.service import Scheduler, SchedulerConfig
from stores.kept import KeptMessages
from stores.tables import TableStateStore
from supervisor.expired import ExpiredRequests
from supervisor.poison import PoisonWatch
from supervisor.service import Supervisor

#: The function that applies agent replies (scheduler/triggers.py).
REPLY_HANDLER = "handle_agent_reply"


def utc_now() -> datetime:
    return datetime.now(UTC)


def instance_id() -> str:
    """Who holds a claim: the Functions instance (or devhost process) and the worker pid."""
    base = (
        os.environ.get("DEVHOST_INSTANCE_ID")
        or os.environ.get("WEBSITE_INSTANCE_ID", "")[:16]
        or socket.gethostname()
    )
    return f"{base}-{os.getpid()}"


@dataclass
class AppContext:
    settings: Settings
    names: Names
    clock: Clock = utc_now

    @cached_property
    def instance_id(self) -> str:
        return instance_id()

    @cached_property
    def store(self) -> TableStateStore:
        service = clients.table_service(self.settings.storage)
        store = TableStateStore(service.get_table_client(self.names.state_table))
        store.ensure_table()  # once per process; exists already in Azure (infra/ creates it)
        return store

    @cached_property
    def queues(self) -> StorageQueues:
        return StorageQueues(clients.queue_service(self.settings.storage))

    @cached_property
    def transport(self) -> AgentTransport:
        if self.settings.transport is Transport.STORAGE:
            return StorageQueueTransport(self.queues, self.names, self.clock)
        from messaging.servicebus import ServiceBusTransport, client_for

        connection = self.settings.service_bus
        assert connection is not None  # Settings refuses servicebus without a connection
        return ServiceBusTransport(lambda: client_for(connection), self.names, self.clock)

    @cached_property
    def agent_transport(self) -> AgentTransport:
        """The agents' transport: replies applied in process where this instance runs the
        reply handler (``messaging/inline.py``), else sent to the reply queue."""
        if function_disabled(os.environ, REPLY_HANDLER):
            return self.transport
        return InlineReplies(
            self.transport,
            self.scheduler.apply_reply,
            self.names.agent_replies,
        )

    @cached_property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_failure_count=self.settings.max_failure_count,
            deferral_window_seconds=self.settings.deferral_window_seconds,
        )

    @cached_property
    def scheduler(self) -> Scheduler:
        return Scheduler(
            self.store,
            self.queues,
            self.transport,
            self.names,
            SchedulerConfig(
                self.instance_id, self.settings.step_timeout_seconds, self.retry_policy
            ),
            self.clock,
            self.kept,
        )

    @cached_property
    def notices(self) -> NoticeSender:
        return NoticeSender(self.store, self.queues, self.names)

    @cached_property
    def dispatch_queue(self) -> DispatchQueue:
        return DispatchQueue(self.queues, self.names, self.clock)

    @cached_property
    def supervisor(self) -> Supervisor:
        return Supervisor(
            self.store, self.notices, self.dispatch_queue, self.retry_policy, self.clock
        )

    @cached_property
    def kept(self) -> KeptMessages:
        return KeptMessages(self.store.table)

    @cached_property
    def poison(self) -> PoisonWatch:
        return PoisonWatch(self.queues, self.names, self.kept, self.clock)

    @cached_property
    def expired_requests(self) -> ExpiredRequests:
        return ExpiredRequests(self.transport, self.clock)

    @cached_property
    def remote(self) -> RemoteServiceClient:
        return RemoteServiceClient(self.settings.require_remote_service_url(), clock=self.clock)

    @cached_property
    def agent(self) -> Agent:
        """The agent of requests that name none (plans from before agents existed)."""
        return Agent(self.remote, self.agent_transport, self.clock, load_order=self._order_body)

    def agent_for(self, name: str | None) -> Agent:
        """The declared agent ``name`` (its own client, breaker and limits), built once."""
        if name is None:
            return self.agent
        with _agents_lock:
            agent = self._agents.get(name)
            if agent is None:
                agent = self._agents[name] = build_agent(
                    AGENTS[name],
                    self.settings,
                    self.agent_transport,
                    self.clock,
                    load_order=self._order_body,
                )
        return agent

    @cached_property
    def _agents(self) -> dict[str, Agent]:
        return {}

    def _order_body(self, order_id: str) -> dict[str, Any]:
        """For an agent request too large to carry its order: read it from the state store."""
        order = self.store.load(order_id)
        if order is None:
            raise OrderNotFound(f"no order {order_id} for its agent request", order_id=order_id)
        return order.body

    @cached_property
    def admin(self) -> OrderAdmin:
        return OrderAdmin(self.store, self.notices, self.dispatch_queue, self.clock)

    def provision(self) -> None:
        """Create the table and queues if missing (local runs; Bicep creates them in Azure)."""
        _ = self.store
        self.queues.ensure(*self.names.storage_queues())


_lock = threading.Lock()
_agents_lock = threading.Lock()
_context: AppContext | None = None


def app_context() -> AppContext:
    global _context  # noqa: PLW0603 - the process-wide composition root
    with _lock:
        if _context is None:
            telemetry.setup()
            _context = AppContext(Settings.from_env(os.environ), Names())
        return _context


def reset_app_context(context: AppContext | None = None) -> None:
    """For tests and the local host: drop (or replace) the process-wide context."""
    global _context  # noqa: PLW0603
    with _lock:
        _context = context
