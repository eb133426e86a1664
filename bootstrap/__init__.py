"""The composition root (``bootstrap/root.py``), the parts it wires
(``bootstrap/parts.py``), the SDK clients they use (``bootstrap/clients.py``), and the
process's app that the trigger modules reach through ``uses`` (``bootstrap/process.py``).
"""

from bootstrap import clients
from bootstrap.parts import ALERT_THREADS, AppContext, utc_now
from bootstrap.process import app_context, current_app_context, reset_app_context, uses
from bootstrap.root import (
    IndexTime,
    bootstrap,
    declarations_from_environment,
    index_time,
    settings_from_environment,
)

__all__ = [
    "ALERT_THREADS",
    "AppContext",
    "IndexTime",
    "app_context",
    "bootstrap",
    "clients",
    "current_app_context",
    "declarations_from_environment",
    "index_time",
    "reset_app_context",
    "settings_from_environment",
    "uses",
    "utc_now",
]
