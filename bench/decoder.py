"""The order decoder on the worst shapes a queue message can carry: how long each takes.

    python -m bench.decoder [--runs 5]

``decode_order`` never trusts its input (docs/contracts.md §3.1); on these shapes its
work is bounded by construction, which ``tests/unit/test_orders_decoder.py`` checks by
counting (one forward scan, at most one parse, nesting refused before parsing). This
prints the figure the tests leave out: milliseconds per shape, the best of ``--runs``.
Numbers from a shared machine are noisy: compare runs made together, not digits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Final

from core.errors import InvalidOrder
from core.order_message import MAX_MESSAGE_CHARS, decode_order

#: name -> a message of at most MAX_MESSAGE_CHARS characters that is costly to look at.
WORST_SHAPES: Final = {
    "unterminated-escapes": '"' + "\\\\" * (MAX_MESSAGE_CHARS // 2 - 1),
    "escaped-quotes": '{"orderId":"a","s":"' + '\\"' * (MAX_MESSAGE_CHARS // 2 - 20) + '"}',
    "open-brackets": "[" * MAX_MESSAGE_CHARS,
    "empty-arrays": '{"orderId":"a","a":['
    + ",".join(["[]"] * (MAX_MESSAGE_CHARS // 3 - 10))
    + "]}",
}


def best_ms(raw: str, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        with contextlib.suppress(InvalidOrder):
            decode_order(raw)
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    figures = {name: best_ms(raw, args.runs) for name, raw in WORST_SHAPES.items()}
    print(json.dumps({"benchmark": "decoder", "runs": args.runs, "msPerShape": figures}, indent=2))


if __name__ == "__main__":
    main()
