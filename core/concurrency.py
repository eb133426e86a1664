"""``Concurrency``: at most ``limit`` orders of one key at once (docs/contracts.md §3.16),
as a workflow declares it (``Workflow(..., concurrency=Concurrency(key=fn, limit=n))``).
What it means at run time: ``core.turns`` (decided) and ``core.turn_keeper`` (kept)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from core.agent_spec import DeclarationError, declared_at

#: The most orders of one key that may run at once (``Concurrency.limit``).
MAX_TURN_LIMIT: Final = 1000


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` orders of the workflow with the same key run at once, across
    every instance; the others wait, in order of acceptance. ``key(ctx)`` is called once,
    at acceptance (``ctx.results`` is empty): a string of 1-256 characters, or None (no
    limit for that order). ``hold_on_error``: an order in ``error`` keeps its slot until
    an operator resubmits or cancels it (default: it frees the slot, and a resubmit takes
    one again). Every mistake is a ``DeclarationError`` naming the file and line."""

    key: Callable[[Any], Any]
    limit: int = 1
    hold_on_error: bool = False
    declared_at: str = field(default_factory=declared_at, compare=False)

    def __post_init__(self) -> None:
        from core.flow import check_function  # flow imports this module for Workflow

        at = f"{self.declared_at}: Concurrency"
        if self.key is None:
            raise DeclarationError(f"{at} needs key=fn, a function of the order's context")
        check_function(self.key, "key", at)
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise DeclarationError(f"{at}: limit={self.limit!r}; a whole number of orders")
        if not 1 <= self.limit <= MAX_TURN_LIMIT:
            raise DeclarationError(
                f"{at}: limit={self.limit}; it must be 1-{MAX_TURN_LIMIT} orders of one key at once"
            )
        if not isinstance(self.hold_on_error, bool):
            raise DeclarationError(
                f"{at}: hold_on_error is True or False, got {self.hold_on_error!r}"
            )

    def describe(self) -> dict[str, Any]:
        from core.flow import name_of

        return {"key": name_of(self.key), "limit": self.limit, "holdOnError": self.hold_on_error}
