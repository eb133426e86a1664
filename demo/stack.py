"""A whole local deployment in processes: Azurite, the simulator, N devhost instances, and
with ``transport="servicebus"`` the local Service Bus double (``localbus``) for the agent
queues (the app's ``AGENT_TRANSPORT=servicebus``, through the real SDK).

    with LocalStack(devhosts=2) as stack:
        stack.submit({"orderId": "o-1"})
        stack.kill(0); stack.restart(0)

Every process is started here, logs to ``workdir``, and is stopped here by
process id (SIGTERM, then SIGKILL), also when the caller fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from bootstrap import AppContext, bootstrap
from config.settings import OPCOUNT_DIR, Settings, Transport
from core.names import Names
from localrun.azurite import Azurite
from localrun.processes import kill_group, read_announcement, stop_group

if TYPE_CHECKING:
    from localbus.process import LocalBus

ROOT = Path(__file__).resolve().parent.parent
#: The queues the demo names as its orders' replyTo (``REPLY_QUEUES``): ``demo-status-<run>``.
DEMO_REPLY_QUEUES = "demo-status-*"


@dataclass
class Devhost:
    index: int
    args: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[str] | None = None
    http_url: str | None = None
    _log: IO[str] | None = None
    starts: int = 0
    module: str = "devhost"  # bench.cpuhost: devhost under a profiler

    def start(self) -> None:
        self.starts += 1
        self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
        args = list(self.args)
        if self.http_url and "--http-port" in args:
            # A restarted instance listens where it did (as an app's address outlives its
            # instances): addresses it handed out (a remote's callback URL) still reach it.
            args[args.index("--http-port") + 1] = self.http_url.rsplit(":", 1)[1]
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                self.module,
                *args,
                "--instance-id",
                f"devhost-{self.index}-{self.starts}",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        if "--only" not in self.args:  # it serves the HTTP routes: wait until it listens
            self.http_url = read_announcement(self.process, "DEVHOST_HTTP=", 60)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, exactly like a host that dies."""
        if self.process is not None:
            kill_group(self.process)
        self._close()

    def stop(self, grace: float = 15) -> None:
        if self.process is not None:
            stop_group(self.process, grace)
        self._close()

    def _close(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class LocalStack:
    devhosts: int = 2
    settings: dict[str, str] = field(default_factory=dict)
    simulator_args: list[str] = field(default_factory=list)
    devhost_args: list[list[str]] | None = None  # per instance; default: all functions
    devhost_env: list[dict[str, str]] | None = None  # per instance, on top of ``settings``
    autostart: bool = True  # False: create the devhosts, start each with ``hosts[i].start()``
    workdir: Path | None = None
    keep_workdir: bool = False
    #: "storage" (Storage queues on Azurite) or "servicebus" (the agent queues on localbus)
    transport: str = "storage"
    #: The managed identity's header secret, shared by the devhosts and the simulator's
    #: identity endpoint, which refuses any other (as App Service's does).
    identity_header: str = field(default_factory=lambda: os.urandom(16).hex())
    #: Service Bus only: queue options for both agent queues, e.g. {"lock-duration": "10"};
    #: the defaults are infra/app/servicebus.bicep's (localbus.entities.QueueConfig).
    bus_options: dict[str, str] = field(default_factory=dict)
    devhost_module: str = "devhost"  # what ``python -m`` runs for each instance

    azurite: Azurite | None = None
    bus: LocalBus | None = None
    simulator: subprocess.Popen[str] | None = None
    simulator_url: str = ""
    hosts: list[Devhost] = field(default_factory=list)
    _context: AppContext | None = None
    _sim_log: IO[str] | None = None

    def start(self) -> LocalStack:
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="orders-stack-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        assert self.workdir is not None
        Transport(self.transport)  # "storage" or "servicebus", or a ValueError
        self.azurite = Azurite.start(location=self._fresh_dir("azurite"))
        if self.transport == Transport.SERVICE_BUS:
            self.bus = self._start_bus()
        self._sim_log = open(self.workdir / "simulator.log", "a")  # noqa: SIM115
        self.simulator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "simulator",
                "--port",
                "0",
                "--ledger",
                str(self.ledger_path),
                "--identity-header",
                self.identity_header,
                *self.simulator_args,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=self._sim_log,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.simulator_url = read_announcement(self.simulator, "SIMULATOR_URL=", 30)
        self.context.provision()
        per_host = self.devhost_args or [[] for _ in range(self.devhosts)]
        for index, extra in enumerate(per_host):
            args = [*extra, "--http-port", "0"] if "--http-port" not in extra else list(extra)
            env = {**self.env, **(self.devhost_env[index] if self.devhost_env else {})}
            log_path = self.workdir / f"devhost-{index}.log"
            host = Devhost(index, args, env, log_path, module=self.devhost_module)
            self.hosts.append(host)
        if self.autostart:
            for host in self.hosts:
                host.start()

    def _start_bus(self) -> LocalBus:
        """The double, with the app's Service Bus queues as infra/ declares them (every
        queue dead-letters what expires: a request as a "not called" report, a reply as an
        alert), plus ``bus_options``."""
        from localbus.process import LocalBus

        assert self.workdir is not None
        names = Names()
        extra = "".join(f":{key}={value}" for key, value in self.bus_options.items())
        return LocalBus.start(
            [f"{queue}{extra}" for queue in names.service_bus_queues()],
            log_path=self.workdir / "localbus.log",
        )

    @property
    def service_bus_connection(self) -> str | None:
        return self.bus.connection_string if self.bus is not None else None

    def _fresh_dir(self, name: str) -> Path:
        assert self.workdir is not None
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def ledger_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "ledger.jsonl"

    @property
    def connection_string(self) -> str:
        assert self.azurite is not None
        return self.azurite.connection_string

    @property
    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AzureWebJobs", "ServiceBus", "ORDERS_FAILPOINTS"))
        }
        env.update(
            {
                "AzureWebJobsStorage": self.connection_string,
                "AGENT_TRANSPORT": self.transport,
                "REMOTE_SERVICE_URL": self.simulator_url,
                "STEP_TIMEOUT_SECONDS": "10",
                "MAX_FAILURE_COUNT": "5",
                "SUPERVISOR_SCHEDULE": "*/2 * * * * *",
                # The demo's status queues (demo/__main__.py), unless you name yours
                "REPLY_QUEUES": os.environ.get("REPLY_QUEUES") or DEMO_REPLY_QUEUES,
                "PYTHONUNBUFFERED": "1",
                # No PYTHON_THREADPOOL_THREAD_COUNT: devhost applies the deployed value when
                # unset (devhost/deployed.py), as it does for anyone who starts it.
                # The app's managed identity, locally: azure-identity's own App Service
                # protocol against the simulator's identity endpoint (simulator/identity.py),
                # for agents declared with EntraToken.
                "IDENTITY_ENDPOINT": f"{self.simulator_url}/_identity/token",
                "IDENTITY_HEADER": self.identity_header,
            }
        )
        if self.bus is not None:
            env["ServiceBusConnection"] = self.bus.connection_string
        env.update(self.settings)
        return env

    @property
    def context(self) -> AppContext:
        """The app's own view of the storage (same names as the devhosts use)."""
        if self._context is None:
            # The client's own requests are not the app's: never counted (opcount).
            env = {k: v for k, v in self.env.items() if k != OPCOUNT_DIR}
            self._context = bootstrap(Settings.from_env(env))
        return self._context

    @property
    def http_url(self) -> str | None:
        return next((h.http_url for h in self.hosts if h.http_url and h.alive), None)

    def submit(self, order: dict[str, Any] | str | bytes) -> None:
        """Put an order message on the `orders` queue, as an app would."""
        if isinstance(order, dict):
            text = json.dumps(order)
        elif isinstance(order, bytes):
            text = order.decode("utf-8", errors="replace")
        else:
            text = order
        self.context.queues.client(self.context.names.orders).send_message(text)

    def outage(self, control: dict[str, Any]) -> dict[str, Any]:
        """Put the simulated remote services into an outage (``POST /_outage``)."""
        import httpx

        response = httpx.post(f"{self.simulator_url}/_outage", json=control, timeout=10)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    def health(self, control: dict[str, Any]) -> dict[str, Any]:
        """Set the simulated service's own health endpoint (``POST /_healthcheck``)."""
        import httpx

        response = httpx.post(f"{self.simulator_url}/_healthcheck", json=control, timeout=10)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    def remote_calls(self, since: str | None = None) -> list[dict[str, Any]]:
        """The calls the remote services received (``GET /_calls``), oldest first."""
        import httpx

        params = {"since": since} if since else None
        response = httpx.get(f"{self.simulator_url}/_calls", params=params, timeout=10)
        response.raise_for_status()
        return response.json()["calls"]  # type: ignore[no-any-return]

    def kill(self, index: int) -> None:
        self.hosts[index].kill()

    def restart(self, index: int) -> None:
        host = self.hosts[index]
        if host.alive:
            host.kill()
        host.start()

    def stop(self) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.stop()
        if self.simulator is not None:
            stop_group(self.simulator)
            if self.simulator.stdout is not None:
                self.simulator.stdout.close()
        if self._sim_log is not None:
            self._sim_log.close()
            self._sim_log = None
        if self.bus is not None:
            self.bus.stop()
            self.bus = None
        if self.azurite is not None:
            self.azurite.stop()
            self.azurite = None
        if self.workdir is not None and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
