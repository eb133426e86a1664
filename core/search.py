"""Search by business keys (docs/contracts.md §3.14, §3.17): which fields a workflow lets
operators search by, and what value of an order a search matches.

A workflow names them: ``Workflow(..., search=("customerId", "receive-return.rma"))``.
Each is either

- a top-level field of the order's business data (``customerId``): 1-64 characters of
  ``A-Z a-z 0-9 _ -``, starting with a letter or ``_``. The order's JSON is free-form, so
  nothing checks that orders carry it; or
- ``"<step>.<field>"``, a top-level field of a step's result (``receive-return.rma``): the
  step must be a task or an ``Event`` of that workflow (a ``Delay``'s result is ``{}``, a
  compensation's is not kept for anyone), checked when the workflow is declared
  (``check_sources``). Its value is indexed once the step succeeded (it stays when the
  step is undone, and a later success of the step replaces it: what ``ctx.results``
  holds).

Either is searched by its field's name: ``?customerId=``, ``?rma=`` (``parameter``). So
that name is not ``orderId``, ``workflow`` or ``replyTo`` (the order's envelope, 3.1), nor
a name the order list's query string uses for something else (``status``, ``from``, ...:
``RESERVED``), and two declared names may not share it, in one workflow or across
workflows (``check_across``): the same name in several workflows is one search. At most
``MAX_SEARCH_FIELDS`` per workflow.

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
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # the order's model imports its plan, which imports this module
    from core.model import Order

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
#: The key of an order under per-key concurrency, searched by ``?turn=`` (§3.16).
TURN: Final = "turn"
RESERVED: Final = (*ENVELOPE, *QUERY_NAMES, TURN)
#: A float is an integer exactly up to here.
_EXACT: Final = 2**53


class SearchError(ValueError):
    """A search field declared wrong (the caller turns it into a ``DeclarationError``)."""


#: ``"<step>.<field>"``: a field of a step's result (a step's name is kebab-case, 1-48).
STEP_FIELD: Final = re.compile(
    r"(?P<step>[a-z0-9]+(?:-[a-z0-9]+)*)\.(?P<field>[A-Za-z_][A-Za-z0-9_-]{0,63})"
)
MAX_STEP_CHARS: Final = 48
#: The steps whose result a search may read, by kind (``core.flow`` names them so).
RESULT_KINDS: Final = ("task", "event")


def step_of(name: str) -> str | None:
    """The step whose result ``name`` reads (``receive-return.rma``), None: the order's."""
    step, dot, _ = name.partition(".")
    return step if dot else None


def parameter(name: str) -> str:
    """The query parameter a declared name is searched by: its field's name."""
    return name.rpartition(".")[2]


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
        _check_name(name)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SearchError(f"search names {', '.join(twice)} more than once")
    by_parameter: dict[str, str] = {}
    for name in names:
        other = by_parameter.setdefault(parameter(name), name)
        if other != name:
            raise SearchError(shared_parameter(other, name))
    return names


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not (
        FIELD_NAME.fullmatch(name)
        or ((found := STEP_FIELD.fullmatch(name)) and len(found["step"]) <= MAX_STEP_CHARS)
    ):
        raise SearchError(
            f"search field {name!r} is not a field name: 1-{MAX_FIELD_CHARS} characters of "
            "A-Z a-z 0-9 _ -, starting with a letter or _ (a top-level field of the order), "
            'or "<step>.<field>" (a top-level field of that step\'s result, like '
            '"receive-return.rma")'
        )
    field_name = parameter(name)
    if field_name in RESERVED:
        if name in ENVELOPE:
            why = "it is the order's envelope, not its business data"
        elif field_name in ENVELOPE:
            why = f"its query parameter ?{field_name}= would read as the order's envelope"
        else:
            that = "that name" if step_of(name) is None else f"?{field_name}="
            why = f"the order list's query string uses {that} for something else"
        raise SearchError(
            f"search field {name!r} cannot be searched: {why} (reserved: {', '.join(RESERVED)})"
        )


