"""Stopping the processes we start: each runs in its own session (process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


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
