"""The order message (contract 3.1): decoding and validation.

Decoding never trusts its input: every failure is an ``InvalidOrder`` whose
text is a sentence the sender can act on; it is what goes to
``orders-rejected``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from core.errors import InvalidOrder
from core.workflows import DEFAULT_WORKFLOW, WORKFLOWS

ORDER_ID_RULE: Final = "1-64 characters of A-Z a-z 0-9 - _"
_ORDER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # always fullmatch: "$" accepts a final "\n"
# Storage queue names: 3-63 characters, lowercase letters, digits and single
# hyphens, starting and ending with a letter or digit.
_QUEUE_NAME = re.compile(r"(?=.{3,63}\Z)[a-z0-9]+(?:-[a-z0-9]+)*")
#: The order is stored in one Table string property: 64 KiB, i.e. 32K UTF-16 code units.
MAX_ORDER_DATA_CHARS: Final = 30_000  # UTF-16 code units, as Table Storage counts them


def is_valid_order_id(value: str) -> bool:
    return bool(_ORDER_ID.fullmatch(value))


class _OrderFields(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    orderId: str
    workflow: str = DEFAULT_WORKFLOW
    replyTo: str | None = None

    @field_validator("orderId")
    @classmethod
    def _order_id(cls, value: str) -> str:
        if not _ORDER_ID.fullmatch(value):
            shown = value if len(value) <= 80 else value[:77] + "..."
            raise ValueError(
                f"orderId must be {ORDER_ID_RULE} (it becomes a Table Storage key); "
                f"got {shown!r} ({len(value)} characters)"
            )
        return value

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, value: str) -> str:
        if value not in WORKFLOWS:
            known = ", ".join(sorted(WORKFLOWS))
            raise ValueError(f"unknown workflow {value!r}; known workflows: {known}")
        return value

    @field_validator("replyTo")
    @classmethod
    def _reply_to(cls, value: str | None) -> str | None:
        if value is not None and not _QUEUE_NAME.fullmatch(value):
            raise ValueError(
                f"replyTo must name a Storage queue (3-63 lowercase letters, digits and single "
                f"hyphens, starting and ending with a letter or digit); got {value!r}"
            )
        return value


@dataclass(frozen=True)
class OrderMessage:
    """A valid order. ``body`` is the whole JSON object, as the app sent it."""

    order_id: str
    workflow: str
    reply_to: str | None
    body: dict[str, Any]

    @property
    def content_hash(self) -> str:
        """Same content, same hash, whatever the key order or spacing of the text."""
        canonical = json.dumps(self.body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @property
    def data_json(self) -> str:
        return json.dumps(self.body, separators=(",", ":"), ensure_ascii=False)


def describe(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    if value is None:
        return "null"
    return type(value).__name__


def _pydantic_reason(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        loc = ".".join(str(p) for p in item["loc"]) or "message"
        msg = str(item["msg"]).removeprefix("Value error, ")
        if item["type"] == "missing":
            msg = (
                f"{loc} is required ({ORDER_ID_RULE})" if loc == "orderId" else f"{loc} is required"
            )
        elif item["type"] in ("string_type", "str_type"):
            msg = f"{loc} must be a string, got {describe(item.get('input'))}"
        elif not msg.startswith(loc):
            msg = f"{loc}: {msg}"
        parts.append(msg)
    return "; ".join(parts)


def _looks_like_base64_json(text: str) -> bool:
    compact = text.strip()
    if len(compact) < 8 or len(compact) % 4:
        return False
    try:
        decoded = base64.b64decode(compact, validate=True).decode("utf-8")
        json.loads(decoded)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    return True


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJson(
        f"the message contains {name}, which is not a JSON number (RFC 8259): send numbers "
        "that JSON can carry, or null"
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _NotJson(
                f"the message repeats the key {key!r} in one object; JSON parsers disagree on "
                "which value wins, so send each key once"
            )
        out[key] = value
    return out


def utf16_units(text: str) -> int:
    """Length as Table Storage counts it (UTF-16 code units)."""
    return len(text.encode("utf-16-le")) // 2


def decode_order(raw: bytes | str) -> OrderMessage:
    """Decode and validate an order message (contract 3.1) or raise ``InvalidOrder``."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8-sig")  # a BOM (PowerShell adds one) is not content
        except UnicodeDecodeError as exc:
            raise InvalidOrder(
                f"the message is not UTF-8 text (invalid byte at position {exc.start}); "
                "send the order as UTF-8 JSON"
            ) from None
    else:
        text = raw
    if not text.strip():
        raise InvalidOrder("the message is empty; send the order as a JSON object")
    try:
        value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except _NotJson as exc:
        raise InvalidOrder(str(exc)) from None
    except json.JSONDecodeError as exc:
        if _looks_like_base64_json(text):
            raise InvalidOrder(
                "the message is base64-encoded JSON; the orders queue takes the JSON text "
                "as it is (message encoding 'none'): send the plain JSON"
            ) from None
        raise InvalidOrder(
            f"the message is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            "send the order as a JSON object"
        ) from None
    if not isinstance(value, dict):
        raise InvalidOrder(f"the order must be a JSON object, got {describe(value)}")
    try:
        fields = _OrderFields.model_validate(value)
    except ValidationError as exc:
        raise InvalidOrder(
            _pydantic_reason(exc),
            order_id=value.get("orderId") if isinstance(value.get("orderId"), str) else None,
        ) from None
    message = OrderMessage(fields.orderId, fields.workflow, fields.replyTo, value)
    size = utf16_units(message.data_json)
    if size > MAX_ORDER_DATA_CHARS:
        raise InvalidOrder(
            f"the order is {size:,} characters of JSON; the limit is {MAX_ORDER_DATA_CHARS:,} "
            "(it is kept in one Table Storage property): keep large documents elsewhere and "
            "send a reference",
            order_id=message.order_id,
        )
    return message
