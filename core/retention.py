"""How long finished orders stay in the state table (docs/contracts.md §3.12).

The setting ``RETENTION`` is a comma-separated list of ``[workflow/]status=duration``:
``completed=30d,compensated=90d,cancelled=90d,error=180d`` (the default) keeps completed
orders 30 days after they finished, compensated and cancelled ones 90, and ``error`` orders
(waiting for an operator) 180 days after their last change, so that no order stays for
ever unless an operator says so; ``fulfilment/completed=7d`` gives one workflow its own
time. A rule naming a workflow wins over one that does not. A status no rule names
stays for ever: a ``RETENTION`` without an ``error`` rule keeps ``error`` orders until
``python -m admin purge --status error`` archives them. Unfinished orders (``pending``,
``processing``, ``compensating``) can never be named.

An order counts as finished at its last change (``UpdatedAt``), or when it was restored
from the archive, whichever is later: an order created long ago that finished
yesterday is kept for its whole retention.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from core.states import OrderStatus

#: What a rule may name: finished orders, and ``error`` when an operator says so.
ARCHIVABLE: Final = (
    OrderStatus.COMPLETED,
    OrderStatus.COMPENSATED,
    OrderStatus.CANCELLED,
    OrderStatus.ERROR,
)
DEFAULT_RETENTION: Final = "completed=30d,compensated=90d,cancelled=90d,error=180d"

_DURATION = re.compile(r"(\d{1,6})([smhd])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WORKFLOW = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_duration(text: str) -> timedelta:
    """``0s``, ``15m``, ``12h``, ``30d``: a whole number and one unit."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(
            f"{text!r} is not a duration: write a whole number and one unit of s, m, h or d "
            "(0s, 15m, 12h, 30d)"
        )
    return timedelta(seconds=int(match[1]) * _UNITS[match[2]])


def format_duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    for unit in ("d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def parse_status(text: str) -> OrderStatus:
    try:
        status = OrderStatus(text.strip())
    except ValueError:
        status = None
    if status not in ARCHIVABLE:
        names = ", ".join(str(s) for s in ARCHIVABLE)
        raise ValueError(f"{text!r} cannot be archived: name one of {names}")
    assert status is not None
    return status


@dataclass(frozen=True)
class Rule:
    status: OrderStatus
    keep: timedelta
    workflow: str | None = None

    def __str__(self) -> str:
        where = f"{self.workflow}/" if self.workflow else ""
        return f"{where}{self.status}={format_duration(self.keep)}"


@dataclass(frozen=True)
class Retention:
    """The rules of one retention run: how long each (workflow, status) stays."""

    rules: tuple[Rule, ...]

    @classmethod
    def parse(cls, text: str, setting: str = "RETENTION") -> Retention:
        rules: dict[tuple[str | None, OrderStatus], Rule] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            name, sep, duration = item.partition("=")
            workflow, slash, status = name.strip().rpartition("/")
            try:
                if not sep:
                    raise ValueError("write status=duration, e.g. completed=30d")
                if slash and not _WORKFLOW.fullmatch(workflow):
                    raise ValueError(f"{workflow!r} is not a workflow name")
                rule = Rule(parse_status(status), parse_duration(duration), workflow or None)
            except ValueError as exc:
                raise ValueError(f"{setting}: {item!r}: {exc}") from None
            key = (rule.workflow, rule.status)
            if key in rules:
                raise ValueError(f"{setting}: {item!r} repeats a rule for {name.strip()!r}")
            rules[key] = rule
        return cls(tuple(rules.values()))

    @classmethod
    def only(cls, status: OrderStatus, keep: timedelta, workflow: str | None = None) -> Retention:
        """One rule: what ``admin purge --status S --older-than D [--workflow W]`` runs."""
        return cls((Rule(status, keep, workflow),))

    def narrowed(self, status: OrderStatus | None, workflow: str | None) -> Retention:
        """The rules for ``status`` (None: all) and orders of ``workflow`` only (None: all
        workflows): what ``admin purge --status S --workflow W`` runs."""
        rules = [r for r in self.rules if status is None or r.status is status]
        if workflow is None:
            return Retention(tuple(rules))
        kept = []
        for s in ARCHIVABLE:
            keep = self.keep_for(workflow, s)
            if keep is not None and any(r.status is s for r in rules):
                kept.append(Rule(s, keep, workflow))
        return Retention(tuple(kept))

    @classmethod
    def older_than(
        cls, keep: timedelta, status: OrderStatus | None, workflow: str | None
    ) -> Retention:
        """``admin purge --older-than D``: one time for ``status``, or for every finished
        status (never ``error`` unless named)."""
        statuses = [status] if status is not None else list(ARCHIVABLE[:3])
        return cls(tuple(Rule(s, keep, workflow) for s in statuses))

    def keep_for(self, workflow: str, status: OrderStatus) -> timedelta | None:
        """How long an order of ``workflow`` that ended ``status`` stays; None: for ever."""
        general = None
        for rule in self.rules:
            if rule.status is status and rule.workflow == workflow:
                return rule.keep
            if rule.status is status and rule.workflow is None:
                general = rule.keep
        return general

    def cli_run(
        self, status: OrderStatus | None, workflow: str | None, older_than: timedelta | None
    ) -> Retention:
        """The rules ``python -m admin purge [--status S] [--workflow W] [--older-than D]``
        runs: these settings narrowed to ``status`` and ``workflow``, or one time for them
        (``older_than``). ``error`` orders only when ``status`` names them
        (docs/contracts.md §3.12), even when the settings do (the timer follows those)."""
        if older_than is not None:
            return Retention.older_than(older_than, status, workflow)
        rules = self.narrowed(status, workflow)
        if status is None:
            rules = Retention(tuple(r for r in rules.rules if r.status is not OrderStatus.ERROR))
        return rules

    def statuses(self) -> list[OrderStatus]:
        return [s for s in ARCHIVABLE if any(r.status is s for r in self.rules)]

    def widest(self, status: OrderStatus) -> timedelta:
        """The shortest time any rule keeps ``status``: every order one rule may archive
        finished before ``now - widest``."""
        return min(r.keep for r in self.rules if r.status is status)

    def due(self, workflow: str, status: OrderStatus, finished: datetime, now: datetime) -> bool:
        keep = self.keep_for(workflow, status)
        return keep is not None and finished <= now - keep

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.rules)


#: Where kept messages (``stores/kept.py``) are archived in the same container: ``_`` can
#: begin no workflow name, so no order blob shares the prefix.
KEPT_PREFIX: Final = "_kept"
DEFAULT_KEPT_DAYS: Final = 30


def kept_archive_path(kept: datetime, run: str, part: int) -> str:
    """``_kept/<yyyy>/<mm>/<dd>/<run>-<part>.jsonl.gz``, by the day the messages were kept."""
    return archive_path(KEPT_PREFIX, kept, run, part)


def archive_path(workflow: str, finished: datetime, run: str, part: int) -> str:
    """``<workflow>/<yyyy>/<mm>/<dd>/<run>-<part>.jsonl.gz``: by workflow and the day the
    orders finished; ``run`` (the run's start, to the second, and a random suffix) keeps
    two runs from writing one blob."""
    return f"{workflow}/{finished:%Y/%m/%d}/{run}-{part:03d}.jsonl.gz"
