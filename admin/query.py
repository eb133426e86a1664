"""The list filter as the query string states it, for the operator API and the console.

``status`` (required by the API unless it searches; the console defaults it), ``workflow``,
``from`` and ``to`` (creation time, UTC: ``2026-11-22``, ``2026-11-22T10:00``, or with an
offset; 1970 to 2199), ``pageSize`` and ``continuationToken``; and a search,
``<field>=<value>`` (docs/contracts.md §3.14): any other name is a field to search by,
which a workflow must declare (``Workflow(..., search=(...))``; a step's result field,
``"<step>.<field>"``, by its field's name: §3.17). Every bad value is a
``ValueError`` whose text tells the caller what to send instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta

from core.ports import ListFilter
from core.search import check_value, step_of
from core.states import OrderStatus
from core.workflows import search_fields, search_names

MAX_PAGE = 100
#: The creation times a filter may name, ``[EARLIEST, LATEST)``: the status rows' keys
#: count milliseconds from 1970 and run out in 2286 (``stores.layout.newest_first``), and
#: near year 1 or 9999 an offset or the day a bare ``to`` adds leaves ``datetime``.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)


def parse_status(raw: str) -> OrderStatus:
    try:
        return OrderStatus(raw)
    except ValueError:
        valid = ", ".join(s.value for s in OrderStatus)
        raise ValueError(f"give ?status= one of: {valid} (got {raw!r})") from None


def parse_time(name: str, raw: str, *, end: bool = False) -> datetime | None:
    """A date or a date and time; naive means UTC. A bare date as ``to`` includes that day."""
    text = raw.strip()
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace(" ", "T"))
    except ValueError:
        raise ValueError(
            f"{name} must be a date or a time like 2026-11-22 or 2026-11-22T10:30 (UTC), "
            f"got {raw[:40]!r}"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if not EARLIEST <= value < LATEST:  # compared as instants: no arithmetic to overflow
        raise ValueError(
            f"{name} must be a time between {EARLIEST:%Y-%m-%d} and "
            f"{LATEST - timedelta(days=1):%Y-%m-%d} (UTC), got {raw[:40]!r}"
        )
    if end and len(text) == 10:  # "to 2026-11-22" means to the end of that day
        value += timedelta(days=1)
    return value.astimezone(UTC)


#: The names the API's list takes for itself (``code``: the function key, in Azure);
#: every other name in its query string is a field to search by.
LIST_PARAMS = frozenset(
    {"status", "workflow", "from", "to", "pageSize", "continuationToken", "waiting", "code"}
)


def searchable_text() -> str:
    """The fields orders can be searched by, for an error message: each with the workflows
    that declare it, and the step whose result it reads (docs/contracts.md §3.17)."""
    fields = search_fields()
    if not fields:
        return "no workflow declares fields to search by (Workflow(..., search=(...)))"
    names = search_names()

    def source(field: str) -> str:
        step = step_of(names.get(field, field))
        return f", from step {step}'s result" if step else ""

    listed = "; ".join(f"{f} ({', '.join(w)}{source(f)})" for f, w in fields.items())
    return f"the fields orders can be searched by (and the workflows that declare them): {listed}"


def one_field_at_a_time(names: Iterable[str]) -> str:
    """The refusal of a search by more than one field (the API's 400, the CLI's exit 2)."""
    return f"search one field at a time (got {', '.join(names)})"


def parse_search(params: Mapping[str, str], known: frozenset[str]) -> tuple[str, str] | None:
    """``(field, value)`` from the one name of ``params`` not in ``known``, a field some
    workflow declares; None if there is none (or its value is blank: no search)."""
    asked = [name for name in params if name not in known]
    if not asked:
        return None
    declared = search_fields()
    for name in asked:
        if name not in declared:
            raise ValueError(
                f"{name[:64]!r} is not a field orders can be searched by (nor a filter of "
                f"the list: {', '.join(sorted(LIST_PARAMS - {'code'}))}); {searchable_text()}"
            )
    if len(asked) > 1:
        raise ValueError(one_field_at_a_time(asked))
    name = asked[0]
    raw = params.get(name) or ""
    if raw == "":
        return None
    return name, check_value(name, raw)


def parse_filter(
    params: Mapping[str, str],
    default_status: str | None = None,
    known: frozenset[str] = LIST_PARAMS,
) -> ListFilter:
    """``waiting=<event>``: the orders waiting for that event (the operators' inbox); they
    are ``processing``, the status it implies. ``<field>=<value>``, a name not in
    ``known``: a search, of any status unless ``status`` names one."""
    search = parse_search(params, known)
    waiting = (params.get("waiting") or "").strip() or None
    if waiting is not None and params.get("status") not in (None, "", "processing"):
        raise ValueError("an order waiting for an event is processing: drop ?status= or say so")
    raw_status = params.get("status") or ("processing" if waiting else None)
    if search is None:
        raw_status = raw_status or default_status
    # no status and no search: parse_status("") refuses it, saying what to give
    status = parse_status(raw_status or "") if raw_status or search is None else None
    workflow = (params.get("workflow") or "").strip() or None
    try:
        return ListFilter(
            status,
            workflow,
            parse_time("from", params.get("from", "")),
            parse_time("to", params.get("to", ""), end=True),
            waiting,
            search,
        )
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def parse_page_size(raw: str | None, default: int = 50) -> int:
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 6:
        raise ValueError(f"pageSize must be a whole number (1-{MAX_PAGE})")
    return max(1, min(int(raw), MAX_PAGE))  # as many as asked, within the bounds
