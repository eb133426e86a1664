"""Start ``python -m localbus`` as a child process and stop it by its process id.

with LocalBus.start(["agent-requests", "agent-replies:lock-duration=5"]) as bus:
    os.environ["ServiceBusConnection"] = bus.connection_string
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from localrun.processes import StartupFailed, read_announcement, stop_group

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "LOCALBUS_CONNECTION="


class LocalBusError(RuntimeError):
    pass


@dataclass
class LocalBus:
    process: subprocess.Popen[bytes]
    connection_string: str
    log_path: Path | None = None
    _log: IO[bytes] | None = None

    @classmethod
    def start(
        cls, queues: list[str], log_path: Path | None = None, timeout: float = 30.0
    ) -> LocalBus:
        """``queues``: specs as ``--queues`` takes them (``name[:option=value...]``)."""
        log = open(log_path, "ab") if log_path else None  # noqa: SIM115 - closed in stop()
        process = subprocess.Popen(  # noqa: S603 - our own module, fixed arguments
            [sys.executable, "-m", "localbus", "--queues", ",".join(queues)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log if log is not None else subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            connection = read_announcement(process, PREFIX, timeout)
        except BaseException as error:
            stop_group(process, grace=5.0)
            if log is not None:
                log.close()
            if isinstance(error, StartupFailed):
                raise LocalBusError(f"localbus did not start: {error}") from error
            raise
        return cls(process, connection, log_path, log)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace: float = 5.0) -> None:
        stop_group(self.process, grace)
        if self.process.stdout is not None:
            self.process.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalBus:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
