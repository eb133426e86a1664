"""``make run``'s progress (``demo/progress.py``): on a terminal the live table; anywhere
else (a pipe, a CI log) plain lines, one per change, unwrapped and without markup."""

from __future__ import annotations

import io

from rich.console import Console

from demo.progress import Lines, LiveTable, progress

LONG = "retry-after-throttling-then-a-dropped-connection-and-a-hang-past-the-deadline"
ROWS = [
    ["demo-1-a", LONG, "order", "[yellow]processing[/]", "process", "process:Processing"],
    ["demo-1-b", "refused", "-", "[dim]not yet stored[/]", "", ""],
]


def test_not_a_terminal_gets_a_plain_line_per_change() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    with progress(console) as view:
        assert isinstance(view, Lines)
        view.update(ROWS, 0.4, 0, 2, "orders")
        view.update(ROWS, 0.9, 0, 2, "orders")  # nothing changed: nothing printed
        done = [[*ROWS[0][:3], "[green]completed ✓[/]", "", "process:Processed"], ROWS[1]]
        view.update(done, 3.2, 1, 2, "orders")
        view.say("[bold]operator:[/] approve demo-1-c → HTTP 200")
    assert out.getvalue().splitlines() == [
        f"    0 s  demo-1-a  {LONG}  order  processing  process  process:Processing",
        "    0 s  demo-1-b  refused  -  not yet stored",
        "orders: 0/2 finished, 0 s",
        f"    3 s  demo-1-a  {LONG}  order  completed ✓  process:Processed",
        "orders: 1/2 finished, 3 s",
        "operator: approve demo-1-c → HTTP 200",
    ]
    assert "\x1b" not in out.getvalue() and "─" not in out.getvalue()


def test_a_terminal_gets_the_live_table() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with progress(console) as view:
        assert isinstance(view, LiveTable)
        view.update(ROWS, 1.0, 0, 2, "orders")
    shown = out.getvalue()
    assert "orders: 0/2 finished, 1 s" in shown and "steps (state x attempts)" in shown
    assert "─" in shown and "\x1b[" in shown  # a box, drawn with terminal codes
