"""The operator's command line: the operations of the HTTP API, against any storage.

    python -m admin show ORDER_ID
    python -m admin list --status error [--page-size 50] [--token T] [--all]
    python -m admin orders --where FIELD=VALUE [--status S] [--workflow W] [--page-size 50]
                           [--token T] [--all]
    python -m admin resubmit ORDER_ID [--reason TEXT] [--patch JSON|@FILE] [--as NAME]
    python -m admin cancel ORDER_ID [--reason TEXT] [--not-applied STEP ...] [--as NAME]
    python -m admin event ORDER_ID NAME (--result JSON | --refuse REASON) [--reason TEXT]
                                        [--as NAME]
    python -m admin repair-index ORDER_ID
    python -m admin drain-legacy-requests [--dry-run]
    python -m admin alerts [--peek N]
    python -m admin kept [list] [--limit N]
    python -m admin kept [show] ROW
    python -m admin kept delete ROW
    python -m admin purge [--dry-run] [--older-than DURATION] [--workflow W] [--status S]
    python -m admin restore ORDER_ID
    python -m admin workflows
    python -m admin agents-json [--write]
    python -m admin deploy-check [--declarations MODULE] [--sample N] [--max-orders N]
                                 [--recent N]
    python -m admin agents [list]
    python -m admin agents pause NAME --reason TEXT [--as NAME]
    python -m admin agents resume NAME [--reason TEXT] [--as NAME]
    python -m admin agents limits NAME [--concurrency N|declared] [--rate R|declared]
                                       [--reset] [--reason TEXT] [--as NAME]
    python -m admin agents audit [--agent NAME] [--page-size N] [--token T]

Storage comes from ``AzureWebJobsStorage`` (connection string) or
``AzureWebJobsStorage__accountName`` (your az login / managed identity), or
``--connection``. Changes are recorded in the order's history as made by your OS
user name, or by ``--as NAME`` (``--by`` is the same). Output is JSON. Exit status:
0 done, 1 refused (the order is not in a state that allows it), 2 bad usage,
3 storage did not answer or the outcome of a change is unknown (read the order,
then retry), 4 order (or kept message) not found, 5 the order's records cannot be read.
``deploy-check``: 0 safe to deploy (notes may say what changes), 1 refused (the JSON
names the orders and what they need), 2 the declarations cannot be loaded, 3 storage
did not answer.

``kept``: messages too large to ride inside their alert (poison and dead-letter queues)
or their record (``orders-rejected``, quarantine in ``<queue>-poison``) are kept in the
state table; the alert or record names one by its ``keptAs`` row key. ``kept`` lists
them (oldest first, with a preview); ``kept show ROW`` (or ``kept ROW``) prints one
whole (``text``: the message exactly; its base64 when ``encoding`` is ``base64``: it
was not UTF-8); ``kept delete ROW`` removes one once dealt with.

``purge`` archives finished orders past their retention (the ``RETENTION`` setting, or
``--older-than``; ``error`` orders only with ``--status error``) to the Blob container
``orders-archive`` and then deletes their rows; ``--dry-run`` says what would go.
``restore`` puts an archived order back (docs/contracts.md §3.12).

``agents``: the agents at runtime (docs/contracts.md §3.7, as ``GET /api/agents``):
pause one (its steps wait, Pending, uncounted, without an alert, on every instance
within seconds), resume it, override its limits per instance (``--concurrency`` calls
at once, ``--rate`` calls a second; ``declared`` or ``--reset`` goes back to the
declaration), and the audit of every such change, newest first. Exit 4: no such agent;
1: refused (already paused, not paused, nothing to change).

``workflows`` and ``agents-json`` read only the declarations (``declarations/``, or the
module ``ORDERS_DECLARATIONS`` names), never storage. ``workflows`` prints the workflows
and agents as ``GET /api/workflows`` does. ``agents-json`` prints ``infra/agents.json``,
the agents as Bicep deploys them (one Service Bus request queue, its Storage poison
queue, role assignments and app settings each); ``--write`` also writes it. Run
``python -m admin agents-json --write`` after changing an agent, and commit the file:
``tests/unit/test_agents_json.py`` fails while it is out of date.

``deploy-check`` (the azd ``predeploy`` and ``preprovision`` hooks run it) compares the
declarations about to deploy (``ORDERS_DECLARATIONS``, default ``declarations``, or
``--declarations MODULE``) and ``infra/agents.json`` with the plans of the orders in
flight (``admin/deploycheck.py`` says exactly what it refuses and why). It prints the
in-flight orders per plan (workflow, fingerprint, steps with their agents, counts, a
sample of ``--sample`` ids), the refusals (each naming the orders and the steps they
still need) and notes (safe changes worth knowing). It reads the in-flight orders
through the status index, 100 ids a page, at most ``--max-orders`` (more: refused as
incomplete), and the ``--recent`` newest orders of each finished status.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from azure.core.exceptions import AzureError

from admin import deploycheck, inflight
from admin.agent_admin import apply_change, parse_change
from admin.archiving import show_or_where
from admin.drain import drain
from admin.query import LIST_PARAMS, one_field_at_a_time, parse_filter, searchable_text
from bootstrap import (
    AppContext,
    bootstrap,
    declarations_from_environment,
    settings_from_environment,
)
from config.settings import AGENT_TRANSPORT, DECLARATIONS, STORAGE
from core import workflows
from core.errors import (
    AgentNotFound,
    ConcurrencyConflict,
    CorruptOrder,
    OrderAlreadyExists,
    OrderError,
    OrderNotFound,
    StorageUnavailable,
    TransitionRefused,
)
from core.limits import DEFAULT_DECLARATIONS
from core.names import Names, poison
from core.order_message import strict_json
from core.ports import ListFilter
from core.retention import ARCHIVABLE, parse_duration
from core.states import OrderStatus
from core.timefmt import iso
from stores.kept import KeptMessages, as_shown

#: Where ``agents-json --write`` writes; ``infra/main.bicep`` reads it (loadJsonContent).
AGENTS_JSON: Final = Path(__file__).resolve().parents[1] / "infra" / "agents.json"
AGENTS_JSON_COMMAND: Final = "python -m admin agents-json --write"


def agents_json(agents: Mapping[str, workflows.Agent] | None = None) -> dict[str, Any]:
    """``infra/agents.json``: each declared agent (by name) as Bicep deploys it.

    ``queue``: its Service Bus request queue; ``poisonQueue``: the Storage queue where its
    malformed messages are quarantined; ``urlSetting``: the app setting of its base URL
    (http agents; null for python ones); ``apiKeySetting``: the setting holding its key
    (ApiKey agents, else null); ``scope``: its Entra ID scope (EntraToken agents, else
    null). Every agent has every key, so Bicep reads them without checking.
    """
    declared = workflows.AGENTS if agents is None else agents
    names = Names()
    entries = []
    for name in sorted(declared):
        agent = declared[name]
        queue = names.agent_queue(agent.name)
        auth = agent.auth
        entries.append(
            {
                "name": agent.name,
                "queue": queue,
                "poisonQueue": poison(queue),
                "kind": agent.kind,
                "auth": auth.kind,
                "urlSetting": agent.url_setting if agent.kind == "http" else None,
                "apiKeySetting": (
                    agent.api_key_setting if isinstance(auth, workflows.ApiKey) else None
                ),
                "scope": auth.scope if isinstance(auth, workflows.EntraToken) else None,
            }
        )
    return {
        "$comment": (
            "Generated from the agent declarations (declarations/) by "
            f"`{AGENTS_JSON_COMMAND}`: never edit it by hand, regenerate it. "
            "infra/main.bicep reads it to create each agent's Service Bus request queue, "
            "its Storage poison queue, the app identity's roles on the queue and the "
            "agent's app settings (docs/deployment.md, 'Agents')."
        ),
        "agents": entries,
    }


def agents_json_text(agents: Mapping[str, workflows.Agent] | None = None) -> str:
    """``agents_json`` exactly as the file holds it."""
    return json.dumps(agents_json(agents), indent=2, ensure_ascii=False) + "\n"


def workflows_json() -> dict[str, Any]:
    """The workflows and agents as declared, in the shape of ``GET /api/workflows``."""
    return {
        "workflows": [workflows.WORKFLOWS[n].describe() for n in sorted(workflows.WORKFLOWS)],
        "agents": [workflows.AGENTS[n].describe() for n in sorted(workflows.AGENTS)],
    }


def _declarations_command(args: argparse.Namespace, source: str) -> int:
    """``workflows`` and ``agents-json``: the declarations only, no storage."""
    try:
        if args.command == "workflows":
            _print(workflows_json())
            return 0
        text = agents_json_text()
    except workflows.DeclarationError as exc:
        _print({"error": str(exc)})
        return 2
    print(text, end="")
    if source != DEFAULT_DECLARATIONS:
        print(
            f"note: from {DECLARATIONS}={source}, not the deployed {DEFAULT_DECLARATIONS}/",
            file=sys.stderr,
        )
    if args.write:
        AGENTS_JSON.write_text(text, encoding="utf-8")
        print(f"wrote {AGENTS_JSON}", file=sys.stderr)
    return 0


def _context(connection: str | None) -> AppContext:
    return bootstrap(
        settings_from_environment(
            {STORAGE: connection} if connection else None,
            # Storage queues unless the environment says Service Bus (only the drain sends)
            defaults={AGENT_TRANSPORT: "storage"},
        )
    )


def os_user() -> str:
    """Who runs the CLI, for the order's history (``--as`` overrides it)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        return f"uid-{os.getuid()}" if hasattr(os, "getuid") else "unknown-user"


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _retention_parsers(sub: Any) -> None:
    """``purge`` and ``restore`` (docs/contracts.md §3.12)."""
    purge = sub.add_parser(
        "purge",
        help="archive finished orders past their retention to Blob Storage, then delete "
        "them (default: the RETENTION setting's rules)",
    )
    purge.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    purge.add_argument(
        "--older-than", metavar="DURATION", help="finished this long ago (0s, 15m, 12h, 30d)"
    )
    purge.add_argument("--workflow", help="only orders of this workflow")
    purge.add_argument(
        "--status",
        choices=[str(s) for s in ARCHIVABLE],
        help="only orders with this status (error orders go only when named here)",
    )
    purge.add_argument(
        "--limit", type=int, default=None, help="at most this many orders (RETENTION_BATCH)"
    )
    restore = sub.add_parser("restore", help="put an archived order back in the table")
    restore.add_argument("order_id")


