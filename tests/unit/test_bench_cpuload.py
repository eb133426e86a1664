"""bench.cpuload: whose CPU a benchmark phase had, from /proc's text (bench/cpuload.py)."""

from __future__ import annotations

from bench.cpuload import CpuSample, descendants_cpu, machine_times, process_times, share

STAT = """cpu  100 5 50 800 20 3 2 10 0 0
cpu0 50 2 25 400 10 1 1 5 0 0
intr 12345
"""


def test_machine_busy_leaves_out_idle_and_iowait() -> None:
    assert machine_times(STAT) == (170.0, 990.0)


def test_a_process_line_is_read_from_the_end_of_its_command_name() -> None:
    line = "4242 (python -m (dev)host) S 4200 4242 4242 0 -1 4194560 1 0 0 0 37 5 0 0 20 0"
    assert process_times(line) == (4200, 42)


def test_our_cpu_is_this_process_and_everything_below_it() -> None:
    table = {1: (0, 1000), 10: (1, 5), 11: (10, 7), 12: (11, 3), 20: (1, 100)}
    assert descendants_cpu(10, table) == 15
    assert descendants_cpu(99, table) == 0


def test_share_splits_the_busy_time_between_us_and_the_others() -> None:
    start, end = CpuSample(100.0, 1000.0, 10.0), CpuSample(190.0, 1100.0, 40.0)
    assert share(start, end) == {"machineBusy": 0.9, "benchmark": 0.3, "others": 0.6}
    assert share(None, end) == {}
