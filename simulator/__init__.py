"""Simulated remote services (docs/contracts.md §3.4) with fault injection, an effects ledger,
an outage switch (error answers, then connections refused) and a call log.

``python -m simulator --port 0`` for a process; ``SimulatorServer`` for a test.
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
