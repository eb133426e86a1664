"""What a test declares for each step: how its remote answers, and what a person decides.

A remote, by step (or compensation) name, in ``run_workflow(..., remotes={...})``:

- ``answer(result, id=None)``: a 2xx with that JSON object (or a function of the body it
  received that returns one); ``id="rma"`` adds a fresh id in that field (``rma-1``);
- ``refuse(reason, status=422)``: a 4xx: nothing applied, the step fails for good;
- ``unavailable(reason)``: every try of the attempt failed, nothing applied (a 503), and
  ``crash(reason)``: the same, but it may have applied (a 500): the step is tried again;
- ``no_answer()``: the remote never answers: the attempt's deadline passes;
- ``calls_back(result)`` (a step with ``completes_on``): the remote accepts (a 202), then
  calls back on the URL ``events_url`` put in its body, with a result or a refusal;
- ``runs(handler)``: a Python function plays the remote, as a Python agent's handler
  (``agents.python``): what it returns, or ``Refused``/``NotApplied``/anything it raises.

A list gives one behaviour per call of the step, in order; the last one repeats:
``[unavailable(), answer({...})]`` fails once, then answers. A step on a Python agent runs
its declared handler unless the test gives it one of these.

A person's decision, by event name, in ``run_workflow(..., events={...})``:
``approve(result)``, ``decline(reason)`` (each ``after=`` seconds of waiting, default
none), ``no_decision()`` (nobody decides: the event's timeout passes) and ``undecided()``
(the run stops while the order waits, for the test to look, then ``Run.decide``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: A JSON object a remote answers with, or a function of the body it received.
Result = Mapping[str, Any] | Callable[[dict[str, Any]], Mapping[str, Any]]

#: Statuses that are not a refusal (agents.remote: transient): use unavailable() or crash().
_NOT_REFUSALS = frozenset({408, 409, 425, 429})


class Remote:
    """What a remote does when called (one of the kinds below): a common type, so that a
    dict of them, or a list, is typed without a note."""

    __slots__ = ()


@dataclass(frozen=True)
class Answer(Remote):
    """A 2xx with a JSON object."""

    result: Result = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Refuse(Remote):
    """A 4xx: nothing applied, never retried."""

    reason: str
    status: int = 422


@dataclass(frozen=True)
class Fail(Remote):
    """Every try of the attempt failed: ``may_have_applied`` a 500 (or no answer to a sent
    request), else a 503."""

    reason: str
    may_have_applied: bool = False


@dataclass(frozen=True)
class NoAnswer(Remote):
    """The remote never answers: the attempt's deadline passes."""


@dataclass(frozen=True)
class CallsBack(Remote):
    """Accepts (``accepted``, a 2xx), then calls back ``after`` seconds later with
    ``result`` or ``refused``."""

    result: Result | None = None
    refused: str | None = None
    after: float = 0.0
    accepted: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Runs(Remote):
    """A Python function plays the remote (a Python agent's handler)."""

    handler: Callable[..., Any]


#: What a test gives for one step: one behaviour, or one per call (the last repeats).
RemoteSpec = Remote | Sequence[Remote]


@dataclass(frozen=True)
class Decision:
    """A person's (or, for ``Event(..., by="machine")``, a remote's) event: ``result`` or
    ``refused``, ``after`` seconds of waiting. Neither, with ``wait``: nobody decides (the
    timeout passes); ``stop``: the run stops while the order waits."""

    result: Mapping[str, Any] | None = None
    refused: str | None = None
    after: float = 0.0
    by: str = "ops@testkit"
    stop: bool = False

    @property
    def body(self) -> dict[str, Any] | None:
        """The events API's body (None: nobody decides)."""
        if self.refused is not None:
            return {"refused": self.refused}
        if self.result is not None:
            return {"result": dict(self.result)}
        return None


def answer(result: Result | None = None, *, id: str | None = None) -> Answer:
    """A 2xx answering ``result`` (a JSON object, or a function of the body the remote
    received returning one; default ``{}``); ``id="rma"``: plus a fresh id in ``rma``
    (``rma-1``, ``rma-2``, ... one per call: as the simulator's ``--id`` hands out one)."""
    return Answer({} if result is None else result, id)


def refuse(reason: str, *, status: int = 422) -> Refuse:
    """A refusal (a 4xx; default 422, the service's own refusal of the key): nothing
    applied, the step fails for good."""
    if not 400 <= status < 500 or status in _NOT_REFUSALS:
        raise ValueError(
            f"refuse(status={status}): a refusal is a 4xx other than "
            f"{', '.join(map(str, sorted(_NOT_REFUSALS)))}, which the agent retries: "
            "use unavailable() or crash() for those"
        )
    return Refuse(reason, status)


def unavailable(reason: str = "HTTP 503 Service Unavailable") -> Fail:
    """Every try of this attempt failed and nothing applied (a 503): the step is retried."""
    return Fail(reason, may_have_applied=False)


def crash(reason: str = "HTTP 500 Internal Server Error") -> Fail:
    """Every try of this attempt failed and it may have applied (a 500): retried, and in
    doubt if it never succeeds."""
    return Fail(reason, may_have_applied=True)


def no_answer() -> NoAnswer:
    """The remote never answers: the attempt's deadline passes, the supervisor retries."""
    return NoAnswer()


def calls_back(
    result: Result | None = None,
    *,
    refused: str | None = None,
    after: float = 0.0,
    accepted: Mapping[str, Any] | None = None,
) -> CallsBack:
    """For a step with ``completes_on``: the remote accepts (a 2xx with ``accepted``),
    then, ``after`` seconds later, calls back on the URL ``events_url`` gave it in its body,
    with ``result`` (default ``{}``; or a function of the body it received) or
    ``refused``."""
    if result is not None and refused is not None:
        raise ValueError("calls_back: a result or refused=, not both")
    return CallsBack(
        result if result is not None or refused is not None else {},
        refused,
        after,
        accepted or {},
    )


def runs(handler: Callable[..., Any]) -> Runs:
    """``handler`` plays the remote, called as a Python agent's handler is
    (``handler(body, *, idempotency_key, deadline, step, attempt)``)."""
    if not callable(handler):
        raise TypeError(f"runs({handler!r}): not a function")
    return Runs(handler)


def approve(
    result: Mapping[str, Any] | None = None, *, after: float = 0.0, by: str = "ops@testkit"
) -> Decision:
    """The event is given, with ``result`` (default ``{}``), ``after`` seconds of waiting."""
    return Decision(result={} if result is None else result, after=after, by=by)


def decline(reason: str, *, after: float = 0.0, by: str = "ops@testkit") -> Decision:
    """The event is refused with ``reason`` (its step fails for good, not applied)."""
    return Decision(refused=reason, after=after, by=by)


def no_decision() -> Decision:
    """Nobody decides: the event's ``timeout_seconds`` pass."""
    return Decision()


def undecided() -> Decision:
    """Nobody has decided yet: the run stops while the order waits for the event (then
    ``Run.decide``)."""
    return Decision(stop=True)


def per_call(spec: RemoteSpec, call: int) -> Remote:
    """The behaviour of call ``call`` (from 0) of a step: the last of a list repeats."""
    if isinstance(spec, Sequence):
        if not spec:
            raise ValueError("an empty list of remote behaviours")
        return spec[min(call, len(spec) - 1)]
    return spec
