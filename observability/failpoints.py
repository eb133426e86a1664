"""Failpoints: kill this process at a named point, to test recovery from real crashes.

Test-only and inert unless armed (the bootstrap arms ``Settings.failpoints``, the
``ORDERS_FAILPOINTS`` setting): ``"after-claim"`` (comma-separated names, each optionally
``name:probability``) makes ``hit("after-claim")`` SIGKILL the process at that
point: no cleanup, no finally blocks, exactly like a host that dies. The e2e
and chaos suites use it to land a kill inside the narrow windows that random
kills rarely hit (between a claim and its request, between a reply's save
and the next dispatch).

Points: ``after-submit-save``, ``after-claim``, ``after-reply-save``,
``agent-after-call``, ``purge-after-archive`` (between writing an archive blob and
deleting its orders).
"""

from __future__ import annotations

import os
import random
import signal

_armed: dict[str, float] = {}


def arm(spec: str) -> None:
    """Arm the failpoints ``spec`` names (replacing any armed before)."""
    points: dict[str, float] = {}
    for item in spec.split(","):
        name, _, probability = item.strip().partition(":")
        if name:
            points[name] = float(probability) if probability else 1.0
    _armed.clear()
    _armed.update(points)


def hit(name: str) -> None:
    probability = _armed.get(name)
    if probability is not None and random.random() < probability:
        os.kill(os.getpid(), signal.SIGKILL)
