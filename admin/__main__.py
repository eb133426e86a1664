"""The operator's command line: the operations of the HTTP API, against any storage.

    python -m admin show ORDER_ID
    python -m admin list --status error [--page-size 50] [--token T] [--all]
    python -m admin resubmit ORDER_ID [--as NAME]
    python -m admin cancel ORDER_ID [--reason TEXT] [--as NAME]
    python -m admin repair-index ORDER_ID
    python -m admin alerts [--peek N]

Storage comes from ``AzureWebJobsStorage`` (connection string) or
``AzureWebJobsStorage__accountName`` (your az login / managed identity), or
``--connection``. Changes are recorded in the order's history as made by your OS
user name, or by ``--as NAME`` (``--by`` is the same). Output is JSON. Exit status:
0 done, 1 refused (the order is not in a state that allows it), 2 bad usage,
3 storage did not answer or the outcome of a change is unknown (read the order,
then retry), 4 order not found, 5 the order's records cannot be read.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from typing import Any

from core.errors import (
    ConcurrencyConflict,
    CorruptOrder,
    OrderError,
    OrderNotFound,
    StorageUnavailable,
    TransitionRefused,
)
from core.names import Names
from core.settings import Settings
from core.states import OrderStatus
from runtime.context import AppContext


def _context(connection: str | None) -> AppContext:
    env = dict(os.environ)
    if connection:
        env["AzureWebJobsStorage"] = connection
    env.setdefault("AGENT_TRANSPORT", "storage")  # the CLI never sends agent messages
    return AppContext(Settings.from_env(env), Names())


def os_user() -> str:
    """Who runs the CLI, for the order's history (``--as`` overrides it)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        return f"uid-{os.getuid()}" if hasattr(os, "getuid") else "unknown-user"


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m admin", description="Operate on orders.")
    parser.add_argument("--connection", help="storage connection string (default: env)")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="an order with every step and attempt")
    show.add_argument("order_id")
    listing = sub.add_parser("list", help="orders with a status, a page at a time")
    listing.add_argument("--status", required=True, choices=[s.value for s in OrderStatus])
    listing.add_argument("--page-size", type=int, default=50)
    listing.add_argument("--token", default=None, help="continuationToken of the last page")
    listing.add_argument("--all", action="store_true", help="follow every page")
    for name, text in (
        ("resubmit", "put an error order back to work at its failed step"),
        ("cancel", "stop an unfinished order and undo what it did"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("order_id")
        command.add_argument(
            "--as",
            "--by",
            dest="by",
            default=None,
            metavar="NAME",
            help="who, for the order's history (default: your OS user name)",
        )
        if name == "cancel":
            command.add_argument("--reason", default="")
    repair = sub.add_parser(
        "repair-index", help="rebuild an order's index rows from its state (idempotent)"
    )
    repair.add_argument("order_id")
    alerts = sub.add_parser("alerts", help="operator alerts waiting on the queue (not removed)")
    alerts.add_argument("--peek", type=int, default=32)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        ctx = _context(args.connection)
        admin = ctx.admin
        if args.command == "show":
            _print(admin.show(args.order_id))
        elif args.command == "list":
            status = OrderStatus(args.status)
            page = admin.list(status, args.page_size, args.token)
            if args.all:
                orders = list(page["orders"])
                while page["continuationToken"]:
                    page = admin.list(status, args.page_size, page["continuationToken"])
                    orders += page["orders"]
                page = {"orders": orders, "continuationToken": None}
            _print(page)
        elif args.command == "resubmit":
            _print(admin.resubmit(args.order_id, args.by or os_user()))
        elif args.command == "cancel":
            _print(admin.cancel(args.order_id, args.by or os_user(), args.reason))
        elif args.command == "repair-index":
            _print(admin.repair_index(args.order_id))
        elif args.command == "alerts":
            client = ctx.queues.client(ctx.names.operator_alerts)
            _print(
                [
                    json.loads(m.content)
                    for m in client.peek_messages(max_messages=min(args.peek, 32))
                ]
            )
    except OrderNotFound as exc:
        _print({"error": exc.message})
        return 4
    except TransitionRefused as exc:
        _print({"error": exc.message, "reason": exc.reason})
        return 1
    except (StorageUnavailable, ConcurrencyConflict) as exc:
        _print({"error": exc.message, "retryable": True})
        print(exc.message, file=sys.stderr)
        return 3
    except CorruptOrder as exc:
        _print({"error": exc.message})
        return 5
    except (OrderError, ValueError) as exc:
        _print({"error": str(exc)})
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
