"""Decisions read typed state, not the log (docs/contracts.md §3.11).

1. A property test: the same moves (claims, reports of every kind for the current and for
   earlier attempts, duplicates, expiries, cancels with and without the statement,
   resubmits) applied to two copies of an order, one of which has its histories cut
   short between moves, end in the same verdicts: statuses, step states, counts, doubt,
   times, and every notice sent.
2. Static checks: no decision in ``core/`` reads a history, and every history event name
   is written through the one enum (``core.history.Happened``).
3. Rows written before typed attempt state are migrated when read.
"""

from __future__ import annotations

import ast
import copy
import json
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import TransitionRefused
from core.history import Happened, read_history
from core.messages import AgentReply
from core.model import Order
from core.outcome import Applied, Outcome
from core.policy import RetryPolicy
from core.states import StepState
from stores import entities
from tests.unit.test_model import T0, new_order

ROOT = Path(__file__).resolve().parents[2]
POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, deferral_window_seconds=120)

OUTCOMES = ("succeeded", "refused", "settling", "transient-no", "transient-maybe", "deferred")
Move = tuple[str, int, int]  # (kind, a number to pick with, seconds to advance)

moves = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "claim",
                "report",
                "report",
                "report",
                "late",
                "expire",
                "cancel",
                "cancel-stating",
                "resubmit",
                "truncate",
            ]
        ),
        st.integers(0, 40),
        st.integers(0, 40),
    ),
    min_size=1,
    max_size=60,
)


def _reply(order: Order, step: str, attempt: int, outcome: str, now: datetime) -> AgentReply:
    kind = {
        "succeeded": Outcome.SUCCEEDED,
        "refused": Outcome.REFUSED,
        "settling": Outcome.REFUSED,
        "transient-no": Outcome.TRANSIENT,
        "transient-maybe": Outcome.TRANSIENT,
        "deferred": Outcome.DEFERRED,
    }[outcome]
    record = order.find(step)
    return AgentReply(
        order.order_id,
        step,
        attempt,
        now,
        kind,
        result={"ok": True} if kind is Outcome.SUCCEEDED else None,
        error=None if kind is Outcome.SUCCEEDED else outcome,
        applied=None
        if kind is Outcome.SUCCEEDED
        else (Applied.MAYBE if outcome == "transient-maybe" else Applied.NO),
        not_before=now + timedelta(seconds=5) if kind is Outcome.DEFERRED else None,
        settled=outcome == "settling",
        token=record.token_for(attempt) if record is not None else "",
    )


def apply(order: Order, move: Move, now: datetime) -> str:
    """One move; what it did (a refusal's reason), to compare between the copies."""
    kind, pick, _ = move
    try:
        if kind == "claim":
            order.claim("i", now)
        elif kind in ("report", "late"):
            steps = [s for s in order.steps if s.attempt]
            if not steps:
                return "no-attempt"
            step = steps[pick % len(steps)] if kind == "late" else steps[-1]
            number = step.attempt if kind == "report" else 1 + pick % step.attempt
            outcome = OUTCOMES[pick % len(OUTCOMES)]
            order.apply_reply(_reply(order, step.step, number, outcome, now), now, POLICY)
        elif kind == "expire":
            order.expire(now, POLICY)
        elif kind == "cancel":
            order.cancel(now, "ops")
        elif kind == "cancel-stating":
            active = order.active_step()
            failed = [s for s in order.steps if s.process_state is StepState.ERROR]
            target = active or (failed[-1] if failed else None)
            order.cancel(now, "ops", not_applied=target.step if target else None)
        elif kind == "resubmit":
            order.resubmit(now, "ops")
    except TransitionRefused as refused:
        return refused.reason
    return "done"


def truncate(order: Order) -> None:
    """What a long life does to the histories: only the first and the last entries stay."""
    for step in order.steps:
        if len(step.history) > 2:
            step.history_dropped += len(step.history) - 2
            step.history = step.history[:1] + step.history[-1:]
    order.history = order.history[:1] + order.history[-1:]


def verdict(order: Order) -> Any:
    return (
        order.status,
        order.cancel_requested,
        [
            (
                s.step,
                s.process_state,
                s.failure_count,
                s.attempt,
                s.complete_by,
                s.locked_by,
                s.maybe_applied,
                s.deferrals,
                s.gave_up,
            )
            for s in order.steps
        ],
        [n.body for n in order.outbox],
    )


@settings(max_examples=300, deadline=None)
@given(moves, st.sampled_from(["order", "fulfilment"]))
def test_a_verdict_does_not_depend_on_the_history(script: list[Move], workflow: str) -> None:
    whole = new_order(workflow)
    cut = copy.deepcopy(whole)
    now = T0
    for move in script:
        now += timedelta(seconds=move[2])
        if move[0] == "truncate":
            truncate(cut)
            continue
        assert apply(whole, move, now) == apply(cut, move, now), move
        assert verdict(whole) == verdict(cut), move


# --- static: no decision reads a history; one enum of event names --------------------------

APP = [
    ROOT / d for d in ("core", "scheduler", "supervisor", "agents", "admin", "console", "messaging")
] + [ROOT / "stores", ROOT / "demo", ROOT / "bench"]