def _event_parser(sub: Any) -> None:
    """``event`` (docs/contracts.md §3.13), as ``POST /api/orders/{id}/events/{name}``."""
    event = sub.add_parser(
        "event",
        help="deliver an event to an order (an approval, a callback): its waiting step takes "
        "it, or it is kept for the step that will",
    )
    event.add_argument("order_id")
    event.add_argument("name", help="the event's name, as the order's workflow declares it")
    given = event.add_mutually_exclusive_group(required=True)
    given.add_argument("--result", metavar="JSON", help="the event's result: a JSON object")
    given.add_argument("--refuse", metavar="REASON", help="refuse it: the step fails for good")
    event.add_argument("--reason", default="", help="a note for the order's history")
    event.add_argument("--as", "--by", dest="by", default=None, metavar="NAME")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m admin", description="Operate on orders.")
    parser.add_argument("--connection", help="storage connection string (default: env)")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="an order with every step and attempt")
    show.add_argument("order_id")
    listing = sub.add_parser(
        "list",
        aliases=["orders"],
        help="orders with a status, or found by a field (--where), a page at a time",
    )
    listing.add_argument(
        "--status",
        default=None,
        choices=[s.value for s in OrderStatus],
        help="orders with this status (required without --where)",
    )
    listing.add_argument(
        "--where",
        action="append",
        default=None,
        metavar="FIELD=VALUE",
        help='orders whose data (or a step\'s result: search=("<step>.<FIELD>",)) has '
        "exactly VALUE in FIELD, a field a workflow searches by (Workflow(..., search=...); "
        "python -m admin workflows lists them); of any status unless --status names one. "
        "One field at a time, as the API",
    )
    listing.add_argument("--workflow", default=None, help="only orders of this workflow")
    listing.add_argument("--page-size", type=int, default=50)
    listing.add_argument("--token", default=None, help="continuationToken of the last page")
    listing.add_argument("--all", action="store_true", help="follow every page")
    _change_parsers(sub)
    _event_parser(sub)
    repair = sub.add_parser(
        "repair-index", help="rebuild an order's index rows from its state (idempotent)"
    )
    repair.add_argument("order_id")
    drain_cmd = sub.add_parser(
        "drain-legacy-requests",
        help="upgrading: move the requests waiting on the retired shared agent-requests "
        "queue to their agents' queues (AGENT_TRANSPORT says where that queue is)",
    )
    drain_cmd.add_argument("--dry-run", action="store_true", help="list them, move nothing")
    alerts = sub.add_parser("alerts", help="operator alerts waiting on the queue (not removed)")
    alerts.add_argument("--peek", type=int, default=32)
    kept = sub.add_parser(
        "kept", help="messages kept because they were too large for their alert or record"
    )
    kept.add_argument(
        "words",
        nargs="*",
        metavar="[list | show ROW | delete ROW | ROW]",
        help="list them (the default), show one whole (ROW alone shows it too), delete one; "
        "ROW is the keptAs of the alert or record",
    )
    kept.add_argument("--limit", type=int, default=100, help="list at most this many")
    submit = sub.add_parser(
        "submit", help="post an order message (JSON) to the orders queue, as an app does"
    )
    submit.add_argument("order_json", metavar="JSON", help='e.g. \'{"orderId": "o-1"}\'')
    _retention_parsers(sub)
    sub.add_parser("workflows", help="the declared workflows and agents (GET /api/workflows)")
    agents = sub.add_parser(
        "agents-json",
        help="infra/agents.json (the agents for Bicep), generated from the declarations",
    )
    agents.add_argument(
        "--write", action="store_true", help=f"also write it to {AGENTS_JSON.name} in infra/"
    )
    check = sub.add_parser(
        "deploy-check",
        help="refuse declarations that remove an agent or step orders in flight still need",
    )
    check.add_argument(
        "--declarations",
        default=None,
        metavar="MODULE",
        help=f"the declarations to check (default: {DECLARATIONS}, else {DEFAULT_DECLARATIONS})",
    )
    check.add_argument(
        "--sample",
        type=int,
        default=deploycheck.SAMPLE,
        help=f"order ids listed per plan or refusal (at most {deploycheck.MAX_SAMPLE})",
    )
    check.add_argument(
        "--max-orders",
        type=int,
        default=inflight.MAX_ORDERS,
        help="orders in flight to read at most (more: refused as incomplete)",
    )
    check.add_argument(
        "--recent",
        type=int,
        default=inflight.RECENT,
        help="newest orders of each finished status to read (what the deployed version plans)",
    )
    _agents_parser(sub)
    args = parser.parse_args(argv)
    if args.command in ("list", "orders") and len(args.where or ()) > 1:
        # The API's 400 for two search fields: never a search of the last one given.
        listing.error(one_field_at_a_time(w.partition("=")[0] for w in args.where))
    if args.command == "kept":
        words = list(args.words)
        if not words or words == ["list"]:
            args.kept_command, args.row = "list", None
        elif len(words) == 2 and words[0] in ("show", "delete"):
            args.kept_command, args.row = words
        elif len(words) == 1 and words[0] not in ("show", "delete"):
            args.kept_command, args.row = "show", words[0]
        else:
            kept.error("use: kept [list] | kept show ROW | kept delete ROW | kept ROW")
    return args


