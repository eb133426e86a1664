"""Message formats of docs/contracts.md besides the order itself (``core/order_message.py``):
agent requests and replies, status notifications, operator alerts, rejections.

(Over 400 lines: each format's encoder and its never-trusting decoder sit together.)

Decoding never trusts its input: every failure is an ``InvalidMessage`` whose
text says what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from core.item_names import item_of
from core.order_message import strict_json
from core.outcome import WIRE_OUTCOMES, Applied, Outcome
from core.text import visible
from core.timefmt import iso
from core.workflows import declared_steps, declares_step

#: A reply's ``applied`` on the wire: what its attempt's failed tries may have done.
APPLIED_VALUES: Final = (Applied.NO.value, Applied.MAYBE.value)
#: A reply's ``outcome`` as the wire spells it (a refusal is ``failed``: contract 3.3).
OUTCOMES: Final = WIRE_OUTCOMES
#: A reply must always fit its queue (a Storage queue message is 64 KiB): a remote
#: result larger than this is cut, with a marker, and the step still succeeds.
MAX_RESULT_CHARS: Final = 16_000
MAX_ERROR_CHARS: Final = 1_000
#: An order body larger than this (UTF-8 bytes) is not copied into the agent request;
#: the agent reads it from the state store (``orderInline: false``).
MAX_INLINE_ORDER_BYTES: Final = 40_000


# --- agent request and reply (docs/contracts.md §3.3) --------------------------------------------


def idempotency_key(order_id: str, step: str, key_round: int = 1) -> str:
    """``<orderId>:<step>``; an item of a ``ForEach`` (``<name>[<i>]``) is
    ``<orderId>:<name>:<i>`` (docs/contracts.md §3.16); a compensation run again as a new
    effect (its step applied after it ran, §3.11) is ``<orderId>:<step>:<round>``."""
    item = item_of(step)
    base = f"{order_id}:{step}" if item is None else f"{order_id}:{item[0]}:{item[1]}"
    return base if key_round == 1 else f"{base}:{key_round}"


#: Rounds of one step's idempotency key (``idempotency_key``): 1 and up to this.
MAX_KEY_ROUND: Final = 99
#: Internal messages wrap an order (or a result) under their own fields: their decoders
#: allow this many levels more than an order may nest, so that every message the app
#: writes is one the app can read (docs/contracts.md §3.1, §3.3).
ENVELOPE_LEVELS: Final = 4
#: Every time a message carries is inside these bounds, so that no arithmetic on it can
#: overflow (a datetime ends at 9999-12-31) and nothing is put off for ever.
EARLIEST_TIME: Final = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_TIME: Final = datetime(2100, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class _StepMessage:
    """What every agent message says about the attempt it belongs to (docs/contracts.md §3.3).

    ``token``: the attempt's own token (``core.steps.StepRecord.token_for``), written by
    the claim into the request and carried back by every report of it: a message whose
    token does not match a claimed attempt is quarantined, never applied or run. It is a
    secret: never logged (it is left out of ``repr``)."""

    order_id: str
    step: str
    attempt: int
    complete_by: datetime
    token: str = field(default="", repr=False, kw_only=True)
    key_round: int = field(default=1, kw_only=True)

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.order_id, self.step, self.key_round)

    @property
    def message_id(self) -> str:
        return f"{self.order_id}:{self.step}:{self.attempt}"

    def _head(self) -> dict[str, Any]:
        head: dict[str, Any] = {
            "orderId": self.order_id,
            "step": self.step,
            "attempt": self.attempt,
            "idempotencyKey": self.idempotency_key,
            "completeBy": iso(self.complete_by),
        }
        if self.token:
            head["token"] = self.token
        return head

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def encode(self) -> str:
        # ASCII: a character outside it is an escape, never a byte sequence that a lone
        # surrogate could make unencodable.
        return json.dumps(self.to_json(), separators=(",", ":"))


def bounded_result(result: dict[str, Any]) -> dict[str, Any]:
    """The result as a reply carries it: whole, or cut with a marker when it is large, or
    replaced by a marker when the remote's JSON is something replies cannot carry (NaN,
    a lone surrogate, nesting too deep). The step still succeeds either way."""
    text = json.dumps(result, separators=(",", ":"))  # ASCII: its length is its size
    try:
        strict_json(text)
    except ValueError as exc:
        return {"unreadable": True, "reason": str(exc), "preview": text[:2_000]}
    if len(text) <= MAX_RESULT_CHARS:
        return result
    return {
        "truncated": True,
        "size": len(text),
        "preview": text[: MAX_RESULT_CHARS // 4],
    }


@dataclass(frozen=True)
class AgentRequest(_StepMessage):
    path: str  # the remote service path (docs/contracts.md §3.4: POST {REMOTE_SERVICE_URL}/{path})
    #: the order's JSON, sent as the body; None when it is too large to travel in the
    #: request (the agent then reads it from the state store)
    order: dict[str, Any] | None = field(default_factory=dict)
    trace: dict[str, str] = field(default_factory=dict)  # W3C trace context
    #: An earlier attempt of this step failed while the remote served other orders: its
    #: failures are its own, not an outage's (the agent uses this to attribute failures).
    singled_out: bool = False
    #: The agent that runs the step (its request queue, ``agent-requests-<agent>``).
    agent: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self._head(), "path": self.path}
        if self.agent:
            out["agent"] = self.agent
        if self.order is not None:
            out["order"] = self.order
        else:
            out["orderInline"] = False
        if self.trace:
            out["trace"] = self.trace
        if self.singled_out:
            out["singledOut"] = True
        return out

    def encode(self) -> str:
        text = super().encode()
        if self.order is not None and len(text.encode("utf-8")) > MAX_INLINE_ORDER_BYTES:
            return replace(self, order=None).encode()
        return text

    def with_order(self, order: dict[str, Any]) -> AgentRequest:
        return replace(self, order=order)

    def _reply(self, outcome: Outcome, **fields: Any) -> AgentReply:
        return AgentReply(
            self.order_id,
            self.step,
            self.attempt,
            self.complete_by,
            outcome,
            trace=self.trace,
            token=self.token,
            key_round=self.key_round,
            **fields,
        )

    def succeeded(self, result: dict[str, Any]) -> AgentReply:
        return self._reply(Outcome.SUCCEEDED, result=bounded_result(result))

    def refused(
        self, error: str, applied: Applied = Applied.NO, *, settled: bool = False
    ) -> AgentReply:
        """The remote refused (permanent 4xx): nothing was applied by that try (``applied``
        says "maybe" when an earlier try of the same attempt may have). ``settled``: the
        service itself refused after looking the key up (400, 422), which settles the
        doubt of earlier attempts (docs/contracts.md §3.11)."""
        return self._reply(
            Outcome.REFUSED, error=error[:MAX_ERROR_CHARS], applied=applied, settled=settled
        )

    def transient(
        self,
        error: str,
        applied: Applied,
        *,
        running_until: datetime | None = None,
        runner: str | None = None,
        evidence_at: datetime | None = None,
    ) -> AgentReply:
        """Every try failed transiently until time ran out; this order's failure.
        ``running_until``: a Python handler of this attempt still runs (until then, at
        least: the agent reports again before it, and when the handler ends).
        ``evidence_at``: when the agent saw what blamed this attempt (``AgentReply``)."""
        return self._reply(
            Outcome.TRANSIENT,
            error=error[:MAX_ERROR_CHARS],
            applied=applied,
            running_until=running_until,
            runner=runner,
            evidence_at=evidence_at,
        )

    def deferred(
        self,
        reason: str,
        not_before: datetime,
        applied: Applied = Applied.NO,
        *,
        running_until: datetime | None = None,
        runner: str | None = None,
        paused: bool = False,
    ) -> AgentReply:
        """Not called (circuit open, Retry-After past the deadline, too late, the agent
        paused by an operator), or the remote is down for everyone: no failure of this
        order; run again at ``not_before`` (``paused``: once the agent is resumed)."""
        return self._reply(
            Outcome.DEFERRED,
            error=reason[:MAX_ERROR_CHARS],
            applied=applied,
            not_before=not_before,
            running_until=running_until,
            runner=runner,
            paused=paused,
        )


@dataclass(frozen=True)
class AgentReply(_StepMessage):
    outcome: Outcome
    result: dict[str, Any] | None = None
    error: str | None = None
    trace: dict[str, str] = field(default_factory=dict)
    #: for refused/transient/deferred: no or maybe (a word of a reply is taken too)
    applied: Applied | None = None
    not_before: datetime | None = None  # for deferred: the earliest time to call again
    #: for failed: the service refused after looking the key up (400, 422)
    settled: bool = False
    #: a Python handler of the attempt still runs, until at least then
    running_until: datetime | None = None
    #: which handler run ``running_until`` and ``run_ended`` speak for
    runner: str | None = None
    #: the report of that run's end (its outcome, like a remote's late answer)
    run_ended: bool = False
    #: for succeeded: when the agent got the success (the remote's answer, the handler's
    #: return), by its clock: a success that lands after its step's undo began is told
    #: apart from one that only arrived late (docs/contracts.md §3.11)
    answered_at: datetime | None = None
    #: for deferred: not called because an operator paused the agent (``core.controls``):
    #: the step waits for the resume, and the wait spends none of its deferral window
    paused: bool = False
    #: for transient: when the agent saw the evidence that made this failure the order's
    #: own (another order served by its endpoint, its host answering others, its health
    #: probe answering healthy), by its clock. None: no new evidence (the request's
    #: ``singledOut`` alone blamed it): the step's flag keeps its age (docs/contracts.md
    #: §3.11, 18: "blame ages from its evidence")
    evidence_at: datetime | None = None

    def __post_init__(self) -> None:
        # One type however it was built (ValueError for an outcome that does not exist).
        outcome = self.outcome
        if not isinstance(outcome, Outcome):
            outcome = Outcome.of_wire(str(outcome))  # a reply's word ("failed": refused)
        object.__setattr__(self, "outcome", outcome)
        if self.applied is not None and not isinstance(self.applied, Applied):
            object.__setattr__(self, "applied", Applied(self.applied))

    @property
    def may_have_applied(self) -> bool:
        return self.applied is Applied.MAYBE

    def to_json(self) -> dict[str, Any]:
        out = {**self._head(), "outcome": self.outcome.wire}
        if self.outcome == "succeeded":
            out["result"] = self.result if self.result is not None else {}
        else:
            out["error"] = self.error or "unspecified failure"
            out["applied"] = str(
                self.applied or (Applied.NO if self.outcome is Outcome.REFUSED else Applied.MAYBE)
            )
        if self.outcome == "deferred":
            out["notBefore"] = iso(self.not_before or self.complete_by)
        if self.settled and self.outcome is Outcome.REFUSED:
            out["settled"] = True
        if self.running_until is not None and self.outcome != "succeeded":
            out["runningUntil"] = iso(self.running_until)
        if self.runner:
            out["runner"] = self.runner
        if self.run_ended:
            out["runEnded"] = True
        if self.answered_at is not None and self.outcome == "succeeded":
            out["answeredAt"] = iso(self.answered_at)
        if self.paused and self.outcome == "deferred":
            out["paused"] = True
        if self.evidence_at is not None and self.outcome is Outcome.TRANSIENT:
            out["evidenceAt"] = iso(self.evidence_at)
        if self.trace:
            out["trace"] = self.trace
        return out


def status_message(order_id: str, status: str, at: datetime, **extra: Any) -> str:
    return json.dumps(
        {"orderId": order_id, "status": status, "at": iso(at), **extra}, separators=(",", ":")
    )


#: An alert's ``kind`` (docs/contracts.md §3.5, §3.14): about an order, or an agent's
#: outage and its end.
ORDER_ALERT: Final = "order"
OUTAGE_ALERT: Final = "outage"
RECOVERED_ALERT: Final = "recovered"
#: A queue the host has not been able to read (every receive failing), and its end.
QUEUE_UNREADABLE_ALERT: Final = "queue-unreadable"
QUEUE_RECOVERED_ALERT: Final = "queue-recovered"

#: What an alert names as its step when that is no step the declarations declare. The step
#: is a dimension of the Azure Monitor alert rule (one e-mail per value, infra/app/
#: alerts.bicep), so it takes only declared names: a message cannot mint new ones.
UNDECLARED_STEP: Final = "(undeclared)"
#: Characters of an undeclared step name an alert's reason quotes.
MAX_UNDECLARED_CHARS: Final = 100


def alert_step(step: object) -> tuple[str, str]:
    """The step an alert carries (a declared step name, ``""`` for none, or
    ``UNDECLARED_STEP``) and what its reason adds when it named another (else ``""``)."""
    if step is None or step == "":
        return "", ""
    text = str(step)
    if text == UNDECLARED_STEP or text in declared_steps():
        return text, ""
    item = item_of(text)
    if item is not None and declares_step(text):
        # an item of a ForEach alerts under its ForEach's name: one dimension value per
        # declared step, however many items an order has (docs/contracts.md §3.16)
        return item[0], f" (item {item[1]}: {text})"
    shown = visible(text[:MAX_UNDECLARED_CHARS])
    more = "\u2026" if len(text) > MAX_UNDECLARED_CHARS else ""
    return UNDECLARED_STEP, f' (it names step "{shown}{more}", which no workflow declares)'


def alert_message(
    order_id: str, step: str, reason: str, failure_count: int, at: datetime, **extra: Any
) -> str:
    """An operator alert about an order (docs/contracts.md §3.5; ``kind`` ``order``, as
    §3.14 tells it from an agent's outage): ``step`` only as ``alert_step`` allows."""
    step, detail = alert_step(step)
    return json.dumps(
        {
            "kind": ORDER_ALERT,
            "orderId": order_id,
            "step": step,
            "reason": visible(reason) + detail,
            "failureCount": failure_count,
            "at": iso(at),
            **extra,
        },
        separators=(",", ":"),
    )


def outage_alert_message(
    agent: str, since: datetime, waiting: int | None, reason: str, at: datetime
) -> str:
    """One agent's outage, told once (docs/contracts.md §3.14): every call to its remote
    has failed since ``since``; ``waiting`` orders are held (None: they could not be
    counted)."""
    return json.dumps(
        {
            "kind": OUTAGE_ALERT,
            "agent": agent,
            "since": iso(since),
            "waiting": waiting,
            "reason": visible(reason),
            "at": iso(at),
        },
        separators=(",", ":"),
    )


def recovered_alert_message(agent: str, since: datetime, at: datetime, reason: str) -> str:
    """The end of the outage that began at ``since``: the remote answered at ``at``."""
    return json.dumps(
        {
            "kind": RECOVERED_ALERT,
            "agent": agent,
            "since": iso(since),
            "at": iso(at),
            "reason": visible(reason),
        },
        separators=(",", ":"),
    )


def queue_alert_message(kind: str, queue: str, since: datetime, reason: str, at: datetime) -> str:
    """A queue the host cannot read (``kind`` ``QUEUE_UNREADABLE_ALERT``: every receive
    has failed since ``since``) or reads again (``QUEUE_RECOVERED_ALERT``), in the shape of
    an outage's alerts (docs/contracts.md §3.5)."""
    return json.dumps(
        {
            "kind": kind,
            "queue": queue,
            "since": iso(since),
            "reason": visible(reason),
            "at": iso(at),
        },
        separators=(",", ":"),
    )


def rejection_message(
    reason: str,
    original: str,
    at: datetime,
    *,
    kept_as: str | None = None,
    **extra: str,
) -> str:
    """A rejection (``orders-rejected``) or quarantine (``<queue>-poison``) record:
    ``{"reason", "message", "at"}`` with ``message`` the original text unchanged, plus
    ``extra`` (``queue``, ``messageBase64``, ...).

    A record must fit a Storage queue message (64 KiB of UTF-8), and quoting a message
    near that size makes it larger. So the caller measures the record; when it is too
    large, it keeps the original elsewhere (``stores/kept.py``) and passes ``kept_as``, its
    key: the record then carries ``messagePreview`` (the first 2,000 characters) and
    ``keptAs`` instead of ``message``, and a reason cut at 2,000 characters; ``reason``
    and ``at`` are always there.
    """
    reason = visible(reason)  # ``message`` stays the original, unchanged
    body: dict[str, Any] = {"reason": reason, "message": original, "at": iso(at), **extra}
    if kept_as is not None:
        cut = 2_000  # characters of the preview and of the reason: the record stays small
        del body["message"]
        if len(reason) > cut:
            body["reason"] = reason[:cut] + "\u2026"
        body["messagePreview"] = original[:cut]
        body["keptAs"] = kept_as
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)
