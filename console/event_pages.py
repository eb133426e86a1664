"""The console's side of events (docs/contracts.md §3.13): an order's page offers to send
each event it waits for, "Approve" (with a result) or "Refuse" (with a reason), through a
confirmation page that changes nothing, then a CSRF-checked POST; and the inbox: the
events the deployed workflows declare, with how many orders wait for each, each a link
to the order list filtered by ``?waiting=<event>``.

Events are delivered through the operator API's own use case
(``OrderAdmin.deliver_event``; the one the HTTP API uses, which claims the next step at
once), so the console, the API and the CLI cannot disagree on what an event does.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import azure.functions as func

from admin.callers import MAX_REASON_CHARS
from admin.service import COUNT_CAP, OrderAdmin, waiting_view
from console import bodies, views
from console.pages import Page, form_of, guard
from core.agent_spec import MAX_STEP_NAME, STEP_NAME
from core.errors import Forbidden, InvalidEvent, OrderNotFound, TransitionRefused
from core.inbox import check_event
from core.model import Order
from core.order_message import strict_json
from core.plans import PlannedStep
from core.workflows import WORKFLOWS, function_of

DECISIONS = ("approve", "refuse")
#: What an operator types as a result: an approval's few fields, not a document. It
#: travels in the confirmation page's URL, as every confirmation's fields do; larger
#: results go through the API (``POST /api/orders/{orderId}/events/{name}``).
MAX_RESULT_CHARS = 4000

#: The detail page's answer for a refused delivery: ``(status, message)`` to the page.
Detail = Callable[[int, str], func.HttpResponse]


def declared_events() -> dict[str, list[str]]:
    """Each person's decision a deployed workflow declares (``Event`` steps decided by a
    person: a remote's callback is no operator's to send, docs/contracts.md §3.15), with
    the workflows that declare it, by name."""
    out: dict[str, list[str]] = {}
    for name in sorted(WORKFLOWS):
        for event in WORKFLOWS[name].person_events():
            out.setdefault(event, []).append(name)
    return dict(sorted(out.items()))


def machine_events() -> frozenset[str]:
    """The events a deployed workflow declares that a machine delivers (a remote's
    callback, ``completes_on``, or an ``Event(..., by="machine")``): never a person's."""
    out: set[str] = set()
    for workflow in WORKFLOWS.values():
        out.update(set(workflow.event_names()) - set(workflow.person_events()))
    return frozenset(out)


@dataclass(frozen=True)
class Awaited:
    """An event the order waits for, as its page says it: who sends it and, for a
    person's decision, what the person decides on (docs/contracts.md §3.15)."""

    step: str
    event: str
    by: str  # person or machine
    #: a person's: why the step waits (its ``when``); a machine's: who calls back
    why: str
    #: a person's: the order's data the decision is about (None for a machine's)
    data: bodies.Shown | None


def awaited(order: Order, waiting: list[dict[str, Any]]) -> list[Awaited]:
    """The events in ``waiting`` (``admin.service.waiting_view``), each with what its
    page shows: a person's with the order's data and why its step waits, a machine's
    with the remote it comes from (no one approves it here)."""
    out: list[Awaited] = []
    for w in waiting:
        if "event" not in w:
            continue
        planned = order.plan.step_for_event(w["event"])
        if w.get("by") == "person":
            why = why_it_waits(order, planned)
            out.append(Awaited(w["step"], w["event"], "person", why, bodies.shown_json(order.body)))
        else:
            out.append(Awaited(w["step"], w["event"], "machine", _caller(planned), None))
    return out


def why_it_waits(order: Order, planned: PlannedStep | None) -> str:
    """Why an ``Event`` step waits for a person: its ``when`` (the function's name and the
    first line of its docstring) said yes for this order, or it has none (every order of
    the workflow waits for it). From the order's pinned plan (``uses``) and today's
    declarations (``core.workflows.function_of``)."""
    if planned is None or "when" not in planned.uses:
        return "It has no condition (when): every order waits for it."
    fn = function_of(order.workflow, planned.name, "when")
    if fn is None:
        return (
            "Its condition (when) said yes when the step started; today's declarations no "
            "longer give it."
        )
    name = getattr(fn, "__name__", "when")
    doc = (inspect.getdoc(fn) or "").strip().splitlines()
    said = f"Its condition {name} said yes for this order"
    return f"{said}: {doc[0]}" if doc and doc[0] else f"{said}."


def _caller(planned: PlannedStep | None) -> str:
    if planned is not None and planned.kind == "task":
        agent = f" of {planned.agent}" if planned.agent else ""
        return f"the callback{agent} (its remote), on the URL its step gave it"
    return "a machine, on the capability URL its step gave it"


def is_event_name(name: str) -> bool:
    """An event name as a declaration may spell it (``core.flow``): kebab-case, 1-48."""
    return bool(STEP_NAME.fullmatch(name)) and len(name) <= MAX_STEP_NAME


