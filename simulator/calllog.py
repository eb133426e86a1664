"""The call log: every ``POST /{step}`` call the server answered (or dropped), bounded.

One entry per call, as JSON:

    {"at": "2025-01-02T03:04:05.123456Z", "step": "process",
     "idempotencyKey": "o-1:process" | null, "answer": 200 | 503 | ... | "dropped",
     "applied": true | false, "fault": null | "outage" | "transient" | "permanent"
     | "hang" | "drop" | "invalid" | "unauthorized" | "refused"}

(``refused``: a compensation that does not name the id its step handed out, 422.)

``at`` is when the call arrived (UTC, microseconds); entries are appended when
the call ends, so a hung call shows up late with an early ``at``. ``applied``
is whether this very call applied the key's effect (a repeat of an applied key
gets the stored answer and applies nothing). The log is a ring buffer: past
``capacity`` the oldest entries go, and ``evicted`` counts them.

Recording is one lock and one deque append of a tuple; formatting happens on read.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any, Final

DEFAULT_CALL_LOG_SIZE: Final = 200_000
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)

# (at in µs since the epoch, step, key, answer, applied, fault)
_Entry = tuple[int, str, str | None, int | str, bool, str | None]


def now_us() -> int:
    """Wall-clock time in whole microseconds since the epoch."""
    return time.time_ns() // 1000


def format_us(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).isoformat(timespec="microseconds")[:-6] + "Z"


def parse_since(text: str) -> int:
    """An ISO-8601 time (``Z`` or an offset; none means UTC) -> µs since the epoch."""
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"'since' must be an ISO-8601 time such as 2025-01-02T03:04:05.123456Z, not {text!r}."
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - _EPOCH) // _MICROSECOND


class CallLog:
    """Thread-safe ring buffer of the last ``capacity`` calls."""

    def __init__(self, capacity: int = DEFAULT_CALL_LOG_SIZE) -> None:
        if capacity < 1:
            raise ValueError("The call log needs a capacity of at least 1.")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: deque[_Entry] = deque(maxlen=capacity)
        self._recorded = 0

    def record(
        self,
        at_us: int,
        step: str,
        key: str | None,
        answer: int | str,
        applied: bool,
        fault: str | None,
    ) -> None:
        with self._lock:
            self._entries.append((at_us, step, key, answer, applied, fault))
            self._recorded += 1

    def entries(self, since: int | str | datetime | None = None) -> list[dict[str, Any]]:
        """The calls that arrived at or after ``since`` (all without it), oldest first."""
        with self._lock:
            raw = list(self._entries)
        if since is not None:
            if isinstance(since, datetime):
                since_us = parse_since(since.isoformat())
            elif isinstance(since, str):
                since_us = parse_since(since)
            else:
                since_us = since
            raw = [entry for entry in raw if entry[0] >= since_us]
        raw.sort(key=lambda entry: entry[0])
        return [
            {
                "at": format_us(at),
                "step": step,
                "idempotencyKey": key,
                "answer": answer,
                "applied": applied,
                "fault": fault,
            }
            for at, step, key, answer, applied, fault in raw
        ]

    @property
    def evicted(self) -> int:
        """How many of the oldest entries the ring dropped (since the last clear)."""
        with self._lock:
            return self._recorded - len(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._recorded = 0


__all__ = ["DEFAULT_CALL_LOG_SIZE", "CallLog", "format_us", "now_us", "parse_since"]