def _agents_parser(sub: Any) -> None:
    agents = sub.add_parser(
        "agents", help="the agents at runtime: list, pause, resume, limits, audit"
    )
    words = agents.add_subparsers(dest="agents_command")
    words.add_parser("list", help="every declared agent: paused or not, its limits")
    who = argparse.ArgumentParser(add_help=False)
    who.add_argument(
        "--as",
        "--by",
        dest="by",
        default=None,
        metavar="NAME",
        help="who, for the audit (default: your OS user name)",
    )
    pause = words.add_parser("pause", parents=[who], help="stop calling the agent's remote")
    pause.add_argument("name")
    pause.add_argument("--reason", required=True, help="why, for the audit")
    resume = words.add_parser("resume", parents=[who], help="call the agent's remote again")
    resume.add_argument("name")
    resume.add_argument("--reason", default="")
    limits = words.add_parser(
        "limits", parents=[who], help="override the agent's limits (per instance)"
    )
    limits.add_argument("name")
    limits.add_argument("--concurrency", metavar="N|declared", help="calls at once")
    limits.add_argument("--rate", metavar="R|declared", help="calls a second")
    limits.add_argument("--reset", action="store_true", help="both back to the declaration")
    limits.add_argument("--reason", default="")
    audit = words.add_parser("audit", help="every pause, resume and limit change, newest first")
    audit.add_argument("--agent", default=None)
    audit.add_argument("--page-size", type=int, default=50)
    audit.add_argument("--token", default=None, help="continuationToken of the last page")


