"""Start and stop a private Azurite (Storage emulator) for local runs, tests and benchmarks.

Azurite runs from the project's pinned npm package (``node_modules/.bin/azurite``),
on 127.0.0.1, on free ports chosen at start, persisting to a fresh temporary
folder. Disk persistence on purpose: ``--inMemoryPersistence`` freezes under
steady queue traffic (see the README's design notes).

    with Azurite.start() as azurite:
        os.environ["AzureWebJobsStorage"] = azurite.connection_string

``python -m devhost.azurite`` runs one until interrupted and prints its
connection string on the first line of standard output.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from devhost.processes import stop_group

ACCOUNT = "devstoreaccount1"
# The well-known development key: public, identical in every Azurite install.
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
ROOT = Path(__file__).resolve().parent.parent


class AzuriteError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _azurite_binary() -> str:
    local = ROOT / "node_modules" / ".bin" / "azurite"
    if local.exists():
        return str(local)
    found = shutil.which("azurite")
    if found:
        return found
    raise AzuriteError(
        "Azurite is not installed: run `npm ci` in the repository root "
        "(make run and make test do it for you)."
    )


def connection_string(blob_port: int, queue_port: int, table_port: int) -> str:
    base = "http://127.0.0.1"
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint={base}:{blob_port}/{ACCOUNT};"
        f"QueueEndpoint={base}:{queue_port}/{ACCOUNT};"
        f"TableEndpoint={base}:{table_port}/{ACCOUNT};"
    )


@dataclass
class Azurite:
    process: subprocess.Popen[bytes]
    location: Path
    blob_port: int
    queue_port: int
    table_port: int
    _log: object = field(default=None, repr=False)

    @property
    def connection_string(self) -> str:
        return connection_string(self.blob_port, self.queue_port, self.table_port)

    @classmethod
    def start(cls, timeout: float = 30.0, location: Path | None = None) -> Azurite:
        binary = _azurite_binary()
        where = location or Path(tempfile.mkdtemp(prefix="azurite-"))
        ports = [_free_port() for _ in range(3)]
        log = open(where / "azurite.log", "ab")  # noqa: SIM115 - closed in stop()
        args = [
            binary,
            "--silent",
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--location",
            str(where),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(ports[0]),
            "--queueHost",
            "127.0.0.1",
            "--queuePort",
            str(ports[1]),
            "--tableHost",
            "127.0.0.1",
            "--tablePort",
            str(ports[2]),
        ]
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        azurite = cls(process, where, ports[0], ports[1], ports[2], _log=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                azurite.stop()
                raise AzuriteError(
                    f"Azurite exited with code {process.returncode}; see {where / 'azurite.log'}"
                )
            if all(_accepts(port) for port in ports):
                return azurite
            time.sleep(0.1)
        azurite.stop()
        raise AzuriteError(f"Azurite did not open its ports within {timeout:.0f} s")

    def stop(self) -> None:
        # Its own session (start_new_session): the group goes, node's children too.
        stop_group(self.process)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            self._log = None

    def __enter__(self) -> Azurite:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def main() -> int:
    azurite = Azurite.start()
    print(azurite.connection_string, flush=True)
    print(f"azurite pid {azurite.process.pid}, data in {azurite.location}", file=sys.stderr)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stop and azurite.process.poll() is None:
            time.sleep(0.2)
    finally:
        azurite.stop()
        shutil.rmtree(azurite.location, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
