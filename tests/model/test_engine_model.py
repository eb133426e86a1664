"""The model checker under pytest (``make test`` runs it): about a minute and a half of
generated workflows and interleavings against the engine, every invariant of contract
3.15 checked after every transition (``tests/model/machine.py``).

A failure prints the invariant's signature and Hypothesis's shortest failing sequence of
rules. ``python -m tests.model --budget SECONDS --report`` searches longer and lists every
distinct failure it finds (``make model-check``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.internal.conjecture import engine as conjecture_engine

from tests.model import signatures
from tests.model.__main__ import replay
from tests.model.machine import EngineModel

#: Shrinking a failure at most this long (Hypothesis's own limit, 300 s, is the whole
#: test's timeout here): the shortest sequence is usually reached in well under a minute.
SHRINK_SECONDS = 120


@pytest.fixture(autouse=True)
def _bounded() -> Iterator[None]:
    """The engine logs every transition (thousands of records would only slow the run);
    shrinking is bounded."""
    logging.disable(logging.CRITICAL)
    try:
        with mock.patch.object(conjecture_engine, "MAX_SHRINKING_SECONDS", SHRINK_SECONDS):
            yield
    finally:
        logging.disable(logging.NOTSET)


_Hypothesis: Any = EngineModel.TestCase


@pytest.mark.timeout(900)  # 650 examples take under a minute here; 3x slower stays inside
class TestEngineModel(_Hypothesis):  # type: ignore[misc]
    def runTest(self) -> None:
        """Hypothesis's run, then a failure it dropped (found at teardown after an example
        ran out of input) fails it too."""
        since = len(signatures.RECORDER.lost)
        super().runTest()
        signatures.no_failure_lost(since)


TestEngineModel.settings = settings(
    # (650, not 800: one example in four now runs 2-3 orders, which costs more)
    max_examples=650,
    stateful_step_count=30,
    # the same examples every run: a lane of `make test` checks, it does not explore (the
    # search is `make model-check`, which found what docs/local-development.md lists open)
    derandomize=True,
    deadline=None,
    database=None,
    # one failure, shrunk and printed (the runner collects them all)
    report_multiple_bugs=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


#: What a longer search found (``make model-check``), each shortest sequence kept as the
#: script the runner printed: replayed every run, so what was fixed stays fixed.
FOUND = sorted((Path(__file__).parent / "found").glob("*.replay"))


@pytest.mark.parametrize("script", FOUND, ids=lambda p: p.stem)
def test_what_the_search_found_stays_fixed(script: Path) -> None:
    assert replay(script) == 0  # it prints the violation, if any