def _agents(ctx: AppContext, args: argparse.Namespace) -> int:
    admin = ctx.agents_admin
    command = args.agents_command or "list"
    if command == "list":
        _print({"agents": admin.list()})
        return 0
    if command == "audit":
        _print(admin.audit(args.page_size, args.token, args.agent))
        return 0
    fields: dict[str, object] = {"reason": args.reason}
    if command == "limits":
        if args.reset and (args.concurrency or args.rate):
            raise ValueError("--reset sets both limits back: give it alone")
        fields["concurrency"] = "declared" if args.reset else args.concurrency
        fields["rate"] = "declared" if args.reset else args.rate
    admin.spec(args.name)  # an unknown agent: exit 4, whatever else is wrong
    change = parse_change(command, fields)
    _print(apply_change(admin, args.name, change, args.by or os_user()))
    return 0


def _kept(ctx: AppContext, args: argparse.Namespace) -> int:
    kept = KeptMessages(ctx.store.table)
    if args.kept_command == "list":
        _print(
            [
                {
                    "keptAs": k.row,
                    "queue": k.queue,
                    "reason": k.reason,
                    "at": iso(k.at),
                    "encoding": k.encoding,
                    "length": k.length,
                    "preview": k.preview,
                }
                for k in (as_shown(s, ctx.names) for s in kept.summaries(max(args.limit, 1)))
            ]
        )
        return 0
    if args.kept_command == "show":
        message = kept.get(args.row)
        if message is None:
            _print({"error": f"no kept message {args.row}"})
            return 4
        message = as_shown(message, ctx.names)  # an agent message: without its tokens
        _print(
            {
                "keptAs": message.row,
                "queue": message.queue,
                "reason": message.reason,
                "at": iso(message.at),
                "encoding": message.encoding,
                "length": message.length,
                "truncated": message.truncated,
                "text": message.text,
            }
        )
        return 0
    if not kept.delete(args.row):
        _print({"error": f"no kept message {args.row}"})
        return 4
    _print({"deleted": args.row})
    return 0


