"""``python -m devhost``: run every function of a v2-model ``function_app.py`` locally, from
the app folder, with the app settings in the environment (local.settings.json is not read),
every invocation through azure-functions-runtime (:mod:`hostrun.worker`). It prints a line
per function, ``DEVHOST_HTTP=<url>`` when it serves HTTP, then ``DEVHOST_READY``.
SIGINT/SIGTERM stop it: running invocations get up to 10 s, then it exits 0; exit code 2:
the configuration cannot run.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from config.principals import OPERATOR
from config.settings import DEV_PRINCIPAL, DEVHOST_INSTANCE_ID, disabled_setting
from devhost import app_loader, deployed, pool
from devhost.host import DevHost
from devhost.invoke import Invoker
from devhost.settings import ConfigError, load_json, with_overrides
from devhost.singleton import host_id
from hostrun import worker as hostrun
from observability import opcount

log = logging.getLogger("devhost")
WEBSITE_HOSTNAME = "WEBSITE_HOSTNAME"
SHUTDOWN_GRACE_SECONDS = 10.0
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devhost",
        description="Run the functions a v2-model function_app.py declares, like `func start`.",
    )
    parser.add_argument("--app", default="function_app", help="module to import (from cwd)")
    parser.add_argument("--http-port", type=int, default=7071, help="0 picks a free port")
    parser.add_argument("--only", default="", help="comma-separated functions to run")
    parser.add_argument("--exclude", default="", help="comma-separated functions to skip")
    parser.add_argument("--instance-id", default=None, help=f"exported as {DEVHOST_INSTANCE_ID}")
    parser.add_argument(
        "--timers",
        choices=["singleton", "every"],
        default="singleton",
        help="singleton (as in Azure): each timer fires on one instance at a time, through "
        "the host's blob lease; every: in every devhost process",
    )
    parser.add_argument("--verbose", action="store_true", help="log successes at DEBUG")
    return parser.parse_args(argv)


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)
    logging.getLogger("devhost").setLevel(logging.DEBUG if verbose else logging.INFO)
    # The SDKs and werkzeug log every request at INFO; only their warnings matter here.
    for name in ("azure", "uamqp", "werkzeug"):
        logging.getLogger(name).setLevel(logging.WARNING)


def build(args: argparse.Namespace) -> DevHost:
    """Load the app, check every function, build what runs them."""
    root = os.getcwd()
    instance = args.instance_id or f"devhost-{socket.gethostname()}-{os.getpid()}"
    os.environ[DEVHOST_INSTANCE_ID] = instance
    # The local stand-in for sign-in (config/principals.py): a request without a principal
    # or key is the developer, as an operator; ORDERS_DEV_PRINCIPAL set (or empty) wins.
    if DEV_PRINCIPAL not in os.environ:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no user name in this environment (some containers)
            user = "developer"
        os.environ[DEV_PRINCIPAL] = f"{user}; roles={OPERATOR}"
    log.info("development principal: %s", os.environ[DEV_PRINCIPAL] or "none")
    # The deployment's platform settings, before the runtime starts (it reads its pool).
    applied = deployed.apply(os.environ, root)
    for name, value in applied.defaults.items():
        log.info("as deployed (%s): %s=%s", deployed.PATH, name, value)
    for name, (mine, value) in applied.overridden.items():
        log.warning("%s=%s set; deployed: %s (%s)", name, mine, value, deployed.PATH)
    # The runtime indexes the app as the host has it do; devhost reads the same bindings.
    runtime = hostrun.start(root, args.app)
    app = app_loader.find_app(app_loader.load_module(args.app, root))
    only, exclude = ({n.strip() for n in t.split(",")} - {""} for t in (args.only, args.exclude))
    every = list(app.get_functions())
    functions = app_loader.select(every, only, exclude, os.environ)
    if not functions:
        raise ConfigError("no functions selected")
    # What the host reads: the app can tell which functions this instance does not run.
    for fn in (fn for fn in every if fn not in functions):
        os.environ[disabled_setting(str(fn.get_function_name()))] = "true"
    specs = [app_loader.build_spec(fn, os.environ) for fn in functions]
    host_json = with_overrides(load_json(Path(root, "host.json")), os.environ)
    if short := pool.shortfall(specs, host_json, os.environ):
        log.warning("%s", short)
    lock_id = host_id(os.environ, str(Path(root, args.app).resolve()))
    singleton = (lock_id, instance) if args.timers == "singleton" else None
    invoker = Invoker(runtime.call)
    devhost = DevHost.build(specs, host_json, os.environ, args.http_port, invoker, singleton)
    runtime.deliver = devhost.deliver  # output bindings
    if devhost.http is not None:
        # This instance's host name, as Azure and `func start` set it (core/links.py).
        os.environ[WEBSITE_HOSTNAME] = devhost.http.base_url.removeprefix("http://")
    # Storage requests counted for the benchmarks: which ones a timer invocation made.
    opcount.set_trigger_lookup(runtime.current_trigger)
    return devhost


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.verbose)
    try:
        devhost = build(args)
    except (ConfigError, hostrun.WorkerError) as error:
        print(f"devhost: error: {error}", file=sys.stderr, flush=True)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():  # a second Ctrl-C: no more waiting
            _exit(1)
        log.info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    print("\n".join(devhost.lines))
    devhost.start(stop)
    if devhost.http is not None:
        print(f"DEVHOST_HTTP={devhost.http.base_url}")
    print(f"DEVHOST_READY instance={os.environ[DEVHOST_INSTANCE_ID]}", flush=True)
    while not stop.wait(0.5):
        pass
    devhost.stop(SHUTDOWN_GRACE_SECONDS)
    log.info("stopped")
    return 0


def _exit(code: int) -> None:
    """Exit without waiting for worker threads: a function or a broker that never returns
    must not keep the process alive (what they hold is leased, so it comes back)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
