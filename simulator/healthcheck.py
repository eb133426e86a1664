"""The simulated service's own health endpoint: what an agent declared with
``Agent(..., health="/health")`` asks (docs/contracts.md §3.11 (18), "a probe settles a lone
order"). Pure apart from the monotonic clock.

It is set healthy or failing on its own, whatever the fault directives and the outage
switch do to step calls, so a test can show both cases: a remote that fails one order
while it says it is healthy, and one that is down for all and says so. (An unreachable
outage phase makes it unreachable too, as it does every endpoint.)

    GET  /health        200 {"status": "healthy"}, or the status set while failing
    GET  /_healthcheck  {"healthy", "status", "remainingSeconds", "probes"}
    POST /_healthcheck  {"healthy": false, "status": 503, "seconds": 20}
                        (failing; ``status`` 4xx or 5xx, 503 by default; ``seconds``,
                        if given, > 0 and <= 3600: healthy again after that)
                        {"healthy": true}
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, Final

DEFAULT_FAILING_STATUS: Final = 503
MAX_SECONDS: Final = 3600.0


class HealthError(ValueError):
    """Invalid health control input; the server answers 400 with this sentence."""


class HealthSwitch:
    """Whether ``GET /health`` answers healthy now, and how often it was asked."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failing: tuple[int, float | None] | None = None  # (status, until)
        self._probes = 0

    def set(self, raw: object) -> dict[str, Any]:
        """Apply a ``POST /_healthcheck`` body (JSON-decoded); the status after it."""
        if not isinstance(raw, dict) or not isinstance(raw.get("healthy"), bool):
            raise HealthError('Send {"healthy": true} or {"healthy": false, ...}.')
        unknown = sorted(set(raw) - {"healthy", "status", "seconds"})
        if unknown:
            raise HealthError(f"Unknown field(s) {', '.join(unknown)}.")
        if raw["healthy"]:
            if set(raw) != {"healthy"}:
                raise HealthError("A healthy endpoint takes no status and no seconds.")
            with self._lock:
                self._failing = None
            return self.status()
        status = raw.get("status", DEFAULT_FAILING_STATUS)
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise HealthError(f"'status' must be a 4xx or 5xx status, not {status!r}.")
        seconds = raw.get("seconds")
        if seconds is not None and (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or not 0 < seconds <= MAX_SECONDS
        ):
            raise HealthError(f"'seconds' must be a number > 0 and <= {MAX_SECONDS:g}.")
        until = None if seconds is None else self._clock() + float(seconds)
        with self._lock:
            self._failing = (status, until)
        return self.status()

    def reset(self) -> None:
        with self._lock:
            self._failing, self._probes = None, 0

    def _current(self) -> tuple[int, float | None] | None:
        failing = self._failing
        if failing is not None and failing[1] is not None and self._clock() >= failing[1]:
            self._failing = failing = None
        return failing

    def answer(self) -> tuple[int, dict[str, Any]]:
        """``GET /health``: its status and body (each call counted)."""
        with self._lock:
            self._probes += 1
            failing = self._current()
        if failing is None:
            return 200, {"status": "healthy"}
        return failing[0], {"status": "failing", "error": "Simulated: the service is unhealthy."}

    def status(self) -> dict[str, Any]:
        with self._lock:
            failing = self._current()
            probes = self._probes
        remaining = None
        if failing is not None and failing[1] is not None:
            remaining = round(max(failing[1] - self._clock(), 0.0), 3)
        return {
            "healthy": failing is None,
            "status": 200 if failing is None else failing[0],
            "remainingSeconds": remaining,
            "probes": probes,
        }


__all__ = ["DEFAULT_FAILING_STATUS", "HealthError", "HealthSwitch"]