def _purge(ctx: AppContext, args: argparse.Namespace) -> dict[str, Any]:
    status = OrderStatus(args.status) if args.status else None
    older = parse_duration(args.older_than) if args.older_than is not None else None
    rules = ctx.retainer.rules.cli_run(status, args.workflow, older)
    if older is None and not rules.rules:
        raise ValueError(
            f"no retention rule names {args.status or 'a status'}"
            f"{' of workflow ' + args.workflow if args.workflow else ''} "
            f"(RETENTION is {ctx.retainer.rules}): give --older-than"
        )
    if args.limit is not None and args.limit < 1:
        raise ValueError("--limit must be at least 1")
    # Kept messages go with the plain run (the timer's), not with one narrowed to orders.
    plain = args.status is None and args.workflow is None and args.older_than is None
    return ctx.retainer.purge(
        dry_run=args.dry_run, rules=rules, limit=args.limit, kept_messages=plain
    ).to_json()


def _run(ctx: AppContext, args: argparse.Namespace) -> int:
    admin = ctx.admin
    if args.command == "show":
        _print(show_or_where(admin, ctx.retainer, args.order_id))
    elif args.command in ("list", "orders"):
        where = _where(args)
        page = admin.page(where, args.page_size, args.token)
        if args.all:
            orders = list(page["orders"])
            while page["continuationToken"]:
                page = admin.page(where, args.page_size, page["continuationToken"])
                orders += page["orders"]
            page = {"orders": orders, "continuationToken": None}
        _print(page)
    elif args.command == "resubmit":
        patch = None if args.patch is None else _patch(args.patch)
        _print(admin.resubmit(args.order_id, args.by or os_user(), args.reason, patch))
    elif args.command == "event":
        body: dict[str, Any] = (
            {"result": json.loads(args.result)}  # not JSON: a ValueError, exit 2
            if args.result is not None
            else {"refused": args.refuse}
        )
        if args.reason:
            body["reason"] = args.reason
        effect, view = admin.deliver_event(args.order_id, args.name, body, args.by or os_user())
        _print({"event": args.name, "effect": effect, **view})
    elif args.command == "cancel":
        _print(admin.cancel(args.order_id, args.by or os_user(), args.reason, args.not_applied))
    elif args.command == "repair-index":
        _print(admin.repair_index(args.order_id))
    elif args.command == "drain-legacy-requests":
        drained = drain(
            ctx.legacy_requests, ctx.store, ctx.transport, ctx.clock, dry_run=args.dry_run
        )
        _print(drained.as_json())
    elif args.command == "alerts":
        client = ctx.queues.client(ctx.names.operator_alerts)
        _print(
            [json.loads(m.content) for m in client.peek_messages(max_messages=min(args.peek, 32))]
        )
    elif args.command == "kept":
        return _kept(ctx, args)
    elif args.command == "agents":
        return _agents(ctx, args)
    elif args.command == "purge":
        _print(_purge(ctx, args))
    elif args.command == "restore":
        _print(ctx.retainer.restore(args.order_id))
    elif args.command == "submit":
        body = json.loads(args.order_json)  # not JSON: a ValueError, exit 2
        if not isinstance(body, dict):
            raise ValueError("an order message is a JSON object")
        ctx.queues.client(ctx.names.orders).send_message(json.dumps(body))
        _print({"submitted": body.get("orderId"), "queue": ctx.names.orders})
    return 0


