"""The internal messages as they travel (docs/contracts.md §3.3): the decoders of an agent
request, an agent reply and a dispatch message. The formats and their encoders are
``core.messages``; this is the edge where text from a queue becomes one of them.

Decoding never trusts its input: every failure is an ``InvalidMessage`` whose text says
what is wrong. (Over 300 lines: each field's rule sits with the decoder that checks it.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from core.errors import InvalidMessage
from core.item_names import RECORD_NAME
from core.messages import (
    APPLIED_VALUES,
    EARLIEST_TIME,
    ENVELOPE_LEVELS,
    LATEST_TIME,
    MAX_KEY_ROUND,
    OUTCOMES,
    AgentReply,
    AgentRequest,
    idempotency_key,
)
from core.order_message import MAX_NESTING, ORDER_ID_RULE, describe, is_valid_order_id, strict_json
from core.outcome import Applied, Outcome
from core.timefmt import parse_iso

#: a step's name, or an item's of a ForEach: ``<name>[<i>]`` (docs/contracts.md §3.16)
_STEP = RECORD_NAME
_PATH = re.compile(r"[a-z0-9]+(?:[-/][a-z0-9]+)*")
_AGENT = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")


def decode_dispatch(raw: bytes | str) -> str:
    """The order id of an ``order-dispatch`` message (``{"orderId": "<id>"}``), read with
    the bounded decoder of every internal message (never ``json.loads``: 60,000 ``[`` would
    be a ``RecursionError`` on every delivery, then a poison message); ``InvalidMessage``
    with the reason otherwise."""
    value = _load_object(raw, "a dispatch message")
    order_id = value.get("orderId")
    if not isinstance(order_id, str) or not is_valid_order_id(order_id):
        raise InvalidMessage(
            f'a dispatch message must be {{"orderId": "<id>"}} with orderId {ORDER_ID_RULE}'
        )
    return order_id


def _load_object(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise InvalidMessage(f"{what} is not UTF-8: {exc}") from None
    try:
        # never raises anything but ValueError; an envelope's own levels on top of an order's
        value = strict_json(text, max_nesting=MAX_NESTING + ENVELOPE_LEVELS)
    except ValueError as exc:
        raise InvalidMessage(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidMessage(f"{what} must be a JSON object, got {describe(value)}")
    return value


@dataclass(frozen=True)
class _Head:
    order_id: str
    step: str
    attempt: int
    complete_by: datetime
    token: str
    key_round: int

    def fields(self) -> dict[str, Any]:
        return {"token": self.token, "key_round": self.key_round}


def _key_round(key: object, order_id: str, step: str) -> int | None:
    """The round an ``idempotencyKey`` names for the step, or None if it names another."""
    base = idempotency_key(order_id, step)
    if key == base:
        return 1
    if isinstance(key, str) and key.startswith(base + ":"):
        tail = key[len(base) + 1 :]
        if tail.isdigit() and tail.isascii() and 2 <= int(tail) <= MAX_KEY_ROUND:
            return int(tail)
    return None


def _head(value: dict[str, Any], what: str) -> _Head:
    order_id, step, attempt, complete_by, key_round = _common(value, what)
    token = value.get("token", "")
    if token != "" and not (isinstance(token, str) and _TOKEN.fullmatch(token)):
        raise InvalidMessage(
            f"{what}: token must be 1-128 characters of A-Z a-z 0-9 - _",
            order_id=order_id,
            step=step,
        )
    return _Head(order_id, step, attempt, complete_by, token, key_round)


def _common(value: dict[str, Any], what: str) -> tuple[str, str, int, datetime, int]:
    order_id, step, attempt = value.get("orderId"), value.get("step"), value.get("attempt")
    if not isinstance(order_id, str) or not is_valid_order_id(order_id):
        raise InvalidMessage(f"{what}: orderId must be {ORDER_ID_RULE}, got {order_id!r}")
    if not isinstance(step, str) or not _STEP.fullmatch(step):
        raise InvalidMessage(
            f"{what}: step must be a kebab-case name (an item: <name>[<i>]), got {step!r}",
            order_id=order_id,
        )
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt <= MAX_ATTEMPT:
        raise InvalidMessage(
            f"{what}: attempt must be a whole number from 1 to {MAX_ATTEMPT}, got {attempt!r}",
            order_id=order_id,
            step=step,
        )
    key_round = _key_round(value.get("idempotencyKey"), order_id, step)
    if key_round is None:
        raise InvalidMessage(
            f"{what}: idempotencyKey must be '{idempotency_key(order_id, step)}' (or that "
            f"and ':<round>', 2-{MAX_KEY_ROUND}), got {value.get('idempotencyKey')!r}",
            order_id=order_id,
            step=step,
        )
    raw_deadline = value.get("completeBy")
    complete_by = _utc_time(raw_deadline)
    if complete_by is None:
        raise InvalidMessage(
            f"{what}: completeBy must be an ISO 8601 UTC time {_TIME_RANGE}, got "
            f"{_shown(raw_deadline)}",
            order_id=order_id,
            step=step,
        )
    return order_id, step, attempt, complete_by, key_round


#: W3C trace context only, bounded: it rides in every message and header.
_TRACE_KEYS: Final = ("traceparent", "tracestate")
_MAX_TRACE_CHARS: Final = 512
_TRACE_VALUE: Final = re.compile(r"[\x20-\x7e]*")  # printable ASCII: it becomes a header


#: An attempt number no step reaches (its message id must fit 128 characters, too).
MAX_ATTEMPT: Final = 999_999
_TIME_RANGE: Final = f"from {EARLIEST_TIME.year} to {LATEST_TIME.year - 1}"


def _shown(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "..."


def _utc_time(raw: object) -> datetime | None:
    """An ISO 8601 time with an offset, as UTC, between ``EARLIEST_TIME`` and
    ``LATEST_TIME``; None if it is anything else."""
    if not isinstance(raw, str) or len(raw) > 64:
        return None
    try:
        value = parse_iso(raw)
    except (ValueError, OverflowError):
        return None
    return value if EARLIEST_TIME <= value < LATEST_TIME else None


def _trace(value: dict[str, Any]) -> dict[str, str]:
    trace = value.get("trace")
    if not isinstance(trace, dict):
        return {}
    return {
        k: v
        for k, v in trace.items()
        if k in _TRACE_KEYS
        and isinstance(v, str)
        and len(v) <= _MAX_TRACE_CHARS
        and _TRACE_VALUE.fullmatch(v)
    }


def decode_request(raw: bytes | str) -> AgentRequest:
    value = _load_object(raw, "agent request")
    head = _head(value, "agent request")
    order_id, step, attempt, complete_by = head.order_id, head.step, head.attempt, head.complete_by
    path = value.get("path", step)
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise InvalidMessage(
            f"agent request: path must be a remote path, got {path!r}", order_id=order_id, step=step
        )
    order: dict[str, Any] | None
    if value.get("orderInline") is False and "order" not in value:
        order = None
    else:
        # Never a default: the remote would be called with an empty body under the real key.
        order = value.get("order")
        if not isinstance(order, dict):
            raise InvalidMessage(
                "agent request: order must be a JSON object (or orderInline: false)",
                order_id=order_id,
                step=step,
            )
    singled_out = value.get("singledOut", False) is True
    agent = value.get("agent", "")
    if agent != "" and not (isinstance(agent, str) and _AGENT.fullmatch(agent)):
        raise InvalidMessage(
            f"agent request: agent must be an agent name (a-z, 0-9, -), got {agent!r}",
            order_id=order_id,
            step=step,
        )
    return AgentRequest(
        order_id,
        step,
        attempt,
        complete_by,
        path,
        order,
        _trace(value),
        singled_out,
        agent,
        **head.fields(),
    )


def decode_reply(raw: bytes | str) -> AgentReply:
    value = _load_object(raw, "agent reply")
    head = _head(value, "agent reply")
    order_id, step, attempt, complete_by = head.order_id, head.step, head.attempt, head.complete_by
    outcome = value.get("outcome")
    runner, run_ended = _run_fields(value, order_id, step)
    if outcome == "succeeded":
        result = value.get("result", {})
        if not isinstance(result, dict):
            result = {"value": result}
        answered_at = None
        if "answeredAt" in value:
            answered_at = _utc_time(value["answeredAt"])
            if answered_at is None:
                raise InvalidMessage(
                    f"agent reply: answeredAt must be an ISO 8601 UTC time {_TIME_RANGE}, "
                    f"got {_shown(value['answeredAt'])}",
                    order_id=order_id,
                    step=step,
                )
        return AgentReply(
            order_id,
            step,
            attempt,
            complete_by,
            Outcome.SUCCEEDED,
            result=result,
            trace=_trace(value),
            runner=runner,
            run_ended=run_ended,
            answered_at=answered_at,
            **head.fields(),
        )
    if outcome in ("failed", "transient", "deferred"):
        kind = Outcome.of_wire(outcome)  # the wire's word: "failed" is a refusal
        error = value.get("error")
        if not isinstance(error, str) or not error:
            raise InvalidMessage(
                f"agent reply: a {outcome} reply needs an error string",
                order_id=order_id,
                step=step,
            )
        # A reply without "applied" comes from an older agent: assume the worst, except
        # for a refusal, which always meant "nothing applied".
        applied = value.get("applied", "no" if kind is Outcome.REFUSED else "maybe")
        if applied not in APPLIED_VALUES:
            raise InvalidMessage(
                f"agent reply: applied must be 'no' or 'maybe', got {applied!r}",
                order_id=order_id,
                step=step,
            )
        not_before = None
        if outcome == "deferred":
            raw_not_before = value.get("notBefore")
            not_before = _utc_time(raw_not_before)
            if not_before is None:
                raise InvalidMessage(
                    f"agent reply: a deferred reply needs notBefore, an ISO 8601 UTC time "
                    f"{_TIME_RANGE}, got {_shown(raw_not_before)}",
                    order_id=order_id,
                    step=step,
                )
        settled = value.get("settled", False)
        if not isinstance(settled, bool) or (settled and kind is not Outcome.REFUSED):
            raise InvalidMessage(
                f"agent reply: settled must be true or false, and true only on a refusal "
                f"(outcome 'failed'), "
                f"got {settled!r}",
                order_id=order_id,
                step=step,
            )
        running_until = None
        if "runningUntil" in value:
            running_until = _utc_time(value["runningUntil"])
            if running_until is None:
                raise InvalidMessage(
                    f"agent reply: runningUntil must be an ISO 8601 UTC time {_TIME_RANGE}, "
                    f"got {_shown(value['runningUntil'])}",
                    order_id=order_id,
                    step=step,
                )
        paused = value.get("paused", False)
        if not isinstance(paused, bool) or (paused and kind is not Outcome.DEFERRED):
            raise InvalidMessage(
                f"agent reply: paused must be true or false, and true only on a deferral, "
                f"got {paused!r}",
                order_id=order_id,
                step=step,
            )
        evidence_at = None
        if "evidenceAt" in value:
            evidence_at = _utc_time(value["evidenceAt"])
            if evidence_at is None or kind is not Outcome.TRANSIENT:
                raise InvalidMessage(
                    f"agent reply: evidenceAt must be an ISO 8601 UTC time {_TIME_RANGE}, "
                    f"and only on a transient reply, got {_shown(value['evidenceAt'])}",
                    order_id=order_id,
                    step=step,
                )
        return AgentReply(
            order_id,
            step,
            attempt,
            complete_by,
            kind,
            error=error,
            trace=_trace(value),
            applied=Applied(applied),
            not_before=not_before,
            settled=settled,
            running_until=running_until,
            runner=runner,
            run_ended=run_ended,
            paused=paused,
            evidence_at=evidence_at,
            **head.fields(),
        )
    raise InvalidMessage(
        f"agent reply: outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}",
        order_id=order_id,
        step=step,
    )


_RUNNER: Final = re.compile(r"[\x21-\x7e]{1,128}")


def _run_fields(value: dict[str, Any], order_id: str, step: str) -> tuple[str | None, bool]:
    runner, ended = value.get("runner"), value.get("runEnded", False)
    if runner is not None and not (isinstance(runner, str) and _RUNNER.fullmatch(runner)):
        raise InvalidMessage(
            f"agent reply: runner must be 1-128 printable ASCII characters, got {runner!r}",
            order_id=order_id,
            step=step,
        )
    if not isinstance(ended, bool) or (ended and runner is None):
        raise InvalidMessage(
            f"agent reply: runEnded must be true or false, and true only with a runner, "
            f"got {ended!r}",
            order_id=order_id,
            step=step,
        )
    return runner, ended


# --- notifications, alerts, rejections (docs/contracts.md §3.1, 3.5) ---------------------------
