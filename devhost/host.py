"""Turn function specs into running listeners, timers and an HTTP server, and stop them."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from devhost import app_loader as loader
from devhost.app_loader import FunctionSpec
from devhost.clients import Clients, service_bus_connection
from devhost.http import ALL_METHODS, DevhostHttpServer, Router, routes_for
from devhost.invoke import Invoker
from devhost.queues import POISON_SUFFIX, QueueListener, StorageQueue
from devhost.servicebus import ServiceBusListener, sdk_receiver_factory
from devhost.settings import (
    ConfigError,
    LeaseOptions,
    QueueOptions,
    ServiceBusOptions,
    route_prefix,
)
from devhost.timers import TimerRunner, parse_schedule

log = logging.getLogger("devhost")
_QUEUE_NAME = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


def check_queue_name(function: str, name: str) -> None:
    if not _QUEUE_NAME.match(name) or len(name) + len(POISON_SUFFIX) > 63:
        raise ConfigError(
            f"function {function!r}: {name!r} is not a usable Storage queue name "
            f"(3-{63 - len(POISON_SUFFIX)} lowercase letters, digits and single hyphens, so "
            f"that '{name}{POISON_SUFFIX}' fits too)"
        )


@dataclass
class DevHost:
    """Everything one devhost process runs. Build with :meth:`build`, then :meth:`start`."""

    invoker: Invoker
    clients: Clients
    lines: list[str] = field(default_factory=list)
    queues: list[QueueListener] = field(default_factory=list)
    timers: list[TimerRunner] = field(default_factory=list)
    service_bus: list[ServiceBusListener] = field(default_factory=list)
    http: DevhostHttpServer | None = None

    @classmethod
    def build(
        cls,
        specs: list[FunctionSpec],
        host_json: Mapping[str, Any],
        environ: Mapping[str, str],
        http_port: int,
    ) -> DevHost:
        """Check every function's configuration and build (not start) what runs it."""
        devhost = cls(Invoker(), Clients(environ))
        queue_options = QueueOptions.from_host_json(host_json)
        lease = LeaseOptions.from_env(environ)
        bus_options = ServiceBusOptions.from_host_json(host_json)
        http_specs = []
        for spec in specs:
            if spec.trigger_type == loader.QUEUE:
                devhost._add_queue(spec, queue_options, lease)
            elif spec.trigger_type == loader.TIMER:
                where = f"function {spec.name!r} schedule"
                runner = TimerRunner(
                    spec,
                    parse_schedule(str(spec.trigger.get("schedule", "")), where),
                    devhost.invoker,
                    run_on_startup=bool(spec.trigger.get("runOnStartup", False)),
                )
                devhost.timers.append(runner)
                devhost._line(spec, runner.describe())
            elif spec.trigger_type == loader.SERVICE_BUS:
                devhost._add_service_bus(spec, environ, bus_options)
            else:
                http_specs.append(spec)
        if http_specs:
            devhost._add_http(http_specs, route_prefix(host_json), http_port)
        return devhost

    def _line(self, spec: FunctionSpec, text: str) -> None:
        self.lines.append(f"devhost: {spec.name}: {spec.trigger_type} {text}")

    def _add_queue(self, spec: FunctionSpec, options: QueueOptions, lease: LeaseOptions) -> None:
        name = str(spec.trigger.get("queueName", ""))
        check_queue_name(spec.name, name)
        connection = str(spec.trigger.get("connection") or "AzureWebJobsStorage")
        service = self.clients.queue_service(connection)
        listener = QueueListener(
            spec,
            StorageQueue(service.get_queue_client(name)),
            StorageQueue(service.get_queue_client(name + POISON_SUFFIX)),
            options,
            lease,
            self.invoker,
        )
        self.queues.append(listener)
        self._line(spec, listener.describe())

    def _add_service_bus(
        self, spec: FunctionSpec, environ: Mapping[str, str], options: ServiceBusOptions
    ) -> None:
        setting = str(spec.trigger.get("connection") or "AzureWebJobsServiceBus")
        connection = service_bus_connection(environ, setting)
        if connection is None:
            self._line(
                spec,
                f"SKIPPED: neither {setting} nor {setting}__fullyQualifiedNamespace is set, so "
                "there is no namespace to receive from",
            )
            return
        listener = ServiceBusListener(
            spec, sdk_receiver_factory(connection, spec.trigger), self.invoker, options
        )
        self.service_bus.append(listener)
        self._line(spec, listener.describe())

    def _add_http(self, specs: list[FunctionSpec], prefix: str, port: int) -> None:
        routes = routes_for(specs, prefix)
        self.http = DevhostHttpServer(port, Router(routes), self.invoker)
        for route in routes:
            assert route.spec is not None
            methods = (
                "any method"
                if route.methods == frozenset(ALL_METHODS)
                else ",".join(sorted(route.methods))
            )
            path = "/".join(p for p in (prefix, route.template.strip("/")) if p)
            auth = route.spec.trigger.get("authLevel", "FUNCTION")
            self._line(
                route.spec,
                f"{methods} {self.http.base_url}/{path} (authLevel {auth} not enforced locally)",
            )

    def start(self, stop: threading.Event) -> None:
        for queue in self.queues:
            queue.start(stop)
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
        deadline = time.monotonic() + grace_seconds
        while self.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        settled = not self.busy()
        for queue in self.queues:
            queue.shutdown()
        for bus in self.service_bus:
            bus.shutdown()
        if settled:  # otherwise running functions may still renew leases through these clients
            self.clients.close()
        return settled

    def busy(self) -> int:
        """Invocations running plus messages not yet settled."""
        return (
            self.invoker.running
            + sum(queue.in_flight for queue in self.queues)
            + sum(bus.in_flight for bus in self.service_bus)
        )
