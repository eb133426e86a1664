"""An entity as the Table service gives it back after a write, built from public types.

Two parts of the store need to know what a read would return without making one: the
in-memory twin (``stores/memory.py``), which keeps what the table keeps, and the table
store's recent writes (``stores/recent.py``), which keep an order's rows as the next read
would return them so that the next step need not read them back. azure-data-tables has
no public entity codec (its own lives in private modules that may change in any
release), so this is the small piece the app needs, over the SDK's public ``EdmType``,
``EntityProperty`` and ``TableEntity``.

What a write and a read do to a property's value (the SDK's serializer, the service, the
SDK's deserializer; ``tests/integration/test_entity_codec.py`` writes every case to
Azurite and reads it back through the SDK, ``tests/unit/test_entity_codec.py`` pins the
cases):

==============================  =========================================================
written                          read back
==============================  =========================================================
``None``                         absent (docs/contracts.md#fact-none-not-stored)
``str``, ``bool``                the same
an ``Enum``                      ``str(value)``
``int`` (32 bits)                the same; a larger ``int`` is refused (``TypeError``):
                                 write ``EntityProperty(n, EdmType.INT64)``
``float``                        the same (``Edm.Double``)
``datetime``                     aware, UTC, to the microsecond (a naive one is taken as
                                 local time, as the SDK's serializer takes it)
``uuid.UUID``, ``bytes``         the same
``EntityProperty(v, EdmType.X)`` what a read of ``Edm.X`` gives: ``INT64`` stays an
                                 ``EntityProperty``; the others their Python value
==============================  =========================================================

Any other type is refused with ``TypeError``, as the SDK refuses it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Final

from azure.data.tables import EdmType, EntityMetadata, EntityProperty, TableEntity

_INT32: Final = range(-(2**31), 2**31)
_INT64: Final = range(-(2**63), 2**63)


class StoredEntity(TableEntity):
    """A ``TableEntity`` with the metadata a read gives it: its ETag (and timestamp).

    The SDK fills ``TableEntity.metadata`` only in its own deserializer, and has no public
    way to set it; this subclass answers ``metadata`` from its own state, so it reads like
    an entity the SDK returned (``entity.metadata["etag"]``) wherever one is expected."""

    def __init__(
        self,
        properties: Mapping[str, Any],
        etag: str | None,
        timestamp: datetime | None = None,
    ) -> None:
        super().__init__(properties)
        self.__metadata: EntityMetadata = {"etag": etag, "timestamp": timestamp}

    @property
    def metadata(self) -> EntityMetadata:
        return self.__metadata


def _int32(value: Any) -> int:
    number = int(value)
    if number not in _INT32:
        raise TypeError(f"{value!r} is too large for Edm.Int32: write it as Edm.Int64")
    return number


def _int64(value: Any) -> EntityProperty:
    number = int(value)
    if number not in _INT64:
        raise TypeError(f"{value!r} is too large for Edm.Int64")
    return EntityProperty(number, EdmType.INT64)


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def _datetime(value: Any) -> datetime:
    if isinstance(value, str):  # a serialized time, passed through by the SDK
        return datetime.fromisoformat(value).astimezone(UTC)
    return _utc(value)


#: How a read gives back a value written with an explicit EDM type.
_TYPED: Final[dict[EdmType, Callable[[Any], Any]]] = {
    EdmType.STRING: str,
    EdmType.INT32: _int32,
    EdmType.INT64: _int64,
    EdmType.DOUBLE: float,
    EdmType.BOOLEAN: bool,
    EdmType.DATETIME: _datetime,
    EdmType.GUID: lambda v: v if isinstance(v, uuid.UUID) else uuid.UUID(str(v)),
    EdmType.BINARY: bytes,
}
#: How a read gives back a plain Python value (the SDK looks its type up exactly: a
#: subclass of ``str`` or ``int`` that is not an ``Enum`` is refused).
_PLAIN: Final[dict[type, Callable[[Any], Any]]] = {
    str: str,
    bool: bool,
    int: _int32,
    float: float,
    uuid.UUID: lambda v: v,
    bytes: bytes,
}


def read_value(name: str, value: Any) -> Any:
    """What a read returns for a property written as ``value`` (not None)."""
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, datetime):
        return _utc(value)
    if isinstance(value, tuple):  # EntityProperty, or a (value, type) pair
        inner, edm = value[0], EdmType(value[1])
        return _TYPED[edm](inner)
    convert = _PLAIN.get(type(value))
    if convert is None:
        raise TypeError(f"property {name!r}: a {type(value).__name__} cannot be stored")
    return convert(value)


def as_read(entity: Mapping[str, Any]) -> dict[str, Any]:
    """The properties of ``entity`` as a read of it returns them (None not stored; an
    ``EntityProperty`` whose value is None neither)."""
    out: dict[str, Any] = {}
    for name, value in entity.items():
        if value is None or (isinstance(value, tuple) and value[0] is None):
            continue
        out[name] = read_value(name, value)
    return out


def stored(entity: Mapping[str, Any], etag: str | None) -> StoredEntity:
    """``entity`` as a read returns it after a write that answered ``etag``."""
    return StoredEntity(as_read(entity), etag)
