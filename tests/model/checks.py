"""Contract 3.15's invariants as checks: each a pure function of what the model knows (the
truth, the flow) and what the engine did (its answer, the order before and after, the
requests and status messages it sent), returning the violations it finds.

- I1 (``requested``): a compensation is requested only when no attempt of its step may
  still apply (every attempt reported, or past its deadline plus the allowed skew,
  unless its key is known applied), and never while a step without a compensation may
  have applied (truly) without the engine knowing it: "never undone around a doubt".
- I2 (``discarded_reply``, ``discarded_callback``): a success report of the current run
  (a 2xx; a callback's result) answered dropped or 409 is evidence lost, unless the
  record already knows it applied.
- I3 (``standing``): compensated or cancelled only when every effect that truly applied
  was undone after it (no step declares ``may_stand`` today).
- I4 (``standing``, ``operator_alerts``): an order in error has had an alert since it
  entered that episode; an operator action by itself raises none.
- I5 (``requested``): a step is requested under a new key only when every earlier key of
  it truly did not apply and cannot any more.
- I6 (``standing``): an unfinished order that waits for no person has a Pending or
  Processing record (a due time or a deadline), unless it waits for its key's slot
  (``tests.model.turn_checks`` T5 then asks that it runs in the end).
- I7 (``told``, ``kept_event``, ``kept_callback``): the status messages of a transition
  repeat no status and the last one is the order's; ``error`` is left only by an
  operator or by evidence; an event is kept only for a step not started that the order
  can still reach.
- I8 (``requested``): nothing is undone while a step declared ``on_failure="hold"`` has
  failed, until an operator cancels (3.17).

A ``ForEach``'s items are steps like any other to every check above (``Flow.tasks`` lists
each, ``<name>[<i>]``), and it adds its own (3.16):

- I5 (``requested``): an item's key is ``<orderId>:<name>:<i>`` (``:<round>`` after it for
  a new run), its compensation's ``<orderId>:<undo>:<i>``: one key per item.
- I9 (``in_flight``): never more than ``max_concurrency`` items of one ``ForEach`` in
  flight (not ended, with an attempt claimed and not ended) at once; an item ended by a
  late success while a retry of it is out is not in flight (docs/contracts.md §3.16).
- I10 (``started_after_halt``): no item is started (its first record) once its group has
  halted: a sibling failed for good (and the workflow does not go on past it), or a
  cancel.
- I11 (``listed``): once the order completed, ``ctx.results[name]`` is the list of the
  items' results in item order (``None`` for one skipped or gone past).

A task declared ``on_failure="continue"`` may stand, in doubt or applied unbeknown, as
one declared ``may_stand`` would (3.17): I1 passes over it, and I3 unless the engine
knows it applied.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from core.item_names import item_name, item_of
from tests.model.flows import Flow
from tests.model.signatures import Finding
from tests.model.truth import Call, Effect, Ledger
from tests.model.vocabulary import Answer, OrderSnap, ReplyKind, terminal
from tests.model.world import ALLOWED_SKEW


def requested(
    call: Call,
    flow: Flow,
    ledger: Ledger,
    successes: set[str],
    reported: dict[int, list[ReplyKind]],
    after: OrderSnap | None,
    now: datetime,
) -> list[Finding]:
    """I1 for a compensation's request, I5 for a step's request under a new key."""
    req = call.req
    out: list[Finding] = []
    undone = flow.compensated(req.step)
    if undone is not None:
        out += _held(req.step, flow, after)
        skew = timedelta(seconds=ALLOWED_SKEW)
        for other in ledger.calls:
            if other.req.step != undone.name or other.req.key in successes:
                continue
            said = reported.get(other.req.index, [])
            if all(k == "transient-maybe" for k in said) and now < other.req.deadline + skew:
                out.append(
                    Finding(
                        "I1-undo-while-may-apply",
                        f"{req.step} requested at {now:%H:%M:%S} while attempt "
                        f"{other.req.attempt} of {undone.name} may still apply (deadline "
                        f"{other.req.deadline:%H:%M:%S} + {ALLOWED_SKEW:g} s)",
                    )
                )
        for task in flow.tasks():
            if task.comp or task.fails == "continue" or not ledger.may_apply(task.name, now):
                continue
            step = after.step(task.name) if after is not None else None
            if step is None or not step.known_applied:
                out.append(
                    Finding(
                        "I1-undo-around-doubt",
                        f"{req.step} requested while {task.name} (no compensation) may have "
                        f"applied ({ledger.truth_of(task.name)}) and the engine does not "
                        "know it",
                    )
                )
        return out
    out += _item_key(req.order_id, req.step, req.key, req.key_round)
    for effect in ledger.effects_of(req.step):
        if effect.key_round >= req.key_round:
            continue
        # a key its remote declined for good stays declined: a call of it still open
        # applies nothing (as ``Ledger.may_apply`` and ``Ledger.take`` have it)
        still = [c for c in ledger.calls if c.req.key == effect.key and c.open(now)]
        if effect.state in ("applied", "accepted") or (still and effect.state != "declined"):
            out.append(
                Finding(
                    "I5-second-key",
                    f"{req.step} requested under {req.key} while {effect.key} is "
                    f"{effect.state}{' with a call still open' if still else ''}",
                )
            )
    return out


def _item_key(order_id: str, step: str, key: str, key_round: int) -> list[Finding]:
    """I5 for an item of a ``ForEach`` (or its compensation): its own key."""
    found = item_of(step)
    if found is None:
        return []
    name, index = found
    want = f"{order_id}:{name}:{index}" + (f":{key_round}" if key_round > 1 else "")
    if key == want:
        return []
    return [
        Finding(
            "I5-item-key",
            f"{step} (run {key_round}) requested under {key}; its key is {want}",
        )
    ]


def in_flight(flow: Flow, snap: OrderSnap) -> list[Finding]:
    """I9: at most ``cap`` items of each ``ForEach`` have an attempt in flight."""
    out: list[Finding] = []
    for each in flow.items():
        running = [
            step.name
            for i in range(each.count)
            if (step := snap.step(item_name(each.name, i))) is not None and step.in_flight
        ]
        if len(running) > each.cap:
            out.append(
                Finding(
                    "I9-items-over-cap",
                    f"{len(running)} items of {each.name} in flight ({', '.join(running)}); "
                    f"its max_concurrency is {each.cap}",
                )
            )
    return out


def started_after_halt(
    flow: Flow, before: OrderSnap | None, after: OrderSnap, requested: list[str]
) -> list[Finding]:
    """I10: a transition that leaves an item's group halted (a sibling failed for good and
    the workflow does not go on past it, or a cancel) started no item of it (its first
    record); one that found it halted already requested no attempt of any of its items
    (``requested``: the steps this transition sent requests for)."""
    out: list[Finding] = []
    for each in flow.items():
        names = [item_name(each.name, i) for i in range(each.count)]
        why = _halted(names, after)
        if why is None:
            continue
        new = [n for n in names if after.step(n) and (before is None or not before.step(n))]
        again = [n for n in names if n in requested and n not in new]
        if new:
            out.append(
                Finding(
                    "I10-item-after-halt",
                    f"{', '.join(new)} started while {each.name} halted ({why})",
                    "cancel" if why == "a cancel" else "failed",
                )
            )
        if again and before is not None and _halted(names, before) is not None:
            out.append(
                Finding(
                    "I10-item-after-halt",
                    f"{', '.join(again)} requested again while {each.name} halted ({why})",
                    "retried",
                )
            )
    return out


def _halted(names: list[str], snap: OrderSnap) -> str | None:
    """Why the group of the items ``names`` (a ``ForEach``, alone in its group) halted: a
    cancel, or an item failed for good that the workflow does not go on past; None if it
    did not."""
    failed = [
        n
        for n in names
        if (step := snap.step(n)) is not None and step.state == "error" and not step.continued
    ]
    if failed:
        return f"{', '.join(failed)} failed for good"
    return "a cancel" if snap.cancel_requested else None


def listed(flow: Flow, snap: OrderSnap, results: dict[str, Any]) -> list[Finding]:
    """I11, on a completed order: ``ctx.results[name]`` of each ``ForEach`` is a list of
    one result per item in item order (each the result of that item's own call: the model's
    agents answer ``{"ref": <its key>}``), ``None`` for an item skipped or gone past."""
    out: list[Finding] = []
    for each in flow.items():
        got = results.get(each.name)
        want: list[str | None] = []
        for i in range(each.count):
            step = snap.step(item_name(each.name, i))
            gone = i in each.skip or (step is not None and step.continued)
            want.append(None if gone else f"{snap.order_id}:{each.name}:{i}")
        if not isinstance(got, list) or len(got) != len(want):
            out.append(
                Finding(
                    "I11-results-unlisted",
                    f"the order completed and ctx.results[{each.name!r}] is {got!r:.200}; "
                    f"{each.count} items",
                )
            )
            continue
        for i, (value, key) in enumerate(zip(got, want, strict=True)):
            ref = value.get("ref") if isinstance(value, dict) else None
            right = value is None if key is None else _of_key(ref, key)
            if not right:
                out.append(
                    Finding(
                        "I11-results-unlisted",
                        f"ctx.results[{each.name!r}][{i}] is {value!r:.200}; the result of "
                        f"{key or 'nothing (skipped or gone past)'} was expected",
                    )
                )
                break
    return out


def _of_key(ref: object, key: str) -> bool:
    """``ref`` is ``key``, or ``key`` in a later run (``<key>:<round>``)."""
    return isinstance(ref, str) and (
        ref == key or re.fullmatch(re.escape(key) + r":\d+", ref) is not None
    )


def _known(step: str, snap: OrderSnap) -> bool:
    found = snap.step(step)
    return found is not None and found.known_applied


def _held(undo: str, flow: Flow, after: OrderSnap | None) -> list[Finding]:
    """I8: ``undo`` requested while a held step has failed and nobody cancelled."""
    if after is None or after.cancel_requested:
        return []
    return [
        Finding("I8-hold-unwound", f"{undo} requested while {task.name} (hold) failed")
        for task in flow.tasks()
        if task.fails == "hold"
        and (step := after.step(task.name)) is not None
        and step.state == "error"
    ]


def discarded_reply(
    call: Call, wire: ReplyKind, answer: Answer, after: OrderSnap | None, ledger: Ledger
) -> list[Finding]:
    """I2 for a 2xx (for a step answered by callback: its acceptance, evidence that it
    may apply)."""
    req = call.req
    if (
        wire != "success"
        or answer.kind not in ("stale", "unbound")
        or not ledger.current(req.step, req.key_round)
    ):
        return []
    accepting = ledger.is_callback(req.step)
    step = after.step(req.step) if after is not None else None
    if step is not None and (step.known_applied or (accepting and step.accepted)):
        return []
    return [
        Finding(
            "I2-evidence-discarded",
            f"the 2xx of {req.key} (attempt {req.attempt}) was answered {answer.kind} "
            f"({answer.detail}); the record of {req.step} does not know it "
            f"{'was accepted' if accepting else 'applied'}",
            f"reply:{step.state if step is not None else 'gone'}",
        )
    ]


def discarded_callback(
    effect: Effect,
    payload: dict[str, Any],
    answer: Answer,
    after: OrderSnap | None,
    ledger: Ledger,
) -> list[Finding]:
    """I2 for a callback's result; I7 for a callback answered kept (its step started: the
    remote only calls back about a request it was sent)."""
    out: list[Finding] = []
    if answer.kind == "kept":
        out.append(
            Finding(
                "I7-kept-unreachable",
                f"the callback of {effect.key} was kept, as if {effect.step} had not started",
                "callback",
            )
        )
    if (
        "result" in payload
        and answer.kind == "refused"
        and ledger.current(effect.step, effect.key_round)
    ):
        step = after.step(effect.step) if after is not None else None
        if step is None or not step.known_applied:
            out.append(
                Finding(
                    "I2-evidence-discarded",
                    f"the callback result of {effect.key} was answered 409 ({answer.detail}); "
                    f"the record of {effect.step} does not know it applied",
                    f"callback:{step.state if step is not None else 'gone'}",
                )
            )
    return out


def kept_event(name: str, before: OrderSnap | None, answer: Answer, flow: Flow) -> list[Finding]:
    """I7: an event is kept only for a step that has not started and that the order can
    still reach."""
    if answer.kind != "kept" or before is None:
        return []
    started = before.step(name)
    if started is not None:
        return [
            Finding(
                "I7-kept-unreachable",
                f"event {name} kept: its step had started ({started.state})",
                "event-started",
            )
        ]
    if not reachable(flow, before):
        cancelling = ", cancel requested" if before.cancel_requested else ""
        return [
            Finding(
                "I7-kept-unreachable",
                f"event {name} kept while the order ({before.status}{cancelling}) cannot reach it",
                "event-unreachable",
            )
        ]
    return []


def reachable(flow: Flow, snap: OrderSnap) -> bool:
    """Whether the order can still go forward to a step it has not started."""
    if snap.cancel_requested:
        # Unless a step in flight that cannot be undone succeeds: then the cancel comes
        # too late and the order goes on (3.11).
        return snap.status != "error" and any(
            s.active and (task := flow.task(s.name)) is not None and not task.comp
            for s in snap.steps
        )
    if snap.status in ("pending", "processing"):
        return not any(s.action and s.state == "error" and not s.continued for s in snap.steps)
    if snap.status == "error":
        return all(s.action for s in snap.steps)  # no undo has begun
    return False


def told(
    rule: str,
    before: OrderSnap | None,
    after: OrderSnap,
    sequence: list[str],
    new: list[str],
    leaves_error: bool,
) -> list[Finding]:
    """I7 on the status messages one transition sent (``new``; ``sequence``: the one before
    them, then them): no status twice, the last one the order's; ``error`` left only by
    an operator or by evidence (``leaves_error``: the transition was one of those)."""
    out: list[Finding] = []
    where = rule.split("-", maxsplit=1)[0]
    if any(a == b for a, b in pairwise(sequence)) or len(set(sequence)) != len(sequence):
        out.append(
            Finding(
                "I7-status-sequence",
                f"{rule} sent {new} after {sequence[: len(sequence) - len(new)]}",
                where,
            )
        )
    last = new[-1] if new else (sequence[-1] if sequence else None)
    if last is not None and last not in (after.status, "received"):
        out.append(
            Finding(
                "I7-status-missed",
                f"after {rule} the order is {after.status}; the app was last told {last}",
            )
        )
    left = before is not None and before.status == "error" and after.status != "error"
    if left and not leaves_error:
        out.append(
            Finding(
                "I7-error-left",
                f"{rule} took the order from error to {after.status} ({new})",
                rule,
            )
        )
    return out


def operator_alerts(rule: str, after: OrderSnap | None, raised: list[str]) -> list[Finding]:
    """I4: an operator action by itself raises no alert (unless it leaves the order in
    front of a person again)."""
    if after is None or not raised or after.status == "error":
        return []
    return [
        Finding(
            "I4-operator-alert",
            f"{rule} raised {len(raised)} alert(s) and left the order {after.status}: "
            f"{raised[0][:200]}",
            rule,
        )
    ]


def standing(
    flow: Flow, ledger: Ledger, snap: OrderSnap, alerted_in_episode: bool, *, final: bool = False
) -> list[Finding]:
    """I3, I4 and I6 on the order as it stands. I3 is judged once the world is calm
    (``final``): a remote may apply what it accepted after the order was undone, and only
    its callback, which the calm world delivers, can tell the engine."""
    out: list[Finding] = []
    if final and snap.status in ("compensated", "cancelled"):
        for task in flow.tasks():
            if not task.comp and task.fails == "continue" and not _known(task.name, snap):
                continue
            for effect in ledger.effects_of(task.name):
                if effect.state == "applied" and not ledger.undone(effect):
                    out.append(
                        Finding(
                            "I3-effect-stands",
                            f"the order is {snap.status} and {effect.key} applied and was "
                            "never undone",
                            "undo-missed" if task.comp else "no-undo",
                        )
                    )
    if snap.status == "error" and not alerted_in_episode:
        out.append(Finding("I4-error-without-alert", "the order is in error; nobody was told"))
    # an order waiting for its key's slot has no record yet: its slot looks at it (T5)
    waits_turn = flow.turns is not None and snap.status == "pending" and not snap.steps
    if not terminal(snap.status) and not snap.active and not waits_turn:
        out.append(
            Finding(
                "I6-no-next-look",
                f"the order is {snap.status} with no Pending or Processing record",
            )
        )
    return out
