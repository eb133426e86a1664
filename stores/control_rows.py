"""The agents' runtime controls and their audit, in the state table
(``core.ports.AgentControlStore``; what they mean: ``core.controls``).

They live beside the orders in the partition ``agents`` (sweeps and listings read only
the ``shard-NN`` partitions; no new table to deploy):

    agent|<name>                      one row per agent ever changed: paused (since, by,
                                      why), the limits that override its declaration,
                                      the last resume, who changed it last, a version
    audit|<newest>|<name>|<version>   one row per change, newest first (``<newest>``
                                      counts milliseconds down, as the status index does;
                                      ``<version>``, the control's, counts down too)

A change writes the agent's row with If-Match on the ETag read (or creates it: it must
not exist yet) and appends its audit row, in one entity group transaction: a change and
its audit entry are stored together or not at all, and of two operators changing one
agent at once the second gets ``ConcurrencyConflict`` and decides again on what the
first wrote. An answer lost on the way is settled as the orders' writes are: each write
stamps a fresh ``WriteId``, read back when the outcome is in doubt.

A store provides ``_range(partition, low, high, select, limit)`` and
``_control_commit(ops, row, write_id)`` (the transaction; ``ConcurrencyConflict`` when
refused, ``StorageUnavailable`` when unanswered and the ``WriteId`` cannot be read).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from azure.core.exceptions import AzureError

from core.controls import Action, AgentControl, AuditEntry, Pause
from core.errors import InvalidContinuationToken, StorageUnavailable
from core.timefmt import ensure_utc
from stores import layout
from stores.rows import RowReads
from stores.writes import Op

PARTITION: Final = "agents"
AGENT_PREFIX: Final = "agent|"
AUDIT_PREFIX: Final = "audit|"
#: "Never" for a time that is not set (a property set to None is not stored and a merge
#: would keep the old value: docs/contracts.md#fact-none-not-stored).
_NEVER: Final = datetime(1970, 1, 1, tzinfo=UTC)
_AUDIT_ROW: Final = re.compile(r"audit\|\d{13}\|[a-z][a-z0-9-]{0,23}\|\d{12}")
_VERSIONS: Final = 10**12 - 1
#: Read at most this many audit rows for one page with an agent filter.
_SCAN_LIMIT: Final = 5000


def _time(value: datetime | None) -> datetime:
    return value if value is not None else _NEVER


def _when(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    value = ensure_utc(value)
    return None if value <= _NEVER else value


def control_entity(control: AgentControl, write_id: str) -> dict[str, Any]:
    pause = control.pause
    return {
        "PartitionKey": PARTITION,
        "RowKey": AGENT_PREFIX + control.agent,
        "Agent": control.agent,
        "Paused": pause is not None,
        "PausedAt": _time(pause.since if pause else None),
        "PausedBy": pause.by if pause else "",
        "PauseReason": pause.reason if pause else "",
        "ResumedAt": _time(control.resumed_at),
        "Concurrency": control.concurrency or 0,  # 0: the declared value
        "Rate": float(control.rate or 0.0),  # 0: the declared value
        "ChangedAt": _time(control.changed_at),
        "ChangedBy": control.changed_by,
        "Version": control.version,
        "WriteId": write_id,
    }


def parse_control(e: Any) -> AgentControl:
    since = _when(e.get("PausedAt"))
    pause = (
        Pause(since or _NEVER, str(e.get("PausedBy") or ""), str(e.get("PauseReason") or ""))
        if e.get("Paused")
        else None
    )
    return AgentControl(
        agent=str(e["Agent"]),
        pause=pause,
        concurrency=int(e.get("Concurrency") or 0) or None,
        rate=float(e.get("Rate") or 0.0) or None,
        resumed_at=_when(e.get("ResumedAt")),
        changed_at=_when(e.get("ChangedAt")),
        changed_by=str(e.get("ChangedBy") or ""),
        version=int(e.get("Version") or 0),
        etag=e.metadata["etag"],
    )


def audit_entity(entry: AuditEntry, version: int) -> dict[str, Any]:
    """The audit row of the change that made ``version`` of the agent's control: newest
    first by time, then (two changes of one agent in one millisecond) by version."""
    countdown = _VERSIONS - min(max(version, 0), _VERSIONS)
    row = f"{AUDIT_PREFIX}{layout.newest_first(entry.at)}|{entry.agent}|{countdown:012d}"
    return {
        "PartitionKey": PARTITION,
        "RowKey": row,
        "Agent": entry.agent,
        "Action": str(entry.action),
        "At": entry.at,
        "By": entry.by,
        "Reason": entry.reason,
        "Before": json.dumps(entry.before, separators=(",", ":")),
        "After": json.dumps(entry.after, separators=(",", ":")),
    }


def parse_audit(e: Any) -> AuditEntry:
    return AuditEntry(
        at=ensure_utc(e["At"]),
        agent=str(e["Agent"]),
        action=Action(e["Action"]),
        by=str(e.get("By") or ""),
        reason=str(e.get("Reason") or ""),
        before=json.loads(e.get("Before") or "{}"),
        after=json.loads(e.get("After") or "{}"),
    )


class _OfAgent(Protocol):
    """A record kept one per agent: it names its agent."""

    @property
    def agent(self) -> str: ...


class AgentRows(RowReads):
    """The rows of the partition ``agents`` kept one per agent (a control, an outage:
    ``ControlRows``, ``OutageRows``): each kind read all at once by its row-key prefix,
    written in the store's transaction."""

    def _control_commit(self, ops: list[Op], row: str, write_id: str) -> str:
        """Submit ``ops`` as one transaction; the new ETag of ``row``."""
        raise NotImplementedError

    def _per_agent[T: _OfAgent](
        self, method: str, prefix: str, parse: Callable[[Any], T], what: str
    ) -> dict[str, T]:
        """Every row under ``prefix``, parsed, by agent (``method``: the read's name, for
        ``_before_read``); ``StorageUnavailable`` that names the agents' ``what`` when the
        range cannot be read."""
        self._before_read(method)
        try:
            rows = list(self._range(PARTITION, prefix, prefix + layout.HIGH))
        except AzureError as exc:
            raise StorageUnavailable(f"could not read the agents' {what}: {exc}") from exc
        parsed = (parse(e) for e in rows)
        return {p.agent: p for p in parsed}


