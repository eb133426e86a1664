"""Order aggregate <-> Table entities (the property names of the OrderState table).

The state fields of docs/contracts.md §3.2 keep their names (``OrderID``, ``Step``,
``LockedBy``, ``CompleteBy``, ``ProcessState``, ``FailureCount``,
``Attempt``); JSON-valued properties are bounded to fit one Table string
property (32K UTF-16 units), except the order's body, which is split over
``Body``, ``Body1``, ... (an entity holds 1 MiB).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from core.errors import CorruptOrder
from core.history import read_history
from core.model import Order, StepRecord
from core.order_message import utf16_units
from core.ports import IndexEntry, OutboxEntry
from core.states import OrderStatus, StepKind, StepState
from core.timefmt import ensure_utc
from core.workflows import Plan
from stores import activity, layout, migrate

log = logging.getLogger(__name__)

MAX_JSON_CHARS: Final = 30_000  # a Table string property holds 32K UTF-16 units
MAX_RESULT_CHARS: Final = 8_000  # a cut result's preview
MAX_RESULT_UNITS: Final = 2 * 65_536


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _bounded_history(history: list[dict[str, Any]]) -> str:
    text = _dumps(history)
    while utf16_units(text) > MAX_JSON_CHARS and len(history) > 2:
        history = history[:1] + history[2:]
        text = _dumps(history)
    return text


def _result_properties(result: dict[str, Any] | None) -> dict[str, Any]:
    """A step's result, whole: later steps read it (docs/contracts.md §3.13). Up to an
    order's size (``MAX_RESULT_UNITS``) over ``Result``, ``Result1``, ...; one larger
    (it cannot come from a reply, which carries 16,000 characters) is cut with a marker."""
    if result is None:
        return {"Result": "", "ResultParts": 0}
    text = _dumps(result)
    if utf16_units(text) > MAX_RESULT_UNITS:
        text = _dumps({"truncated": True, "preview": text[:MAX_RESULT_CHARS]})
    return _split("Result", text)


def _result(record: Any) -> dict[str, Any] | None:
    """What ``_result_properties`` wrote; a row written before results were split has one
    ``Result`` (empty: none)."""
    if record.get("ResultParts") is None:
        raw = record.get("Result")
        return json.loads(raw) if raw else None
    value = _optional_json(record, "Result") if record.get("ResultParts") else None
    return value if isinstance(value, dict) else None


BODY_PART_UNITS: Final = MAX_JSON_CHARS  # UTF-16 units per Body, Body1, Body2, ... property


def split_utf16(text: str, limit: int) -> list[str]:
    """``text`` in consecutive parts of at most ``limit`` UTF-16 units each, cut only between
    code points (a character outside the BMP, two units, is never split in half)."""
    if limit < 2:
        raise ValueError("a part must hold at least 2 UTF-16 units (one surrogate pair)")
    parts: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + limit, len(text))  # a code point is one or two units
        excess = utf16_units(text[start:end]) - limit
        while excess > 0:  # each code point cut removes one or two units
            end -= (excess + 1) // 2
            excess = utf16_units(text[start:end]) - limit
        parts.append(text[start:end])
        start = end
    return parts


def _body_properties(order: Order) -> dict[str, Any]:
    """The body's JSON over ``Body``, ``Body1``, ``Body2``, ... (one Table string property
    holds 32K UTF-16 units; an order can carry up to 64 KiB, and more once re-serialized).
    ``BodyParts`` says how many there are, so a missing part is an error, not a cut body."""
    return _split("Body", _dumps(order.body))


def _split(name: str, text: str) -> dict[str, Any]:
    """``text`` over ``<name>``, ``<name>1``, ... and ``<name>Parts`` (their count)."""
    parts = split_utf16(text, BODY_PART_UNITS) or [""]
    props: dict[str, Any] = {_part_name(name, n): part for n, part in enumerate(parts)}
    props[f"{name}Parts"] = len(parts)
    return props


def _part_name(name: str, n: int) -> str:
    return name if n == 0 else f"{name}{n}"


def _body_json(record: Any) -> str:
    """Join the body's parts; a record written before bodies were split has only ``Body``."""
    if record.get("BodyParts") is None:
        return str(record["Body"])
    return _joined(record, "Body")


