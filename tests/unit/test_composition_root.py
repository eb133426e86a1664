"""The composition root and the rooms it wires: the trigger modules reach the process's
app only through ``bootstrap.uses`` (and see the app a test installs), nothing is built
at import, each part is one object per app, and the console's reads go through the
operator's services (``admin/watch.py``, ``OrderAdmin.exists``), not a store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from admin.service import OrderAdmin
from admin.watch import PEEK, Watch
from bootstrap import bootstrap, reset_app_context, uses
from core.names import Names
from dashboard.figures import STUCK_ROW
from dashboard.ports import RowWrite
from stores.memory import InMemoryStateStore
from tests.support import settings_from
from tests.unit.test_services_in_memory import (
    RecordingKeeper,
    RecordingQueues,
    RecordingTransport,
    build,
)

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Settings that are never reached: every part a test uses is in memory.
LOCAL = {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "AGENT_TRANSPORT": "storage"}


def test_a_trigger_module_sees_the_app_installed_and_the_next_one_at_its_next_call() -> None:
    instance = uses(lambda app: app.instance_id)
    first, second = SimpleNamespace(instance_id="first"), SimpleNamespace(instance_id="second")
    reset_app_context(first)  # type: ignore[arg-type]
    try:
        assert instance() == "first"
        reset_app_context(second)  # type: ignore[arg-type]
        assert instance() == "second"
    finally:
        reset_app_context(None)


def test_importing_every_trigger_module_builds_no_part_of_the_app() -> None:
    """A Function App imports every trigger module at its cold start: the app is built
    by the first invocation that uses it, not then."""
    code = (
        "import function_app, bootstrap\n"
        "assert bootstrap.current_app_context() is None, 'built at import'\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "AzureWebJobsStorage"}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_each_part_is_one_object_per_app_and_parts_share_their_parts() -> None:
    app = bootstrap(
        settings_from(LOCAL),
        store=InMemoryStateStore(),
        queues=RecordingQueues(),
        transport=RecordingTransport(),
        kept=RecordingKeeper(),
    )
    assert app.admin is app.admin
    assert app.watch is app.watch
    assert app.scheduler is app.scheduler
    assert app.dashboard is app.dashboard


def test_a_part_the_app_has_not_is_refused_by_name() -> None:
    settings = settings_from(LOCAL)
    with pytest.raises(TypeError, match="no part called 'stores'"):
        bootstrap(settings, stores=InMemoryStateStore())


# --- what the console reads, through the operator's services --------------------------------


def test_the_console_looks_an_order_up_through_the_operator_service() -> None:
    s = build()
    admin: OrderAdmin = s.admin
    s.scheduler.submit(json.dumps({"orderId": "o-1", "replyTo": "app-status"}).encode())
    assert admin.exists("o-1")
    assert not admin.exists("o-2")


@dataclass
class Peeked:
    content: str
    inserted_on: datetime = T0


class FakeQueue:
    def __init__(self, texts: list[str], trouble: Exception | None = None) -> None:
        self.texts, self.trouble = texts, trouble

    def get_queue_properties(self) -> Any:
        if self.trouble is not None:
            raise self.trouble
        return SimpleNamespace(approximate_message_count=len(self.texts))

    def peek_messages(self, max_messages: int) -> list[Peeked]:
        assert max_messages == PEEK
        return [Peeked(t) for t in self.texts[:max_messages]]


class FakeQueues:
    def __init__(self, queues: dict[str, FakeQueue]) -> None:
        self.queues = queues

    def client(self, queue: str) -> FakeQueue:
        return self.queues.get(queue) or FakeQueue([], ResourceNotFoundError("gone"))


class FakeKept:
    def __init__(self, summaries: list[Any]) -> None:
        self._summaries = summaries

    def summaries(self, limit: int = 100) -> list[Any]:
        return self._summaries[:limit]


def watch_of(queues: dict[str, FakeQueue], store: InMemoryStateStore | None = None) -> Watch:
    return Watch(
        store or InMemoryStateStore(),
        FakeKept([]),  # type: ignore[arg-type]
        FakeQueues(queues),  # type: ignore[arg-type]
        Names(),
    )


def test_the_alerts_are_peeked_newest_first() -> None:
    names = Names()
    older, newer = json.dumps({"at": "2026-01-01T00:00:00Z"}), json.dumps({"at": "2026-01-02"})
    watch = watch_of({names.operator_alerts: FakeQueue([older, newer])})
    alerts = watch.alerts()
    assert alerts.count == 2
    assert [m["body"]["at"] for m in alerts.messages] == ["2026-01-02", "2026-01-01T00:00:00Z"]


def test_rejected_lists_only_queues_with_messages_or_trouble_and_never_shows_a_token() -> None:
    names = Names()
    poisoned = names.agent_replies + "-poison"  # an agent message: its token never shows
    request = json.dumps({"orderId": "o-1", "token": "secret-token"})
    watch = watch_of(
        {
            names.orders_rejected: FakeQueue([]),
            poisoned: FakeQueue([request]),
            names.poison_queues()[0]: FakeQueue([], HttpResponseError("down")),
        }
    )
    waiting = {w.queue: w for w in watch.rejected()}
    assert names.orders_rejected not in waiting  # empty: not listed
    assert waiting[names.poison_queues()[0]].problem == (
        f"could not read {names.poison_queues()[0]}: HttpResponseError"
    )
    assert not names.holds_orders(poisoned)
    assert "secret-token" not in waiting[poisoned].messages[0]["text"]
    assert waiting[poisoned].messages[0]["body"]["orderId"] == "o-1"


def test_the_stuck_list_and_the_figures_are_read_through_the_watch() -> None:
    store = InMemoryStateStore()
    store.write_dashboard([RowWrite(STUCK_ROW, {"Steps": "[]", "CheckedAt": T0})])
    watch = watch_of({}, store)
    assert [r.row for r in watch.stuck_rows()] == [STUCK_ROW]
    assert watch.read_outages() == {}
    assert [r.row for r in watch.dashboard_rows(STUCK_ROW, STUCK_ROW + "~")] == [STUCK_ROW]


def test_the_root_hands_core_the_apps_host_name_from_the_settings() -> None:
    """Core reads no environment: the links a step hands out (``events_url``) are built on
    the host the settings read once, set by the composition root."""
    from core import links

    try:
        bootstrap(settings_from({**LOCAL, "WEBSITE_HOSTNAME": "app.example:7071"}))
        assert links.served_at() == "app.example:7071"
        bootstrap(settings_from(LOCAL))
        assert links.served_at() == ""
    finally:
        links.serve_at("")
