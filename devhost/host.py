"""Turn function specs into running listeners, timers and an HTTP server, and stop them.

Connections are read and clients built as the app does it (``core.settings``,
``bootstrap.clients``, ``messaging.servicebus``), with one Storage client per connection.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bootstrap import clients
from config.settings import OPCOUNT_DIR, STORAGE
from config.settings import connection as read_connection
from devhost import app_loader as loader
from devhost.app_loader import FunctionSpec
from devhost.http import HttpServer, route_path
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
    enqueued: EnqueueWatcher = field(default_factory=EnqueueWatcher)
    #: The timers' singleton locks (None: every timer fires in this process)
    timer_locks: TimerLocks | None = None
    #: Queues no receive has read for a minute: one alert each (``devhost/unreadable.py``)
    unreadable: UnreadableQueues = field(init=False)

    def __post_init__(self) -> None:
        self.unreadable = UnreadableQueues(self._send_alert)

    def _send_alert(self, queue: str, body: str) -> None:
        """An alert of devhost's own, to the app's ``operator-alerts`` in its storage."""
        StorageQueues(self.queue_service(STORAGE)).send(queue, body)

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
        """Check every function's configuration and build (not start) what runs it.
        ``singleton``: (host id, instance id) to fire each timer on one instance at a time
        (``devhost/singleton.py``); None fires every timer here."""
        devhost = cls(invoker, environ)
        timers = [spec for spec in specs if spec.trigger_type == loader.TIMER]
        if timers and singleton is not None:
            devhost.timer_locks = devhost._timer_locks(*singleton)
            devhost.timer_locks.add(spec.name for spec in timers)
        queue_options: QueueOptions | None = None  # read only if there is a queue trigger
        lease = LeaseOptions.from_env(environ)
        bus_options = ServiceBusOptions.from_host_json(host_json)
        for spec in specs:
            if spec.trigger_type == loader.QUEUE:
                queue_options = queue_options or QueueOptions.from_host_json(host_json)
                devhost._add_queue(spec, queue_options, lease)
            elif spec.trigger_type == loader.TIMER:
                where = f"function {spec.name!r} schedule"
                schedule = parse_schedule(str(spec.trigger.get("schedule", "")), where)
                startup = bool(spec.trigger.get("runOnStartup", False))
                gate = devhost.timer_locks.gate(spec.name) if devhost.timer_locks else None
                runner = TimerRunner(
                    spec, schedule, devhost.invoker, run_on_startup=startup, gate=gate
                )
                devhost.timers.append(runner)
                devhost._line(spec, runner.describe())
            elif spec.trigger_type == loader.SERVICE_BUS:
                devhost._add_service_bus(spec, bus_options)
        http = [spec for spec in specs if spec.trigger_type == loader.HTTP]
        if http:
            devhost._add_http(http, route_prefix(host_json), http_port)
        return devhost

    def _line(self, spec: FunctionSpec, text: str) -> None:
        self.lines.append(f"devhost: {spec.name}: {spec.trigger_type} {text}")

    def _timer_locks(self, host: str, instance: str) -> TimerLocks:
        connection = read_connection(self.environ, STORAGE)
        if connection is None:
            raise ConfigError(
                f"timer functions take their singleton locks in {STORAGE}, which is not set: "
                "set it, or run every timer in every process with --timers every"
            )
        try:
            service = clients.blob_service(connection, **lock_client_options())
            container = service.get_container_client(LOCK_CONTAINER)
        except ValueError as error:
            raise ConfigError(f"setting {STORAGE}: not usable for blobs ({error})") from error
        return TimerLocks(BlobLeases(container), host, instance)

    def queue_service(self, setting: str) -> Any:
        """The process's QueueServiceClient for a connection setting, built on first use."""
        if setting not in self.queue_services:
            connection = read_connection(self.environ, setting)
            if connection is None:
                raise ConfigError(
                    f"Storage connection {setting!r} is not configured: set {setting} to a "
                    f"connection string, or {setting}__accountName / {setting}__queueServiceUri "
                    "for an identity-based connection"
                )
            try:
                # the host's own requests are counted too, where a benchmark asks for it
                self.queue_services[setting] = clients.queue_service(
                    connection, self.environ.get(OPCOUNT_DIR)
                )
            except ValueError as error:
                raise ConfigError(f"setting {setting}: not usable for Storage ({error})") from error
        return self.queue_services[setting]

    def deliver(self, spec: FunctionSpec, outputs: Mapping[str, Any]) -> None:
        """A successful invocation's output bindings, as the host flushes them: each Storage
        queue output's value sent to its queue (created if missing, as the host does), a
        list as one message per item; raises if a send fails (the invocation then fails)."""
        for name, value in outputs.items():
            binding = spec.outputs.get(name)
            if binding is None:  # the runtime only returns declared bindings
                raise ConfigError(f"function {spec.name}: no output binding {name!r}")
            service = self.queue_service(str(binding.get("connection") or STORAGE))
            queues = StorageQueues(service)  # its send creates a missing queue, as the host
            queue = str(binding["queueName"])
            for item in value if isinstance(value, list) else [value]:
                text = (
                    bytes(item).decode("utf-8")  # messageEncoding none: text only
                    if isinstance(item, bytes | bytearray)
                    else item
                    if isinstance(item, str)
                    else json.dumps(item)
                )
                queues.send(queue, text)
                # The host's SharedQueueWatcher: its own output bindings wake the listener.
                self.enqueued.notify(str(getattr(service, "account_name", "")), queue)

    def _add_queue(self, spec: FunctionSpec, options: QueueOptions, lease: LeaseOptions) -> None:
        name = str(spec.trigger.get("queueName", ""))
        service = self.queue_service(str(spec.trigger.get("connection") or STORAGE))
        queues = StorageQueues(service)
        queue, poison = (StorageQueue(queues, n) for n in (name, name + POISON_SUFFIX))
        listener = QueueListener(
            spec, queue, poison, options, lease, self.invoker, watcher=self.enqueued
        )
        listener.unreadable = self.unreadable
        self.queues.append(listener)
        self.enqueued.register(listener)
        self._line(spec, listener.describe())

    def _add_service_bus(self, spec: FunctionSpec, options: ServiceBusOptions) -> None:
        setting = str(spec.trigger.get("connection") or "AzureWebJobsServiceBus")
        connection = read_connection(self.environ, setting)
        if not (
            connection and (connection.connection_string or connection.fully_qualified_namespace)
        ):
            self._line(
                spec,
                f"SKIPPED: neither {setting} nor {setting}__fullyQualifiedNamespace is set, so "
                "there is no namespace to receive from",
            )
            return
        try:
            receiver = sdk_receiver_factory(connection, str(spec.trigger["queueName"]))
        except ValueError as error:
            raise ConfigError(f"setting {setting}: not usable for Service Bus ({error})") from error
        listener = ServiceBusListener(spec, receiver, self.invoker, options)
        listener.unreadable = self.unreadable
        self.service_bus.append(listener)
        self._line(spec, listener.describe())

    def _add_http(self, specs: list[FunctionSpec], prefix: str, port: int) -> None:
        self.http = HttpServer(port, specs, prefix, self.invoker)
        for spec in specs:
            methods = ",".join(sorted(spec.trigger.get("methods") or [])) or "any method"
            auth = spec.trigger.get("authLevel", "FUNCTION")
            url = f"{self.http.base_url}/{route_path(spec, prefix)}"
            self._line(spec, f"{methods} {url} (authLevel {auth} not enforced locally)")

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
        deadline = time.monotonic() + grace_seconds
        while self.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        settled = not self.busy()
        if self.timer_locks is not None:  # another instance takes the timers at once
            self.timer_locks.release_all()
        for queue in self.queues:
            queue.shutdown()
        for bus in self.service_bus:
            bus.shutdown()
        if settled:  # otherwise running functions may still renew leases through these clients
            for service in self.queue_services.values():
                service.close()
        return settled

    def busy(self) -> int:
        """Invocations running, or messages not yet settled (which include the running
        ones of queue triggers): zero when nothing is left to finish."""
        queues = sum(queue.in_flight for queue in self.queues)
        return max(self.invoker.running, queues + sum(bus.in_flight for bus in self.service_bus))
