"""Stopping the processes we start: each runs in its own session (process group)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from typing import Any


class StartupFailed(RuntimeError):
    """A process we started exited, or did not announce itself in time."""


def read_announcement(process: subprocess.Popen[Any], prefix: str, timeout: float) -> str:
    """Read the process's stdout until a line starts with ``prefix`` (how devhost, the
    simulator and localbus say they are ready, and where); return the rest of that line.
    Raises ``StartupFailed`` if the process exits first or ``timeout`` passes."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:  # closed: the process is exiting; say how it ended
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
                break
            buffer += chunk
            for line in buffer.decode("utf-8", errors="replace").splitlines():
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
        elif process.poll() is not None:
            break
    if process.poll() is not None:
        raise StartupFailed(f"process {process.args!r} exited with {process.returncode}")
    raise StartupFailed(f"{process.args!r} did not print {prefix!r} within {timeout:.0f} s")


def stop_group(process: subprocess.Popen[Any], grace: float = 10) -> None:
    """SIGTERM the process's group, wait ``grace`` seconds, then SIGKILL it."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        kill_group(process)


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL: no cleanup, exactly like a host that dies."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