def _joined(record: Any, name: str) -> str:
    """The text ``_split`` wrote (a missing part is an error, not a cut value)."""
    count = int(record[f"{name}Parts"])
    missing = [_part_name(name, n) for n in range(count) if record.get(_part_name(name, n)) is None]
    if missing:
        raise ValueError(
            f"record {record.get('RowKey')!r} lacks {name.lower()} part(s) "
            f"{', '.join(missing)} of {count}"
        )
    return "".join(record[_part_name(name, n)] for n in range(count))


def _optional_json(record: Any, name: str) -> Any:
    """A JSON value ``_split`` wrote under ``name``, or None where there is none."""
    if record.get(f"{name}Parts") is None:
        return None
    return json.loads(_joined(record, name))


def order_entity(order: Order, write_id: str) -> dict[str, Any]:
    return {
        "PartitionKey": layout.shard_of(order.order_id),
        "RowKey": layout.order_row(order.order_id),
        "Kind": "order",
        "OrderID": order.order_id,
        "Workflow": order.workflow,
        "Status": str(order.status),
        "ReplyTo": order.reply_to or "",
        **_body_properties(order),
        "ContentHash": order.content_hash,
        "Plan": _dumps(order.plan.to_json()),
        "CancelRequested": order.cancel_requested,
        "StuckAlerted": order.stuck_alerted,
        "CreatedAt": order.created_at,
        "UpdatedAt": order.updated_at,
        "Version": order.version,
        "WriteId": write_id,
        "History": _bounded_history(order.history),
        "TraceContext": _dumps(order.trace) if order.trace else "",
        # the key of its events' capability tokens (core/inbox.py): never shown
        "EventKey": order.event_key,
        "Unwound": order.unwound,
        # events delivered (docs/contracts.md §3.13): each up to an order's size
        **(_split("Events", _dumps(order.events)) if order.events else {"EventsParts": 0}),
    }


def step_entity(step: StepRecord) -> dict[str, Any]:
    return {
        "PartitionKey": layout.shard_of(step.order_id),
        "RowKey": layout.step_row(step.order_id, step.seq, step.step),
        "Kind": "step",
        # docs/contracts.md §3.2: always written, so a merge can never keep an old value
        "OrderID": step.order_id,
        "Step": step.step,
        "LockedBy": step.locked_by,
        "CompleteBy": step.complete_by,
        "ProcessState": str(step.process_state),
        "FailureCount": step.failure_count,
        "Attempt": step.attempt,
        # ours
        "Seq": step.seq,
        "StepKind": str(step.kind),
        "Path": step.path,
        "TimeoutSeconds": step.timeout_seconds,
        "Compensates": step.compensates or "",
        **_result_properties(step.result),
        "LastError": (step.last_error or "")[:4000],
        "History": _bounded_history(step.history),
        "HistoryDropped": step.history_dropped,
        # what the failure semantics decide from (core/steps.py): always written, never None
        "AttemptState": _dumps(step.decision_state()),
        "MaybeApplied": _dumps(step.maybe_applied),  # for people: derived from AttemptState
        "Deferrals": step.deferrals,
        "DeferredSince": step.deferred_since or _NEVER,
        "SingledOut": step.singled_out,
        # the body its ``input`` decided (docs/contracts.md §3.13), over as many parts
        **(_split("Input", _dumps(step.input)) if step.input is not None else {"InputParts": 0}),
    }


