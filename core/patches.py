"""Fix and resubmit (docs/contracts.md §3.14): an operator corrects an order's business
data with a JSON merge patch (RFC 7386) when resubmitting it.

``apply_patch`` checks the patch and what it makes: the patch is a JSON object; it cannot
change ``orderId`` or ``workflow`` (what the order is), nor ``replyTo`` (where its status
goes: routing, not business data); the patched data must be an order the app would accept
(``core.order_message.decode_order``: size, depth, the rules of §3.1), else ``InvalidPatch`` says
why (a 400). It returns the new data and each field that changed, old and new, for the
order's history; the history keeps at most ``MAX_CHANGES`` of them, each value cut to
``MAX_VALUE_CHARS`` characters of JSON (an order's history is read by operators, not a
copy of its data: the state keeps the data).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from core.errors import InvalidOrder, OrderError
from core.order_message import decode_order, describe

#: Fields a patch cannot change.
FIXED_FIELDS: Final = ("orderId", "workflow", "replyTo")
#: Changed fields the history lists (the rest are counted).
MAX_CHANGES: Final = 20
#: A value's JSON in the history is cut to this many characters.
MAX_VALUE_CHARS: Final = 200
_ABSENT: Final = object()


class InvalidPatch(OrderError):
    """A patch that is not a JSON object, changes a fixed field, or makes an order the app
    would not accept (a 400 saying why; nothing changes)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One field the patch changed: its path (``address.city``), and its value before and
    after (absent: the field did not exist, or was removed)."""

    field: str
    old: Any = _ABSENT
    new: Any = _ABSENT

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"field": self.field}
        for name, value in (("old", self.old), ("new", self.new)):
            if value is not _ABSENT:
                text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
                out[name] = value if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"
        return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: an object patch merges member by member (``null`` removes one); anything
    else replaces the target."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def patch_between(old: Any, new: Any) -> Any:
    """The merge patch that turns ``old`` into ``new`` (what the console sends for an
    order's data edited as a whole). A member set to ``null`` in ``new`` becomes a
    removal: a merge patch cannot say "set to null"."""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            if value is not None:
                patch[key] = value
        elif not _same(old[key], value):
            patch[key] = patch_between(old[key], value)
    return patch


def changes(old: Any, new: Any, path: str = "") -> list[Change]:
    """The leaves that differ between ``old`` and ``new`` (objects compared member by
    member; arrays and other values as a whole)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[Change] = []
        for key in [*old, *(k for k in new if k not in old)]:
            out += changes(old.get(key, _ABSENT), new.get(key, _ABSENT), _join(path, key))
        return out
    if old is _ABSENT and new is _ABSENT:
        return []
    if old is not _ABSENT and new is not _ABSENT and _same(old, new):
        return []
    return [Change(path, old, new)]


def apply_patch(body: dict[str, Any], patch: Any) -> tuple[dict[str, Any], list[Change]]:
    """The order's data with ``patch`` merged in, and what changed; ``InvalidPatch`` if the
    patch or what it makes is refused."""
    if not isinstance(patch, dict):
        raise InvalidPatch(
            f"the patch must be a JSON object (a merge patch of the order's data), got "
            f"{describe(patch)}"
        )
    for name in FIXED_FIELDS:
        if name in patch and not _same(patch[name], body.get(name)):
            raise InvalidPatch(
                f"a patch cannot change {name} ({_why_fixed(name)}); leave it out of the patch"
            )
    patched = merge_patch(body, patch)
    text = json.dumps(patched, ensure_ascii=False, separators=(",", ":"))
    try:
        decode_order(text)  # replyTo cannot change: the queue it names was checked on arrival
    except InvalidOrder as exc:
        raise InvalidPatch(f"the patched order would not be accepted: {exc.message}") from None
    return patched, changes(body, patched)


def history_of(found: list[Change]) -> dict[str, Any]:
    """What the order's history keeps of a patch's changes."""
    out: dict[str, Any] = {"changed": [c.to_json() for c in found[:MAX_CHANGES]]}
    if len(found) > MAX_CHANGES:
        out["changedMore"] = len(found) - MAX_CHANGES
    return out


def _why_fixed(name: str) -> str:
    return {
        "orderId": "an order id names one order: submit a new order for another",
        "workflow": "the order's steps were planned for its workflow: submit a new order",
        "replyTo": "where its status messages go is not the order's business data",
    }[name]


def _same(a: Any, b: Any) -> bool:
    """The same JSON, whatever the order of an object's members."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _join(path: str, key: str) -> str:
    part = key if key and all(c.isalnum() or c in "_-" for c in key) else json.dumps(key)
    return f"{path}.{part}" if path else part