@dataclass(frozen=True)
class Decision:
    """An operator's answer to an event, as the forms carry it."""

    event: str
    action: str  # approve or refuse
    reason: str  # approve: an optional note; refuse: the reason (required)
    result: dict[str, Any] | None  # approve only
    result_text: str

    def body(self) -> dict[str, Any]:
        """The event's body (docs/contracts.md §3.13). A refusal's reason is also its note,
        so the step's history keeps it beside who sent it, as an approval's note is."""
        if self.action == "approve":
            return {"result": self.result, **({"reason": self.reason} if self.reason else {})}
        return {"refused": self.reason, "reason": self.reason}

    def fields(self) -> dict[str, str]:
        """What the confirmation page carries to the POST."""
        return {"action": self.action, "reason": self.reason, "result": self.result_text}


def parse_decision(event: str, fields: Mapping[str, str]) -> Decision:
    """The decision the form states; ``ValueError`` with a sentence for the operator."""
    if not is_event_name(event):
        raise ValueError(
            f"An event name is kebab-case (a-z, 0-9, -), at most {MAX_STEP_NAME} characters."
        )
    action = fields.get("action", "")
    if action not in DECISIONS:
        raise ValueError("Choose Approve or Refuse.")
    reason = (fields.get("reason") or "").strip()[:MAX_REASON_CHARS]
    result: dict[str, Any] | None = None
    text = ""
    if action == "refuse":
        if not reason:
            raise ValueError("Give the reason for the refusal: the order's history keeps it.")
    else:
        text = (fields.get("result") or "").strip() or "{}"
        if len(text) > MAX_RESULT_CHARS:
            raise ValueError(
                f"The result is {len(text):,} characters; the console sends at most "
                f"{MAX_RESULT_CHARS:,} (send larger ones through the API)."
            )
        try:
            parsed = strict_json(text)
        except ValueError as exc:
            raise ValueError(f"The result is not JSON ({exc}); for example {{}}.") from None
        if not isinstance(parsed, dict):
            raise ValueError('The result must be a JSON object, like {"approver": "maria"}.')
        result = parsed
    decision = Decision(event, action, reason, result, text)
    try:
        check_event(decision.body())  # the engine's own check, before anything is asked
    except InvalidEvent as exc:
        raise ValueError(f"The event cannot be sent: {exc.message}") from None
    return decision


def confirm(page: Page, admin: OrderAdmin, order_id: str) -> func.HttpResponse:
    """What sending the event would do, and the button that does it (GET: nothing
    changes). Bad input: back to the order's page with what to fix."""
    params = page.req.params
    try:
        decision = parse_decision(params.get("event", ""), params)
    except ValueError as exc:
        return page.redirect(f"/orders/{order_id}", {"message": str(exc), "failed": 1})
    try:
        order = admin.get(order_id)
    except OrderNotFound as exc:
        return page.render("message.html", 404, message=exc.message, failed=True)
    waits = [w for w in waiting_view(order) if w.get("event") == decision.event]
    planned = order.plan.step_for_event(decision.event)
    return page.render(
        "event_confirm.html",
        order=order,
        decision=decision,
        waits=waits[0] if waits else None,
        # what the decision is about, again beside the button that sends it
        about=next((a for a in awaited(order, waits) if a.by == "person"), None),
        # the step that takes it, and whether it is an Event step or a remote's callback
        taker=planned,
        why=views.why(order),
    )


def deliver(
    page: Page, events: OrderAdmin, order_id: str, event: str, by: str, detail: Detail
) -> func.HttpResponse:
    """The confirmed event (POST, CSRF-checked): back to the order's page with what was
    done, or the page with why it was refused (400, 409)."""
    form = form_of(page.req)
    refused = guard(page, form)
    if refused is not None:
        return refused
    try:
        decision = parse_decision(event, form)
    except ValueError as exc:
        return page.redirect(f"/orders/{order_id}", {"message": str(exc), "failed": 1})
    try:
        effect, _ = events.deliver_event(order_id, event, decision.body(), by)
    except OrderNotFound as exc:
        return page.render("message.html", 404, message=exc.message, failed=True)
    except InvalidEvent as exc:
        return detail(400, f"Refused: {exc.message}")
    except Forbidden as exc:
        return detail(403, f"Refused: {exc.message}")
    except TransitionRefused as exc:
        return detail(409, f"Refused: {exc.message}")
    return page.redirect(f"/orders/{order_id}", {"message": _done(decision, effect, by)})


def _done(decision: Decision, effect: str, by: str) -> str:
    event = decision.event
    if effect == "same":
        return f"Event {event} was delivered before with this same answer: nothing changed."
    if effect == "kept":
        return (
            f"Event {event} kept, sent by {by}: its step has not started yet and takes it "
            "when it does."
        )
    if decision.action == "approve":
        return f"Approved by {by}: event {event} was taken and the order goes on."
    return f"Refused by {by}: event {event} was taken; its step failed and the order unwinds."


def inbox(page: Page, admin: OrderAdmin) -> func.HttpResponse:
    """The events the deployed workflows declare, with how many orders wait for each."""
    declared = declared_events()
    counts = admin.waiting_counts(declared)
    return page.render("inbox.html", declared=declared, counts=counts, cap=COUNT_CAP)
