"""``python -m tests.model --budget SECONDS [--seed N] [--report]``: a longer search.

Runs the model (``tests.model.machine``) seed after seed until the budget is spent. On a
failure it prints the seed, the invariant's signature and Hypothesis's shortest failing
sequence of rules, as a script ``--replay`` runs again (each step followed by the
invariants, as Hypothesis runs them). Without ``--report`` it stops at the first failure
(exit 1). With ``--report`` it goes on: a signature already found is recorded but no
longer fails an example (so the next seeds look for others), and at the end a table
lists each DISTINCT signature with the time (from the start) at which it was first seen
and the seed whose shortest sequence is printed.

``make model-check`` runs it with ``MODEL_BUDGET`` (default 3600 s).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.internal.conjecture import engine as conjecture_engine
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from tests.model import signatures
from tests.model.machine import EngineModel
from tests.model.signatures import KNOWN, SIGNATURES, Recorder, Violation, invariant_of

#: Examples per seed: a seed's run stays short (a failure's shrinking comes on top), so
#: the budget is spent over many seeds.
EXAMPLES = 300
STEPS = 30
#: Shrinking per seed at most (seconds): a sequence is short long before this.
SHRINK_SECONDS = 60.0
HEADER = (
    "from tests.model.flows import Flow, Group, Items, Sleep, Task, Turns, Wait\n"
    "from tests.model.machine import EngineModel\n"
)


@dataclass
class Found:
    signature: str
    seed: int
    first_seen: float
    steps: str
    message: str


def run_seed(number: int, examples: int, steps: int, shrink_seconds: float) -> list[Violation]:
    """One Hypothesis run of the model under ``seed(number)``: the failures it shrank (for
    at most ``shrink_seconds`` in all: Hypothesis's own limit, 300 s, is an internal
    constant, set here so that a budget is spent searching more than shrinking)."""
    seeded = seed(number)(type("EngineModel", (EngineModel,), {}))
    try:
        with (
            mock.patch.object(conjecture_engine, "MAX_SHRINKING_SECONDS", shrink_seconds),
            with_reporter(_reported),
        ):
            run_state_machine_as_test(
                seeded,
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=steps,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                    phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    print_blob=False,
                ),
            )
    except Violation as exc:
        return [exc]
    except BaseExceptionGroup as group:
        for other in [e for e in group.exceptions if not isinstance(e, Violation)]:
            # Not a contract violation: the model's own trouble (a flaky replay, a bug in
            # it). Said, and the search goes on.
            print(f"seed {number}: the model failed: {type(other).__name__}: {other}")
        return [e for e in group.exceptions if isinstance(e, Violation)]
    except Exception as exc:  # the same, alone
        print(f"seed {number}: the model failed: {type(exc).__name__}: {exc}")
    return []


def _reported(value: object) -> None:
    """Hypothesis's own messages, but the steps (printed later, minimized) and its warning
    that shrinking stopped after "five minutes" (here: the per-seed limit)."""
    text = str(value)
    if text.startswith("state"):
        return
    if text.startswith("WARNING: Hypothesis has spent more than five minutes"):
        print("(shrinking stopped at the per-seed limit, --shrink-seconds)", flush=True)
        return
    print(text, flush=True)


def steps_of(exc: BaseException) -> list[str]:
    """Hypothesis's shortest failing sequence (its notes): one statement per item (a call
    may be printed over several lines), from ``state = ...`` to ``state.teardown()``."""
    notes = "\n".join(getattr(exc, "__notes__", []))  # one note a line, or one for all
    if "state = " not in notes:
        return []
    body = notes[notes.index("state = ") :].split("\nExplanation:")[0]
    statements: list[str] = []
    for line in body.splitlines():
        if line.startswith("state"):
            statements.append(line)
            if line.startswith("state.teardown"):
                break
        elif statements:
            statements[-1] += "\n" + line
    return statements


def script(statements: list[str]) -> str:
    """The statements as a script ``--replay`` runs: each step followed by
    ``state.check()`` (the invariants, which Hypothesis runs after every step)."""
    out: list[str] = []
    for statement in statements:
        out.append(statement)
        if statement.startswith("state.") and not statement.startswith("state.teardown"):
            out.append("state.check()")
    return HEADER + "\n".join(out)


def fails_with(source: str) -> str | None:
    """The signature a script fails with (None: it passes, or fails otherwise)."""
    scope: dict[str, Any] = {}
    try:
        exec(compile(source, "<steps>", "exec"), scope)
    except Violation as exc:
        return exc.signature
    except Exception:
        return None  # a step that makes no sense without one removed before it
    finally:
        state = scope.get("state")
        if isinstance(state, EngineModel):
            state.close()  # a script that failed before its teardown
    return None


def minimized(statements: list[str], signature: str, seconds: float = 20.0) -> list[str]:
    """``statements`` without every step the failure does not need (one at a time, until
    none can go): Hypothesis's shrinking, bounded per seed, may leave some behind. The
    model is deterministic, so a replay fails as the run did."""
    deadline = time.monotonic() + seconds
    steps = list(statements)
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for n in range(len(steps) - 2, 1, -1):  # never the machine, start or teardown
            if n >= len(steps) - 1 or time.monotonic() > deadline:
                continue
            candidate = steps[:n] + steps[n + 1 :]
            if fails_with(script(candidate)) == signature:
                steps, changed = candidate, True
    return steps


def replay(path: Path) -> int:
    """Run a script the runner printed; 1 if it fails (it prints the failure)."""
    logging.disable(logging.CRITICAL)
    source = path.read_text(encoding="utf-8")
    scope: dict[str, Any] = {}
    try:
        exec(compile(source, str(path), "exec"), scope)
    except Violation as exc:
        print(f"FAILED {exc}")
        return 1
    print("passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.model", description=__doc__)
    parser.add_argument("--budget", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--seed", type=int, default=None, help="the first seed (default: random)")
    parser.add_argument("--report", action="store_true", help="collect every distinct failure")
    parser.add_argument("--examples", type=int, default=EXAMPLES, help="examples per seed")
    parser.add_argument("--steps", type=int, default=STEPS, help="rules per example at most")
    parser.add_argument(
        "--shrink-seconds", type=float, default=SHRINK_SECONDS, help="shrinking per seed at most"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SIGNATURE",
        help="fail only on signatures starting with this (repeatable); others are only recorded",
    )
    parser.add_argument("--replay", type=Path, default=None, help="run a printed script again")
    args = parser.parse_args(argv)
    if args.replay is not None:
        return replay(args.replay)
    logging.disable(logging.CRITICAL)  # the engine's own logs: thousands of lines a second
    number = args.seed if args.seed is not None else random.randrange(1, 10**6)
    recorder = signatures.RECORDER = Recorder(only=tuple(args.only))
    found: dict[str, Found] = {}
    reported: dict[str, str] = {}  # failures lost at teardown, printed, by signature
    print(f"model check: budget {args.budget:g} s, first seed {number}", flush=True)
    while time.monotonic() - recorder.started < args.budget:
        began = time.monotonic() - recorder.started
        failures = run_seed(number, args.examples, args.steps, args.shrink_seconds)
        took = time.monotonic() - recorder.started - began
        print(f"seed {number}: {len(failures)} failure(s) in {took:.0f} s", flush=True)
        for exc in failures:
            if exc.signature in found:
                continue
            steps = steps_of(exc)
            if steps and fails_with(script(steps)) == exc.signature:
                steps = minimized(steps, exc.signature)
            item = Found(
                exc.signature,
                number,
                recorder.first_seen.get(exc.signature, began),
                script(steps) if steps else "(Hypothesis printed no steps)",
                str(exc).splitlines()[0],
            )
            found[exc.signature] = item
            recorder.suppressed.add(exc.signature)
            print(f"\n=== {item.signature} (seed {number}, first seen at {item.first_seen:.1f} s)")
            print(f"{item.message}\n")
            print(item.steps, flush=True)
            print()
        # failures Hypothesis dropped (at teardown, the input run out), of signatures that
        # failed no example (shrinking overruns often: those are found already)
        lost = {
            sig: text for sig, text in recorder.lost if sig not in found and sig not in reported
        }
        recorder.lost.clear()
        reported.update(lost)
        for text in lost.values():
            print(f"\n=== lost at teardown (seed {number}; the example ran out of input): {text}")
        if (failures or lost) and not args.report:
            return 1
        number += 1
    if not args.report:
        print("no failure found")
        return 0
    print("\n=== distinct failures (first seen: seconds from the start)")
    width = max([len(f.signature) for f in found.values()] + [9])
    print(f"{'signature':<{width}} {'first seen':>10} {'seed':>8}  meaning")
    for item in sorted(found.values(), key=lambda f: f.first_seen):
        meaning = SIGNATURES.get(invariant_of(item.signature), "")
        print(f"{item.signature:<{width}} {item.first_seen:>9.1f}s {item.seed:>8}  {meaning}")
    unshrunk = sorted(set(recorder.first_seen) - set(found))
    for signature in unshrunk:
        why = "seen, not shrunk (the budget ran out, or only in a replay)"
        if signature in KNOWN:
            why = "known, not fixed yet (signatures.KNOWN)"
        print(
            f"{why}: {signature} at "
            f"{recorder.first_seen[signature]:.1f} s: {recorder.first_message[signature][:300]}"
        )
    for text in reported.values():
        print(f"lost at teardown (the example ran out of input): {text[:300]}")
    return 1 if found or reported else 0


if __name__ == "__main__":
    sys.exit(main())
