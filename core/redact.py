"""No token value leaves in a quoted message.

An agent request or reply carries its attempt's secret ``token`` (``core/messages.py``):
whoever holds it can report on that attempt. A message the app gives up on is quoted
for an operator (a quarantine record, a poison or dead-letter alert, a kept copy, a
preview on the console or the CLI, a log line), and none of those may carry it: each
quotes the message with every token value replaced by ``MARKER``.

The text is not always JSON (cut short, not UTF-8, a record that quotes it as a string),
so the rule is textual first: ``"token": "<value>"``, also JSON-escaped once or more
inside a string (``\\"token\\":\\"<value>\\"``), keeps its key and loses its value,
and so does a value a preview cut short at its end.
Valid JSON that still names a token another way (``"tok\\u0065n"``) is written again
with the value replaced. An order's own data is no agent message: rejected and poisoned
orders are quoted unchanged (docs/contracts.md §3.1), so callers apply this to the agent
and internal queues only (``core.names.Names.holds_orders``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, Final

#: What a token's value becomes wherever a message is quoted.
MARKER: Final = "(removed)"
_KEY: Final = "token"

# Plain JSON: a string value, escapes included.
_PLAIN = r'("token"\s*:\s*)"(?:[^"\\]|\\.)*"'
# Escaped n levels deep (the quote is written as backslashes then a quote): the value
# runs to the next quote written the same way.
_ESCAPED = r'((\\+)"token\2"\s*:\s*)\2"(?:(?!\2").)*?\2"'
# A preview may end inside a value: what is left of it goes.
_CUT = r'((\\*)"token\2"\s*:\s*)\2"(?:(?!\2").)*\Z'
_PLAIN_STR, _PLAIN_BYTES = re.compile(_PLAIN, re.S), re.compile(_PLAIN.encode(), re.S)
_ESCAPED_STR = re.compile(_ESCAPED, re.S)
_ESCAPED_BYTES = re.compile(_ESCAPED.encode(), re.S)
_CUT_STR, _CUT_BYTES = re.compile(_CUT, re.S), re.compile(_CUT.encode(), re.S)


#: A capability in a callback URL (``core.links.events_url``: ``?token=r<run>.<mac>``).
_CAPABILITY: Final = re.compile(r"([?&]token=)r\d{1,2}\.[0-9a-f]{8,64}")


def without_capabilities(text: str) -> str:
    """``text`` with the capability of every callback URL in it replaced (a step's body
    that carries its events_url is shown to people: docs/contracts.md §3.15)."""
    return _CAPABILITY.sub(lambda m: f"{m[1]}{MARKER}", text)


def shown(value: Any) -> Any:
    """A JSON value as people may see it: no capability in it (None stays None)."""
    if value is None:
        return None
    text = json.dumps(value, ensure_ascii=False)
    cleaned = without_capabilities(text)
    return value if cleaned == text else json.loads(cleaned)


def without_tokens(text: str) -> str:
    """``text`` with every token value replaced by ``MARKER``, and every callback URL's
    capability; otherwise unchanged."""
    text = without_capabilities(text)
    out = _PLAIN_STR.sub(lambda m: f'{m[1]}"{MARKER}"', text)
    out = _ESCAPED_STR.sub(lambda m: f'{m[1]}{m[2]}"{MARKER}{m[2]}"', out)
    out = _CUT_STR.sub(lambda m: f'{m[1]}{m[2]}"{MARKER}', out)
    return _rewritten_if_still_named(out)


def without_tokens_bytes(raw: bytes) -> bytes:
    """The same for a message's exact bytes, UTF-8 or not."""
    marker = MARKER.encode()
    out = _PLAIN_BYTES.sub(lambda m: m[1] + b'"' + marker + b'"', raw)
    out = _ESCAPED_BYTES.sub(lambda m: m[1] + m[2] + b'"' + marker + m[2] + b'"', out)
    out = _CUT_BYTES.sub(lambda m: m[1] + m[2] + b'"' + marker, out)
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:
        return out
    rewritten = _rewritten_if_still_named(text)
    return out if rewritten is text else rewritten.encode("utf-8")


def base64_without_tokens(exact: str) -> str:
    """Base64 of a message's exact bytes (its quoted form when it is not UTF-8), their
    tokens removed; text that is not base64 loses its tokens as text."""
    try:
        raw = base64.b64decode(exact, validate=True)
    except (binascii.Error, ValueError):
        return without_tokens(exact)
    return base64.b64encode(without_tokens_bytes(raw)).decode("ascii")


def _rewritten_if_still_named(text: str) -> str:
    """Valid JSON whose keys still name a token with a value other than the marker (a key
    spelled with escapes, which no pattern sees): written again without it. Anything else:
    ``text`` itself."""
    if "\\u" not in text:  # every other spelling of the key is matched by the patterns
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    cleaned, changed = _clean(value)
    return json.dumps(cleaned, ensure_ascii=False) if changed else text


def _clean(value: Any) -> tuple[Any, bool]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        changed = False
        for key, item in value.items():
            if key == _KEY and item != MARKER:
                out[key], changed = MARKER, True
                continue
            out[key], sub = _clean(item)
            changed = changed or sub
        return out, changed
    if isinstance(value, list):
        items = [_clean(item) for item in value]
        return [item for item, _ in items], any(sub for _, sub in items)
    return value, False
