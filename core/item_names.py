"""The names of a ``ForEach``'s records (docs/contracts.md §3.16): item ``i`` of ``name`` is
the record ``<name>[<i>]`` (its compensation's, ``<undo>[<i>]``); a plan names the step
every item runs ``<name>[]``. And the bounds of a ``ForEach``.
"""

from __future__ import annotations

import re
from typing import Final

#: The most items a ``ForEach`` runs (docs/contracts.md §3.16): an ``items`` that gives more
#: fails its step for good, not applied, saying how many.
MAX_ITEMS: Final = 100
#: The most items of one ``ForEach`` in flight at once. Every record that changes together
#: is in the order's one Table transaction (at most 100 operations): claiming N items at
#: once writes 3N + a few (each record, and its index row moved from pending to
#: processing). 33 would fill it; 25 leaves room for the order's row, its status and
#: search rows, notices and activity (``tests/unit/test_for_each.py`` runs 100 items at
#: 25 through the in-memory store, which refuses what Azure would).
MAX_ITEM_CONCURRENCY: Final = 25
#: A record's name as messages and operators may give it: a step's (kebab-case), or an
#: item's of a ForEach, ``<name>[<i>]`` (``messaging.wire``, the admin API's notApplied).
RECORD_NAME: Final = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*(?:\[(?:0|[1-9][0-9]?)\])?")
#: An item's record name, ``<name>[<i>]``; a template's (in a plan) is ``<name>[]``.
ITEM_NAME: Final = re.compile(r"(?P<base>[a-z0-9]+(?:-[a-z0-9]+)*)\[(?P<index>0|[1-9][0-9]?)?\]")


def item_name(name: str, index: int) -> str:
    """The record name of item ``index`` of the ``ForEach`` (or compensation) ``name``."""
    return f"{name}[{index}]"


def template_of(step: str) -> str:
    """The name a plan gives the step a record of an item belongs to (``<name>[]``);
    ``step`` itself for any other record."""
    found = ITEM_NAME.fullmatch(step)
    return f"{found['base']}[]" if found else step


def item_of(step: str) -> tuple[str, int] | None:
    """``(name, index)`` of an item's record name ``<name>[<i>]``; None for another name."""
    found = ITEM_NAME.fullmatch(step)
    if found is None or found["index"] is None:
        return None
    return found["base"], int(found["index"])


def declared_name(step: str) -> str:
    """The name ``step`` is declared by: an item's record (``<name>[<i>]``) is its
    ForEach's ``<name>`` (figures and alerts count steps by declared name, not by item)."""
    found = item_of(step)
    return found[0] if found is not None else step
