"""The archive of finished orders: gzip-compressed JSON lines in Blob Storage
(docs/contracts.md §3.12).

One blob per retention run, workflow and day the orders finished
(``core.retention.archive_path``), written create-only: a blob is never overwritten, so
an archive that was written stays what it was. Each line is one order
(``archived_line``): a summary for people (``orderId``, ``workflow``, ``status``,
``createdAt``, ``finishedAt``, ``archivedAt``), the order as the API shows it with its
steps and history (``order``), and its table rows exactly as stored (``rows``, with the
type of each property that JSON cannot carry), from which ``restore`` writes it back.

A blob is written in full before any of its orders is deleted (``supervisor/retention.py``).
A run that dies after writing a blob and before deleting its orders leaves them in the
table; the next run archives them again, in a new blob: the archive may hold two copies
of an order, never none.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any, Final

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import EdmType, EntityProperty
from azure.storage.blob import ContainerClient, ContentSettings

from core.errors import StorageUnavailable
from core.timefmt import iso_exact, parse_iso

#: Version of the line format; a restore refuses lines it does not know.
FORMAT: Final = 1
#: Table properties the service sets itself: never archived, never written back.
_SYSTEM: Final = frozenset({"Timestamp", "etag", "odata.etag"})


# --- rows <-> JSON --------------------------------------------------------------------


def _typed(edm: str, value: Any) -> dict[str, Any]:
    return {"$type": edm, "value": value}


def row_to_json(entity: dict[str, Any]) -> dict[str, Any]:
    """A table row as JSON: strings, booleans and 32-bit integers as themselves, every
    other type as ``{"$type": "Edm.X", "value": ...}``."""
    out: dict[str, Any] = {}
    for name, value in entity.items():
        if name in _SYSTEM:
            continue
        if isinstance(value, EntityProperty):
            edm = EdmType(value.edm_type)
            inner = value.value
            if edm is EdmType.BINARY and isinstance(inner, bytes):
                inner = base64.b64encode(inner).decode("ascii")
            elif edm is EdmType.DATETIME and isinstance(inner, datetime):
                inner = iso_exact(inner)
            else:
                inner = str(inner) if edm in (EdmType.INT64, EdmType.GUID) else inner
            out[name] = _typed(edm.value, inner)
        elif isinstance(value, bool | str):
            out[name] = value
        elif isinstance(value, int):
            out[name] = value if -(2**31) <= value < 2**31 else _typed("Edm.Int64", str(value))
        elif isinstance(value, float):
            out[name] = _typed("Edm.Double", value)
        elif isinstance(value, datetime):
            out[name] = _typed("Edm.DateTime", iso_exact(value))
        elif isinstance(value, bytes):
            out[name] = _typed("Edm.Binary", base64.b64encode(value).decode("ascii"))
        elif isinstance(value, uuid.UUID):
            out[name] = _typed("Edm.Guid", str(value))
        else:
            raise TypeError(f"property {name!r}: cannot archive a {type(value).__name__}")
    return out


def row_from_json(data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``row_to_json``: an entity the table SDK writes with the same types."""

    out: dict[str, Any] = {}
    for name, value in data.items():
        if not isinstance(value, dict):
            out[name] = value
            continue
        edm, inner = value.get("$type"), value["value"]
        if edm == "Edm.DateTime":
            out[name] = parse_iso(inner)
        elif edm == "Edm.Int64":
            out[name] = EntityProperty(int(inner), EdmType.INT64)
        elif edm == "Edm.Double":
            out[name] = float(inner)
        elif edm == "Edm.Binary":
            out[name] = base64.b64decode(inner)
        elif edm == "Edm.Guid":
            out[name] = uuid.UUID(inner)
        else:
            raise ValueError(f"property {name!r}: unknown type {edm!r}")
    return out


# --- the archive ----------------------------------------------------------------------


def encode_lines(lines: Iterable[dict[str, Any]]) -> bytes:
    text = "".join(
        json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n" for line in lines
    )
    return gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)


def decode_lines(data: bytes) -> Iterator[dict[str, Any]]:
    for raw in gzip.decompress(data).decode("utf-8").splitlines():
        if raw.strip():
            yield json.loads(raw)


class BlobArchive:
    """Archive blobs in one container (``orders-archive`` of the app's storage account)."""

    def __init__(self, container: ContainerClient):
        self._container = container
        self._ensured = False

    @property
    def container(self) -> str:
        return str(self._container.container_name)

    def ensure_container(self) -> None:
        """Create the container if missing, once per process (before the first write; in
        Azure, infra/ creates it)."""
        if not self._ensured:
            with contextlib.suppress(ResourceExistsError):
                self._container.create_container()
            self._ensured = True

    def write(self, path: str, lines: list[dict[str, Any]]) -> int:
        """Write one blob of ``lines``, create-only; its size in bytes. A blob already at
        ``path`` is an error (runs never share a path)."""
        data = encode_lines(lines)
        try:
            self.ensure_container()
            self._container.upload_blob(
                path,
                data,
                overwrite=False,
                content_settings=ContentSettings(content_type="application/gzip"),
                metadata={"orders": str(len(lines)), "format": str(FORMAT)},
            )
        except ResourceExistsError as exc:
            raise StorageUnavailable(f"archive blob {path} exists already") from exc
        except AzureError as exc:
            raise StorageUnavailable(f"could not write archive blob {path}: {exc}") from exc
        return len(data)

    def read(self, path: str) -> Iterator[dict[str, Any]]:
        """The lines of one blob; ``KeyError`` when there is no such blob."""
        try:
            data = self._container.download_blob(path).readall()
        except ResourceNotFoundError as exc:
            raise KeyError(path) from exc
        except AzureError as exc:
            raise StorageUnavailable(f"could not read archive blob {path}: {exc}") from exc
        return decode_lines(data)
