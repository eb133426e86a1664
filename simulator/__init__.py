"""Simulated remote services (contract 3.4) with fault injection and an effects ledger.

``python -m simulator --port 0`` for a process; ``SimulatorServer`` for a test.
"""

from simulator.faults import Directive, RandomFaults, parse_directive
from simulator.ledger import (
    double_effects,
    effects_by_order,
    load_ledger,
    standing_effects,
)
from simulator.server import SimulatorServer

__all__ = [
    "Directive",
    "RandomFaults",
    "SimulatorServer",
    "double_effects",
    "effects_by_order",
    "load_ledger",
    "parse_directive",
    "standing_effects",
]
