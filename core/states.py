"""Step states (docs/contracts.md §3.2) and order statuses (docs/contracts.md §3.7)."""

from __future__ import annotations

from enum import StrEnum


class StepState(StrEnum):
    PENDING = "Pending"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    ERROR = "Error"
    COMPENSATING = "Compensating"
    COMPENSATED = "Compensated"
    #: its ``when`` said no: never called, never compensated (docs/contracts.md §3.13)
    SKIPPED = "Skipped"


class OrderStatus(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """No further work happens without an operator (``error`` waits for one)."""
        return self in _TERMINAL

    @property
    def finished(self) -> bool:
        """The order is over for good: completed, compensated or cancelled."""
        return self in _FINISHED


_FINISHED = frozenset({OrderStatus.COMPLETED, OrderStatus.COMPENSATED, OrderStatus.CANCELLED})
_TERMINAL = _FINISHED | {OrderStatus.ERROR}


class StepKind(StrEnum):
    ACTION = "action"
    COMPENSATION = "compensation"