#: "Not deferring": a property set to None is not stored and a merge keeps the old
#: value (docs/contracts.md#fact-none-not-stored), so an absent time is written as this sentinel.
_NEVER: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _since(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    value = ensure_utc(value)
    return None if value <= _NEVER else value


def _decisions(e: Any, step: StepRecord) -> StepRecord:
    """The step's typed decision state; a row written before it existed is migrated from
    its history (``stores/migrate.py``) and gets ``AttemptState`` on its next save."""
    raw = e.get("AttemptState")
    if raw:
        step.load_decision_state(json.loads(raw))
    else:
        migrate.rebuild(step, [int(n) for n in json.loads(e.get("MaybeApplied") or "[]")])
    return step


def parse_order(entities: Sequence[Any]) -> Order | None:
    record = next((e for e in entities if e.get("Kind") == "order"), None)
    if record is None:
        return None
    steps = [
        _decisions(
            e,
            StepRecord(
                order_id=e["OrderID"],
                step=e["Step"],
                seq=int(e["Seq"]),
                kind=StepKind(e["StepKind"]),
                path=e["Path"],
                timeout_seconds=int(e["TimeoutSeconds"]),
                process_state=StepState(e["ProcessState"]),
                locked_by=e.get("LockedBy", ""),
                complete_by=ensure_utc(e["CompleteBy"]),
                failure_count=int(e.get("FailureCount", 0)),
                attempt=int(e.get("Attempt", 0)),
                compensates=e.get("Compensates") or None,
                result=_result(e),
                last_error=e.get("LastError") or None,
                history=read_history(json.loads(e.get("History") or "[]")),
                history_dropped=int(e.get("HistoryDropped", 0)),
                deferrals=int(e.get("Deferrals", 0)),
                deferred_since=_since(e.get("DeferredSince")),
                singled_out=bool(e.get("SingledOut", False)),
                input=_optional_json(e, "Input") if e.get("InputParts") else None,
                etag=e.metadata["etag"],
            ),
        )
        for e in entities
        if e.get("Kind") == "step"
    ]
    steps.sort(key=lambda s: s.seq)
    order = Order(
        order_id=record["OrderID"],
        plan=Plan.from_json(json.loads(record["Plan"])),
        body=json.loads(_body_json(record)),
        content_hash=record["ContentHash"],
        reply_to=record.get("ReplyTo") or None,
        status=OrderStatus(record["Status"]),
        created_at=ensure_utc(record["CreatedAt"]),
        updated_at=ensure_utc(record["UpdatedAt"]),
        steps=steps,
        cancel_requested=bool(record.get("CancelRequested", False)),
        stuck_alerted=str(record.get("StuckAlerted") or ""),
        history=json.loads(record.get("History") or "[]"),
        trace=json.loads(record.get("TraceContext") or "{}"),
        version=int(record.get("Version", 0)),
        etag=record.metadata["etag"],
        events=_optional_json(record, "Events") if record.get("EventsParts") else {},
        event_key=str(record.get("EventKey") or ""),
        unwound=bool(record.get("Unwound", False)),
    )
    order.store_meta["index"] = layout.index_rows(order)
    order.store_meta["write_id"] = record.get("WriteId", "")
    order.store_meta["activity"] = activity.tags(order)
    return order


#: What reading a malformed entity raises: a missing property (KeyError), a bad value or
#: JSON text (ValueError, json.JSONDecodeError), a property of the wrong type (TypeError,
#: AttributeError), a number out of range (OverflowError).
PARSE_ERRORS = (KeyError, ValueError, TypeError, AttributeError, IndexError, OverflowError)


def well_formed[T](
    rows: Iterator[dict[str, Any]], parse: Callable[[dict[str, Any]], T], what: str
) -> Iterator[T]:
    """``parse`` of each row; a malformed one (a manual edit) is skipped with an ERROR log
    rather than ending every sweep."""
    for e in rows:
        try:
            entry = parse(e)
        except PARSE_ERRORS as exc:
            log.error(
                "skipping malformed %s: %s (%s: %s)", what, e.get("RowKey"), type(exc).__name__, exc
            )
            continue
        yield entry


def index_entry(e: dict[str, Any]) -> IndexEntry:
    _, when, _, _ = e["RowKey"].split("|", 3)
    order_id, step = e.get("OrderRef"), e.get("StepName")
    if not isinstance(order_id, str) or not order_id or not isinstance(step, str) or not step:
        # A selected property that is absent comes back as None: a malformed row, not an
        # order called "None".
        raise ValueError(f"OrderRef {order_id!r} / StepName {step!r}")
    return IndexEntry(order_id, step, parse_sortable(when))


def outbox_entry(e: dict[str, Any]) -> OutboxEntry:
    return OutboxEntry(
        e["PartitionKey"],
        e["RowKey"],
        e["NoticeKind"],
        e.get("Queue") or None,
        e["Body"],
        e["OrderRef"],
    )


def parse_sortable(text: str) -> datetime:
    return datetime.strptime(text, "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)


def parse_stored(order_id: str, rows: Sequence[Any]) -> Order | None:
    """``parse_order`` of an order's rows as a store read them; records that cannot be
    read are ``CorruptOrder`` (for that order only: a person must repair them)."""
    try:
        return parse_order(rows)
    except PARSE_ERRORS as exc:
        raise CorruptOrder(
            f"order {order_id}'s stored records cannot be read "
            f"({type(exc).__name__}: {exc}); repair them by hand (see docs/operating.md)",
            order_id=order_id,
        ) from exc
