"""Message formats of contract 3 besides the order itself (``core/orders.py``):
agent requests and replies, status notifications, operator alerts, rejections.

Decoding never trusts its input: every failure is an ``InvalidMessage`` whose
text says what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.errors import InvalidMessage
from core.orders import ORDER_ID_RULE, describe, is_valid_order_id
from core.timefmt import iso, parse_iso

_STEP = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_PATH = re.compile(r"[a-z0-9]+(?:[-/][a-z0-9]+)*")


# --- agent request and reply (contract 3.3) --------------------------------------------


def idempotency_key(order_id: str, step: str) -> str:
    return f"{order_id}:{step}"


@dataclass(frozen=True)
class _StepMessage:
    """What every agent message says about the attempt it belongs to (contract 3.3)."""

    order_id: str
    step: str
    attempt: int
    complete_by: datetime

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.order_id, self.step)

    @property
    def message_id(self) -> str:
        return f"{self.order_id}:{self.step}:{self.attempt}"

    def _head(self) -> dict[str, Any]:
        return {
            "orderId": self.order_id,
            "step": self.step,
            "attempt": self.attempt,
            "idempotencyKey": self.idempotency_key,
            "completeBy": iso(self.complete_by),
        }

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def encode(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class AgentRequest(_StepMessage):
    path: str  # the remote service path (contract 3.4: POST {REMOTE_SERVICE_URL}/{path})
    order: dict[str, Any] = field(default_factory=dict)  # the order's JSON, sent as the body
    trace: dict[str, str] = field(default_factory=dict)  # W3C trace context

    def to_json(self) -> dict[str, Any]:
        out = {**self._head(), "path": self.path, "order": self.order}
        if self.trace:
            out["trace"] = self.trace
        return out

    def _reply(self, outcome: str, **fields: Any) -> AgentReply:
        return AgentReply(
            self.order_id,
            self.step,
            self.attempt,
            self.complete_by,
            outcome,
            trace=self.trace,
            **fields,
        )

    def succeeded(self, result: dict[str, Any]) -> AgentReply:
        return self._reply("succeeded", result=result)

    def failed(self, error: str) -> AgentReply:
        return self._reply("failed", error=error)


@dataclass(frozen=True)
class AgentReply(_StepMessage):
    outcome: str  # "succeeded" | "failed"
    result: dict[str, Any] | None = None
    error: str | None = None
    trace: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {**self._head(), "outcome": self.outcome}
        if self.outcome == "succeeded":
            out["result"] = self.result if self.result is not None else {}
        else:
            out["error"] = self.error or "unspecified failure"
        if self.trace:
            out["trace"] = self.trace
        return out


def _load_object(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidMessage(f"{what} is not UTF-8 JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidMessage(f"{what} must be a JSON object, got {describe(value)}")
    return value


def _common(value: dict[str, Any], what: str) -> tuple[str, str, int, datetime]:
    order_id, step, attempt = value.get("orderId"), value.get("step"), value.get("attempt")
    if not isinstance(order_id, str) or not is_valid_order_id(order_id):
        raise InvalidMessage(f"{what}: orderId must be {ORDER_ID_RULE}, got {order_id!r}")
    if not isinstance(step, str) or not _STEP.fullmatch(step):
        raise InvalidMessage(
            f"{what}: step must be a kebab-case name, got {step!r}", order_id=order_id
        )
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise InvalidMessage(
            f"{what}: attempt must be a whole number >= 1, got {attempt!r}",
            order_id=order_id,
            step=step,
        )
    key = value.get("idempotencyKey")
    if key != idempotency_key(order_id, step):
        raise InvalidMessage(
            f"{what}: idempotencyKey must be '{idempotency_key(order_id, step)}', got {key!r}",
            order_id=order_id,
            step=step,
        )
    raw_deadline = value.get("completeBy")
    try:
        complete_by = parse_iso(raw_deadline) if isinstance(raw_deadline, str) else None
    except ValueError:
        complete_by = None
    if complete_by is None:
        raise InvalidMessage(
            f"{what}: completeBy must be an ISO 8601 UTC time, got {raw_deadline!r}",
            order_id=order_id,
            step=step,
        )
    return order_id, step, attempt, complete_by


def _trace(value: dict[str, Any]) -> dict[str, str]:
    trace = value.get("trace")
    if isinstance(trace, dict):
        return {str(k): str(v) for k, v in trace.items() if isinstance(v, str)}
    return {}


def decode_request(raw: bytes | str) -> AgentRequest:
    value = _load_object(raw, "agent request")
    order_id, step, attempt, complete_by = _common(value, "agent request")
    path = value.get("path", step)
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise InvalidMessage(
            f"agent request: path must be a remote path, got {path!r}", order_id=order_id, step=step
        )
    order = value.get("order", {})
    if not isinstance(order, dict):
        raise InvalidMessage(
            "agent request: order must be a JSON object", order_id=order_id, step=step
        )
    return AgentRequest(order_id, step, attempt, complete_by, path, order, _trace(value))


def decode_reply(raw: bytes | str) -> AgentReply:
    value = _load_object(raw, "agent reply")
    order_id, step, attempt, complete_by = _common(value, "agent reply")
    outcome = value.get("outcome")
    if outcome == "succeeded":
        result = value.get("result", {})
        if not isinstance(result, dict):
            result = {"value": result}
        return AgentReply(
            order_id, step, attempt, complete_by, outcome, result=result, trace=_trace(value)
        )
    if outcome == "failed":
        error = value.get("error")
        if not isinstance(error, str) or not error:
            raise InvalidMessage(
                "agent reply: a failed reply needs an error string", order_id=order_id, step=step
            )
        return AgentReply(
            order_id, step, attempt, complete_by, outcome, error=error, trace=_trace(value)
        )
    raise InvalidMessage(
        f"agent reply: outcome must be 'succeeded' or 'failed', got {outcome!r}",
        order_id=order_id,
        step=step,
    )


# --- notifications, alerts, rejections (contract 3.1, 3.5) ---------------------------


def status_message(order_id: str, status: str, at: datetime, **extra: Any) -> str:
    return json.dumps(
        {"orderId": order_id, "status": status, "at": iso(at), **extra}, separators=(",", ":")
    )


def alert_message(order_id: str, step: str, reason: str, failure_count: int, at: datetime) -> str:
    return json.dumps(
        {
            "orderId": order_id,
            "step": step,
            "reason": reason,
            "failureCount": failure_count,
            "at": iso(at),
        },
        separators=(",", ":"),
    )


def rejection_message(reason: str, original: str, at: datetime, **extra: str) -> str:
    return json.dumps(
        {"reason": reason, "message": original, "at": iso(at), **extra},
        separators=(",", ":"),
        ensure_ascii=False,
    )
