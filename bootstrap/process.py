"""The process's app, and the one way a trigger module reaches it: ``uses``.

A trigger module says once, at its top, which parts it uses
(``_scheduler = uses(lambda app: app.scheduler)``); calling that accessor returns the
part of the process's app, which is bootstrapped from the environment on the first call
(never at import: a Function App imports every trigger module at its cold start).
Only the entry points may import this module (``tests/unit/test_import_rules.py``):
the ``*/triggers.py`` modules, ``function_app.py``, the local hosts and the tests. The
services, pages, views, stores and ``core`` are handed what they use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from bootstrap.parts import AppContext
from bootstrap.root import bootstrap, settings_from_environment

_lock = threading.Lock()
_context: AppContext | None = None


def app_context() -> AppContext:
    """The process's app: bootstrapped from the environment on first use."""
    global _context  # noqa: PLW0603 - the process-wide app
    with _lock:
        if _context is None:
            _context = bootstrap(settings_from_environment())
        return _context


def current_app_context() -> AppContext | None:
    """The process's app if it is bootstrapped already, else None (no I/O)."""
    with _lock:
        return _context


def reset_app_context(context: AppContext | None = None) -> None:
    """For tests and the local host: drop (or replace) the process-wide app."""
    global _context  # noqa: PLW0603
    with _lock:
        _context = context


def uses[T](pick: Callable[[AppContext], T]) -> Callable[[], T]:
    """What a trigger module uses of the process's app: ``pick`` of it, on each call (an
    attribute: each part is built once, on first use, by ``bootstrap/parts.py``; a test
    that installs another app with ``reset_app_context`` is seen at the next call)."""
    return lambda: pick(app_context())
