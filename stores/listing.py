"""Listing orders by status, newest first, across the shards (the operator API and console).

Every order has one status row, ``status|<status>|<newest-first time>|<orderId>``
(``layout.status_row``), in its shard's partition, carrying ``OrderRef``, ``Workflow``
and ``CreatedAt``. The time part is the order's creation time counted down from a fixed
point, so within a shard the rows of a status sort newest first. A page is a merge: each
shard is read from just past the last row already returned, up to a page's worth, and
the rows are merged by key. So one page costs one query per shard (16), whatever the
table holds, and the continuation token is simply the key of the last row returned.

A filter narrows the key range (a creation-time range) or is evaluated by the table
service (``Workflow eq``), never by loading orders. A search (docs/contracts.md §3.14)
reads the search rows of one field and value instead of the status rows: the same shape.
Rows written before the time part existed (``status|<status>|<orderId>``) still list,
after all newer ones, until ``python -m admin repair-index`` rewrites them.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Protocol

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient

from core.errors import InvalidContinuationToken, StorageUnavailable
from core.ports import ListFilter
from stores import layout

#: Counts stop here: an operator needs "many", not an exact 100,000 (that would read them all).
COUNT_CAP: Final = 1000
MAX_TOKEN_CHARS: Final = 200
#: A token is the part of the last row's key after ``status|<status>|``: a newest-first
#: time and an order id, or ``~`` and the order id for a row from before the time part.
_TOKEN = re.compile(r"[0-9]{13}\|[A-Za-z0-9_-]{1,64}|~[A-Za-z0-9_-]{1,64}")
_LEGACY: Final = "~"


def _prefix(where: ListFilter) -> str:
    """The rows a filter reads: by status; (``waiting``) the orders waiting for an event;
    or (``search``) the orders whose data has a value in a field (``layout.search_row``):
    the same key shape, so the same merge and tokens. A search reads only the rows of that
    value, so its cost grows with the orders that match, not with all orders; what else
    the filter asks (a status) is checked on the orders read."""
    if where.search is not None:
        return layout.search_prefix(*where.search)
    if where.waiting is not None:
        return layout.waiting_prefix(where.waiting)
    return layout.status_prefix(str(where.status))


def key_range(where: ListFilter) -> tuple[str, str]:
    """The status rows' RowKey range ``[low, high)`` a filter reads."""
    prefix = _prefix(where)
    low = prefix
    high = prefix + layout.HIGH
    if where.created_to is not None:  # newest first: a later time is a smaller key
        low = prefix + layout.newest_first(where.created_to) + "|~"
    if where.created_from is not None:
        high = prefix + layout.newest_first(where.created_from) + "|~"
    return low, high


def parse_token(token: str) -> str:
    """The one place a ``continuationToken`` is checked; it is the last row's key part."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not _TOKEN.fullmatch(token):
        raise InvalidContinuationToken(
            "continuationToken is not one this API returned; start again without it to "
            "get the first page"
        )
    return token.removeprefix(_LEGACY)


def format_token(key_part: str) -> str:
    """The token for a page that ended at the row whose key ends with ``key_part``."""
    return key_part if key_part[:1].isdigit() and "|" in key_part else _LEGACY + key_part


class StatusRows(Protocol):
    """Reads one shard's status rows: RowKey in ``[low, high)`` (``(low, high)`` if
    ``strictly``), of ``workflow`` if given, with the ``select``ed properties, in key
    order. ``table_rows`` reads Azure Table Storage; the in-memory store has its own."""

    def __call__(
        self,
        shard: str,
        low: str,
        high: str,
        workflow: str | None,
        select: list[str],
        strictly: bool,
    ) -> Iterable[dict[str, Any]]: ...


def table_rows(table: TableClient) -> StatusRows:
    def read(
        shard: str, low: str, high: str, workflow: str | None, select: list[str], strictly: bool
    ) -> Iterator[dict[str, Any]]:
        query = f"PartitionKey eq @pk and RowKey {'gt' if strictly else 'ge'} @lo and RowKey lt @hi"
        parameters = {"pk": shard, "lo": low, "hi": high}
        if workflow is not None:
            query += " and Workflow eq @wf"
            parameters["wf"] = workflow
        yield from table.query_entities(query, parameters=parameters, select=select)

    return read


def list_page(
    rows: StatusRows, where: ListFilter, page_size: int, token: str | None
) -> tuple[list[str], str | None]:
    """Order ids matching ``where``, newest first, ``page_size`` at most, and the token of
    the next page (None at the end)."""
    prefix = _prefix(where)
    low, high = key_range(where)
    after = prefix + parse_token(token) if token is not None else None
    if after is not None and after >= low:
        low = after  # and strictly after it: the last row of the previous page
    if low >= high:
        return [], None
    strictly = after is not None and low == after

    def read(shard: str) -> list[tuple[str, str]]:
        found = rows(shard, low, high, where.workflow, ["RowKey", "OrderRef"], strictly)
        listed = ((str(e["RowKey"]), str(e["OrderRef"])) for e in found if e.get("OrderRef"))
        return list(itertools.islice(listed, page_size))

    per_shard = _each_shard(read, f"list {_what(where)} orders")
    merged = sorted(row for shard_rows in per_shard for row in shard_rows)
    page = merged[:page_size]
    more = len(merged) > page_size or any(len(r) == page_size for r in per_shard)
    if not page or not more:
        return [order_id for _, order_id in page], None
    return [order_id for _, order_id in page], format_token(page[-1][0][len(prefix) :])


def count(rows: StatusRows, where: ListFilter, cap: int = COUNT_CAP) -> int:
    """How many orders match ``where``, counting to ``cap`` at most (then ``cap``)."""
    low, high = key_range(where)

    def read(shard: str) -> list[tuple[str, str]]:
        found = rows(shard, low, high, where.workflow, ["RowKey", "OrderRef"], False)
        listed = (("", "") for e in found if e.get("OrderRef"))  # a row without one lists nothing
        return list(itertools.islice(listed, cap))

    return min(cap, sum(len(r) for r in _each_shard(read, f"count {_what(where)} orders")))


def _what(where: ListFilter) -> str:
    return f"{where.search[0]}-matching" if where.search else str(where.status)


def _each_shard(read: Any, what: str) -> list[list[tuple[str, str]]]:
    """``read(shard)`` for every shard, four at a time (one page is 16 small queries)."""
    try:
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="list") as pool:
            return list(pool.map(read, layout.all_shards()))
    except AzureError as exc:
        raise StorageUnavailable(f"could not {what}: {exc}") from exc
