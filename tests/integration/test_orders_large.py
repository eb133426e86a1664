"""Large orders on real Azurite (docs/contracts.md §3.1): whatever the queue can carry is accepted,
stored across several Table properties and read back exactly as sent."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import pytest

os.environ.setdefault("AGENT_TRANSPORT", "storage")

from core.model import Order
from core.order_message import MAX_MESSAGE_CHARS, decode_order, utf16_units
from core.workflows import WORKFLOWS, Plan
from stores import layout
from stores.entities import BODY_PART_UNITS
from stores.tables import TableStateStore
from tests.support import drain, make_context

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)

# Characters outside the BMP (two UTF-16 units each), accents, CJK, and text that JSON
# escapes: spread through the order so that every property boundary falls among them.
_SAMPLES = ["\U0001f600", "\U0001f4e6 box", "Zo\u00eb", "\u4e2d\u6587", "\U00010348", 'a "q"']


def large_body(order_id: str, target_chars: int = 60_000) -> dict[str, object]:
    lines: list[dict[str, object]] = []
    body: dict[str, object] = {"orderId": order_id, "customer": "c-42", "lines": lines}
    n = 0
    while len(json.dumps(body, ensure_ascii=False, separators=(",", ":"))) < target_chars:
        lines.append({"sku": f"S-{n}", "note": _SAMPLES[n % len(_SAMPLES)] * (1 + n % 7)})
        n += 1
    return body


def accept(raw: str) -> Order:
    return Order.accept(decode_order(raw), Plan.of(WORKFLOWS["order"], 30), T0)


@pytest.fixture
def store(storage_connection: str, tag: str) -> TableStateStore:
    return make_context(storage_connection, tag).store


def order_record(store: TableStateStore, order_id: str) -> dict[str, object]:
    return dict(store.table.get_entity(layout.shard_of(order_id), layout.order_row(order_id)))


def test_a_60_kb_order_with_emoji_is_stored_and_loaded_back_identically(
    store: TableStateStore,
) -> None:
    body = large_body("big-emoji")
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    assert 60_000 <= len(raw) <= MAX_MESSAGE_CHARS
    assert utf16_units(raw) > 2 * BODY_PART_UNITS  # more than one property can hold
    order = accept(raw)

    store.create(order)
    loaded = store.load("big-emoji")

    assert loaded is not None
    assert loaded.body == body
    assert loaded.content_hash == order.content_hash
    record = order_record(store, "big-emoji")
    parts = int(record["BodyParts"])  # type: ignore[call-overload]
    assert parts >= 3
    names = ["Body"] + [f"Body{n}" for n in range(1, parts)]
    assert all(utf16_units(str(record[name])) <= BODY_PART_UNITS for name in names)
    assert "".join(str(record[name]) for name in names) == decode_order(raw).data_json


def test_the_largest_re_serialized_body_fits_one_entity(store: TableStateStore) -> None:
    # 1e15 is stored as 1000000000000000.0: a full queue message grows ~3.8x.
    count = (MAX_MESSAGE_CHARS - 40) // 5
    raw = '{"orderId":"big-floats","a":[' + ",".join(["1e15"] * count) + "]}"
    assert len(decode_order(raw).data_json) > 3 * MAX_MESSAGE_CHARS
    order = accept(raw)

    store.create(order)
    loaded = store.load("big-floats")

    assert loaded is not None and loaded.body == order.body


def test_control_characters_and_noncharacters_are_data(store: TableStateStore) -> None:
    body = {"orderId": "ctl-1", "s": "a\x00b\x01\x1f\x7f\x85\u2028\ufeff\ufffe\uffff\U0010ffff"}
    order = accept(json.dumps(body))

    store.create(order)
    loaded = store.load("ctl-1")

    assert loaded is not None and loaded.body == body


def test_a_record_written_before_bodies_were_split_is_still_read(store: TableStateStore) -> None:
    store.create(accept('{"orderId":"old-1","x":"\U0001f600"}'))
    record = order_record(store, "old-1")
    # The record as the code before this change wrote it: only ``Body``.
    del record["BodyParts"]
    from azure.data.tables import UpdateMode

    store.table.upsert_entity(record, mode=UpdateMode.REPLACE)
    assert "BodyParts" not in order_record(store, "old-1")

    loaded = store.load("old-1")

    assert loaded is not None and loaded.body == {"orderId": "old-1", "x": "\U0001f600"}


def test_a_60_kb_order_through_the_real_trigger_is_accepted_not_rejected(
    storage_connection: str, tag: str
) -> None:
    from bootstrap import reset_app_context

    ctx = make_context(storage_connection, tag)
    reset_app_context(ctx)
    try:
        # The bad-input catalogue's caller: app.get_functions() may run once per app.
        from tests.integration.test_bad_input import call

        body = large_body(f"{tag}-big")
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

        call("submit_order", raw)

        assert drain(ctx, ctx.names.orders_rejected) == []
        order = ctx.store.load(f"{tag}-big")
        assert order is not None and order.body == body
    finally:
        reset_app_context(None)
