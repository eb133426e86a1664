"""The console's agents page: every declared agent, paused or not and its limits, the
pause, resume and limits forms (each through a confirmation page that changes nothing),
and the audit of every change, newest first. The use cases are the operator API's
(``admin.agent_admin.AgentAdmin``), so the console, the API and the CLI cannot disagree.
"""

from __future__ import annotations

from collections.abc import Mapping

import azure.functions as func

from admin.agent_admin import AgentAdmin, Change, parse_change
from console.pages import Page, form_of, guard
from core.control_cache import PERIOD
from core.errors import AgentNotFound, InvalidContinuationToken, TransitionRefused

AUDIT_PAGE = 50
#: The form fields of a change (what the confirm page carries to the POST).
FIELDS = ("action", "reason", "concurrency", "rate")


def listing(page: Page, admin: AgentAdmin) -> func.HttpResponse:
    token = page.req.params.get("auditPage") or None
    try:
        audit = admin.audit(AUDIT_PAGE, token)
    except InvalidContinuationToken as exc:
        return page.render("message.html", 400, message=str(exc), failed=True)
    return page.render(
        "agents.html",
        agents=admin.list(),
        audit=audit["entries"],
        next_token=audit["continuationToken"],
        period=int(PERIOD.total_seconds()),
    )


def _fields(params: Mapping[str, str]) -> dict[str, str]:
    fields = {k: (params.get(k) or "").strip() for k in FIELDS}
    if params.get("reset"):  # the limits form's "back to the declaration"
        fields["concurrency"] = fields["rate"] = "declared"
    return fields


def _checked(fields: Mapping[str, str]) -> Change:
    action = fields["action"]
    given = {k: v for k, v in fields.items() if k != "action"}
    if action != "limits":
        given = {"reason": given["reason"]}
    return parse_change(action, given)


def confirm(page: Page, admin: AgentAdmin, agent: str, by: str) -> func.HttpResponse:
    """What the change would do, and the button that does it (GET: nothing changes)."""
    if page.read_only:
        return page.render("message.html", 403, message="The console is read-only here.")
    fields = _fields(page.req.params)
    try:
        admin.spec(agent)
        change = _checked(fields)
        before, after = admin.preview(agent, change, by)
    except AgentNotFound as exc:
        return page.render("message.html", 404, message=exc.message, failed=True)
    except ValueError as exc:
        return page.redirect("/agents", {"message": f"{agent}: {exc}", "failed": 1})
    except TransitionRefused as exc:
        return page.redirect("/agents", {"message": f"Refused: {exc.message}", "failed": 1})
    return page.render(
        "agent_confirm.html",
        agent=agent,
        change=change,
        fields=fields,
        before=before,
        after=after,
        period=int(PERIOD.total_seconds()),
    )


def change(page: Page, admin: AgentAdmin, agent: str, by: str) -> func.HttpResponse:
    """The confirmed change (POST, CSRF-checked); back to the agents page with what was
    done, or why it was refused."""
    form = form_of(page.req)
    refused = guard(page, form)
    if refused is not None:
        return refused
    try:
        admin.spec(agent)
        checked = _checked(_fields(form))
        admin.change(agent, checked, by)
    except AgentNotFound as exc:
        return page.render("message.html", 404, message=exc.message, failed=True)
    except ValueError as exc:
        return page.redirect("/agents", {"message": f"{agent}: {exc}", "failed": 1})
    except TransitionRefused as exc:
        return page.redirect("/agents", {"message": f"Refused: {exc.message}", "failed": 1})
    done = {
        "pause": f"Agent {agent} paused by {by}: no instance calls it from now on.",
        "resume": f"Agent {agent} resumed by {by}: its waiting steps go on.",
        "limits": f"Agent {agent}'s limits changed by {by}.",
    }[checked.action]
    return page.redirect("/agents", {"message": done})
