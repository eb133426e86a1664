"""The Functions RPC messages: the vendored ``.proto`` files compiled on first use.

The Python worker's proxy compiles the same files (Azure/azure-functions-python-worker,
``proxy_worker/protos``) and passes the compiled module to the runtime as
``properties["protos"]`` of the ``WorkerInitRequest`` (``proxy_worker/dispatcher.py``,
``_handle__worker_init_request``). The runtime reads message classes off it by name
(``protos.InvocationResponse``, ``protos.NullableString`` ...), so :func:`load` returns one
namespace holding every message of the three files, as the worker's ``protos`` package
re-exports them.

Imports between the files are rewritten to a package (``hostrun_rpc``), as the worker's
build does, so the generated modules import each other wherever they are put.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PROTO_DIR = Path(__file__).resolve().parent / "protos"
PROTO_FILES = (
    "FunctionRpc.proto",
    "identity/ClaimsIdentityRpc.proto",
    "shared/NullableTypes.proto",
)
PACKAGE = "hostrun_rpc"
_IMPORT = re.compile(r'^import "(identity|shared)/', re.MULTILINE)
_lock = threading.Lock()
_loaded: dict[str, SimpleNamespace] = {}  # the one namespace, once built


def _digest() -> str:
    sha = hashlib.sha256()
    for name in PROTO_FILES:
        sha.update((PROTO_DIR / name).read_bytes())
    return sha.hexdigest()[:12]


def compile_protos(out: Path) -> Path:
    """Compile the vendored files into ``out/<hash>/hostrun_rpc`` (once); returns the root
    to put on ``sys.path``."""
    from grpc_tools import protoc  # the pinned grpcio-tools: its protoc matches protobuf

    root = out / _digest()
    if (root / PACKAGE / "FunctionRpc_pb2.py").exists():
        return root
    source = root / "src"
    for name in PROTO_FILES:
        target = source / PACKAGE / name
        target.parent.mkdir(parents=True, exist_ok=True)
        text = (PROTO_DIR / name).read_text(encoding="utf-8")
        target.write_text(_IMPORT.sub(rf'import "{PACKAGE}/\1/', text), encoding="utf-8")
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = ["protoc", f"-I{source}", f"-I{well_known}", f"--python_out={root}"]
    if protoc.main([*args, *(f"{source}/{PACKAGE}/{name}" for name in PROTO_FILES)]) != 0:
        raise RuntimeError(f"protoc failed on {source}")
    for package in ("", "/identity", "/shared"):
        (root / f"{PACKAGE}{package}" / "__init__.py").touch()
    return root


def load(out: Path | None = None) -> Any:
    """The ``protos`` namespace the runtime expects (compiled into the venv if needed)."""
    with _lock:
        if not _loaded:
            root = compile_protos(out or Path(sys.prefix) / "hostrun-protos")
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            names: dict[str, Any] = {}
            for module in ("shared.NullableTypes_pb2", "identity.ClaimsIdentityRpc_pb2"):
                names.update(_public(importlib.import_module(f"{PACKAGE}.{module}")))
            names.update(_public(importlib.import_module(f"{PACKAGE}.FunctionRpc_pb2")))
            _loaded["protos"] = SimpleNamespace(**names)
        return _loaded["protos"]


def _public(module: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and k[0].isupper()}
