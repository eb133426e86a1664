"""Turn function specs into running listeners, timers and an HTTP server, and stop them.

Connections are read and clients built as the app does it (``config.settings``,
``bootstrap.clients``, ``messaging.servicebus``), with one Storage client per connection.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bootstrap import clients
from config.settings import OPCOUNT_DIR, STORAGE, Connection
from config.settings import connection as read_connection
from devhost import app_loader as loader
from devhost.app_loader import FunctionSpec
from devhost.http import HttpServer
from devhost.invoke import Invoker, start_thread
from devhost.queues import POISON_SUFFIX, EnqueueWatcher, QueueListener, StorageQueue
from devhost.servicebus import ServiceBusListener, sdk_receiver_factory
from devhost.settings import (
    ConfigError,
    LeaseOptions,
    QueueOptions,
    ServiceBusOptions,
    route_prefix,
)
from devhost.singleton import LOCK_CONTAINER, BlobLeases, TimerLocks, lock_client_options
from devhost.timers import TimerRunner, parse_schedule
from devhost.unreadable import UnreadableQueues
from messaging.storage_queues import StorageQueues

log = logging.getLogger("devhost")
SERVICE_BUS = "AzureWebJobsServiceBus"  # the host's default Service Bus connection setting


@dataclass
class DevHost:
    """Everything one devhost process runs. Build with :meth:`build`, then :meth:`start`."""

    invoker: Invoker
    environ: Mapping[str, str]
    lines: list[str] = field(default_factory=list)  # what runs, printed at start
    queues: list[QueueListener] = field(default_factory=list)
    timers: list[TimerRunner] = field(default_factory=list)
    service_bus: list[ServiceBusListener] = field(default_factory=list)
    http: HttpServer | None = None
    queue_services: dict[str, Any] = field(default_factory=dict)  # by connection setting
    senders: dict[int, StorageQueues] = field(default_factory=dict)  # by client, for sends
    enqueued: EnqueueWatcher = field(default_factory=EnqueueWatcher)
    timer_locks: TimerLocks | None = None  # None: every timer fires in this process
    unreadable: UnreadableQueues = field(init=False)  # one alert per queue nobody can read

    def __post_init__(self) -> None:
        # devhost's own alerts, to the app's ``operator-alerts`` in its storage
        self.unreadable = UnreadableQueues(
            lambda queue, body: self.sender(STORAGE).send(queue, body)
        )

    @classmethod
    def build(
        cls,
        specs: list[FunctionSpec],
        host_json: Mapping[str, Any],
        environ: Mapping[str, str],
        http_port: int,
        invoker: Invoker,
        singleton: tuple[str, str] | None = None,
    ) -> DevHost:
        """Check every function's configuration and build (not start) what runs it;
        ``singleton``: (host id, instance id) to fire each timer on one instance at a time."""
        devhost = cls(invoker, environ)
        kinds = {spec.trigger_type for spec in specs}
        if loader.TIMER in kinds and singleton is not None:
            devhost.timer_locks = TimerLocks(BlobLeases(devhost._lock_container()), *singleton)
            devhost.timer_locks.add(s.name for s in specs if s.trigger_type == loader.TIMER)
        # host.json's options are read (and checked) only for the triggers that use them
        queues = QueueOptions.from_host_json(host_json) if loader.QUEUE in kinds else QueueOptions()
        bus = ServiceBusOptions.from_host_json(host_json)
        lease = LeaseOptions.from_env(environ)
        for spec in specs:
            if spec.trigger_type == loader.QUEUE:
                devhost._add_queue(spec, queues, lease)
            elif spec.trigger_type == loader.TIMER:
                devhost._add_timer(spec)
            elif spec.trigger_type == loader.SERVICE_BUS:
                devhost._add_service_bus(spec, bus)
        http = [spec for spec in specs if spec.trigger_type == loader.HTTP]
        if http:
            devhost.http = HttpServer(http_port, http, route_prefix(host_json), invoker)
            for spec in http:
                devhost._line(spec, devhost.http.describe(spec))
        return devhost

    def _line(self, spec: FunctionSpec, text: str) -> None:
        self.lines.append(f"devhost: {spec.name}: {spec.trigger_type} {text}")

    def _client(
        self, setting: str, what: str, build: Callable[[Connection], Any], missing: str
    ) -> Any:
        """The client ``build`` makes for connection ``setting``; a :class:`ConfigError` saying
        ``missing`` when it is not set, or that it is not usable for ``what``."""
        connection = read_connection(self.environ, setting)
        if connection is None:
            raise ConfigError(missing)
        try:
            return build(connection)
        except ValueError as error:
            raise ConfigError(f"setting {setting}: not usable for {what} ({error})") from error

    def _lock_container(self) -> Any:
        missing = f"timers take their singleton locks in {STORAGE}, which is not set: set it, "
        blobs = partial(clients.blob_service, **lock_client_options())
        service = self._client(STORAGE, "blobs", blobs, missing + "or pass --timers every")
        return service.get_container_client(LOCK_CONTAINER)

    def queue_service(self, setting: str) -> Any:
        """The process's QueueServiceClient for a connection setting, built on first use
        (the host's own requests are counted too, where a benchmark asks for it)."""
        if setting not in self.queue_services:
            build = partial(clients.queue_service, opcount_dir=self.environ.get(OPCOUNT_DIR))
            missing = (
                f"Storage connection {setting!r} is not configured: set {setting} to a connection "
                f"string, or {setting}__accountName / {setting}__queueServiceUri (an identity)"
            )
            self.queue_services[setting] = self._client(setting, "Storage", build, missing)
        return self.queue_services[setting]

    def sender(self, setting: str) -> StorageQueues:
        """Sends over ``setting``'s client, kept per client (and so its queue clients)."""
        service = self.queue_service(setting)
        kept = self.senders.get(id(service))  # built on a miss only
        return kept or self.senders.setdefault(id(service), StorageQueues(service))

    def deliver(self, spec: FunctionSpec, outputs: Mapping[str, Any]) -> None:
        """A successful invocation's Storage queue outputs, sent as the host flushes them (a
        list one message per item; a queue created if missing), each waking this host's
        listeners of its queue (SharedQueueWatcher); a send that fails fails the invocation."""
        for name, value in outputs.items():
            binding = spec.outputs.get(name)
            if binding is None:  # the runtime only returns declared bindings
                raise ConfigError(f"function {spec.name}: no output binding {name!r}")
            setting, queue = str(binding.get("connection") or STORAGE), str(binding["queueName"])
            service, queues = self.queue_service(setting), self.sender(setting)
            for item in value if isinstance(value, list) else [value]:  # text (encoding none)
                text = bytes(item).decode() if isinstance(item, bytes | bytearray) else item
                queues.send(queue, text if isinstance(text, str) else json.dumps(text))
                self.enqueued.notify(str(getattr(service, "account_name", "")), queue)

    def _add_queue(self, spec: FunctionSpec, options: QueueOptions, lease: LeaseOptions) -> None:
        name = str(spec.trigger.get("queueName", ""))
        queues = StorageQueues(self.queue_service(str(spec.trigger.get("connection") or STORAGE)))
        queue, poison = (StorageQueue(queues, n) for n in (name, name + POISON_SUFFIX))
        parts = (spec, queue, poison, options, lease, self.invoker)
        self.queues.append(QueueListener(*parts, watcher=self.enqueued))
        self.enqueued.register(self.queues[-1])
        self._listening(self.queues[-1])

    def _add_timer(self, spec: FunctionSpec) -> None:
        where, startup = f"function {spec.name!r} schedule", spec.trigger.get("runOnStartup")
        schedule = parse_schedule(str(spec.trigger.get("schedule", "")), where)
        gate = partial(self.timer_locks.holds, spec.name) if self.timer_locks else None
        self.timers.append(TimerRunner(spec, schedule, self.invoker, bool(startup), gate=gate))
        self._line(spec, self.timers[-1].describe())

    def _add_service_bus(self, spec: FunctionSpec, options: ServiceBusOptions) -> None:
        setting = str(spec.trigger.get("connection") or SERVICE_BUS)
        missing = (
            f"neither {setting} nor {setting}__fullyQualifiedNamespace is set, so there is no "
            "namespace to receive from"
        )
        connection = read_connection(self.environ, setting)
        if not (
            connection and (connection.connection_string or connection.fully_qualified_namespace)
        ):
            return self._line(spec, f"SKIPPED: {missing}")
        factory = partial(sdk_receiver_factory, queue_name=str(spec.trigger["queueName"]))
        receiver = self._client(setting, "Service Bus", factory, missing)
        self.service_bus.append(ServiceBusListener(spec, receiver, self.invoker, options))
        self._listening(self.service_bus[-1])

    def _listening(self, listener: QueueListener | ServiceBusListener) -> None:
        listener.unreadable = self.unreadable
        self._line(listener.spec, listener.describe())

    def start(self, stop: threading.Event) -> None:
        for queue in self.queues:
            queue.start(stop)
        if self.timer_locks is not None:
            self.timer_locks.try_all()  # before the first tick (and runOnStartup)
            start_thread("timer-locks", self.timer_locks.run, stop)
        for timer in self.timers:
            timer.start(stop)
        for bus in self.service_bus:
            bus.start(stop)
        if self.http is not None:
            self.http.start()

    def stop(self, grace_seconds: float) -> bool:
        """Stop serving (the caller has set the stop event) and wait up to ``grace_seconds``
        for running invocations *and* the settling of their messages; True if all ended."""
        if self.http is not None:
            self.http.stop()
        for queue in self.queues:
            queue.wake()  # out of its back-off, to see the stop
        if self.busy():
            log.info("waiting up to %.0f s for %d invocation(s)", grace_seconds, self.busy())
        deadline = time.monotonic() + grace_seconds
        while self.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not (settled := not self.busy()):
            text = "%d invocation(s) still running after %.0f s; exiting anyway: their queue "
            log.warning(text + "messages return as their leases lapse", self.busy(), grace_seconds)
        if self.timer_locks is not None:  # another instance takes the timers at once
            self.timer_locks.release_all()
        for listener in [*self.queues, *self.service_bus]:
            listener.shutdown()
        if settled:  # otherwise running functions may still renew leases through these clients
            for service in self.queue_services.values():
                service.close()
        return settled

    def busy(self) -> int:
        """Invocations running or messages not settled: zero when nothing is left to finish."""
        held = sum(q.in_flight for q in self.queues) + sum(b.in_flight for b in self.service_bus)
        return max(self.invoker.running, held)
