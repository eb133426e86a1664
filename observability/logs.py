"""Logging with the order's context on every record.

``with order_context(order_id=..., step=..., attempt=...)`` puts the fields in
a context variable; ``OrderContextFilter`` copies them onto every record
(``record.orderId`` etc., which OpenTelemetry exports as custom dimensions)
and ``log`` appends them to the message text, so they also survive paths
that keep only the text (the Functions host's own log forwarding).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

from core.messages import alert_step

_FIELDS = ("orderId", "step", "attempt")
#: Loggers that write a line or two for every HTTP request at INFO: the Azure SDKs' HTTP
#: logging policy (each Storage request and its answer, headers listed) and httpx (each
#: remote call, which the agent logs itself). In Azure the Functions worker forwards INFO
#: to the host and Application Insights: about 0.1 ms of CPU per Storage request measured
#: with a handler that writes nowhere (more through the worker's), and a trace per request
#: in the bill. ``quiet_request_logs`` sets them to WARNING unless a level was set.
REQUEST_LOGGERS = ("azure.core.pipeline.policies.http_logging_policy", "httpx")
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "order_context", default=MappingProxyType({})
)


@contextmanager
def order_context(
    order_id: str | None = None, step: str | None = None, attempt: int | None = None
) -> Iterator[None]:
    current = dict(_context.get())
    for key, value in (("orderId", order_id), ("step", step), ("attempt", attempt)):
        if value is not None:
            current[key] = value
    token = _context.set(current)
    try:
        yield
    finally:
        _context.reset(token)


def quiet_request_logs() -> None:
    """Per-request INFO lines off (``REQUEST_LOGGERS``); a level set elsewhere (an
    operator's logging configuration, a test) is kept."""
    for name in REQUEST_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


class OrderContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _context.get()
        for key in _FIELDS:
            if not hasattr(record, key):
                setattr(record, key, ctx.get(key, ""))
        return True


class OrderLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger whose messages end with `` [orderId=.. step=.. attempt=..]``."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        ctx = dict(_context.get())
        extra = dict(kwargs.pop("extra", None) or {})
        for key in _FIELDS:
            if key in extra:
                ctx[key] = extra[key]
        extra.update({k: ctx.get(k, "") for k in _FIELDS})
        kwargs["extra"] = extra
        parts = [f"{k}={ctx[k]}" for k in _FIELDS if ctx.get(k) not in (None, "")]
        return (f"{msg} [{' '.join(parts)}]" if parts else msg), kwargs


def get_logger(name: str) -> OrderLogger:
    logger = logging.getLogger(name)
    if not any(isinstance(f, OrderContextFilter) for f in logger.filters):
        logger.addFilter(OrderContextFilter())
    return OrderLogger(logger, {})


def log_operator_alert(
    log: OrderLogger,
    order_id: object,
    step: object,
    failure_count: object,
    reason: object,
    **extra: Any,
) -> None:
    """The ERROR record of an operator alert. The alert rule in infra/ matches its text:
    keep it stable. Every alert (outbox, sweep, poison) writes it through here, with the
    step its alert message carries (``core.messages.alert_step``: declared names only)."""
    step, _ = alert_step(step)
    with order_context(
        order_id=str(order_id) if order_id else None, step=str(step) if step else None
    ):
        log.error(
            "OPERATOR ALERT order=%s step=%s failureCount=%s: %s",
            order_id,
            step,
            failure_count,
            reason,
            extra={
                "event": "operator_alert",
                "failureCount": failure_count,
                "reason": reason,
                **extra,
            },
        )
