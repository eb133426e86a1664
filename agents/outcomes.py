"""The words an attempt is made of (docs/contracts.md §3.11): what one try did (``Try``),
the kind of try an agent makes (``TryKind``: an HTTP call in ``agents.remote``, a Python
handler in ``agents.python``), a call that runs on past its attempt (``Running``), and
how the attempt ended (``CallOutcome``), which the agent turns into its reply.

``agents.runner`` runs an attempt over any kind of try: admission, the time budget and
pacing (``agents.pacing``), the tries, and the classification of the attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from agents.limits import Slot
from core.messages import AgentRequest
from core.outcome import Applied, Outcome


@dataclass(frozen=True)
class Try:
    """One try: what it did, as far as the caller can know."""

    applied: Applied
    retryable: bool
    error: str = ""
    status: int | None = None
    retry_after: float | None = None
    result: dict[str, Any] | None = None
    #: a refusal by the service itself after it looked the key up (400, 422)
    settles: bool = False
    #: the endpoint answered for itself (it is up), though this try failed (409)
    answered: bool = False
    #: the call runs on past this try (a Python handler): what the attempt reports follows it
    running: Running | None = None


class Running(Protocol):
    """A call that outlived its try (``agents.python``)."""

    #: names this run in the reports about it (its end clears only its own hold)
    runner: str

    def until(self) -> datetime:
        """How long a report of it holds its step's compensation (renewed while it runs)."""
        ...

    def ended(self) -> Try | None:
        """What it did, if it has ended; None while it runs."""
        ...

    def watch(self, heartbeat: Callable[[datetime], None], ended: Callable[[Try], None]) -> None:
        """Call ``heartbeat`` while it runs (each renews the hold), then ``ended`` with
        what it did; on a thread of its own."""
        ...


class TryKind(Protocol):
    """One kind of try. The runner decides when a try starts and how long it may take;
    the kind makes it and says what it did, never raising for what the remote does."""

    def endpoint(self, path: str) -> str:
        """What one breaker guards (its name in logs): the URL, or the handler."""
        ...

    async def run(self, request: AgentRequest, timeout: float, slot: Slot | None) -> Try:
        """One try, over within ``timeout`` seconds, awaited on the caller's event loop (it
        holds no thread while it waits). ``slot``: the attempt's concurrency slot, for a
        call that runs on past its try (it holds the slot until it returns)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class CallOutcome:
    """How one attempt ended: the agent turns it into its reply."""

    kind: Outcome
    result: dict[str, Any] | None = None
    error: str = ""
    applied: Applied = Applied.NO
    not_before: datetime | None = None
    tries: int = 0
    #: refused by the service after it looked the key up: settles earlier attempts' doubt
    settled: bool = False
    #: a call of this attempt runs on past it (a Python handler): the agent reports it,
    #: and its outcome when it ends
    running: Running | None = None
    #: deferred because an operator paused the agent (``core.controls``)
    paused: bool = False
    #: transient: when the evidence that blamed this attempt was seen (None: no new
    #: evidence, the request's flag alone): the reply's ``evidenceAt``
    evidence_at: datetime | None = None


def applied_of(tries: Sequence[Try]) -> Applied:
    """What failed tries may have done: ``maybe`` if any may have applied."""
    return Applied.MAYBE if any(t.applied is Applied.MAYBE for t in tries) else Applied.NO
