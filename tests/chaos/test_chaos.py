"""The chaos suite: only system-wide invariants, after real crashes, faults and an outage.

`make test` runs the short form; `make chaos` also runs the long one.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.chaos.runner import ChaosPlan, run_chaos


def _run(plan: ChaosPlan) -> None:
    report, timings = run_chaos(plan)
    summary = {**report.as_json(), **timings, "seed": plan.seed}
    print("\nCHAOS SUMMARY " + json.dumps(summary))
    # Every invariant held: nothing lost or applied twice, nothing undone around a doubt,
    # no two turns of one key overlapping beyond its limit (demo.verify.check_turns,
    # which allows for the skew between the instances' clocks) ...
    found = report.violations()
    assert not found, json.dumps({k: v[:10] for k, v in found.items()}, indent=2)
    # Every order ended as its scenario expected, or ran out of attempts (MAX_FAILURES on
    # one step), or ended in error in doubt about a step, told so (demo.verify reports
    # those apart, not as "unexpected") ...
    ended = report.as_expected + len(report.exhausted) + len(report.doubted)
    assert ended == report.orders == plan.orders, summary
    # ... each doubt explained by a process death while its attempt ran (its request came
    # back to an agent that could only say "an earlier delivery may have called") ...
    assert not timings["doubtedUnexplained"], timings["doubted"]
    # ... and running out is rare (the bound and its reason: runner.exhausted_bound) and,
    # attempt by attempt, explained by the faults this run injected (runner.explain_exhausted).
    assert len(report.exhausted) <= timings["exhaustedBound"], timings["exhausted"]
    assert not timings["exhaustedUnexplained"], timings["exhausted"]
    assert timings["kills"] >= 3, "the run must actually kill processes"
    assert timings["duplicatedReplies"] > 0, "the run must actually duplicate replies"
    # Every big checkout got its approval in (kept or taken), and none was lost: each
    # ended completed (above), so its approved step took the event.
    approvals = timings["approvals"]
    assert approvals["orders"] > 0 and approvals["approved"] == approvals["orders"], approvals
    if timings["stormCopied"] is not None:
        assert timings["stormCopied"] > 0, "the run must actually redeliver requests"
    assert timings["rejected"] == 0
    # Orders over their lines ran beside the rest (their checks are in the verdict above:
    # tests.chaos.item_effects), and never more lines of one in flight than it allows.
    items = timings["items"]
    assert items["orders"] > 0 and items["effects"] > 0, items
    assert items["mostInFlight"] <= items["maxConcurrency"], items
    # Orders whose remote only stalled (2.5 step timeouts): every one completed, unalerted.
    assert timings["stalled"] > 0, "the run must actually stall some orders"
    assert timings["stalledWrong"] == [] and timings["stalledAlerted"] == [], summary
    # Keyed orders took turns (tests.chaos.turn_checks): some waited, none ran beside more
    # of its key than the limit, every one ran, and no slot was left held.
    turns = timings["turns"]
    assert turns["orders"] > 0 and turns["waited"] > 0, turns
    assert not turns["overLimit"] and not turns["neverRan"] and not turns["leaked"], turns
    outage = timings["outage"]
    # The outage happened: the remote's outage switch answered calls 503 ...
    assert outage["outageAnswered"] > 0, "the run must actually take the remote down"
    # ... and, its breakers open, the instances sent only a trickle of probes
    # (the bound and its derivation: runner.Outage.call_bound).
    assert outage["callsAfterSettling"] <= outage["callBoundAfterSettling"], outage


@pytest.mark.timeout(420)
def test_chaos_short() -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261122"))
    _run(ChaosPlan(orders=80, chaos_seconds=26, seed=seed))


@pytest.mark.long
@pytest.mark.timeout(900)
def test_chaos_long() -> None:
    seed = int(os.environ.get("CHAOS_SEED", "7"))
    _run(ChaosPlan(orders=400, chaos_seconds=120, settle_seconds=240, seed=seed))