def shared_parameter(first: str, second: str, where: tuple[str, str] | None = None) -> str:
    """The refusal of two declared names searched by one query parameter."""
    at = f" (workflow {where[0]!r} and workflow {where[1]!r})" if where else ""
    return (
        f"search names {first!r} and {second!r}{at}: both would be searched by "
        f"?{parameter(first)}=, and one query parameter finds one kind of value. Keep one "
        "of them (a step's result field is searched by its field's name)"
    )


def check_sources(names: Iterable[str], kinds: Mapping[str, str]) -> None:
    """Each ``"<step>.<field>"`` of ``names`` reads a step that can carry a result: one of
    ``kinds`` (the workflow's step names, by kind: ``task``, ``event``, ``delay``,
    ``compensation``) whose kind is in ``RESULT_KINDS``. A plain name is the order's and
    cannot be checked: the order's JSON is free-form."""
    for name in names:
        step = step_of(name)
        if step is None:
            continue
        kind = kinds.get(step)
        if kind is None:
            raise SearchError(
                f"search field {name!r} reads the result of step {step!r}, which this "
                f"workflow does not have (its steps: {', '.join(kinds) or 'none'})"
            )
        if kind not in RESULT_KINDS:
            why = {
                "delay": "a Delay's result is always {}",
                "items": "a ForEach's result is the list of its items' results",
            }.get(kind, "a compensation's result is not kept for searching")
            raise SearchError(
                f"search field {name!r} reads the result of {kind} {step!r}: {why}; search "
                "by a field of a task's result or of what an Event delivered"
            )


def check_across(declared: Mapping[str, Iterable[str]]) -> None:
    """The names of every workflow (``declared``: workflow -> its ``search``): one query
    parameter is one declared name, whichever workflows name it."""
    seen: dict[str, tuple[str, str]] = {}
    for workflow, names in declared.items():
        for name in names:
            first = seen.setdefault(parameter(name), (name, workflow))
            if first[0] != name:
                raise SearchError(shared_parameter(first[0], name, (first[1], workflow)))


def describe(names: Iterable[str]) -> list[dict[str, str]]:
    """Each declared name with the query parameter it is searched by and where its value
    comes from (``GET /api/workflows``): so that a typo shows."""
    out: list[dict[str, str]] = []
    for name in names:
        step = step_of(name)
        entry = {"name": name, "parameter": parameter(name)}
        entry.update({"from": "order"} if step is None else {"from": "result", "step": step})
        out.append(entry)
    return out


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


def searchable(
    body: Mapping[str, Any],
    fields: Iterable[str],
    results: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, str]:
    """The text of each of ``fields`` that the order (``body``) or a step's result
    (``results``: the succeeded steps', as ``ctx.results`` holds them) carries a searchable
    value in, by declared name."""
    found: dict[str, str] = {}
    for name in fields:
        step = step_of(name)
        if step is None:
            value = body.get(name)
        else:
            result = (results or {}).get(step)
            value = result.get(parameter(name)) if isinstance(result, Mapping) else None
        text = search_text(value)
        if text is not None:
            found[name] = text
    return found


def of_order(order: Order) -> dict[str, str]:
    """What the order is found by now, by declared name (its plan's ``search``): its own
    fields, and its succeeded steps' result fields; and ``turn``, its key under per-key
    concurrency (docs/contracts.md §3.16), if it has one."""
    fields = order.plan.search
    rule = order.plan.concurrency
    turn = {TURN: rule.order_key} if rule is not None and rule.order_key else {}
    if not fields:
        return turn
    results = order.context().results if any(step_of(n) for n in fields) else None
    return {**searchable(order.body, fields, results), **turn}


def text_of(order: Order, field: str) -> str | None:
    """The order's value for the query parameter ``field``, as a search matches it (None:
    its plan does not search by it, or it carries no searchable value)."""
    if field == TURN:
        return of_order(order).get(TURN)
    names = [n for n in order.plan.search if parameter(n) == field]
    if not names:
        return None
    return of_order(order).get(names[0])


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
