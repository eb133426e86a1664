"""The README stays true where a test can check it cheaply: its table of functions against
what ``function_app.py`` registers, its settings table against ``core/settings.py``, and
the size of the bad-input catalogue it quotes against the catalogue itself."""

from __future__ import annotations

import re
from pathlib import Path

from core import settings
from core.names import Names
from core.workflows import AGENTS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _table_after(header: str) -> list[str]:
    start = README.index(header)
    rows = []
    for line in README[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _expand(name: str) -> set[str]:
    """A name as the README writes it, with ``<agent>`` or ``<queue>`` spelled out."""
    names = Names()
    if "<agent>" in name:
        # an agent's function name is its name with "-" as "_" (core/agent_spec.py)
        return {name.replace("<agent>", a.replace("-", "_")) for a in AGENTS}
    if name == "alert_<queue>_poison":
        return {f"alert_{q.replace('-', '_')}" for q in names.poison_queues()}
    if name == "alert_<queue>_dead_letters":
        return {f"alert_{q.replace('-', '_')}_dead_letters" for q in names.agent_queues()} | {
            f"alert_{names.agent_replies.replace('-', '_')}_dead_letters"
        }
    return {name}


def test_the_function_table_is_what_the_app_registers() -> None:
    from tests.support import app_function

    app_function("submit_order")  # loads function_app once for the whole process
    from tests.support import _FUNCTIONS

    registered = set(_FUNCTIONS)
    listed: set[str] = set()
    for row in _table_after("| role | functions (trigger) | code |"):
        functions = row.split("|")[2]
        # function names: identifiers in backticks that are not a queue or a setting
        for name in re.findall(r"`([a-z][a-z_<>]*)`", functions):
            if "_" in name or name == "supervise":
                listed |= _expand(name)
    assert listed == registered, {
        "listed, not registered": sorted(listed - registered),
        "registered, not listed": sorted(registered - listed),
    }


def test_the_settings_table_names_every_setting_the_code_reads() -> None:
    table = _table_after("| setting | default | meaning |")
    named = {m for row in table for m in re.findall(r"^\| `([A-Za-z_.<>]+)`", row)}
    expected = set(settings.APP_SETTINGS) | {
        settings.DECLARATIONS,
        settings.APPINSIGHTS_CONNECTION,
        settings.APPINSIGHTS_AUTHENTICATION,
        "AGENT_<NAME>_URL",
        "AGENT_<NAME>_API_KEY",
    }
    assert named == expected, {
        "in the README only": sorted(named - expected),
        "missing from the README": sorted(expected - named),
    }


def test_the_bad_input_counts_are_the_catalogues() -> None:
    from tests.integration import test_bad_input

    match = re.search(r"(\d+) kinds of bad order and (\d+) kinds of bad transport", README)
    assert match is not None
    transport = next(
        m
        for m in test_bad_input.test_bad_transport_messages_are_quarantined_with_a_reason.pytestmark  # type: ignore[attr-defined]
        if m.name == "parametrize"
    )
    assert (int(match[1]), int(match[2])) == (
        len(test_bad_input.ORDER_CATALOGUE),
        len(transport.args[1]),
    )
