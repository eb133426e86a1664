"""``stores/codec.py`` against the real thing: each value written to Azurite through the
SDK and read back through it is what the codec says a read returns (value and type)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import Any

import pytest
from azure.data.tables import EdmType, EntityProperty, TableClient, TableServiceClient

from stores import codec


class Colour(Enum):
    RED = "red"


#: Every kind of value the codec describes (see its table).
VALUES: dict[str, Any] = {
    "Text": "é-1 'quoted' ☃",
    "Empty": "",
    "Yes": True,
    "No": False,
    "Small": 7,
    "Negative": -(2**31),
    "Big": EntityProperty(2**40, EdmType.INT64),
    "BigPair": (2**33, "Edm.Int64"),
    "Int32Typed": EntityProperty(5, EdmType.INT32),
    "Rate": 2.5,
    "Whole": 3.0,
    "DoubleTyped": EntityProperty(4, EdmType.DOUBLE),
    "When": datetime(2026, 11, 27, 6, 5, 28, 123456, tzinfo=UTC),
    "WhenElsewhere": datetime(2026, 11, 27, 8, 5, 28, tzinfo=timezone(timedelta(hours=2))),
    "WhenTyped": EntityProperty(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), EdmType.DATETIME),
    "Id": uuid.UUID("c9da6455-213d-42c9-9a79-3e9149a57833"),
    "Blob": b"\x00\x01binary\xff",
    "BlobTyped": EntityProperty(b"typed", EdmType.BINARY),
    "Enum": Colour.RED,
    "Missing": None,
    "MissingTyped": EntityProperty(None, EdmType.STRING),
    "StringTyped": EntityProperty("s", EdmType.STRING),
    "BoolTyped": EntityProperty(True, EdmType.BOOLEAN),
    "GuidTyped": EntityProperty("0f8fad5b-d9cb-469f-a165-70867728950e", EdmType.GUID),
}


@pytest.fixture
def table(storage_connection: str, tag: str) -> Iterator[TableClient]:
    service = TableServiceClient.from_connection_string(storage_connection)
    client = service.create_table(f"Codec{tag.replace('-', '')[:20]}")
    yield client
    client.delete_table()


def _typed(entity: dict[str, Any]) -> dict[str, tuple[type, Any]]:
    return {name: (type(value), value) for name, value in entity.items()}


def test_a_write_then_a_read_gives_what_the_codec_says(table: TableClient) -> None:
    entity = {"PartitionKey": "p", "RowKey": "r", **VALUES}
    written = table.create_entity(entity)
    read = table.get_entity("p", "r")
    expected = codec.stored(entity, written["etag"])
    assert read.metadata["etag"] == expected.metadata["etag"]
    actual = {k: v for k, v in read.items()}
    # Types compared as the app can tell them apart (the SDK returns its own datetime
    # subclass for a time: a datetime, equal to the codec's).
    assert {k: _kind(v) for k, v in actual.items()} == {k: _kind(v) for k, v in expected.items()}
    assert actual == dict(expected)


def _kind(value: Any) -> str:
    if isinstance(value, datetime):
        return f"datetime {value.tzinfo}"
    if isinstance(value, EntityProperty):
        return f"EntityProperty {EdmType(value.edm_type).value}"
    return type(value).__name__


def test_a_transaction_writes_the_same_as_a_single_write(table: TableClient) -> None:
    """The store writes through ``submit_transaction``: its rows read back the same."""
    entity = {"PartitionKey": "p", "RowKey": "t", **VALUES}
    [result] = table.submit_transaction([("create", entity)])
    read = table.get_entity("p", "t")
    expected = codec.stored(entity, result["etag"])
    assert read.metadata["etag"] == expected.metadata["etag"]
    assert dict(read) == dict(expected)


@pytest.mark.parametrize(
    "value",
    [2**31, object(), [1], {"a": 1}],
    ids=["int over 32 bits", "object", "list", "dict"],
)
def test_what_the_sdk_refuses_the_codec_refuses(table: TableClient, value: Any) -> None:
    entity = {"PartitionKey": "p", "RowKey": "x", "V": value}
    with pytest.raises(TypeError):
        table.create_entity(entity)
    with pytest.raises(TypeError):
        codec.as_read(entity)