def _where(args: argparse.Namespace) -> ListFilter:
    """``list`` / ``orders``: the filter of ``GET /api/orders`` (``admin.query``), a
    ValueError (exit 2) saying what to give instead."""
    params = {"status": args.status or "", "workflow": args.workflow or ""}
    if args.where:
        if len(args.where) > 1:  # parse_args refuses it first
            raise ValueError(one_field_at_a_time(w.partition("=")[0] for w in args.where))
        field_name, equals, value = args.where[0].partition("=")
        if not equals or not field_name or field_name in LIST_PARAMS:
            raise ValueError(
                f"--where takes FIELD=VALUE, like customerId=c-42; {searchable_text()}"
            )
        if not value:
            raise ValueError(f"--where {field_name}= needs a value to search for")
        params[field_name] = value
    elif args.status is None:
        raise ValueError("give --status, or --where FIELD=VALUE to search")
    return parse_filter(params)


def _target(module: str) -> deploycheck.Target:
    """The declarations ``module`` (put to use by the bootstrap) and ``infra/agents.json``."""
    agents, flows = dict(workflows.AGENTS), dict(workflows.WORKFLOWS)  # imported, checked
    try:
        committed = AGENTS_JSON.read_text(encoding="utf-8")
        infra = frozenset(str(a["name"]) for a in json.loads(committed)["agents"])
    except (OSError, ValueError, KeyError, TypeError):
        return deploycheck.Target(module, agents, flows, None, infra_current=False)
    return deploycheck.Target(module, agents, flows, infra, committed == agents_json_text(agents))


