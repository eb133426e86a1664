"""``python -m simulator``: serve the simulated remote services until SIGTERM/SIGINT.

Prints exactly one line, ``SIMULATOR_URL=http://127.0.0.1:<port>``, once listening.
With ``--outage SCHEDULE`` the schedule's first phase is in force before that line.
The managed identity endpoint is ``<SIMULATOR_URL>/_identity/token`` (``simulator.identity``).
Steps hand out ids that their compensations must name (``simulator.engine``), and a call
that asks for a callback is called back (``simulator.callbacks``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from simulator.callbacks import DEFAULT_CALLBACK_MS
from simulator.engine import DEFAULT_COMPENSATIONS, DEFAULT_IDS
from simulator.faults import DEFAULT_HANG_SECONDS, RandomFaults, parse_latency
from simulator.identity import DEFAULT_TOKEN_SECONDS, MAX_TOKEN_SECONDS, parse_rule
from simulator.outage import OutageError, Phase, parse_outage_cli
from simulator.server import SimulatorServer


def _compensation(text: str) -> tuple[str, str]:
    step, sep, target = text.partition("=")
    if not sep or not step or not target:
        raise argparse.ArgumentTypeError(f"{text!r} is not STEP=TARGET")
    return step, target


def _id(text: str) -> tuple[str, str]:
    step, sep, field = text.partition("=")
    if not sep or not step or not field:
        raise argparse.ArgumentTypeError(f"{text!r} is not STEP=FIELD")
    return step, field


def _callback_ms(text: str) -> int:
    if not text.isdigit() or int(text) > 600_000:
        raise argparse.ArgumentTypeError(f"{text!r} is not 0-600000 milliseconds")
    return int(text)


def _rule(text: str) -> tuple[str, str]:
    try:
        return parse_rule(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _token_seconds(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_TOKEN_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not 1-{MAX_TOKEN_SECONDS} seconds")
    return int(text)


def _latency(text: str) -> tuple[int, int]:
    try:
        return parse_latency(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _outage(text: str) -> list[Phase]:
    try:
        return parse_outage_cli(text)
    except OutageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator",
        description="Simulated remote services: POST /<step> with an Idempotency-Key.",
    )
    parser.add_argument("--port", type=int, default=0, help="0 (default) picks a free port")
    parser.add_argument("--ledger", metavar="PATH", help="append applied effects to this JSONL")
    parser.add_argument("--transient-rate", type=float, default=0.0, metavar="P")
    parser.add_argument("--hang-rate", type=float, default=0.0, metavar="P")
    parser.add_argument("--hang-seconds", type=float, default=DEFAULT_HANG_SECONDS, metavar="S")
    parser.add_argument("--drop-rate", type=float, default=0.0, metavar="P")
    parser.add_argument(
        "--latency-ms", type=_latency, default=(0, 0), metavar="N|LOW-HIGH",
        help="added latency, uniform in [LOW, HIGH] ms",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="default: random")
    parser.add_argument("--max-random-faults-per-key", type=int, default=2, metavar="N")
    parser.add_argument(
        "--compensation", type=_compensation, action="append", metavar="STEP=TARGET",
        help="STEP undoes TARGET (repeatable; added to the default map "
        + ", ".join(f"{k}={v}" for k, v in DEFAULT_COMPENSATIONS.items()) + ")",
    )  # fmt: skip
    parser.add_argument(
        "--id", type=_id, action="append", dest="ids", metavar="STEP=FIELD",
        help="STEP hands out an id in FIELD of its answer, and a compensation of STEP must "
        "name it in the same field of its body (repeatable; replaces the default map "
        + ", ".join(f"{k}={v}" for k, v in DEFAULT_IDS.items()) + ")",
    )  # fmt: skip
    parser.add_argument(
        "--no-ids", action="store_true",
        help="hand out no ids and require none (compensations undo by order)",
    )  # fmt: skip
    parser.add_argument(
        "--callback-ms", type=_callback_ms, default=DEFAULT_CALLBACK_MS, metavar="MS",
        help="how long after accepting a call that asks for a callback it is sent (default "
        f"{DEFAULT_CALLBACK_MS}; a directive's callbackMs overrides it)",
    )  # fmt: skip
    parser.add_argument(
        "--outage", type=_outage, metavar="SCHEDULE",
        help="start with an outage: phases back to back, e.g. 'error:503:20,unreachable:15' "
        "(error:STATUS:SECONDS[:RETRY_AFTER], unreachable:SECONDS; 3600 s at most in all)",
    )  # fmt: skip
    parser.add_argument(
        "--identity-header", metavar="SECRET",
        default=os.environ.get("SIMULATOR_IDENTITY_HEADER") or None,
        help="the X-IDENTITY-HEADER the identity endpoint accepts (the app's IDENTITY_HEADER; "
        "default: $SIMULATOR_IDENTITY_HEADER, else any non-empty value)",
    )  # fmt: skip
    parser.add_argument(
        "--require-token", type=_rule, action="append", metavar="STEP=AUDIENCE",
        help="POST /STEP needs a bearer token issued here for AUDIENCE (repeatable), "
        "e.g. ship=api://carrier",
    )  # fmt: skip
    parser.add_argument(
        "--token-seconds", type=_token_seconds, default=DEFAULT_TOKEN_SECONDS, metavar="S",
        help=f"lifetime of the tokens issued (default {DEFAULT_TOKEN_SECONDS})",
    )  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    seed = args.seed
    if seed is None:
        seed = int.from_bytes(os.urandom(4))
    try:
        faults = RandomFaults(
            transient_rate=args.transient_rate,
            hang_rate=args.hang_rate,
            drop_rate=args.drop_rate,
            hang_seconds=args.hang_seconds,
            latency_ms=args.latency_ms,
            seed=seed,
            max_per_key=args.max_random_faults_per_key,
        )
    except ValueError as exc:
        parser.error(str(exc))
    compensations = {**DEFAULT_COMPENSATIONS, **dict(args.compensation or [])}
    if args.no_ids and args.ids:
        parser.error("--no-ids and --id exclude each other")
    ids = {} if args.no_ids else dict(args.ids) if args.ids else None

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = SimulatorServer(
        faults=faults,
        compensations=compensations,
        ledger_path=args.ledger,
        port=args.port,
        verbose=args.verbose,
        identity_header=args.identity_header,
        require_token=dict(args.require_token or ()),
        token_seconds=args.token_seconds,
        ids=ids,
        callback_ms=args.callback_ms,
    )
    try:
        server.start()
    except OSError as exc:
        print(f"simulator: cannot listen on port {args.port}: {exc}", file=sys.stderr)
        return 2
    if args.outage:
        # In force before the URL is printed, so the first call meets it.
        server.start_outage(args.outage)
    print(f"SIMULATOR_URL={server.url}", flush=True)
    if args.verbose:
        print(f"simulator: seed={seed} faults={faults}", file=sys.stderr, flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
