"""The composition root: ``bootstrap(settings)`` wires the app, once per process.

It is the one place that turns settings into parts: the store, the queues, the agent
transport, the services, the agents. Each service gets exactly what it uses (ports in,
no global look-ups); each part is built on first use and reused (never at import: that
slows cold start and breaks tests). The triggers and the CLI reach it through
``app_context()``; tests call ``bootstrap`` with their own settings, names, clock and
fakes, instead of patching the environment.

Settings are read once: ``settings_from_environment`` is, with ``core.settings`` that it
calls, the only code of the app that reads the environment. ``index_time`` reads the
two things the trigger modules need while ``function_app.py`` is indexed (which
transport, which declarations), before any other setting may exist.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from admin.agent_admin import AgentAdmin
from admin.drain import LegacyQueue, ServiceBusLegacyQueue, StorageLegacyQueue
from admin.service import OrderAdmin
from agents.agent import AgentWorker
from agents.binding import RequestBinding
from agents.build import build_agent
from agents.outage_watch import OutageWatch, SerialWorker
from agents.threads import OwnThreads
from agents.url_settings import check_agent_urls, mentions_agent_urls
from bootstrap import clients
from core import workflows
from core.control_cache import ControlView
from core.names import Names
from core.outages import OutagePolicy
from core.policy import RetryPolicy
from core.ports import AgentTransport, Clock
from core.settings import (
    Settings,
    Transport,
    dashboard_schedule_of,
    declarations_of,
    retention_schedule_of,
    transport_from_env,
)
from core.unit_of_work import OrderChanges
from core.workflows import AGENTS
from messaging.dispatch import DispatchQueue
from messaging.inline import InlineReplies
from messaging.outages import OutageBook
from messaging.outbox import NoticeSender
from messaging.resilience import ride_out
from messaging.storage_queues import StorageQueues, StorageQueueTransport
from observability import failpoints, logs, telemetry
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


def utc_now() -> datetime:
    return datetime.now(UTC)


def _offset(settings: Settings) -> Clock:
    offset = timedelta(seconds=settings.clock_offset_seconds)
    return lambda: datetime.now(UTC) + offset


def settings_from_environment(
    overrides: Mapping[str, str] | None = None, defaults: Mapping[str, str] | None = None
) -> Settings:
    """Every setting of this process, read once (``core.settings``); ``overrides`` win over
    the environment, ``defaults`` fill what it lacks (the CLI's ``--connection``, say)."""
    return Settings.from_env({**(defaults or {}), **os.environ, **(overrides or {})})


@dataclass(frozen=True)
class IndexTime:
    """What the trigger modules need while ``function_app.py`` is indexed."""

    transport: Transport
    declarations: str
    retention_schedule: str
    dashboard_schedule: str


@cache
def index_time() -> IndexTime:
    """Read once, when the first trigger module is imported (``AGENT_TRANSPORT`` decides
    the agent queues' trigger type; the declarations, which agents get a function;
    ``RETENTION_SCHEDULE``, when the retention timer fires)."""
    env: Mapping[str, str] = os.environ
    found = IndexTime(
        transport_from_env(env),
        declarations_of(env),
        retention_schedule_of(env),
        dashboard_schedule_of(env),
    )
    workflows.use(found.declarations)
    return found


def declarations_from_environment() -> str:
    """For the CLI's declaration commands, which need no other setting: the declarations
    module (``ORDERS_DECLARATIONS``), put to use; its name."""
    name = declarations_of(os.environ)
    workflows.use(name)
    return name


def bootstrap(
    settings: Settings,
    *,
    names: Names | None = None,
    clock: Clock | None = None,
    **parts: Any,
) -> AppContext:
    """The app, wired from ``settings``. ``parts`` replaces any part by name (``store``,
    ``queues``, ``transport`` ...): tests pass in-memory twins and fakes this way. The
    clock is the system's, or (a test switch: ``ORDERS_CLOCK_OFFSET_SECONDS``) the
    system's moved by an offset: an instance whose clock is off, for the chaos suite.
    An agent URL setting that names no declared agent is refused (``SettingsError``:
    ``agents.url_settings``), not left for the agent's calls to go elsewhere."""
    if clock is None:
        clock = utc_now if not settings.clock_offset_seconds else _offset(settings)
    workflows.use(settings.declarations)
    if mentions_agent_urls(settings.agent_settings):  # a typo would call REMOTE_SERVICE_URL
        check_agent_urls(settings.agent_settings, workflows.AGENTS)
    failpoints.arm(settings.failpoints)
    logs.quiet_request_logs()
    telemetry.setup(settings.telemetry_connection, settings.telemetry_authentication)
    context = AppContext(settings, names or Names(), clock)
    for name, part in parts.items():
        if not isinstance(getattr(AppContext, name, None), cached_property):
            raise TypeError(f"bootstrap: no part called {name!r}")
        context.__dict__[name] = part
    return context


#: Builds every part of every context: parts depend on parts (re-entrant), and are built
#: once, on first use, by whichever thread needs one first.
_parts_lock = threading.RLock()
_MISSING: Any = object()


class part[T](cached_property[T]):
    """A ``cached_property`` built under a lock. Since Python 3.12 ``cached_property``
    takes none: two threads asking for a part at once (the first invocations of a process,
    on the runtime's thread pool) would each build one, and keep different objects, such as
    two state stores whose caches of what this process wrote (``StateStore.recent``) then
    disagree: a save made through one is not seen by the other."""

    @overload
    def __get__(self, instance: None, owner: type[Any] | None = None) -> Self: ...

    @overload
    def __get__(self, instance: object, owner: type[Any] | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type[Any] | None = None) -> Any:
        if instance is None:
            return self
        name = self.attrname
        assert name is not None  # set when the class is made (__set_name__)
        cache = instance.__dict__
        found = cache.get(name, _MISSING)
        if found is _MISSING:
            with _parts_lock:
                found = cache.get(name, _MISSING)
                if found is _MISSING:
                    found = cache[name] = self.func(instance)
        return found


@dataclass
class AppContext:
    settings: Settings
    names: Names
    clock: Clock = utc_now

    @property
    def instance_id(self) -> str:
        return self.settings.instance_id

    @part
    def store(self) -> TableStateStore:
        service = clients.table_service(self.settings.storage, self.settings.opcount_dir)
        store = TableStateStore(service.get_table_client(self.names.state_table))
        store.ensure_table()  # once per process; exists already in Azure (infra/ creates it)
        return store

    @part
    def queues(self) -> StorageQueues:
        return StorageQueues(
            clients.queue_service(self.settings.storage, self.settings.opcount_dir)
        )

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
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_failure_count=self.settings.max_failure_count,
            deferral_window_seconds=self.settings.deferral_window_seconds,
            clock_skew_seconds=self.settings.max_clock_skew_seconds,
        )

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
        )

    @part
    def agent_controls(self) -> ControlView:
        """The agents' runtime controls (paused, limits) as this process knows them: read
        at most every few seconds (``core.control_cache``), by the scheduler and agents."""
        return ControlView(self.store, self.clock, warn=_control_log.warning, outages=self.store)

    @part
    def outage_policy(self) -> OutagePolicy:
        return OutagePolicy.of(self.settings.outage_alert_seconds)

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
    def notices(self) -> NoticeSender:
        return NoticeSender(self.store, self.queues, self.names, self.settings.reply_queues)

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
    def supervisor(self) -> Supervisor:
        return Supervisor(
            self.store, self.notices, self.dispatch_queue, self.retry_policy, self.clock
        )

    @part
    def kept(self) -> KeptMessages:
        return KeptMessages(self.store.table)

    @part
    def poison(self) -> PoisonWatch:
        return PoisonWatch(
            self.queues, self.names, self.kept, self.clock, record=self.store.add_activity
        )

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
    def expired_requests(self) -> ExpiredRequests:
        return ExpiredRequests(self.transport, self.clock)

    def agent_for(self, name: str) -> AgentWorker:
        """The declared agent ``name`` (its own client, breaker and limits), built once."""
        with _agents_lock:
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

    @part
    def alert_threads(self) -> OwnThreads:
        """The threads of the poison and dead-letter alert triggers, all of them together
        (``supervisor.triggers``; alerts are rare: eight, started when needed)."""
        return OwnThreads("alerts", ALERT_THREADS)

    def built_agent(self, name: str) -> AgentWorker | None:
        """The agent ``name`` if it is built already (no I/O: for the event loop)."""
        with _agents_lock:
            return self._agents.get(name)

    @part
    def _agents(self) -> dict[str, AgentWorker]:
        return {}

    @part
    def admin(self) -> OrderAdmin:
        return OrderAdmin(
            self.store, self.notices, self.dispatch_queue, self.clock, controls=self.store
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
        )

    @part
    def agents_admin(self) -> AgentAdmin:
        """Pause, resume and limit agents at runtime, with the audit (operator API, CLI,
        console); this process's own view is refreshed after each change."""
        return AgentAdmin(self.store, self.clock, AGENTS, changed=self.agent_controls.forget)

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

    def ride_out(self, work: Callable[[], T], *, what: str) -> T:
        """``work``, riding out storage trouble for this process's budget (a trigger's)."""
        return ride_out(work, what=what, seconds=self.settings.ride_out_seconds)

    def provision(self) -> None:
        """Create the table and queues if missing (local runs; Bicep creates them in Azure)."""
        _ = self.store
        self.queues.ensure(*self.names.storage_queues())


#: The alert triggers' threads (``AppContext.alert_threads``).
ALERT_THREADS = 8
_lock = threading.Lock()
_agents_lock = threading.Lock()
_context: AppContext | None = None


def app_context() -> AppContext:
    """The process's app: bootstrapped from the environment on first use."""
    global _context  # noqa: PLW0603 - the process-wide composition root
    with _lock:
        if _context is None:
            _context = bootstrap(settings_from_environment())
        return _context


def current_app_context() -> AppContext | None:
    """The process's app if it is bootstrapped already, else None (no I/O)."""
    with _lock:
        return _context


def reset_app_context(context: AppContext | None = None) -> None:
    """For tests and the local host: drop (or replace) the process-wide app."""
    global _context  # noqa: PLW0603
    with _lock:
        _context = context
