"""What an order's page shows of the JSON its steps sent and received: pure functions.

Each step shows the body its remote was sent (its ``input``, or the order's data when it
declares none: the page says which) and the result it received, as pretty JSON cut to
``PREVIEW_CHARS`` with the whole of it one click away (a ``<details>``: no JavaScript).
The values come from the order's view (``admin.service.step_view``), so a callback's
capability never shows (``core.redact.shown``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from core.history import Happened
from core.model import Order, StepRecord
from core.states import StepKind
from core.timefmt import parse_iso

#: How much of a JSON value a page shows before "the whole of it".
PREVIEW_CHARS = 300


@dataclass(frozen=True)
class Shown:
    """A JSON value as a page shows it: its first lines, and the whole if it was cut."""

    preview: str
    whole: str
    cut: bool


def shown_json(value: Any, limit: int = PREVIEW_CHARS) -> Shown:
    """``value`` as pretty JSON, cut to ``limit`` characters (at a line's end when one is
    near) with "…" where it was cut."""
    whole = json.dumps(value, indent=2, ensure_ascii=False)
    if len(whole) <= limit:
        return Shown(whole, whole, False)
    head = whole[:limit]
    line_end = head.rfind("\n")
    if line_end >= limit // 2:
        head = head[:line_end]
    return Shown(head.rstrip() + "\n…", whole, True)


@dataclass(frozen=True)
class StepIO:
    """What a step sent and received, as its page says it.

    ``source``: where the body came from: ``input`` (the step's ``input`` function),
    ``order`` (the order's data: it declares no ``input``), ``unsent`` (a call not sent
    yet) or ``none`` (an event or a delay: nothing is sent)."""

    source: str
    sent_label: str
    sent: Shown | None
    received_label: str
    received: Shown | None


def step_io(order: Order, record: StepRecord, view: dict[str, Any]) -> StepIO:
    """``record``'s body sent and result received; ``view``: its ``step_view``."""
    if record.kind is StepKind.ACTION and order.waits(record):
        # an event or a delay: nothing is sent; an event's result is shown as the event's
        return StepIO("none", "", None, "", None)
    source, sent_label, sent = _sent(order, record, view)
    result = view.get("result")
    if result is not None:
        return StepIO(source, sent_label, sent, "result received", shown_json(result))
    label = "" if source == "unsent" else _no_result(record)
    return StepIO(source, sent_label, sent, label, None)


def _sent(order: Order, record: StepRecord, view: dict[str, Any]) -> tuple[str, str, Shown | None]:
    if not _was_sent(record):
        return "unsent", "nothing sent yet", None
    body = view.get("input")
    if body is not None:
        return "input", "body sent (built by its input)", shown_json(body)
    label = "body sent: the order's data (the step declares no input)"
    if _patched_since(order, record):
        label += "; shown as it is now: a fix changed the data after this step was sent"
    return "order", label, shown_json(order.body)


def _was_sent(record: StepRecord) -> bool:
    if not record.attempt:
        return False
    return bool(record.attempts.compacted) or any(a.sent for a in record.attempts.items)


def _patched_since(order: Order, record: StepRecord) -> bool:
    """The order's data was fixed after the step's last request was sent."""
    claims = [a.claimed_at for a in record.attempts.items if a.sent]
    if not claims:
        return False
    last = max(claims)
    for entry in order.history:
        if entry.get("event") == Happened.PATCHED:
            try:
                if parse_iso(str(entry.get("at"))) > last:
                    return True
            except ValueError:
                continue
    return False


def _no_result(record: StepRecord) -> str:
    if record.is_active:
        return "no result yet"
    return "no result"
