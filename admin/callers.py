"""Who acts, for an order's history, and how much of why they keep: shared by the
operator API (``admin/triggers.py``) and the console (``console/triggers.py``), so
neither blueprint imports the other.

Who did it: the principal's name; for a key caller ``function-key``, with a name it
sent in ``x-operator`` (or an unverified principal header) kept only as a claim:
``function-key (claims: alice)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from config.principals import CLIENT_PRINCIPAL_NAME, Principal

FUNCTION_KEY_CALLER = "function-key"
MAX_NAME_CHARS = 64
#: A reason kept in the history, at most (a longer one is cut).
MAX_REASON_CHARS = 500
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def clean_name(value: str | None) -> str:
    """A name as a header sent it, printable and ``MAX_NAME_CHARS`` at most."""
    text = _UNPRINTABLE.sub("", value or "").strip()
    return text[:MAX_NAME_CHARS]


def caller_of(principal: Principal | None, headers: Mapping[str, str]) -> str:
    """Who acts, for the history: the principal's name, else ``function-key`` (with what
    the request claims, as a claim)."""
    if principal is not None:
        return principal.name
    claimed = clean_name(headers.get(CLIENT_PRINCIPAL_NAME)) or clean_name(
        headers.get("x-operator")
    )
    return f"{FUNCTION_KEY_CALLER} (claims: {claimed})" if claimed else FUNCTION_KEY_CALLER
