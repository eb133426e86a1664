"""The dashboard page (``GET /api/console/dashboard``): the figures the aggregator keeps
(``supervisor/aggregator.py``), drawn on the server as SVG, as the timeline is.

A page view reads three ranges of the dashboard partition (the last hour's minute rows,
the last day's hour rows, the stuck list) and the agents' outage records (one row per
agent): never an order, whatever the history. Colours
are SVG presentation attributes (not ``style``), so the page needs nothing from other
hosts and no inline style under the console's Content-Security-Policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Protocol

from core.outages import Outage
from core.timefmt import iso
from dashboard.figures import (
    FAILURE_KINDS,
    HOUR_PREFIX,
    MINUTE_PREFIX,
    STUCK_ROW,
    DurationRow,
    Figures,
    OutageRow,
    duration_rows,
    hour_row,
    merged,
    minute_row,
    outage_rows,
    split_key,
    time_of_row,
)
from dashboard.ports import StoredRow

#: Series colours, in the order workflows (or kinds) appear.
PALETTE: Final = ("#3a6fd8", "#3aa55d", "#f0a030", "#8e44ad", "#d9453b", "#16a2b8", "#7f8c8d")
LEFT: Final = 40
COLUMN: Final = 12
CHART_HEIGHT: Final = 110
TOP: Final = 12


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    fill: str
    title: str
    series: str


@dataclass
class Chart:
    """Bars per time column, stacked by series."""

    id: str
    title: str
    width: int
    height: int
    bars: list[Rect] = field(default_factory=list)
    ticks: list[tuple[float, str]] = field(default_factory=list)
    max_value: int = 0
    legend: list[tuple[str, str]] = field(default_factory=list)  # (series, colour)


def _chart(
    chart_id: str,
    title: str,
    columns: list[tuple[datetime, dict[str, int]]],
    series: list[str],
    label: str,
    tick_every: int,
    fmt: str,
) -> Chart:
    width = LEFT + COLUMN * len(columns) + 10
    chart = Chart(chart_id, title, width, TOP + CHART_HEIGHT + 20)
    peak = max((sum(values.values()) for _, values in columns), default=0)
    chart.max_value = peak
    scale = CHART_HEIGHT / peak if peak else 0.0
    colours = {s: PALETTE[n % len(PALETTE)] for n, s in enumerate(series)}
    chart.legend = [(s, colours[s]) for s in series]
    for n, (start, values) in enumerate(columns):
        x = LEFT + n * COLUMN
        base = float(TOP + CHART_HEIGHT)
        for s in series:
            count = values.get(s, 0)
            if not count:
                continue
            h = round(count * scale, 1)
            base -= h
            chart.bars.append(
                Rect(
                    x + 1,
                    round(base, 1),
                    COLUMN - 2,
                    h,
                    colours[s],
                    f"{start.strftime(fmt)}: {count} {s} {label}",
                    s,
                )
            )
        if n % tick_every == 0:
            chart.ticks.append((x, start.strftime(fmt)))
    return chart


@dataclass
class WorkflowTotals:
    workflow: str
    started_hour: int = 0
    finished_hour: int = 0
    started_day: int = 0
    finished_day: int = 0
    by_status_day: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FailureRow:
    agent: str
    hour: dict[str, int]
    day: dict[str, int]


@dataclass
class Dashboard:
    now: str
    minutes: Chart
    finished: Chart
    alerts: Chart
    totals: list[WorkflowTotals]
    durations: list[DurationRow]
    failures: list[FailureRow]
    kinds: tuple[str, ...]
    alerts_hour: int
    poison_hour: int
    alerts_day: int
    poison_day: int
    stuck: list[dict[str, Any]]
    stuck_checked: str | None
    #: the agents failing now, and the outages that ended in the last days
    outages: list[OutageRow] = field(default_factory=list)
    past_outages: list[OutageRow] = field(default_factory=list)


def _figures(rows: list[StoredRow]) -> dict[str, Figures]:
    out = {}
    for r in rows:
        try:
            out[r.row] = Figures.from_json(json.loads(str(r.value.get("Figures") or "{}")))
        except (ValueError, TypeError):
            continue  # a damaged bucket shows as empty rather than failing the page
    return out


def stuck_of(rows: list[StoredRow]) -> tuple[list[dict[str, Any]], str | None]:
    """The stuck list the last run kept, and when it looked."""
    for r in rows:
        if r.row == STUCK_ROW:
            try:
                steps = json.loads(str(r.value.get("Steps") or "[]"))
            except ValueError:
                steps = []
            checked = r.value.get("CheckedAt")
            return steps, iso(checked) if isinstance(checked, datetime) else None
    return [], None


class DashboardSource(Protocol):
    """What the page reads (``admin.watch.Watch``): the dashboard's rows and the agents'
    outage records."""

    def dashboard_rows(self, low: str, high: str, limit: int = 1000) -> list[StoredRow]: ...

    def read_outages(self) -> dict[str, Outage]: ...


def load(source: DashboardSource, now: datetime) -> Dashboard:
    """The page as ``source`` has it at ``now``."""
    store = source
    minute_rows = store.dashboard_rows(minute_row(now - timedelta(minutes=59)), MINUTE_PREFIX + "~")
    hour_rows = store.dashboard_rows(hour_row(now - timedelta(hours=23)), HOUR_PREFIX + "~")
    stuck_rows = store.dashboard_rows(STUCK_ROW, STUCK_ROW + "~")
    return build(
        _figures(minute_rows),
        _figures(hour_rows),
        stuck_of(stuck_rows),
        now,
        outages=store.read_outages().values(),
    )


def build(
    minutes: dict[str, Figures],
    hours: dict[str, Figures],
    stuck: tuple[list[dict[str, Any]], str | None],
    now: datetime,
    *,
    outages: Iterable[Outage] = (),
) -> Dashboard:
    """The page from the bucket rows: the last 60 minutes and the last 24 hours."""
    minute_keys = [minute_row(now - timedelta(minutes=59 - n)) for n in range(60)]
    hour_keys = [hour_row(now - timedelta(hours=23 - n)) for n in range(24)]
    in_minutes = [minutes.get(k, Figures()) for k in minute_keys]
    in_hours = [hours.get(k, Figures()) for k in hour_keys]
    hour_total, day_total = merged(in_minutes), merged(in_hours)
    workflows = sorted(
        set(day_total.started)
        | {split_key(k)[0] for k in day_total.finished}
        | set(hour_total.started)
        | {split_key(k)[0] for k in hour_total.finished}
    )

    def finished_by_workflow(f: Figures) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, n in f.finished.items():
            wf = split_key(key)[0]
            out[wf] = out.get(wf, 0) + n
        return out

    started_chart = _chart(
        "chart-started",
        "Orders started per minute, by workflow",
        [(time_of_row(k), f.started) for k, f in zip(minute_keys, in_minutes, strict=True)],
        workflows,
        "started",
        10,
        "%H:%M",
    )
    finished_chart = _chart(
        "chart-finished",
        "Orders finished per minute, by workflow",
        [
            (time_of_row(k), finished_by_workflow(f))
            for k, f in zip(minute_keys, in_minutes, strict=True)
        ],
        workflows,
        "finished",
        10,
        "%H:%M",
    )
    alerts_chart = _chart(
        "chart-alerts",
        "Operator alerts and poisoned messages per hour",
        [
            (time_of_row(k), {"alerts": f.alerts, "poison": f.poison})
            for k, f in zip(hour_keys, in_hours, strict=True)
        ],
        ["alerts", "poison"],
        "",
        4,
        "%H:00",
    )
    totals = []
    fin_hour, fin_day = finished_by_workflow(hour_total), finished_by_workflow(day_total)
    for wf in workflows:
        t = WorkflowTotals(
            wf,
            hour_total.started.get(wf, 0),
            fin_hour.get(wf, 0),
            day_total.started.get(wf, 0),
            fin_day.get(wf, 0),
        )
        for key, n in day_total.finished.items():
            name, status = split_key(key)
            if name == wf:
                t.by_status_day[status] = t.by_status_day.get(status, 0) + n
        totals.append(t)
    agents = sorted({split_key(k)[0] for k in (*hour_total.failures, *day_total.failures)})
    failures = [
        FailureRow(
            agent,
            {kind: hour_total.failures.get(f"{agent}|{kind}", 0) for kind in FAILURE_KINDS},
            {kind: day_total.failures.get(f"{agent}|{kind}", 0) for kind in FAILURE_KINDS},
        )
        for agent in agents
    ]
    current, past = outage_rows(outages, now)
    return Dashboard(
        iso(now),
        started_chart,
        finished_chart,
        alerts_chart,
        totals,
        duration_rows(hour_total, day_total),
        failures,
        FAILURE_KINDS,
        hour_total.alerts,
        hour_total.poison,
        day_total.alerts,
        day_total.poison,
        stuck[0],
        stuck[1],
        current,
        past,
    )


def ms(value: float | None) -> str:
    """A duration for people: ms under a second, then seconds."""
    if value is None:
        return "-"
    if value < 1000:
        return f"{value:.0f} ms"
    return f"{value / 1000:.1f} s"
