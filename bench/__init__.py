"""Benchmarks: they print JSON numbers; nothing here asserts a speed."""

from __future__ import annotations

import argparse


def stack_options(parser: argparse.ArgumentParser, *, timeout: float) -> None:
    """The options of a benchmark that starts the local stack (``demo.stack.LocalStack``):
    ``--devhosts`` (2), ``--transport`` (``storage``) and ``--timeout`` (``timeout`` s)."""
    parser.add_argument("--devhosts", type=int, default=2)
    parser.add_argument(
        "--transport",
        default="storage",
        choices=["storage", "servicebus"],
        help="the agent queues: Storage (Azurite) or Service Bus (localbus, as deployed)",
    )
    parser.add_argument("--timeout", type=float, default=timeout)
