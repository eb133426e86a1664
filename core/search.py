"""Search by business keys (docs/contracts.md §3.14): which fields a workflow lets operators
search by, and what value of an order a search matches.

A workflow names them: ``Workflow(..., search=("customerId", "email"))``. Each is a
top-level field of the order's business data: 1-64 characters of ``A-Z a-z 0-9 _ -``,
starting with a letter or ``_``; not ``orderId``, ``workflow`` or ``replyTo`` (the
order's envelope, 3.1), nor a name the order list's query string uses for something else
(``status``, ``from``, ...: ``RESERVED``); at most ``MAX_SEARCH_FIELDS`` of them.

What is matched is the value as the order carried it, as text (``search_text``):

- a string is itself (1 to ``MAX_VALUE_CHARS`` characters, compared exactly: case,
  spaces and all);
- a number is its decimal text: an integer as its digits (``42``), a number with a
  fraction as Python writes it back (``42.5``, ``1e+100``); a whole number written with a
  fraction is the integer (``42.0`` is ``42``) up to 2**53, where floats stop being exact.

A query is text, so ``?customerId=42`` finds the orders that carried the string ``"42"``
and those that carried the number ``42`` (or ``42.0``): an operator types what they see,
and need not know which the sending app used. Anything else (``true``, ``null``, an object,
a list, an empty string, a longer string) is not searchable: the order is accepted all the
same, and a search does not find it by that field.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

#: How many fields one workflow may name (each is one more small row written with the
#: order, in the same transaction: ``stores.layout.search_rows``).
MAX_SEARCH_FIELDS: Final = 8
MAX_FIELD_CHARS: Final = 64
#: The longest value a search matches (the contract's 256 characters).
MAX_VALUE_CHARS: Final = 256
FIELD_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
#: The order's envelope (docs/contracts.md §3.1): not business data.
ENVELOPE: Final = ("orderId", "workflow", "replyTo")
#: Names the order list's query string (the API's and the console's) already gives a
#: meaning: a field with one of them could not be searched by ``?<field>=<value>``.
QUERY_NAMES: Final = (
    "status",
    "from",
    "to",
    "pageSize",
    "continuationToken",
    "waiting",
    "code",
    "page",
    "refresh",
    "message",
    "failed",
    "searchField",
    "searchValue",
)
RESERVED: Final = ENVELOPE + QUERY_NAMES
#: A float is an integer exactly up to here.
_EXACT: Final = 2**53


class SearchError(ValueError):
    """A search field declared wrong (the caller turns it into a ``DeclarationError``)."""


def check_fields(fields: object) -> tuple[str, ...]:
    """The ``search=`` of a workflow, checked: a tuple of distinct field names. Raises
    ``SearchError`` with a sentence that says what to write instead."""
    if isinstance(fields, str) or not isinstance(fields, Iterable):
        raise SearchError(
            f'search is a tuple of field names, like search=("customerId",); got {fields!r}'
        )
    names = tuple(fields)
    if len(names) > MAX_SEARCH_FIELDS:
        raise SearchError(
            f"search names {len(names)} fields; at most {MAX_SEARCH_FIELDS} (each is a row "
            "written with every order)"
        )
    for name in names:
        if not isinstance(name, str) or not FIELD_NAME.fullmatch(name):
            raise SearchError(
                f"search field {name!r} is not a field name: 1-{MAX_FIELD_CHARS} characters of "
                "A-Z a-z 0-9 _ -, starting with a letter or _ (a top-level field of the order)"
            )
        if name in RESERVED:
            raise SearchError(
                f"search field {name!r} cannot be searched: "
                + (
                    "it is the order's envelope, not its business data"
                    if name in ENVELOPE
                    else "the order list's query string uses that name for something else"
                )
                + f" (reserved: {', '.join(RESERVED)})"
            )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SearchError(f"search names {', '.join(twice)} more than once")
    return names


def search_text(value: Any) -> str | None:
    """The text a search matches for a value an order carried; None: not searchable."""
    if isinstance(value, bool):  # a bool is an int in Python, not a number in JSON
        return None
    if isinstance(value, str):
        text = value
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):  # pragma: no cover - the decoder refuses them
            return None
        text = str(int(value)) if value.is_integer() and abs(value) <= _EXACT else repr(value)
    else:
        return None
    return text if 0 < len(text) <= MAX_VALUE_CHARS else None


def searchable(body: Mapping[str, Any], fields: Iterable[str]) -> dict[str, str]:
    """The order's text for each of ``fields`` it carries a searchable value in."""
    found: dict[str, str] = {}
    for name in fields:
        text = search_text(body.get(name))
        if text is not None:
            found[name] = text
    return found


def check_value(field: str, raw: str) -> str:
    """A searched-for value as a query gives it: 1-256 characters, matched exactly."""
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"give ?{field}= a value to search for")
    if len(raw) > MAX_VALUE_CHARS:
        raise ValueError(
            f"{field} is {len(raw):,} characters; a search matches values of at most "
            f"{MAX_VALUE_CHARS} characters"
        )
    return raw


def digest(text: str) -> str:
    """A key-safe stand-in for a value (Table keys refuse ``/ \\ # ?`` and control
    characters, and hold 1 KiB): 32 hex digits of its SHA-256. The row keeps the value
    too, and a search checks the order's own value, so a collision could never list an
    order that does not match."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
