"""UTC time as text: ISO 8601 for messages, fixed-width sortable text for keys."""

from __future__ import annotations

from datetime import UTC, datetime


def ensure_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r}: every time here is timezone-aware UTC")
    return value.astimezone(UTC)


def iso(value: datetime) -> str:
    """``2026-11-22T10:15:30.123Z``: what messages carry."""
    return ensure_utc(value).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def iso_exact(value: datetime) -> str:
    """``2026-11-22T10:15:30.123456Z``: stored state, to the microsecond (it round-trips)."""
    return ensure_utc(value).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_iso(text: str) -> datetime:
    """Parse an ISO 8601 time with an explicit offset or ``Z``; naive text is refused."""
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError(f"time {text!r} has no UTC offset")
    return value.astimezone(UTC)


def sortable(value: datetime) -> str:
    """``20261122T101530.123456Z``: fixed width, so text order is time order."""
    return ensure_utc(value).strftime("%Y%m%dT%H%M%S.%fZ")


def parse_sortable(text: str) -> datetime:
    """The inverse of ``sortable``."""
    return datetime.strptime(text, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)