def _deploy_check(args: argparse.Namespace) -> int:
    overrides = {AGENT_TRANSPORT: "storage"}  # it reads the state table and sends nothing
    if args.connection:
        overrides[STORAGE] = args.connection
    if args.declarations:
        overrides[DECLARATIONS] = args.declarations
    try:
        ctx = bootstrap(settings_from_environment(overrides))
        module = ctx.settings.declarations
        try:
            target = _target(module)
        except Exception as exc:  # noqa: BLE001 - importing the user's module may raise anything
            _print({"error": f"the declarations {module} cannot be loaded: {exc!r}"})
            return 2
        check = inflight.read(
            ctx.store,
            deploycheck.DeployCheck(target, args.sample),
            max_orders=max(args.max_orders, 1),
            recent=max(min(args.recent, 100), 0),
        )
    except (StorageUnavailable, AzureError) as exc:
        message = exc.message if isinstance(exc, StorageUnavailable) else str(exc)
        _print({"error": f"the state table could not be read: {message}", "retryable": True})
        return 3
    except ValueError as exc:  # a setting missing or invalid
        _print({"error": str(exc)})
        return 2
    _print(check.report())
    return 1 if check.refused else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command in ("workflows", "agents-json"):
        return _declarations_command(args, declarations_from_environment())
    if args.command == "deploy-check":
        try:
            return _deploy_check(args)
        except Exception as exc:  # noqa: BLE001 - exit 1 means "refused": never for a crash
            _print({"error": f"the check could not run: {exc!r}"})
            return 2
    try:
        return _run(_context(args.connection), args)
    except (OrderNotFound, AgentNotFound) as exc:
        _print({"error": exc.message})
        return 4
    except OrderAlreadyExists as exc:
        _print({"error": exc.message})
        return 1
    except TransitionRefused as exc:
        _print({"error": exc.message, "reason": exc.reason})
        return 1
    except (StorageUnavailable, ConcurrencyConflict) as exc:
        _print({"error": exc.message, "retryable": True})
        print(exc.message, file=sys.stderr)
        return 3
    except CorruptOrder as exc:
        _print({"error": exc.message})
        return 5
    except (OrderError, ValueError) as exc:
        _print({"error": str(exc)})
        return 2


def _change_parsers(sub: Any) -> None:
    for name, text in (
        ("resubmit", "put an error order back to work at its failed step"),
        ("cancel", "stop an unfinished order and undo what it did"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("order_id")
        command.add_argument(
            "--as",
            "--by",
            dest="by",
            default=None,
            metavar="NAME",
            help="who, for the order's history (default: your OS user name)",
        )
        command.add_argument("--reason", default="", help="why, for the order's history")
        if name == "resubmit":
            command.add_argument(
                "--patch",
                default=None,
                metavar="JSON|@FILE",
                help="fix the order's data first: a JSON merge patch (RFC 7386), e.g. "
                '\'{"address": {"zip": "10115"}}\' (null removes a field), or @FILE to read it '
                "from a file; only for a failed step known not to have applied",
            )
        if name == "cancel":
            command.add_argument(
                "--not-applied",
                default=None,
                action="append",
                metavar="STEP",
                help="state that STEP (which may have applied and cannot be undone) did not "
                "happen: a cancel that would undo the other steps around it needs this, for "
                "each such step (repeat it)",
            )


def _patch(text: str) -> Any:
    """``--patch``: JSON, or ``@FILE``; a ValueError (exit 2) saying what is wrong."""
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as patch_file:
            text = patch_file.read()
    try:
        return strict_json(text)
    except ValueError as exc:
        raise ValueError(f"--patch must be a JSON object ({exc})") from None


if __name__ == "__main__":
    sys.exit(main())
