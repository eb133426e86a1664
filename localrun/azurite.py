"""Start and stop a private Azurite (Storage emulator) for local runs, tests and benchmarks.

Azurite runs from the project's pinned npm package (``node_modules/.bin/azurite``), on
127.0.0.1, on free ports chosen at start, persisting to a fresh temporary folder. Disk
persistence on purpose: ``--inMemoryPersistence`` freezes under steady queue traffic (see
docs/contracts.md, "Azurite and tools").

    with Azurite.start() as azurite:
        os.environ["AzureWebJobsStorage"] = azurite.connection_string

``python -m localrun.azurite`` runs one until interrupted and prints its connection string
on the first line of standard output.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from localrun.processes import stop_group

ACCOUNT = "devstoreaccount1"
# The well-known development key: public, identical in every Azurite install.
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("blob", "queue", "table")


class AzuriteError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Azurite:
    process: subprocess.Popen[bytes]
    location: Path
    ports: dict[str, int]  # by service: blob, queue, table
    _log: IO[bytes] | None = None

    @property
    def connection_string(self) -> str:
        endpoints = "".join(
            f"{kind.capitalize()}Endpoint=http://127.0.0.1:{port}/{ACCOUNT};"
            for kind, port in self.ports.items()
        )
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"{endpoints}"
        )

    @classmethod
    def start(cls, timeout: float = 30.0, location: Path | None = None) -> Azurite:
        binary = ROOT / "node_modules" / ".bin" / "azurite"
        found = str(binary) if binary.exists() else shutil.which("azurite")
        if not found:
            raise AzuriteError(
                "Azurite is not installed: run `npm ci` in the repository root "
                "(make run and make test do it for you)."
            )
        where = location or Path(tempfile.mkdtemp(prefix="azurite-"))
        ports = {kind: _free_port() for kind in SERVICES}
        args = [found, "--silent", "--disableTelemetry", "--skipApiVersionCheck"]
        args += ["--location", str(where)]
        for kind, port in ports.items():
            args += [f"--{kind}Host", "127.0.0.1", f"--{kind}Port", str(port)]
        log = open(where / "azurite.log", "ab")  # noqa: SIM115 - closed in stop()
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        azurite = cls(process, where, ports, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                azurite.stop()
                raise AzuriteError(
                    f"Azurite exited with code {process.returncode}; see {where / 'azurite.log'}"
                )
            if all(_accepts(port) for port in ports.values()):
                return azurite
            time.sleep(0.1)
        azurite.stop()
        raise AzuriteError(f"Azurite did not open its ports within {timeout:.0f} s")

    def stop(self) -> None:
        # Its own session (start_new_session): the group goes, node's children too.
        stop_group(self.process)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Azurite:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main() -> int:
    azurite = Azurite.start()
    print(azurite.connection_string, flush=True)
    print(f"azurite pid {azurite.process.pid}, data in {azurite.location}", file=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while not stop.wait(0.2) and azurite.process.poll() is None:
            pass
    finally:
        azurite.stop()
        shutil.rmtree(azurite.location, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
