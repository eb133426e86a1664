"""Simulated remote services (docs/contracts.md §3.4) with fault injection, an effects ledger,
an outage switch (error answers, then connections refused) and a call log.

``python -m simulator --port 0`` for a process; ``SimulatorServer`` for a test.

What a remote sees and does, in short (each module says more):

- ``POST /{step}``, ``Idempotency-Key: <orderId>:<step>`` (the order id comes from it),
  a JSON object as body: the order, or what the step's ``input`` built. Each key's
  effect is applied once; a repeat gets the stored answer (``simulator.engine``).
- Ids: ``reserve-stock`` answers ``{"reservation": "<id>"}``, ``charge-payment``
  ``{"charge": "<id>"}``, ``ship`` ``{"parcel": "<id>"}``, the same for every retry. Their
  compensations, ``release-stock`` and ``refund-payment``, must name that id in the same
  field of their body, or are refused (422, nothing undone) (``simulator.engine``).
- A body with ``"callback": {"url": "<http(s) URL>"}`` is answered 202, and the URL later
  gets ``POST {"result": <the answer>}`` (or ``{"refused": "<reason>"}``), tried again a
  few times if it fails (``simulator.callbacks``).
- Faults per order and step: the body's ``"simulate"`` (``simulator.faults``); random
  faults, outages and a managed identity endpoint are options of the server.
"""

from simulator.calllog import CallLog
from simulator.faults import Directive, RandomFaults, parse_directive
from simulator.ledger import (
    double_effects,
    effects_by_order,
    load_ledger,
    standing_effects,
)
from simulator.outage import OutageError, Phase, parse_outage, parse_outage_cli
from simulator.server import SimulatorServer

__all__ = [
    "CallLog",
    "Directive",
    "OutageError",
    "Phase",
    "RandomFaults",
    "SimulatorServer",
    "double_effects",
    "effects_by_order",
    "load_ledger",
    "parse_directive",
    "parse_outage",
    "parse_outage_cli",
    "standing_effects",
]
