"""Outage control input and the error switch. Pure apart from the monotonic clock.

An outage is a schedule of phases run back to back, each time-bounded:

    {"mode": "error", "status": 503, "seconds": S, "retryAfter": N}   every step call
        is answered with ``status`` (5xx, 408, 425 or 429) and applies nothing
    {"mode": "unreachable", "seconds": S}   the port refuses connections, then listens again
    {"phases": [<phase>, ...]}             several, back to back
    {"mode": "off"}                        end the outage now

``seconds`` is required, > 0 and <= 3600, and a whole schedule lasts at most
3600 s. The command line's form is ``error:503:20,unreachable:15`` (``error:
STATUS:SECONDS[:RETRY_AFTER]``, ``unreachable:SECONDS``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from simulator.faults import TRANSIENT_4XX

PhaseMode = Literal["error", "unreachable"]

MAX_OUTAGE_SECONDS: Final = 3600.0
MAX_PHASES: Final = 100
DEFAULT_OUTAGE_STATUS: Final = 503

_PHASE_FIELDS: Final[dict[str, frozenset[str]]] = {
    "error": frozenset({"mode", "status", "seconds", "retryAfter"}),
    "unreachable": frozenset({"mode", "seconds"}),
    "off": frozenset({"mode"}),
}


class OutageError(ValueError):
    """Invalid outage control input; the server answers 400 with this sentence."""


@dataclass(frozen=True, slots=True)
class Phase:
    """One time-bounded outage phase."""

    mode: PhaseMode
    seconds: float
    status: int = 0
    retry_after: int | None = None

    def __post_init__(self) -> None:
        # Programmatic construction gets the same checks as parsed input.
        if self.mode not in ("error", "unreachable"):
            raise OutageError(f"An outage phase's mode is error or unreachable, not {self.mode!r}.")
        _check_seconds(self.seconds, "the phase")
        if self.mode == "error":
            _check_status(self.status, "the phase")
            _check_retry_after(self.retry_after, "the phase")
        elif self.status or self.retry_after is not None:
            raise OutageError("An unreachable phase has no status and no retryAfter.")

    @classmethod
    def error(
        cls, seconds: float, status: int = DEFAULT_OUTAGE_STATUS, retry_after: int | None = None
    ) -> Phase:
        return cls("error", float(seconds), status, retry_after)

    @classmethod
    def unreachable(cls, seconds: float) -> Phase:
        return cls("unreachable", float(seconds))

    def to_json(self) -> dict[str, Any]:
        if self.mode == "unreachable":
            return {"mode": "unreachable", "seconds": self.seconds}
        return {
            "mode": "error",
            "status": self.status,
            "seconds": self.seconds,
            "retryAfter": self.retry_after,
        }


def parse_outage(raw: object) -> list[Phase]:
    """Parse a ``POST /_outage`` body (already JSON-decoded): the phases, ``[]`` for off."""
    if not isinstance(raw, dict):
        raise OutageError(
            'The outage must be a JSON object: {"mode": "error"|"unreachable"|"off", ...} '
            'or {"phases": [...]}.'
        )
    if "phases" in raw:
        if set(raw) != {"phases"}:
            raise OutageError("Send either 'phases' or a single phase's fields, not both.")
        items = raw["phases"]
        if not isinstance(items, list) or not items:
            raise OutageError("'phases' must be a non-empty list of phases.")
        if len(items) > MAX_PHASES:
            raise OutageError(f"At most {MAX_PHASES} phases.")
        phases = [_parse_phase(item, f"phase {n}") for n, item in enumerate(items, start=1)]
        if any(phase is None for phase in phases):
            raise OutageError('\'off\' is not a phase; send {"mode": "off"} on its own.')
        result = [phase for phase in phases if phase is not None]
    else:
        phase = _parse_phase(raw, "the outage")
        result = [] if phase is None else [phase]
    total = sum(phase.seconds for phase in result)
    if total > MAX_OUTAGE_SECONDS:
        raise OutageError(
            f"The phases last {total:g} s in all; an outage lasts at most {MAX_OUTAGE_SECONDS:g} s."
        )
    return result


def parse_outage_body(body: bytes) -> list[Phase]:
    """Parse the raw ``POST /_outage`` body."""
    try:
        raw = json.loads(body)
    except ValueError:
        raise OutageError("The body is not valid UTF-8 JSON.") from None
    return parse_outage(raw)


def parse_outage_cli(text: str) -> list[Phase]:
    """``"error:503:20,unreachable:15"`` -> two phases (see the module docstring)."""
    raws: list[dict[str, Any]] = []
    for part in text.split(","):
        fields = part.strip().split(":")
        mode, args = fields[0], fields[1:]
        try:
            if mode == "error" and len(args) in (2, 3):
                raw: dict[str, Any] = {"mode": "error", "status": int(args[0])}
                raw["seconds"] = float(args[1])
                if len(args) == 3:
                    raw["retryAfter"] = int(args[2])
            elif mode == "unreachable" and len(args) == 1:
                raw = {"mode": "unreachable", "seconds": float(args[0])}
            else:
                raise ValueError
        except ValueError:
            raise OutageError(
                f"The outage phase {part.strip()!r} is not 'error:STATUS:SECONDS[:RETRY_AFTER]' "
                "or 'unreachable:SECONDS'."
            ) from None
        raws.append(raw)
    return parse_outage({"phases": raws})


def _parse_phase(raw: object, where: str) -> Phase | None:
    if not isinstance(raw, dict):
        raise OutageError(f"In {where}: a phase must be a JSON object with a 'mode'.")
    mode = raw.get("mode")
    if not isinstance(mode, str) or mode not in _PHASE_FIELDS:
        raise OutageError(f"In {where}: 'mode' must be error, unreachable or off, not {mode!r}.")
    unknown = sorted(set(raw) - _PHASE_FIELDS[mode])
    if unknown:
        raise OutageError(f"In {where}: field(s) {', '.join(unknown)} do not apply to {mode}.")
    if mode == "off":
        return None
    if "seconds" not in raw:
        raise OutageError(f"In {where}: 'seconds' is required (every outage is time-bounded).")
    seconds = raw["seconds"]
    _check_seconds(seconds, where)
    if mode == "unreachable":
        return Phase("unreachable", float(seconds))
    status = raw.get("status", DEFAULT_OUTAGE_STATUS)
    _check_status(status, where)
    retry_after = raw.get("retryAfter")
    _check_retry_after(retry_after, where)
    return Phase("error", float(seconds), status, retry_after)


def _check_seconds(seconds: object, where: str) -> None:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 < seconds <= MAX_OUTAGE_SECONDS
    ):
        raise OutageError(
            f"In {where}: 'seconds' must be a number > 0 and <= {MAX_OUTAGE_SECONDS:g}."
        )


def _check_retry_after(value: object, where: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise OutageError(f"In {where}: 'retryAfter' must be an integer >= 0 (seconds).")


def _check_status(status: object, where: str) -> None:
    if (
        isinstance(status, bool)
        or not isinstance(status, int)
        or not (status in TRANSIENT_4XX or 500 <= status <= 599)
    ):
        raise OutageError(f"In {where}: 'status' must be 408, 425, 429 or 5xx, not {status!r}.")


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """The answer every step call gets while an error phase lasts."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]
    until: float  # on the switch's clock


