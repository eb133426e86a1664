"""``python -m localbus``: a local Service Bus double for local runs and tests.

    python -m localbus --queues agent-requests,agent-replies [--host 127.0.0.1] [--port 0]
    python -m localbus --queues "orders:lock-duration=5:max-delivery-count=3,replies"

Prints ``LOCALBUS_CONNECTION=<connection string>`` (``UseDevelopmentEmulator=true``: plain
AMQP on the port it listens on), then serves until SIGTERM or SIGINT (exit 0). Queue
options (seconds for durations): ``max-delivery-count`` (5), ``lock-duration`` (30),
``default-ttl`` (3600), ``duplicate-window`` (600), ``dead-letter-on-expiration`` (true),
``duplicate-detection`` (true): the defaults are infra/app/servicebus.bicep's.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from typing import Any

from localbus import connection_string
from localbus.broker import Broker, run
from localbus.entities import QueueConfig


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m localbus", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--queues", required=True, help="comma-separated queues, each name[:option=value...]"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 (the default) picks a free port")
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        queues = [QueueConfig.parse(spec) for spec in args.queues.split(",") if spec.strip()]
    except ValueError as error:
        sys.stderr.write(f"localbus: error: {error}\n")
        return 2
    if not queues:
        sys.stderr.write("localbus: error: no queues\n")
        return 2
    broker = Broker(queues, args.host, args.port)

    def ready(port: int) -> None:
        sys.stdout.write(f"LOCALBUS_CONNECTION={connection_string(args.host, port)}\n")
        sys.stdout.flush()

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    broker.on_ready = ready
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with contextlib.suppress(SystemExit):
        run(broker).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
