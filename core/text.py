"""Text from outside (a remote's answer, a message's field, an operator's reason) made safe
to show: where it enters a reason, an alert or an order's history, every character that
a reader cannot see or that reorders what they see is written out as visible text.

C0 and C1 control characters (line breaks included: a reason is one line), DEL, the
Unicode line and paragraph separators, and the bidirectional controls (U+202E RIGHT-TO-LEFT
OVERRIDE makes ``exe.txt`` read ``txt.exe``; U+2066-U+2069, U+200E/F, U+061C) become
``\\u202e``-style escapes. Everything else, accents and emoji included, stays as it is.
"""

from __future__ import annotations

import re
from typing import Any, Final

_HIDDEN: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]"
)


def visible(text: str) -> str:
    """``text`` with every control and bidirectional character escaped (``\\u202e``)."""
    return _HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def visible_details(value: Any) -> Any:
    """``visible`` on every string of a history entry's details (nested too, keys too)."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible_details(k): visible_details(v) for k, v in value.items()}
    if isinstance(value, list):
        return [visible_details(v) for v in value]
    return value
