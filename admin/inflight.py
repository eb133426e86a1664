"""The orders the deploy guard reads (``admin.deploycheck``): every order in flight, through
the status index (``status|<status>|…`` rows, ``stores/listing.py``), a page of ids at a
time, each order loaded once; and a few of the newest finished orders, which show what the
deployed version has been planning.

Cost: a page of ``PAGE`` ids is one range query per shard (16), each order one range query
(its records): about 16 x (4 + in-flight / 100) + in-flight queries, plus 3 x 16 and up to
3 x ``RECENT`` loads for the finished ones. It grows with the work in flight, never with
history; ``MAX_ORDERS`` bounds it (beyond that the check refuses, as incomplete).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from admin.deploycheck import FINISHED, IN_FLIGHT, DeployCheck
from core.errors import CorruptOrder
from core.model import Order
from core.ports import ListFilter, StateStore
from core.workflows import UndeclaredStep

MAX_ORDERS: Final = 20_000
RECENT: Final = 20
PAGE: Final = 100


def read(
    store: StateStore,
    check: DeployCheck,
    *,
    max_orders: int = MAX_ORDERS,
    recent: int = RECENT,
    page: int = PAGE,
) -> DeployCheck:
    """Feed ``check`` every order in flight (via the status index: a page of ``page`` ids
    costs one query per shard, then one query per order loaded), at most ``max_orders``,
    and the ``recent`` newest orders of each finished status."""
    seen: set[str] = set()
    for status in IN_FLIGHT:
        token: str | None = None
        while check.complete:
            ids, token = store.list_by_status(ListFilter(status), page, token)
            check.list_pages += 1
            fresh = [i for i in ids if i not in seen]
            room = max_orders - len(seen)
            if len(fresh) > room or (room == len(fresh) and token is not None):
                check.complete = False
                fresh = fresh[:room]
            seen.update(fresh)
            for order_id, loaded in _load_each(store, check, fresh):
                if isinstance(loaded, CorruptOrder):
                    cause = loaded.__cause__
                    if isinstance(cause, UndeclaredStep):
                        check.stranded(order_id, status, cause)
                    else:
                        check.unreadable(order_id, status, loaded.message)
                elif loaded is not None and not loaded.status.finished:
                    check.in_flight(loaded)  # under its status now, if it moved
            if token is None:
                break
    for status in FINISHED if recent > 0 else ():
        ids, _ = store.list_by_status(ListFilter(status), recent, None)
        check.list_pages += 1
        for _, loaded in _load_each(store, check, [i for i in ids if i not in seen]):
            if isinstance(loaded, Order) and loaded.status.finished:
                check.finished(loaded)
    return check


def _load_each(
    store: StateStore, check: DeployCheck, ids: list[str]
) -> Iterator[tuple[str, Order | CorruptOrder | None]]:
    """Each order of ``ids``, four loads at a time (StorageUnavailable stops the check)."""

    def load(order_id: str) -> tuple[str, Order | CorruptOrder | None]:
        try:
            return order_id, store.load(order_id)
        except CorruptOrder as exc:
            return order_id, exc

    check.order_loads += len(ids)
    if not ids:
        return iter(())
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="deploy-check") as pool:
        return iter(list(pool.map(load, ids)))
