"""The app's parts, each built once, on first use, from the parts it depends on.

Read top to bottom, the parts come in the order they depend on each other: the
adapters over the SDK clients (``bootstrap/clients.py``), the policies, the scheduler,
the agents, the supervisor, then the operator's services. Each service gets exactly what
it uses (ports in, no global look-ups). Nothing is built at import (that slows a Function
App's cold start, which imports every trigger module) nor before a trigger needs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from admin.agent_admin import AgentAdmin
from admin.drain import LegacyQueue, ServiceBusLegacyQueue, StorageLegacyQueue
from admin.service import OrderAdmin
from admin.watch import Watch
from agents.agent import AgentWorker
from agents.binding import RequestBinding
from agents.build import build_agent
from agents.outage_watch import OutageWatch, SerialWorker
from agents.threads import OwnThreads
from bootstrap import clients
from config.settings import Settings, Transport
from core.control_cache import ControlView
from core.names import Names
from core.outages import OutagePolicy
from core.policy import RetryPolicy
from core.ports import AgentTransport, Clock
from core.turn_keeper import TurnKeeper
from core.unit_of_work import OrderChanges
from core.workflows import AGENTS
from messaging.dispatch import DispatchQueue
from messaging.inline import InlineReplies
from messaging.outages import OutageBook
from messaging.outbox import NoticeSender
from messaging.quarantine import quarantine
from messaging.resilience import ride_out
from messaging.storage_queues import StorageQueues, StorageQueueTransport
from observability.logs import get_logger
from scheduler.service import Scheduler, SchedulerConfig
from stores import layout
from stores.kept import KeptMessages
from stores.tables import TableStateStore
from supervisor.aggregator import DashboardAggregator
from supervisor.expired import ExpiredRequests
from supervisor.poison import PoisonWatch
from supervisor.service import Supervisor

if TYPE_CHECKING:
    from admin.archiving import Retainer

T = TypeVar("T")
_control_log = get_logger("core.control_cache")
#: The alert triggers' threads (``AppContext.alert_threads``).
ALERT_THREADS = 8
#: Parts depend on parts (re-entrant), and each is built once, by whichever thread asks
#: first: two threads asking at once (the first invocations of a process, on the runtime's
#: thread pool) would otherwise keep different objects, such as two state stores whose
#: caches of what this process wrote (``StateStore.recent``) then disagree.
_building = threading.RLock()
#: Builds the agents, one at a time (an agent's parts are built under ``_building``).
_building_agents = threading.Lock()


def utc_now() -> datetime:
    return datetime.now(UTC)


def part[T](build: Callable[[Any], T]) -> cached_property[T]:
    """A part of the app: ``build`` runs once, on first use, under the parts' lock
    (``functools.cached_property`` takes none since Python 3.12)."""
    name = build.__name__

    def once(app: Any) -> T:
        with _building:
            built = app.__dict__.get(name, _building)
            if built is _building:
                built = app.__dict__[name] = build(app)
            return built  # type: ignore[no-any-return]

    once.__name__, once.__doc__ = name, build.__doc__
    return cached_property(once)


@dataclass
class AppContext:
    """The parts of one app (``bootstrap.bootstrap`` makes it from settings)."""

    settings: Settings
    names: Names
    clock: Clock = utc_now

    @property
    def instance_id(self) -> str:
        return self.settings.instance_id

    # --- adapters over the clients ------------------------------------------------------

    @part
    def store(self) -> TableStateStore:
        service = clients.table_service(self.settings.storage, self.settings.opcount_dir)
        store = TableStateStore(service.get_table_client(self.names.state_table))
        store.ensure_table()  # once per process; exists already in Azure (infra/ creates it)
        return store

    @part
    def queues(self) -> StorageQueues:
        """The app's queues, on ``AzureWebJobsStorage``: the account of the functions'
        output bindings too (``messaging.bound``)."""
        service = clients.queue_service(self.settings.storage, self.settings.opcount_dir)
        return StorageQueues(service, bindable=True)

    @part
    def kept(self) -> KeptMessages:
        return KeptMessages(self.store.table)

    @part
    def transport(self) -> AgentTransport:
        if self.settings.transport is Transport.STORAGE:
            return StorageQueueTransport(self.queues, self.names, self.clock)
        from messaging.servicebus import ServiceBusTransport, client_for

        connection = self.settings.service_bus
        assert connection is not None  # Settings refuses servicebus without a connection
        return ServiceBusTransport(
            lambda: client_for(connection, clients.credential), self.names, self.clock
        )

    @part
    def dispatch_queue(self) -> DispatchQueue:
        """Wake-ups for later as Service Bus scheduled messages where the agent queues are
        on Service Bus (``order-wakeups``, ``wake_order``); on Storage queues, a visibility
        delay on ``order-dispatch``."""
        if self.settings.transport is Transport.STORAGE:
            return DispatchQueue(self.queues, self.names, self.clock)
        from messaging.servicebus import ServiceBusTransport

        transport = self.transport
        scheduled = transport if isinstance(transport, ServiceBusTransport) else None
        return DispatchQueue(self.queues, self.names, self.clock, scheduled=scheduled)

    @part
    def turns(self) -> TurnKeeper:
        """The slots of per-key concurrency (docs/contracts.md §3.16): in the state table;
        an order whose turn comes is woken on order-dispatch."""
        return TurnKeeper(self.store, self.dispatch_queue.send, self.clock, self.store.load)

    @part
    def notices(self) -> NoticeSender:
        return NoticeSender(self.store, self.queues, self.names, self.settings.reply_queues)

    # --- policies and controls ------------------------------------------------------------

    @part
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_failure_count=self.settings.max_failure_count,
            deferral_window_seconds=self.settings.deferral_window_seconds,
            clock_skew_seconds=self.settings.max_clock_skew_seconds,
        )

    @part
    def outage_policy(self) -> OutagePolicy:
        return OutagePolicy.of(self.settings.outage_alert_seconds)

    @part
    def agent_controls(self) -> ControlView:
        """The agents' runtime controls (paused, limits) as this process knows them: read
        at most every few seconds (``core.control_cache``), by the scheduler and agents."""
        return ControlView(self.store, self.clock, warn=_control_log.warning, outages=self.store)

    # --- the scheduler --------------------------------------------------------------------

    @part
    def scheduler(self) -> Scheduler:
        return Scheduler(
            self.store,
            self.queues,
            self.transport,
            self.names,
            SchedulerConfig(
                self.instance_id,
                self.settings.step_timeout_seconds,
                self.retry_policy,
                self.settings.reply_queues,
            ),
            self.clock,
            self.kept,
            self.notices,
            self.dispatch_queue,
            controls=self.agent_controls,
            turns=self.turns,
            sleep=self.sleep,
        )

    @part
    def sleep(self) -> Callable[[float], None]:
        """How the scheduler waits between a reply's tries on a crowded order (a few ms:
        ``core.unit_of_work.Crowded``); tests pass a fake."""
        return time.sleep

    # --- the agents -----------------------------------------------------------------------

    @part
    def agent_transport(self) -> AgentTransport:
        """The agents' transport: replies applied in process where this instance runs the
        reply handler (``messaging/inline.py``), else sent to the reply queue."""
        if not self.settings.inline_replies:
            return self.transport
        return InlineReplies(
            self.transport,
            self.scheduler.apply_reply,
            self.names.agent_replies,
        )

    @part
    def outages(self) -> OutageBook:
        """The agents' shared outage records and their alerts (docs/contracts.md §3.14):
        where this process's agents report, and what the supervisor's timer finishes."""
        return OutageBook(
            self.store,
            self.queues,
            self.names,
            self.clock,
            self.outage_policy,
            learn=self.agent_controls.learn,
            record=self.store.add_activity,
        )

    @part
    def outage_reports(self) -> SerialWorker:
        """The thread the agents' outage reports run on, one after the other."""
        return SerialWorker()

    @part
    def _agents(self) -> dict[str, AgentWorker]:
        return {}

    def agent_for(self, name: str) -> AgentWorker:
        """The declared agent ``name`` (its own client, breaker and limits), built once."""
        with _building_agents:
            agent = self._agents.get(name)
            if agent is None:
                spec = AGENTS[name]
                controls = self.agent_controls
                agent = self._agents[name] = build_agent(
                    spec,
                    self.settings,
                    self.agent_transport,
                    self.clock,
                    # Storage queues detect no duplicates: copies of a request are told
                    # apart by their message ids (Service Bus drops them by message_id).
                    bind=RequestBinding(
                        self.store, name, copies=self.settings.transport is Transport.STORAGE
                    ),
                    runtime=lambda: controls.runtime(spec),
                    runtime_at_hand=lambda: controls.runtime_at_hand(spec),
                    watch=OutageWatch(
                        name,
                        self.outages,
                        lambda: controls.outage(name),
                        self.outage_policy,
                        self.outage_reports.submit,
                    ),
                )
        return agent

    def built_agent(self, name: str) -> AgentWorker | None:
        """The agent ``name`` if it is built already (no I/O: for the event loop)."""
        agents: dict[str, AgentWorker] = self.__dict__.get("_agents", {})
        return agents.get(name)

    # --- the supervisor -------------------------------------------------------------------

    @part
    def supervisor(self) -> Supervisor:
        return Supervisor(
            self.store,
            self.notices,
            self.dispatch_queue,
            self.retry_policy,
            self.clock,
            turns=self.turns,
        )

    @part
    def poison(self) -> PoisonWatch:
        return PoisonWatch(
            self.queues, self.names, self.kept, self.clock, record=self.store.add_activity
        )

    @part
    def expired_requests(self) -> ExpiredRequests:
        return ExpiredRequests(self.transport, self.clock)

    @part
    def dashboard(self) -> DashboardAggregator:
        """The dashboard's timer: figures from activity rows, and the stuck check."""
        return DashboardAggregator(
            self.store,
            self.clock,
            shards=layout.all_shards(),
            changes=OrderChanges(self.store, self.notices, self.dispatch_queue),
            floor=timedelta(seconds=self.settings.stuck_floor_seconds),
        )

    @part
    def alert_threads(self) -> OwnThreads:
        """The threads of the poison and dead-letter alert triggers, all of them together
        (``supervisor.triggers``; alerts are rare: eight, started when needed)."""
        return OwnThreads("alerts", ALERT_THREADS)

    # --- the operator's services (API, console, CLI) --------------------------------------

    @part
    def admin(self) -> OrderAdmin:
        return OrderAdmin(
            self.store,
            self.notices,
            self.dispatch_queue,
            self.clock,
            controls=self.store,
            turns=self.turns,
        )

    @part
    def events(self) -> OrderAdmin:
        """Events delivered over HTTP (docs/contracts.md §3.13): the next step is claimed
        and its request sent in the same invocation (the CLI's go through order-dispatch)."""
        return OrderAdmin(
            self.store,
            self.notices,
            self.scheduler.dispatch_loaded,
            self.clock,
            controls=self.store,
            turns=self.turns,
        )

    @part
    def agents_admin(self) -> AgentAdmin:
        """Pause, resume and limit agents at runtime, with the audit (operator API, CLI,
        console); this process's own view is refreshed after each change."""
        return AgentAdmin(self.store, self.clock, AGENTS, changed=self.agent_controls.forget)

    @part
    def watch(self) -> Watch:
        """What the console's alerts and dashboard pages read: figures, outages, the stuck
        steps, kept messages and the alert, rejected and poison queues."""
        return Watch(self.store, self.kept, self.queues, self.names)

    @part
    def retainer(self) -> Retainer:
        """Retention and restore (docs/contracts.md §3.12). Imported here, on first use:
        the Blob SDK is for the retention timer, the CLI and the console, never an
        order's path."""
        from admin.archiving import Retainer
        from stores.archive import BlobArchive
        from stores.retention_rows import TableRetention

        blobs = clients.blob_service(self.settings.storage)
        archive = BlobArchive(blobs.get_container_client(self.names.orders_archive))
        return Retainer(
            TableRetention(self.store.table),
            archive,
            self.settings.retention,
            self.clock,
            limit=self.settings.retention_batch,
            archive_days=self.settings.archive_days,
            kept=KeptMessages(self.store.table),
            kept_days=self.settings.kept_days,
        )

    @part
    def legacy_requests(self) -> LegacyQueue:
        """The shared request queue of versions before per-agent queues (the upgrade)."""
        queue = self.names.legacy_requests
        if self.settings.transport is Transport.STORAGE:
            return StorageLegacyQueue(self.queues.client(queue))
        from messaging.servicebus import client_for

        connection = self.settings.service_bus
        assert connection is not None  # Settings refuses servicebus without a connection
        return ServiceBusLegacyQueue(client_for(connection, clients.credential), queue)

    # --- for the triggers and local runs --------------------------------------------------

    def ride_out(self, work: Callable[[], T], *, what: str) -> T:
        """``work``, riding out storage trouble for this process's budget (a trigger's)."""
        return ride_out(work, what=what, seconds=self.settings.ride_out_seconds)

    def quarantine(self, queue: str, raw: bytes, reason: str) -> None:
        """A message that cannot be read, off ``queue`` to its poison queue and kept
        (``messaging/quarantine.py``)."""
        quarantine(self.queues, queue, raw, reason, self.clock, keeper=self.kept)

    def provision(self) -> None:
        """Create the table and queues if missing (local runs; Bicep creates them in Azure)."""
        _ = self.store
        self.queues.ensure(*self.names.storage_queues())
