"""The order message (docs/contracts.md §3.1): decoding and validation.

Decoding never trusts its input: every failure is an ``InvalidOrder`` whose
text is a sentence the sender can act on; it is what goes to
``orders-rejected``. Nothing the parser meets escapes as another exception
(docs/contracts.md §3.1): lone surrogates, integers beyond Python's digit limit,
nesting deeper than ``MAX_NESTING``, numbers too large for a float (``1e400``)
and text longer than a queue message are all rejections with a reason.
Control characters (NUL included) inside JSON strings are valid JSON and are
kept as data: the stored JSON escapes them (``\\u0000``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from core.errors import InvalidOrder
from core.names import Names
from core.reply_queues import QUEUE_NAME, ReplyQueues
from core.workflows import DEFAULT_WORKFLOW, WORKFLOWS

ORDER_ID_RULE: Final = "1-64 characters of A-Z a-z 0-9 - _"
_ORDER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # always fullmatch: "$" accepts a final "\n"
# Storage queue names: 3-63 characters, lowercase letters, digits and single
# hyphens, starting and ending with a letter or digit.
_QUEUE_NAME = QUEUE_NAME
#: A Storage queue message holds at most 64 KiB (65,536 characters): nothing longer can
#: arrive, so a longer text is refused before it is parsed.
MAX_MESSAGE_CHARS: Final = 65_536
#: Defensive bound on the stored JSON (UTF-16 code units, as Table Storage counts them;
#: ``stores.entities`` splits it over several properties). Re-serializing can make the
#: JSON longer than the message (``1e15`` becomes ``1000000000000000.0``: at most about
#: 3.8 times), so the bound is 4 x 64 KiB: every message the queue can carry fits.
MAX_ORDER_DATA_UNITS: Final = 4 * MAX_MESSAGE_CHARS
#: Arrays and objects nested deeper than this are refused (the parser, the encoder and
#: every consumer of the order recurse once per level).
MAX_NESTING: Final = 64
#: Python refuses to convert integers longer than this (``sys.get_int_max_str_digits``).
MAX_INT_DIGITS: Final = 4_300


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
        _parse(decoded)  # never json.loads: deep nesting or huge integers escape it
    except _NotJson:
        return True  # JSON, though one the decoder would refuse: still base64 of JSON
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    return True


class _NotJson(ValueError):
    pass


def _shown(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _NotJson(
            f"the message contains an integer of {digits:,} digits; the limit is "
            f"{MAX_INT_DIGITS:,} digits: send very large numbers as strings"
        )
    try:
        return int(text)
    except ValueError:  # the interpreter's own digit limit is set lower than ours
        raise _NotJson(
            f"the message contains an integer of {digits:,} digits, more than this service "
            "can read: send very large numbers as strings"
        ) from None


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJson(
            f"the message contains the number {_shown(text)}, which is too large for a "
            "64-bit floating-point number (beyond about 1.8e308): send it as a string, or "
            "send a smaller number"
        )
    return value


# Finds what changes the nesting depth outside strings: brackets and string openings.
_STRUCTURE = re.compile(r'["\[\]{}]')
# The rest of a JSON string after its opening quote (unrolled: linear, no backtracking).
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def _too_deep(text: str, max_nesting: int = MAX_NESTING) -> bool:
    """Whether arrays and objects nest deeper than ``max_nesting`` (before parsing, so the
    parser never recurses that far). Invalid JSON is left for the parser to report."""
    depth, pos = 0, 0
    while (found := _STRUCTURE.search(text, pos)) is not None:
        char = found.group()
        if char == '"':
            rest = _STRING_REST.match(text, found.end())
            if rest is None:
                return False  # an unterminated string: not JSON
            pos = rest.end()
            continue
        pos = found.end()
        if char in "[{":
            depth += 1
            if depth > max_nesting:
                return True
        else:
            depth -= 1
    return False


def _parse(text: str, max_nesting: int = MAX_NESTING) -> Any:
    """``json.loads`` with every escape turned into ``_NotJson`` or ``JSONDecodeError``."""
    if _too_deep(text, max_nesting):
        raise _NotJson(
            f"the message nests arrays and objects more than {max_nesting} levels deep; "
            f"flatten the order's data to at most {MAX_NESTING} levels"
        )
    try:
        return json.loads(
            text,
            parse_constant=_no_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
            object_pairs_hook=_unique_keys,
        )
    except RecursionError:  # pragma: no cover - _too_deep stops this first
        raise _NotJson(
            f"the message nests arrays and objects too deeply; flatten the order's data to "
            f"at most {MAX_NESTING} levels"
        ) from None


def _has_lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _path_part(key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return "." + key
    return "[" + json.dumps(key) + "]"  # ASCII: a lone surrogate shows as \udXXX


def _lone_surrogate_reason(where: str) -> str:
    return (
        f"the message has a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair) "
        f"in {where}; that is not a Unicode character: send the character itself, or both "
        "halves of its surrogate pair"
    )


def strict_json(text: str, *, max_nesting: int = MAX_NESTING) -> Any:
    """Parse JSON text as ``decode_order`` does, for other decoders of untrusted messages.

    Raises ``ValueError`` (its text a sentence) for what is not JSON, NaN/Infinity, a
    repeated key, an integer over ``MAX_INT_DIGITS`` digits, a number beyond a float,
    nesting deeper than ``max_nesting`` and a lone surrogate; never another exception.
    """
    value = _parse(text, max_nesting)
    where = _lone_surrogate_at(value)
    if where is not None:
        raise _NotJson(_lone_surrogate_reason(where))
    return value


def _lone_surrogate_at(value: Any) -> str | None:
    """Where a string (key or value) holds a lone UTF-16 surrogate, or None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if _has_lone_surrogate(item):
                return f"the value at {path[1:] or 'the top'}"
        elif isinstance(item, dict):
            for key, child in item.items():
                if _has_lone_surrogate(key):
                    return f"a key of the object at {path[1:] or 'the top'}"
                stack.append((child, path + _path_part(key)))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{n}]") for n, child in enumerate(item))
    return None


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
    """Length as Table Storage counts it (UTF-16 code units). Never raises: a lone
    surrogate (possible in text from elsewhere, e.g. a remote result) counts one unit."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def decode_order(
    raw: bytes | str,
    *,
    names: Names | None = None,
    reply_queues: ReplyQueues | None = None,
) -> OrderMessage:
    """Decode and validate an order message (docs/contracts.md §3.1) or raise ``InvalidOrder``.

    ``names``: the deployment's queue names, none of which ``replyTo`` may name
    (``Names.is_own_queue``; default ``Names()``). ``reply_queues``: the queues
    ``REPLY_QUEUES`` allows; None checks no list (decoding only, as tests and benchmarks do).
    """
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            text = bytes(raw).decode("utf-8-sig")  # a BOM (PowerShell adds one) is not content
        except UnicodeDecodeError as exc:
            raise InvalidOrder(
                f"the message is not UTF-8 text (invalid byte at position {exc.start}); "
                "send the order as UTF-8 JSON"
            ) from None
    else:
        text = raw
    if not text.strip():
        raise InvalidOrder("the message is empty; send the order as a JSON object")
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidOrder(
            f"the message is {len(text):,} characters; a Storage queue message holds at most "
            f"{MAX_MESSAGE_CHARS:,}: keep large documents elsewhere and send a reference"
        )
    try:
        value = _parse(text)
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
    where = _lone_surrogate_at(value)
    if where is not None:
        raise InvalidOrder(_lone_surrogate_reason(where))
    order_id = value.get("orderId")
    order_id = order_id if isinstance(order_id, str) and is_valid_order_id(order_id) else None
    try:
        fields = _OrderFields.model_validate(value)
    except ValidationError as exc:
        raise InvalidOrder(_pydantic_reason(exc), order_id=order_id) from None
    if fields.replyTo is not None and (names or Names()).is_own_queue(fields.replyTo):
        raise InvalidOrder(
            f"replyTo {fields.replyTo!r} is one of this app's own queues, which take only the "
            "app's own messages; name a queue of your application for status messages",
            order_id=order_id,
        )
    if fields.replyTo is not None and reply_queues is not None:
        refusal = reply_queues.refusal(fields.replyTo)
        if refusal is not None:
            raise InvalidOrder(refusal, order_id=order_id)
    message = OrderMessage(fields.orderId, fields.workflow, fields.replyTo, value)
    size = utf16_units(message.data_json)
    if size > MAX_ORDER_DATA_UNITS:  # pragma: no cover - a queue message cannot grow this much
        raise InvalidOrder(
            f"the order is {size:,} characters of JSON; the limit is {MAX_ORDER_DATA_UNITS:,}: "
            "keep large documents elsewhere and send a reference",
            order_id=order_id,
        )
    return message