class ControlRows(AgentRows):
    """``AgentControlStore`` over a store's rows (``TableStateStore``, ``InMemoryStateStore``)."""

    def read_controls(self) -> dict[str, AgentControl]:
        return self._per_agent("read_controls", AGENT_PREFIX, parse_control, "controls")

    def write_control(self, control: AgentControl, entry: AuditEntry) -> AgentControl:
        write_id = uuid.uuid4().hex
        row = AGENT_PREFIX + control.agent
        entity = control_entity(control, write_id)
        audit = audit_entity(entry, control.version)
        first = (
            Op("create", row, entity)
            if control.etag is None
            else Op("update", row, entity, control.etag)
        )
        etag = self._control_commit([first, Op("create", audit["RowKey"], audit)], row, write_id)
        return replace(control, etag=etag)

    def audit_page(
        self, page_size: int, token: str | None = None, agent: str | None = None
    ) -> tuple[list[AuditEntry], str | None]:
        if token is not None and not _AUDIT_ROW.fullmatch(token):
            raise InvalidContinuationToken(
                "continuationToken is not one this audit handed out; start from the first page"
            )
        # No key has another as its prefix: every key after the token sorts after this.
        self._before_read("audit_page")
        low = token + "|" if token is not None else AUDIT_PREFIX
        wanted = max(page_size, 1)
        found: list[tuple[str, AuditEntry]] = []
        more = False
        try:
            scan = self._range(
                PARTITION, low, AUDIT_PREFIX + layout.HIGH, limit=_SCAN_LIMIT if agent else None
            )
            for e in scan:
                if agent is not None and e.get("Agent") != agent:
                    continue
                if len(found) == wanted:
                    more = True
                    break
                found.append((str(e["RowKey"]), parse_audit(e)))
        except AzureError as exc:
            raise StorageUnavailable(f"could not read the agents' audit: {exc}") from exc
        return [entry for _, entry in found], (found[-1][0] if more and found else None)
