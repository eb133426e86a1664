"""Tracing and metrics: one order is one trace, across every process it touches.

When the settings carry an Application Insights connection string, ``setup`` configures
Azure Monitor OpenTelemetry (identity-based ingestion when
``APPLICATIONINSIGHTS_AUTHENTICATION_STRING`` names a client id) and the
``orders.*`` counters. Without it, spans still work against whatever tracer
provider is installed (tests install an in-memory one), and cost nothing when
none is.

The trace context travels with the order: the submitter's span starts the
trace and its context is stored on the order record; dispatch, the agent and
the reply handler each continue it from the message they receive
(``AgentRequest.trace`` / ``AgentReply.trace``, also set as Service Bus
application properties); the supervisor continues it from the order record.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace

from observability.logs import get_logger
from observability.metrics import METRICS

log = get_logger(__name__)
_tracer = trace.get_tracer("orders")
_lock = threading.Lock()
_configured = False


def setup(connection: str | None, authentication: str | None = None) -> bool:
    """Configure Azure Monitor once per process, if there is a connection string
    (``APPLICATIONINSIGHTS_CONNECTION_STRING``; ``authentication`` is
    ``APPLICATIONINSIGHTS_AUTHENTICATION_STRING``)."""
    global _configured  # noqa: PLW0603
    with _lock:
        if _configured or not connection:
            return _configured
        from azure.monitor.opentelemetry import configure_azure_monitor
        from opentelemetry import metrics

        options: dict[str, Any] = {"logger_name": "", "connection_string": connection}
        auth = dict(part.split("=", 1) for part in (authentication or "").split(";") if "=" in part)
        if auth.get("Authorization", "").upper() == "AAD":
            from azure.identity import ManagedIdentityCredential

            options["credential"] = ManagedIdentityCredential(client_id=auth.get("ClientId"))
        configure_azure_monitor(**options)
        METRICS.use_meter(metrics.get_meter("orders"))
        _configured = True
        log.info("Azure Monitor OpenTelemetry configured")
        return True


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``, ``tracestate``)."""
    out: dict[str, str] = {}
    propagate.inject(out)
    return out


@contextmanager
def span(name: str, parent: Mapping[str, str] | None = None, **attributes: Any) -> Iterator[Any]:
    """A span continuing ``parent`` (a carrier from a message or the order record)."""
    context = propagate.extract(dict(parent)) if parent else None
    attrs = {k: v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(name, context=context, attributes=attrs) as current:
        yield current
