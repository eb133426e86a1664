"""docs/deployment.md stays true where a test can check it cheaply: the cost model counts
every timer the app registers, at its default schedule, with arithmetic that adds up; the
page never tells anyone to put a function key on the console, whose routes take none; and
the Microsoft Graph rights sign-in needs are named before its first ``az ad`` step."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config import settings

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
SECONDS_A_MONTH = 30 * 86_400
INSTANCE_GB = 2  # FUNCTION_INSTANCE_MEMORY_MB's default, 2048

#: The app's timers (name, schedule) and HTTP routes (name, route, auth level), as
#: function_app registers them, in a process of its own (the app is read when indexed).
_LISTING = """
import json, function_app
timers, routes = [], []
for f in function_app.app.get_functions():
    for b in f.get_bindings():
        if b.type == "timerTrigger":
            timers.append([f.get_function_name(), b.schedule])
        elif b.type == "httpTrigger":
            routes.append([f.get_function_name(), b.route, str(b.auth_level.name)])
print(json.dumps({"timers": timers, "routes": routes}))
"""


@pytest.fixture(scope="module")
def registered() -> dict[str, list[list[str]]]:
    listing = subprocess.run(
        [sys.executable, "-c", _LISTING],
        cwd=ROOT,
        env={**os.environ, "AGENT_TRANSPORT": "servicebus"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr[-2000:]
    found: dict[str, list[list[str]]] = json.loads(listing.stdout.strip().splitlines()[-1])
    return found


def _section(heading: str) -> str:
    start = GUIDE.index(heading)
    end = GUIDE.find("\n#", start + len(heading))
    return GUIDE[start : end if end != -1 else len(GUIDE)]


def _rows(section: str) -> list[list[str]]:
    """The cells of a section's first table, header and rule left out."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _number(cell: str) -> float:
    match = re.search(r"[\d,]+(?:\.\d+)?", cell.replace("**", ""))
    assert match is not None, f"no number in {cell!r}"
    return float(match[0].replace(",", ""))


def _matches(field: str, size: int) -> int:
    """How many values of 0..size-1 an NCRONTAB field (``*``, ``*/n``, ``a,b``, ``n``)
    matches."""
    if field == "*":
        return size
    if field.startswith("*/"):
        return len(range(0, size, int(field[2:])))
    return len(field.split(","))


def runs_a_month(schedule: str) -> int:
    second, minute, hour, *days = schedule.split()
    assert days == ["*", "*", "*"], f"{schedule}: a schedule by day is not counted here"
    return _matches(second, 60) * _matches(minute, 60) * _matches(hour, 24) * 30


def test_runs_a_month_counts_the_schedules_forms() -> None:
    assert runs_a_month("*/10 * * * * *") == SECONDS_A_MONTH // 10
    assert runs_a_month("30 * * * * *") == 60 * 24 * 30
    assert runs_a_month("0 */15 * * * *") == 4 * 24 * 30
    assert runs_a_month("0 0,30 * * * *") == 2 * 24 * 30


def _default(schedule: str) -> str:
    """A timer's schedule as deployed by default: an app setting's default when it names
    one (``%SUPERVISOR_SCHEDULE%``)."""
    if schedule == f"%{settings.SUPERVISOR_SCHEDULE}%":
        return settings.DEFAULT_SUPERVISOR_SCHEDULE
    return schedule


def test_the_cost_model_counts_every_timer_at_its_default_schedule(
    registered: dict[str, list[list[str]]],
) -> None:
    timers = {name: _default(schedule) for name, schedule in registered["timers"]}
    rows = _rows(_section("### What runs at rest"))
    listed = {re.sub(r"[`*]", "", row[0]): row for row in rows if "total" not in row[0]}
    assert set(listed) == set(timers), {
        "in the cost model only": sorted(set(listed) - set(timers)),
        "registered, not counted": sorted(set(timers) - set(listed)),
    }
    runs_total = gbs_total = requests_total = 0
    for name, schedule in timers.items():
        _, written, runs, gbs, per_run, per_month = listed[name]
        assert f"`{schedule}`" in written, f"{name} runs on {schedule} by default"
        assert _number(runs) == runs_a_month(schedule), name
        assert _number(gbs) == _number(runs) * 1 * INSTANCE_GB, name  # 1 s billed a run
        assert _number(per_month) == _number(runs) * _number(per_run), name
        runs_total += runs_a_month(schedule)
        gbs_total += runs_a_month(schedule) * INSTANCE_GB
        requests_total += int(_number(per_month))
    total = next(row for row in rows if "total" in row[0])
    assert [_number(total[i]) for i in (2, 3, 5)] == [runs_total, gbs_total, requests_total]


def test_the_monthly_execution_time_adds_up() -> None:
    at_rest = _rows(_section("### What runs at rest"))
    rest_gbs = _number(next(row for row in at_rest if "total" in row[0])[3])
    month = _rows(_section("### A month, at rest and at 10,000 orders a day"))
    row = next(r for r in month if r[0].startswith("Functions on-demand execution time"))
    _, rest, loaded, price, rest_cost, loaded_cost = row
    per_gbs = _number(price.split("per GB-s")[0])
    orders = 10_000 * 30
    added, total = (_number(part) for part in loaded.split("="))
    assert _number(rest) == rest_gbs
    assert added == orders * 2 * 1 * INSTANCE_GB  # two executions, 1 s billed each
    assert total == rest_gbs + added
    assert _number(rest_cost) == round(rest_gbs * per_gbs, 2)
    assert _number(loaded_cost) == round(total * per_gbs, 2)


def test_the_console_takes_no_function_key(registered: dict[str, list[list[str]]]) -> None:
    console = [
        (name, level) for name, route, level in registered["routes"] if route.startswith("console")
    ]
    assert console and all(level == "ANONYMOUS" for _, level in console), console
    # the page says so where it hands out CONSOLE_URL, and never asks for a key on it
    assert "the console takes no\nfunction key" in _section("### Opening the console")
    assert not re.search(r"add `\?code=", GUIDE), "the console's URL takes no ?code="


def test_the_graph_rights_come_before_the_first_az_ad_step() -> None:
    sign_in = " ".join(_section("### Sign-in and roles").split())  # words, not lines
    first_step = sign_in.index("```sh")  # the steps' first block
    for named in ("Owner", "Application Administrator", "Cloud Application Administrator"):
        assert -1 < sign_in.find(named) < first_step, f"{named} is named before the steps"
    # and what works without them: the table of "Opening the console", just above
    assert "without sign-in" in _section("### Opening the console")
