"""One short chaos run with ``AGENT_TRANSPORT=servicebus``: the agent queues on localbus
(the local Service Bus double), the same kills, failpoints, faults, duplicated replies and
remote outage as the storage runs, and the same invariants (``test_chaos._run``)."""

from __future__ import annotations

import os

import pytest

from tests.chaos.runner import ChaosPlan
from tests.chaos.test_chaos import _run


@pytest.mark.timeout(420)
def test_chaos_short_over_service_bus() -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261122"))
    _run(ChaosPlan(orders=50, chaos_seconds=18, seed=seed, transport="servicebus"))
