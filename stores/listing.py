"""Listing orders by status, newest first, across the shards (the operator API and console).

Every order has one status row, ``status|<status>|<newest-first time>|<orderId>``
(``layout.status_row``), in its shard's partition, carrying ``OrderRef``, ``Workflow``
and ``CreatedAt``. The time part is the order's creation time counted down from a fixed
point, so within a shard the rows of a status sort newest first. A page is a merge: each
shard is read from just past the last row already returned, up to a page's worth, and
the rows are merged by key. So one page costs one query per shard (16), whatever the
table holds, and the continuation token is simply the key of the last row returned.

A filter narrows the key range (a creation-time range) or is evaluated by the table
service (``Workflow eq``), never by loading orders. Rows written before the time part
existed (``status|<status>|<orderId>``) still list, after all newer ones, until
``python -m admin repair-index`` rewrites them.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient

from core.errors import StorageUnavailable
from core.states import OrderStatus
from stores import layout

#: Counts stop here: an operator needs "many", not an exact 100,000 (that would read them all).
COUNT_CAP: Final = 1000
MAX_TOKEN_CHARS: Final = 200
#: A token is the part of the last row's key after ``status|<status>|``: a newest-first
#: time and an order id, or ``~`` and the order id for a row from before the time part.
_TOKEN = re.compile(r"[0-9]{13}\|[A-Za-z0-9_-]{1,64}|~[A-Za-z0-9_-]{1,64}")
_LEGACY: Final = "~"
_WORKFLOW = re.compile(r"[A-Za-z0-9_-]{1,64}")


class InvalidContinuationToken(ValueError):
    """A ``continuationToken`` this API did not hand out: a 400 for its caller."""


@dataclass(frozen=True)
class ListFilter:
    """What a listing keeps: one status, optionally one workflow and a creation-time range
    (``created_from`` inclusive, ``created_to`` exclusive)."""

    status: OrderStatus
    workflow: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None

    def __post_init__(self) -> None:
        if self.workflow is not None and not _WORKFLOW.fullmatch(self.workflow):
            raise ValueError("workflow must be 1-64 characters of A-Z a-z 0-9 - _")
        for name in ("created_from", "created_to"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ValueError(f"{name} must carry a time zone")
        if self.created_from and self.created_to and self.created_from >= self.created_to:
            raise ValueError("the time range is empty: 'from' must be before 'to'")

    def key_range(self) -> tuple[str, str]:
        """The status rows' RowKey range ``[low, high)`` this filter reads."""
        prefix = layout.status_prefix(str(self.status))
        low = prefix
        high = prefix + layout.HIGH
        if self.created_to is not None:  # newest first: a later time is a smaller key
            low = prefix + layout.newest_first(self.created_to) + "|~"
        if self.created_from is not None:
            high = prefix + layout.newest_first(self.created_from) + "|~"
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


def list_page(
    table: TableClient, where: ListFilter, page_size: int, token: str | None
) -> tuple[list[str], str | None]:
    """Order ids matching ``where``, newest first, ``page_size`` at most, and the token of
    the next page (None at the end)."""
    prefix = layout.status_prefix(str(where.status))
    low, high = where.key_range()
    after = prefix + parse_token(token) if token is not None else None
    if after is not None and after >= low:
        low = after  # and strictly after it: the last row of the previous page
    if low >= high:
        return [], None

    def read(shard: str) -> list[tuple[str, str]]:
        rows = _query(table, shard, low, high, where.workflow, ["RowKey", "OrderRef"], after)
        return [(str(e["RowKey"]), str(e["OrderRef"])) for e in itertools.islice(rows, page_size)]

    per_shard = _each_shard(read, f"list {where.status} orders")
    merged = sorted(row for rows in per_shard for row in rows)
    page = merged[:page_size]
    more = len(merged) > page_size or any(len(rows) == page_size for rows in per_shard)
    if not page or not more:
        return [order_id for _, order_id in page], None
    return [order_id for _, order_id in page], format_token(page[-1][0][len(prefix) :])


def count(table: TableClient, where: ListFilter, cap: int = COUNT_CAP) -> int:
    """How many orders match ``where``, counting to ``cap`` at most (then ``cap``)."""
    low, high = where.key_range()

    def read(shard: str) -> list[tuple[str, str]]:
        rows = _query(table, shard, low, high, where.workflow, ["RowKey"])
        return [("", "") for _ in itertools.islice(rows, cap)]

    return min(cap, sum(len(rows) for rows in _each_shard(read, f"count {where.status} orders")))


def _query(
    table: TableClient,
    shard: str,
    low: str,
    high: str,
    workflow: str | None,
    select: list[str],
    after: str | None = None,
) -> Iterator[dict[str, Any]]:
    strictly = after is not None and low == after
    query = f"PartitionKey eq @pk and RowKey {'gt' if strictly else 'ge'} @lo and RowKey lt @hi"
    parameters = {"pk": shard, "lo": low, "hi": high}
    if workflow is not None:
        query += " and Workflow eq @wf"
        parameters["wf"] = workflow
    for entity in table.query_entities(query, parameters=parameters, select=select):
        if entity.get("OrderRef", "x"):  # a row without its order reference lists nothing
            yield entity


def _each_shard(read: Any, what: str) -> list[list[tuple[str, str]]]:
    """``read(shard)`` for every shard, four at a time (one page is 16 small queries)."""
    try:
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="list") as pool:
            return list(pool.map(read, layout.all_shards()))
    except AzureError as exc:
        raise StorageUnavailable(f"could not {what}: {exc}") from exc
