"""Helpers shared by integration and e2e tests."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.functions.decorators.http import HttpTrigger
from azure.storage.queue import QueueClient

from bootstrap import AppContext, bootstrap, reset_app_context
from config.principals import OPERATOR, Principal, SignIn
from config.settings import DECLARATIONS, Settings
from core.names import Names
from devhost.app_loader import FunctionSpec
from devhost.invoke import Invoker
from testkit.fakes import FakeClock as FakeClock  # noqa: PLC0414 - the tests import it from here
from tests import SUITE_DECLARATIONS


def settings_from(env: dict[str, str]) -> Settings:
    """``Settings.from_env(env)`` on the suite's declarations unless ``env`` names others
    (the tests never run on ``declarations/``, the deployment's own)."""
    return Settings.from_env({DECLARATIONS: SUITE_DECLARATIONS, **env})


#: The app registration of the tests' sign-in (a GUID, as SIGN_IN_CLIENT_ID must be).
CLIENT_ID = "00000000-0000-4000-8000-0000000000c1"
#: App Service authentication on, as Bicep and the platform set it in Azure.
SIGNED_IN = {"SIGN_IN_CLIENT_ID": CLIENT_ID, "WEBSITE_AUTH_ENABLED": "True"}
#: devhost's development principal by default: the developer, an operator.
DEV_OPERATOR = Principal("ops@devhost", frozenset({OPERATOR}), "devhost")


def client_principal(
    name: str, *roles: str, audience: str = CLIENT_ID, role_typ: str = "roles"
) -> dict[str, str]:
    """The headers App Service authentication sets for ``name`` signed in with ``roles``
    (``X-MS-CLIENT-PRINCIPAL``: base64 of the claims as JSON)."""
    claims = [
        {"typ": "aud", "val": audience},
        {"typ": "name", "val": name.split("@", maxsplit=1)[0].title()},
        {"typ": "preferred_username", "val": name},
        *({"typ": role_typ, "val": role} for role in roles),
    ]
    document = {"auth_typ": "aad", "claims": claims, "name_typ": "name", "role_typ": role_typ}
    encoded = base64.b64encode(json.dumps(document).encode()).decode()
    return {
        "X-MS-CLIENT-PRINCIPAL": encoded,
        "X-MS-CLIENT-PRINCIPAL-NAME": name,
        "X-MS-CLIENT-PRINCIPAL-IDP": "aad",
    }


def on_devhost(ctx: AppContext, principal: Principal | None = DEV_OPERATOR) -> AppContext:
    """``ctx`` as devhost runs it: a request that names no principal and no key is
    ``principal`` (what ORDERS_DEV_PRINCIPAL sets; the settings refuse it outside devhost,
    so the tests set it on the settings)."""
    ctx.settings = replace(ctx.settings, sign_in=SignIn(dev_default=principal))
    return ctx


@contextlib.contextmanager
def settings_only(sign_in: SignIn | None = None) -> Iterator[None]:
    """An app context of settings alone (no sign-in unless ``sign_in``): for a route that
    reads no store (the workflows' list) but still asks who calls."""
    reset_app_context(SimpleNamespace(settings=SimpleNamespace(sign_in=sign_in or SignIn())))  # type: ignore[arg-type]
    try:
        yield
    finally:
        reset_app_context(None)


@contextlib.contextmanager
def declarations(module: str = "tests.fixtures.flows") -> Iterator[None]:
    """The agents and workflows of ``module`` as the declarations, for the block (the
    tests' own: they never depend on what ``declarations/`` holds)."""
    from core import workflows

    before = workflows.in_use()
    workflows.use(module)
    try:
        yield
    finally:
        workflows.use(before)


def callback_token(order: Any, event: str, run: int = 1) -> str:
    """The capability of the URL ``events_url`` gives a remote for run ``run`` of ``event``
    of ``order`` (a ``core.model.Order``): what a test's remote calls back with."""
    from core.inbox import capability

    return capability(order.event_key, order.order_id, event, run)


def unanswered[M](reply: M) -> M:
    """A reply without the time its agent got the answer (``answeredAt``), to compare
    with one built from its request in a test."""
    return replace(reply, answered_at=None)  # type: ignore[type-var]


#: ``REPLY_QUEUES`` of ``make_context``: the queues the tests name as an order's ``replyTo``.
STATUS_QUEUES = "st-*"


def make_context(
    connection: str,
    tag: str,
    *,
    remote_url: str = "http://127.0.0.1:9",
    clock: Any = None,
    max_failures: int = 3,
    timeout: int = 30,
    inline_replies: bool = False,
    reply_queues: str = STATUS_QUEUES,
) -> AppContext:
    """The app, bootstrapped on a table and queues of its own (``tag``), with the Storage
    transport. ``inline_replies``: this instance runs the reply handler (its agents apply
    their replies in process); by default replies go through the reply queue, so a test
    can move each message by hand, hop by hop. ``reply_queues``: ``REPLY_QUEUES`` (the
    tests' status queues are ``st-<tag>``, made by ``status_queue``)."""
    settings = settings_from(
        {
            "AzureWebJobsStorage": connection,
            "AGENT_TRANSPORT": "storage",
            "REMOTE_SERVICE_URL": remote_url,
            "STEP_TIMEOUT_SECONDS": str(timeout),
            "MAX_FAILURE_COUNT": str(max_failures),
            "REPLY_QUEUES": reply_queues,
        }
    )
    ctx = bootstrap(
        replace(settings, inline_replies=inline_replies),
        names=Names.unique(tag),
        **({"clock": clock} if clock is not None else {}),
    )
    ctx.provision()
    return ctx


def status_queue(ctx: AppContext, tag: str) -> str:
    """``st-<tag>``, created: a ``replyTo`` queue must exist (the app never creates one)."""
    queue = f"st-{tag}"
    ctx.queues.ensure(queue)
    return queue


def drain(ctx: AppContext, queue: str, max_messages: int = 1000) -> list[str]:
    """Receive and delete everything visible on a queue; returns the texts."""
    client: QueueClient = ctx.queues.client(queue)
    texts: list[str] = []
    while len(texts) < max_messages:
        try:
            batch = list(
                client.receive_messages(
                    messages_per_page=32, max_messages=32, visibility_timeout=30
                )
            )
        except ResourceNotFoundError:
            return texts  # nobody ever sent to it
        if not batch:
            break
        for message in batch:
            texts.append(message.content)
            client.delete_message(message)
    return texts


def drain_json(ctx: AppContext, queue: str) -> list[dict[str, Any]]:
    return [json.loads(t) for t in drain(ctx, queue)]


def wait_for[T](
    condition: Callable[[], T | None],
    timeout: float,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Poll until ``condition()`` is truthy and return that value (so never None); fail
    with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


_FUNCTIONS: dict[str, Callable[..., Any]] = {}
#: The HTTP functions' triggers: name -> (route, methods, auth level), from the same list.
_HTTP: dict[str, tuple[str, tuple[str, ...], str]] = {}


def app_function(name: str) -> Callable[..., Any]:
    """A function of ``function_app`` by name, as the worker calls it: an ``async def``
    one (the agents) run to completion on an event loop, as the worker awaits it on its
    own. The app lists its functions only once per process
    (docs/contracts.md#fact-get-functions-once), so every test shares this one list."""
    if not _FUNCTIONS:
        import function_app

        for function in function_app.app.get_functions():
            named = function.get_function_name()
            assert named is not None, f"a function of function_app has no name: {function}"
            _FUNCTIONS[named] = function.get_user_function()
            trigger = function.get_trigger()
            if isinstance(trigger, HttpTrigger):
                methods = tuple(str(getattr(m, "value", m)) for m in trigger.methods or ())
                level = getattr(trigger.auth_level, "value", trigger.auth_level)
                _HTTP[named] = (str(trigger.route), methods, str(level))
    user = _FUNCTIONS[name]
    if inspect.iscoroutinefunction(user):
        return lambda *args, **kwargs: asyncio.run(user(*args, **kwargs))
    return user


def http_functions() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """Every HTTP function of ``function_app``: name -> (route, methods, auth level)."""
    app_function("get_order")  # lists the functions (once per process)
    return dict(_HTTP)


def run_cli(capsys: pytest.CaptureFixture[str], connection: str, *args: str) -> tuple[int, Any]:
    """``python -m admin --connection <connection> <args>``, in this process: its exit code
    and its JSON output (an object, or a list for ``alerts`` and ``kept``), captured by
    ``capsys``."""
    from admin.__main__ import main

    code = main(["--connection", connection, *args])
    return code, json.loads(capsys.readouterr().out)


def installed(storage_connection: str, tag: str) -> Iterator[AppContext]:
    """A context of its own (no simulator, wall clock), installed as the process's app
    context for the triggers under test, and removed afterwards (for a fixture); as
    devhost runs it, a request that names no principal and no key is an operator."""
    context = on_devhost(make_context(storage_connection, tag))  # the console: an operator
    reset_app_context(context)
    yield context
    reset_app_context(None)


def drain_requests(ctx: AppContext) -> list[str]:
    """Every agent request waiting, on every agent's queue."""
    texts: list[str] = []
    for queue in ctx.names.agent_queues():
        texts += drain(ctx, queue)
    return texts


def drain_requests_json(ctx: AppContext) -> list[Any]:
    return [json.loads(t) for t in drain_requests(ctx)]


def handle_request(ctx: AppContext, request: Any) -> Any:
    """Run an agent request (its text, or decoded) through its own agent, as its queue's
    function does."""
    from messaging.wire import decode_request

    decoded = decode_request(request) if isinstance(request, str | bytes) else request
    return asyncio.run(ctx.agent_for(decoded.agent).handle(decoded))


def call_handler(spec: FunctionSpec, trigger: Any) -> Any:
    """devhost's runner for its own unit tests: calls the test's handler with the trigger
    as devhost hands it over (hostrun/shapes.py; an async handler to completion). The app
    never runs this way: ``python -m devhost`` always goes through azure-functions-runtime
    (hostrun/)."""
    result = spec.func(**{spec.trigger_arg: trigger})
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def direct_invoker() -> Invoker:
    """An :class:`Invoker` calling test handlers (:func:`call_handler`)."""
    return Invoker(call_handler)


@dataclass
class MemoryLeases:
    """devhost's timer lock ``Leases`` in memory, with a clock (the same contract tests as
    ``devhost.singleton.BlobLeases`` run on both)."""

    clock: Callable[[], float] = time.monotonic
    _held: dict[str, tuple[str, float]] = field(default_factory=dict)

    def acquire(self, name: str, lease_id: str, seconds: int) -> bool:
        holder = self._held.get(name)
        if holder is not None and holder[0] != lease_id and self.clock() < holder[1]:
            return False
        self._held[name] = (lease_id, self.clock() + seconds)
        return True

    def release(self, name: str, lease_id: str) -> None:
        holder = self._held.get(name)
        if holder is not None and holder[0] == lease_id:
            del self._held[name]
