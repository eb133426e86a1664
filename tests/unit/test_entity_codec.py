"""``stores/codec.py``: what a read returns for each kind of value written (checked against
Azurite in tests/integration/test_entity_codec.py), and entities that carry their ETag."""

from __future__ import annotations

import copy
import uuid
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import Any

import pytest
from azure.data.tables import EdmType, EntityProperty, TableEntity

from stores import codec


class Kind(Enum):
    A = "a"


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("text", "text"),
        (True, True),
        (7, 7),
        (2.5, 2.5),
        (EntityProperty(2**40, EdmType.INT64), EntityProperty(2**40, EdmType.INT64)),
        ((2**33, "Edm.Int64"), EntityProperty(2**33, EdmType.INT64)),
        (EntityProperty(5, EdmType.INT32), 5),
        (EntityProperty(4, EdmType.DOUBLE), 4.0),
        (EntityProperty(1, EdmType.BOOLEAN), True),
        (EntityProperty("s", EdmType.STRING), "s"),
        (
            datetime(2026, 1, 1, 8, tzinfo=timezone(timedelta(hours=2))),
            datetime(2026, 1, 1, 6, tzinfo=UTC),
        ),
        (
            EntityProperty("2026-01-01T06:00:00.5Z", EdmType.DATETIME),
            datetime(2026, 1, 1, 6, 0, 0, 500000, tzinfo=UTC),
        ),
        (uuid.UUID(int=5), uuid.UUID(int=5)),
        (EntityProperty(str(uuid.UUID(int=6)), EdmType.GUID), uuid.UUID(int=6)),
        (b"\x00\xff", b"\x00\xff"),
        (Kind.A, str(Kind.A)),
    ],
    ids=repr,
)
def test_a_value_reads_back_as_the_service_returns_it(written: Any, read: Any) -> None:
    [(name, value)] = codec.as_read({"V": written}).items()
    assert name == "V"
    assert value == read
    assert type(value) is type(read)
    if isinstance(value, datetime):
        assert value.utcoffset() == timedelta(0)


def test_none_is_not_stored() -> None:
    entity = {"A": None, "B": EntityProperty(None, EdmType.STRING), "C": ""}
    assert codec.as_read(entity) == {"C": ""}


@pytest.mark.parametrize(
    "value",
    [2**31, -(2**31) - 1, EntityProperty(2**63, EdmType.INT64), [1], object()],
    ids=["int32+1", "int32-1", "int64+1", "list", "object"],
)
def test_what_the_service_cannot_store_is_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        codec.as_read({"V": value})


def test_reading_what_was_read_changes_nothing() -> None:
    written = {"N": EntityProperty(2**40, EdmType.INT64), "T": datetime.now(UTC), "S": "x"}
    once = codec.as_read(written)
    assert codec.as_read(once) == once


def test_a_stored_entity_is_a_table_entity_with_its_etag() -> None:
    entity = codec.stored({"PartitionKey": "p", "RowKey": "r", "X": 1}, 'W/"1"')
    assert isinstance(entity, TableEntity)
    assert entity.metadata == {"etag": 'W/"1"', "timestamp": None}
    assert dict(entity) == {"PartitionKey": "p", "RowKey": "r", "X": 1}
    copied = copy.deepcopy(entity)
    assert copied.metadata["etag"] == 'W/"1"' and copied == entity
    other = codec.stored({}, 'W/"2"')
    assert entity.metadata["etag"] == 'W/"1"'  # each its own metadata
    assert other.metadata["etag"] == 'W/"2"'