class OutageSwitch:
    """Whether step calls are answered with an outage error right now.

    ``current()`` is the hot path: one attribute read when off, plus a clock
    read when on; no lock. The answer expires at its ``until`` by itself, so
    an error phase is time-bounded even if whoever set it never clears it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._answer: ErrorAnswer | None = None

    def set_error(self, phase: Phase, until: float | None = None) -> ErrorAnswer:
        """Answer every call per ``phase`` until ``until`` (default: now + its seconds)."""
        if phase.mode != "error":
            raise OutageError("Only an error phase sets the error switch.")
        headers: tuple[tuple[str, str], ...] = ()
        if phase.retry_after is not None:
            headers = (("Retry-After", str(phase.retry_after)),)
        message = f"Simulated outage: the service answers {phase.status} to every call for now."
        answer = ErrorAnswer(
            status=phase.status,
            body=json.dumps({"error": message}).encode(),
            headers=headers,
            until=self._clock() + phase.seconds if until is None else until,
        )
        self._answer = answer
        return answer

    def clear(self) -> None:
        self._answer = None

    def current(self) -> ErrorAnswer | None:
        answer = self._answer
        if answer is None or self._clock() >= answer.until:
            return None
        return answer


def total_seconds(phases: Sequence[Phase]) -> float:
    return sum(phase.seconds for phase in phases)


__all__ = [
    "DEFAULT_OUTAGE_STATUS",
    "MAX_OUTAGE_SECONDS",
    "ErrorAnswer",
    "OutageError",
    "OutageSwitch",
    "Phase",
    "parse_outage",
    "parse_outage_body",
    "parse_outage_cli",
    "total_seconds",
]
