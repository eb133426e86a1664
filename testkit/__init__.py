"""A test kit for a team's own workflows: run a declared workflow in process, with fake
remotes, in milliseconds (docs/add-a-workflow.md, "Test it").

    from testkit import answer, refuse, run_workflow

    def test_a_refused_refund_is_held_for_an_operator():
        run = run_workflow(
            "returns",
            order={"chargeId": "ch-1", "amount": 40},
            remotes={"receive-return": answer({"rma": "R-1"}), "refund": refuse("card expired")},
        )
        assert run.status == "error"
        assert "card expired" in run.alerts[0]["reason"]
        assert run.received["refund"][0]["chargeId"] == "ch-1"

The order runs through the app's own scheduler, supervisor and operator admin
(``bootstrap``), on the in-memory state store and a fake clock that jumps to each next
deadline, delay, timeout or decision: a two-day approval timeout takes no time. The kit
plays the agents: each remote as the test declares it (``testkit.remotes``), each Python
agent with its declared handler. Not part of the deployment (``.funcignore``).
"""

from __future__ import annotations

from testkit.checks import KitError
from testkit.fakes import FakeClock
from testkit.players import Call
from testkit.remotes import (
    answer,
    approve,
    calls_back,
    crash,
    decline,
    no_answer,
    no_decision,
    refuse,
    runs,
    unavailable,
    undecided,
)
from testkit.run import Run, Step, run_workflow

__all__ = [
    "Call",
    "FakeClock",
    "KitError",
    "Run",
    "Step",
    "answer",
    "approve",
    "calls_back",
    "crash",
    "decline",
    "no_answer",
    "no_decision",
    "refuse",
    "run_workflow",
    "runs",
    "unavailable",
    "undecided",
]
