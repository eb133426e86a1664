"""The agents' shared outage records in the state table (``core.ports.OutageStore``; what
they mean: ``core.outages``).

One row per agent that ever had a failing streak worth telling, beside its controls in
the partition ``agents`` (no new table to deploy; sweeps and listings never read it):

    outage|<name>    the current or last streak (failing, since, last failure, end,
                     reason, alerted, orders held), the alerts it owes (JSON, at most
                     two) and its past outages (JSON, at most ten)

Every write is conditional: If-Match the ETag read, or a create that fails if the row
exists, so of two instances reporting at once the second gets ``ConcurrencyConflict``
and decides again on what the first wrote. An answer lost on the way is settled as the
controls' writes are (``_control_commit``: a fresh ``WriteId``, read back when the
outcome is in doubt). The costs are per outage, never per order or per call: a read of
the range (one row per agent) and a write per report (``core.outages``).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any, Final

from core.outages import Outage, parse_owed, parse_past
from stores.control_rows import PARTITION, AgentRows, _time, _when
from stores.writes import Op

PREFIX: Final = "outage|"
# A time not set is stored as the controls' "never" (``_time``, ``_when``): a property set
# to None is not stored (docs/contracts.md#fact-none-not-stored).


def outage_entity(outage: Outage, write_id: str) -> dict[str, Any]:
    return {
        "PartitionKey": PARTITION,
        "RowKey": PREFIX + outage.agent,
        "Agent": outage.agent,
        "Failing": outage.failing,
        "Since": _time(outage.since),
        "LastFailureAt": _time(outage.last_failure_at),
        "EndedAt": _time(outage.ended_at),
        "Reason": outage.reason,
        "Alerted": outage.alerted,
        "Waiting": -1 if outage.waiting is None else outage.waiting,  # -1: not counted
        "Owed": outage.owed_json(),
        "Past": outage.past_json(),
        "WriteId": write_id,
    }


def parse_outage(e: Any) -> Outage:
    waiting = int(e.get("Waiting", -1))
    return Outage(
        agent=str(e["Agent"]),
        failing=bool(e.get("Failing")),
        since=_when(e.get("Since")),
        last_failure_at=_when(e.get("LastFailureAt")),
        ended_at=_when(e.get("EndedAt")),
        reason=str(e.get("Reason") or ""),
        alerted=bool(e.get("Alerted")),
        waiting=None if waiting < 0 else waiting,
        owed=parse_owed(str(e.get("Owed") or "[]")),
        past=parse_past(str(e.get("Past") or "[]")),
        etag=e.metadata["etag"],
    )


class OutageRows(AgentRows):
    """``OutageStore`` over a store's rows (``TableStateStore``, ``InMemoryStateStore``)."""

    def read_outages(self) -> dict[str, Outage]:
        return self._per_agent("read_outages", PREFIX, parse_outage, "outages")

    def write_outage(self, outage: Outage) -> Outage:
        write_id = uuid.uuid4().hex
        row = PREFIX + outage.agent
        entity = outage_entity(outage, write_id)
        op = (
            Op("create", row, entity)
            if outage.etag is None
            else Op("update", row, entity, outage.etag)
        )
        return replace(outage, etag=self._control_commit([op], row, write_id))