def test_no_decision_in_core_reads_a_history() -> None:
    """In ``core/``, ``.history`` is only appended to (``record``, ``note``): no transition
    reads it to decide anything."""
    readers = []
    for path in sorted((ROOT / "core").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or fn.name in ("record", "note"):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Attribute) and node.attr == "history":
                    parent_calls = [
                        c
                        for c in ast.walk(fn)
                        if isinstance(c, ast.Call)
                        and isinstance(c.func, ast.Attribute)
                        and c.func.value is node
                        and c.func.attr == "append"
                    ]
                    if not parent_calls:
                        readers.append(f"{path.name}:{node.lineno} in {fn.name}")
    assert readers == []


def _event_literals(path: Path) -> list[str]:
    """String literals used as event names: compared with an ``event`` field, or passed as
    the event of ``record``/``_event``."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {str(e) for e in Happened}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            mentions_event = any(
                (isinstance(s, ast.Subscript) and getattr(s.slice, "value", None) == "event")
                or (
                    isinstance(s, ast.Call)
                    and isinstance(s.func, ast.Attribute)
                    and s.func.attr == "get"
                    and s.args
                    and getattr(s.args[0], "value", None) == "event"
                )
                for s in sides
            )
            if mentions_event:
                for s in sides:
                    for c in ast.walk(s):
                        if isinstance(c, ast.Constant) and c.value in names:
                            found.append(f"{path.name}:{c.lineno} {c.value!r}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("record", "_event")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            found.append(f"{path.name}:{node.lineno} {node.args[1].value!r}")
    return found


def test_event_names_are_written_and_read_through_the_one_enum() -> None:
    literals = []
    for folder in APP:
        for path in sorted(folder.rglob("*.py")):
            literals += _event_literals(path)
    assert literals == []


# --- migration: rows written before typed attempt state ------------------------------------


def _old_row(order: Order, step_index: int = 0) -> list[dict[str, Any]]:
    """The order's rows as the previous version wrote them: no AttemptState."""
    rows = []
    order_row = entities.order_entity(order, "w-1")
    rows.append(order_row)
    for step in order.steps:
        row = entities.step_entity(step)
        del row["AttemptState"]
        rows.append(row)
    return rows


class _Entity(dict[str, Any]):
    metadata = {"etag": "e-1"}


def _read(rows: list[dict[str, Any]]) -> Order:
    order = entities.parse_order([_Entity(r) for r in rows])
    assert order is not None
    return order


def test_an_old_row_is_migrated_from_its_history_when_read() -> None:
    order = new_order("fulfilment")
    now = T0
    for outcome in ("succeeded", "succeeded"):  # reserve-stock, charge-payment
        step = order.claim("i", now)
        order.apply_reply(_reply(order, step.step, 1, outcome, now), now, POLICY)
    ship = order.claim("i", now)
    order.expire(ship.complete_by + timedelta(seconds=1), POLICY)  # attempt 1: no report
    now = ship.complete_by + timedelta(seconds=2)
    order.claim("i", now)
    order.apply_reply(_reply(order, "ship", 2, "transient-no", now), now, POLICY)
    rows = _old_row(order)
    rows[-1]["MaybeApplied"] = json.dumps([1])  # what the old version kept for doubt
    # and named a transient ending "failed" (the wire's word for a refusal)
    history = json.loads(rows[-1]["History"])
    for entry in history:
        if entry["event"] == "transient":
            entry["event"] = "failed"
    assert [e["event"] for e in history].count("failed") == 1
    rows[-1]["History"] = json.dumps(history)
    migrated = _read(rows).find("ship")
    assert migrated is not None
    assert [a.number for a in migrated.attempts.items] == [1, 2]
    assert migrated.maybe_applied == [1]
    first, second = migrated.attempts.items
    assert (first.ending, first.counted, str(first.applied)) == ("expired", True, "unknown")
    assert (second.ending, str(second.applied)) == ("transient", "no")
    assert "failed" not in [e["event"] for e in migrated.history]  # read in today's words
    assert migrated.budget_since == ship.attempts.items[0].claimed_at
    # a truncated history keeps the old doubt, folded: no doubt is lost
    rows[-1]["History"] = json.dumps(json.loads(rows[-1]["History"])[:1])
    folded = _read(rows).find("ship")
    assert folded is not None and folded.maybe_applied == [1]


def test_an_old_row_whose_doubt_was_settled_stays_settled() -> None:
    order = new_order()
    step = order.claim("i", T0)
    order.expire(step.complete_by + timedelta(seconds=1), POLICY)
    rows = _old_row(order)
    rows[-1]["MaybeApplied"] = "[]"  # a late report had cleared it
    migrated = _read(rows).steps[0]
    assert migrated.maybe_applied == [] and migrated.attempts.items[0].settled_by


def test_a_new_row_round_trips_its_typed_state() -> None:
    order = new_order()
    step = order.claim("i", T0)
    order.apply_reply(
        replace(_reply(order, "process", 1, "transient-maybe", T0), running_until=T0),
        T0 + timedelta(seconds=1),
        POLICY,
    )
    rows = [entities.order_entity(order, "w"), entities.step_entity(step)]
    again = _read(rows).steps[0]
    assert again.attempts == step.attempts and again.budget_since == step.budget_since


def test_an_old_word_for_a_transient_ending_reads_as_today_s() -> None:
    # Rows and typed state written before 2026-11 said "failed" for a transient ending.
    assert Happened("failed") is Happened.TRANSIENT
    assert Outcome("failed") is Outcome.TRANSIENT
    assert [e["event"] for e in read_history([{"event": "failed"}, {"event": "refused"}])] == [
        "transient",
        "refused",
    ]
    assert Outcome.REFUSED.wire == "failed"  # on the wire a refusal keeps contract 3.3's word
    assert Outcome.of_wire("failed") is Outcome.REFUSED
