"""Whose CPU a benchmark phase had: the machine's, and the benchmark's own processes'.

On a machine shared with other engineers' test runs, a load average says how many
processes wanted a CPU, not who used them. ``CpuMeter`` reads ``/proc/stat`` (every
CPU's busy and total time) and ``/proc/<pid>/stat`` of this process and all its
descendants (the stack: Azurite, the simulator, the devhosts) at the start and end of
a phase; ``share`` turns the two samples into fractions of the machine:
``machineBusy`` (all processes), ``benchmark`` (ours) and ``others`` (the rest).
Linux only; elsewhere the figures are absent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class CpuSample:
    busy: float  # seconds of CPU time every CPU spent busy, since boot
    total: float  # seconds of CPU time in all, busy or idle
    ours: float  # seconds of CPU used by this process and its descendants (alive now)


def machine_times(stat_text: str) -> tuple[float, float]:
    """(busy, total) in clock ticks from ``/proc/stat``'s ``cpu`` line (idle and iowait are
    not busy; guest time is already counted in user)."""
    for line in stat_text.splitlines():
        if line.startswith("cpu "):
            fields = [int(x) for x in line.split()[1:]]
            user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
            busy = user + nice + system + irq + softirq + steal
            return float(busy), float(busy + idle + iowait)
    raise ValueError("no cpu line in /proc/stat")


def process_times(stat_text: str) -> tuple[int, int]:
    """(parent pid, utime + stime in clock ticks) from a ``/proc/<pid>/stat`` line. The
    command name is in parentheses and may hold spaces, so fields count from its end."""
    rest = stat_text[stat_text.rindex(")") + 2 :].split()
    # rest[0] is the state (field 3); ppid is field 4, utime 14, stime 15
    return int(rest[1]), int(rest[11]) + int(rest[12])


def descendants_cpu(root: int, table: dict[int, tuple[int, int]]) -> int:
    """Ticks used by ``root`` and every process below it in ``table`` (pid -> (ppid,
    ticks))."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        total += table[pid][1]
        stack.extend(children.get(pid, []))
    return total


def sample() -> CpuSample | None:
    try:
        tick = float(os.sysconf("SC_CLK_TCK"))
        busy, total = machine_times((PROC / "stat").read_text())
        table: dict[int, tuple[int, int]] = {}
        for entry in PROC.iterdir():
            if entry.name.isdigit():
                try:
                    table[int(entry.name)] = process_times((entry / "stat").read_text())
                except (OSError, ValueError, IndexError):
                    continue  # gone meanwhile
        ours = descendants_cpu(os.getpid(), table)
    except (OSError, ValueError):
        return None
    return CpuSample(busy / tick, total / tick, ours / tick)


def share(start: CpuSample | None, end: CpuSample | None) -> dict[str, float]:
    """Fractions of the machine's CPU over the interval: all busy, ours, the others'.
    Ours counts processes alive at both samples (one that ended meanwhile is left out)."""
    if start is None or end is None or end.total <= start.total:
        return {}
    total = end.total - start.total
    busy = (end.busy - start.busy) / total
    ours = max(0.0, end.ours - start.ours) / total
    return {
        "machineBusy": round(busy, 2),
        "benchmark": round(min(ours, busy), 2),
        "others": round(max(0.0, busy - ours), 2),
    }
