"""The demo's progress: a live table on a terminal, plain lines anywhere else.

On a terminal ``make run`` redraws one table of every order a few times a second. Piped
or in a CI log that table would be squeezed into 80 columns and printed again and again;
there ``Lines`` prints one line per order each time its row changes (and one when the
count of finished orders changes), with no markup and no width limit, so that the log
reads top to bottom. ``progress(console)`` picks by ``console.is_terminal``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import IO, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

#: The table's columns: a row of ``demo.__main__.row_for`` has one value per column.
COLUMNS = ("order", "scenario", "workflow", "status", "active", "steps (state x attempts)")


class View(Protocol):
    def update(
        self, rows: list[list[str]], elapsed: float, done: int, total: int, title: str
    ) -> None:
        """The orders as they are now."""
        ...

    def say(self, text: str) -> None:
        """A line of its own (what the demo's operator did), in rich markup."""
        ...


def render(
    rows: list[list[str]], elapsed: float, done: int, total: int, title: str = "orders"
) -> Panel:
    """The live table."""
    table = Table(expand=True, show_lines=False)
    for name in COLUMNS:
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return Panel(Group(table), title=heading(title, done, total, elapsed))


def heading(title: str, done: int, total: int, elapsed: float) -> str:
    return f"{title}: {done}/{total} finished, {elapsed:.0f} s"


def plain(markup: str) -> str:
    """Rich markup as the text it shows (``[green]completed ✓[/]``: ``completed ✓``)."""
    return Text.from_markup(markup).plain


class LiveTable:
    """On a terminal: the table, redrawn in place."""

    def __init__(self, live: Live):
        self._live = live

    def update(
        self, rows: list[list[str]], elapsed: float, done: int, total: int, title: str
    ) -> None:
        self._live.update(render(rows, elapsed, done, total, title))

    def say(self, text: str) -> None:
        self._live.console.print(text)


class Lines:
    """Anywhere else: a line per change, ``  12 s  demo-1-ok  retry  order  completed ✓
    process:Processed``; and ``orders: 3/20 finished, 12 s`` when that count changes."""

    def __init__(self, out: IO[str]):
        self._out = out
        self._rows: dict[str, list[str]] = {}
        self._done: tuple[str, int] | None = None

    def update(
        self, rows: list[list[str]], elapsed: float, done: int, total: int, title: str
    ) -> None:
        for row in rows:
            shown = [plain(value) for value in row]
            if self._rows.get(shown[0]) != shown:
                self._rows[shown[0]] = shown
                self._write(f"{elapsed:5.0f} s  " + "  ".join(v for v in shown if v))
        if self._done != (title, done):
            self._done = (title, done)
            self._write(heading(title, done, total, elapsed))

    def say(self, text: str) -> None:
        self._write(plain(text))

    def _write(self, line: str) -> None:
        self._out.write(line + "\n")
        self._out.flush()


@contextlib.contextmanager
def progress(console: Console) -> Iterator[View]:
    """The view for ``console``: ``LiveTable`` on a terminal, else ``Lines`` on its file."""
    if console.is_terminal:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            yield LiveTable(live)
    else:
        yield Lines(console.file)
