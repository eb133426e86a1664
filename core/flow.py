"""What a workflow can say (docs/contracts.md §3.8, §3.13): its steps, and how they relate.

A ``Workflow`` is a named sequence of elements, each one of:

- ``StepSpec``: a call to a remote service (or a Python handler) through its agent. With
  ``input=`` a function of the step's context gives the body sent (default: the order's
  JSON); with ``when=`` a function decides whether it runs at all (false: ``Skipped``);
  with ``completes_on="<event>"`` a 2xx is the remote's acceptance and the step ends when
  that event arrives (a callback). ``compensation=Compensation(...)`` undoes it;
  ``on_failure=`` says what its failure for good means: unwind (the default), hold the
  order for an operator, or continue.
- ``Event(name, timeout_seconds)``: wait for an event delivered to the order
  (``POST /api/orders/{orderId}/events/{name}``): an approval, a webhook.
- ``Delay(name, seconds=... | until=...)``: wait until then.
- ``Parallel(a, b, ...)``: the steps run at once; the workflow goes on when each has
  succeeded or been skipped.
- ``ForEach(name, items=fn, step=StepSpec(...), max_concurrency=N)``: one step per item of
  the list ``items(ctx)`` gives (decided once), each a record of its own named
  ``<name>[<i>]``, at most ``N`` in flight at once; the workflow goes on when every item
  succeeded or was skipped, with ``ctx.results[name]`` the list of their results.

Functions (``input``, ``when``, ``until``, ``items``) take one argument, the step's ``Context``, and
are called when the step is about to start; what they decide is recorded with the step
and never decided again. An order keeps its plan (``core.plans``) from submission: kinds,
groups, events, delays and timeouts; the functions are looked up in today's declarations
by workflow and step name (``core.workflows.function_of``), and ``python -m admin
deploy-check`` refuses a deployment that drops one an order in flight still needs.

Every mistake is a ``DeclarationError`` naming the file and line of the declaration.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from core.agent_spec import (
    DEFAULT_AGENT,
    MAX_STEP_NAME,
    PATH_PATTERN,
    STEP_NAME,
    DeclarationError,
    declared_at,
)
from core.concurrency import Concurrency
from core.item_names import MAX_ITEM_CONCURRENCY
from core.limits import MAX_STEP_TIMEOUT_SECONDS
from core.one_line import for_each_summary
from core.search import SearchError, check_fields, check_sources
from core.search import describe as describe_search

#: A function of a step's context (``input``, ``when``, ``until``).
Fn = Callable[[Any], Any]
#: How long an event may be waited for, or a delay last: a year.
MAX_WAIT_SECONDS: Final = 365 * 86_400
#: The functions a step can have, as plans name them.
FUNCTIONS: Final = ("input", "when", "until", "items")
StepKindName = Literal["task", "event", "delay", "items"]
#: What a step's failure for good means to its order (docs/contracts.md §3.17).
OnFailure = Literal["unwind", "hold", "continue"]
ON_FAILURE: Final = ("unwind", "hold", "continue")


@dataclass(frozen=True)
class Context:
    """What ``input``, ``when`` and ``until`` see: the order's id, its JSON as submitted (a
    copy of their own), each succeeded step's result by step name (a remote's 2xx JSON
    object, a Python handler's dict, an event's ``result``; a delay's is ``{}``; a
    ``ForEach``'s, once every item ended, the list of its items' results in item order,
    ``None`` for one skipped or gone past), the reason each ``on_failure="continue"`` step
    that failed gave (§3.17), and, for a step of a ``ForEach``, its ``item`` and
    ``index``."""

    order_id: str
    order: dict[str, Any]
    results: Mapping[str, Any]
    failures: Mapping[str, str] = field(default_factory=dict)
    #: for a step of a ``ForEach`` (and its compensation): its item, and the item's index
    item: Any = None
    index: int | None = None


def _check_function(fn: object, what: str, where: str) -> None:
    """``fn`` must be callable with one positional argument (the context)."""
    if fn is None:
        return
    if not callable(fn):
        raise DeclarationError(f"{where}: {what} must be a function of one argument (ctx)")
    try:
        inspect.signature(fn).bind(object())
    except TypeError as exc:
        raise DeclarationError(
            f"{where}: {what} must take exactly one argument, the step's context ({exc})"
        ) from None
    except ValueError:  # no signature to read (a builtin): checked when it runs
        pass


def _check_name(name: object, where: str, what: str = "a step name") -> None:
    if not isinstance(name, str) or not STEP_NAME.fullmatch(name):
        raise DeclarationError(f"{where}: {what} is kebab-case (a-z, 0-9, -), got {name!r}")
    if len(name) > MAX_STEP_NAME:
        raise DeclarationError(
            f"{where}: {name!r} is {len(name)} characters; at most {MAX_STEP_NAME}, so that "
            "the Service Bus message id <orderId>:<step>:<attempt> fits 128 characters"
        )


def _check_wait(seconds: object, where: str, what: str) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise DeclarationError(f"{where}: {what} must be a whole number of seconds")
    if not 1 <= seconds <= MAX_WAIT_SECONDS:
        raise DeclarationError(
            f"{where}: {what} of {seconds} s; it must be 1-{MAX_WAIT_SECONDS} s (a year)"
        )


@dataclass(frozen=True)
class Compensation:
    """The step that undoes another. ``input`` (a function of the context, where
    ``ctx.results[<the step it undoes>]`` is what that step returned) gives its body."""

    step: str
    agent: str | None = None  # None: the agent of the step it undoes
    path: str | None = None  # remote path; None: the compensation step's name
    timeout_seconds: int | None = None  # None: STEP_TIMEOUT_SECONDS
    input: Fn | None = None
    declared_at: str = field(default_factory=declared_at, compare=False)

    @property
    def remote_path(self) -> str:
        return self.path or self.step


@dataclass(frozen=True)
class StepSpec:
    """A call to a remote service through ``agent`` (docs/contracts.md §3.4, §3.13)."""

    name: str
    agent: str = DEFAULT_AGENT
    input: Fn | None = None
    when: Fn | None = None
    completes_on: str | None = None
    compensation: Compensation | None = None
    timeout_seconds: int | None = None  # None: STEP_TIMEOUT_SECONDS
    path: str | None = None  # remote path; None: the step's name
    #: Its effect may stand when the order is undone (a notification): an unwinding that
    #: leaves it applied ends ``compensated``/``cancelled`` and says so, where a step
    #: without a compensation otherwise makes it ``error``, told (docs/contracts.md §3.15).
    may_stand: bool = False
    #: What its failure for good means (docs/contracts.md §3.17): ``"unwind"`` the order
    #: (undo what applied), ``"hold"`` it in ``error`` for an operator (fix and resubmit,
    #: or cancel to undo), or ``"continue"`` (recorded on the step; the workflow goes on).
    on_failure: OnFailure = "unwind"
    declared_at: str = field(default_factory=declared_at, compare=False)

    @property
    def remote_path(self) -> str:
        return self.path or self.name

    @property
    def kind(self) -> StepKindName:
        return "task"

    def functions(self) -> tuple[str, ...]:
        return tuple(n for n in ("input", "when") if getattr(self, n) is not None)

    def check(self) -> None:
        at = f"{self.declared_at}: step {self.name!r}"
        _check_name(self.name, at)
        if not PATH_PATTERN.fullmatch(self.remote_path):
            raise DeclarationError(f"{at}: path {self.remote_path!r} is not a-z, 0-9, - and /")
        _check_timeout(self.timeout_seconds, at)
        _check_function(self.input, "input", at)
        _check_function(self.when, "when", at)
        if self.completes_on is not None:
            _check_name(self.completes_on, at, "completes_on (an event name)")
        if not isinstance(self.may_stand, bool):
            raise DeclarationError(f"{at}: may_stand is True or False, got {self.may_stand!r}")
        if self.on_failure not in ON_FAILURE:
            raise DeclarationError(
                f'{at}: on_failure={self.on_failure!r}; it is "unwind" (undo what applied, the '
                'default), "hold" (the order waits in error for an operator: fix and resubmit, '
                'or cancel to undo) or "continue" (the failure is recorded and the workflow '
                "goes on)"
            )
        if self.may_stand and self.compensation is not None:
            raise DeclarationError(
                f"{at}: may_stand with a compensation; a step that can be undone is undone "
                "(may_stand is for a step without one)"
            )
        c = self.compensation
        if c is not None:
            cat = f"{c.declared_at}: compensation {c.step!r} of step {self.name!r}"
            _check_name(c.step, cat)
            if not PATH_PATTERN.fullmatch(c.remote_path):
                raise DeclarationError(f"{cat}: path {c.remote_path!r} is not a-z, 0-9, - and /")
            _check_timeout(c.timeout_seconds, cat)
            _check_function(c.input, "input", cat)


def _check_timeout(timeout: int | None, where: str) -> None:
    if timeout is not None and not 1 <= timeout <= MAX_STEP_TIMEOUT_SECONDS:
        raise DeclarationError(
            f"{where}: a timeout of {timeout} s; it must be 1-{MAX_STEP_TIMEOUT_SECONDS} s, "
            "what the host can honour (an agent invocation lasts up to it; see "
            "config/settings.py)"
        )


#: Who delivers an ``Event``: a person (``Orders.Operator``), or a machine on the
#: capability URL of its run (docs/contracts.md §3.15).
EventBy = Literal["person", "machine"]


@dataclass(frozen=True)
class Event:
    """Wait for the event ``name`` to be delivered to the order (an approval, a webhook),
    at most ``timeout_seconds``: then the step fails for good, not applied, and the
    workflow unwinds. ``when`` false: skipped. ``by``: who decides it, a ``"person"`` (an
    operator, from the console, the API or the CLI) or a ``"machine"`` (a remote, on the
    URL ``events_url`` gives: a key alone delivers nothing)."""

    name: str
    timeout_seconds: int | None = None
    when: Fn | None = None
    by: EventBy = "person"
    declared_at: str = field(default_factory=declared_at, compare=False)

    @property
    def kind(self) -> StepKindName:
        return "event"

    def functions(self) -> tuple[str, ...]:
        return ("when",) if self.when is not None else ()

    def check(self) -> None:
        at = f"{self.declared_at}: event {self.name!r}"
        _check_name(self.name, at, "an event name")
        if self.timeout_seconds is None:
            raise DeclarationError(
                f"{at}: an Event needs timeout_seconds (how long to wait for it; then the "
                "step fails and the workflow unwinds)"
            )
        _check_wait(self.timeout_seconds, at, "timeout_seconds")
        _check_function(self.when, "when", at)
        if self.by not in ("person", "machine"):
            raise DeclarationError(
                f'{at}: by={self.by!r}; an event is decided by a "person" (an operator) or a '
                '"machine" (a remote, on its capability URL: events_url)'
            )


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` after the step starts, or until ``until(ctx)`` (an aware datetime);
    then the step is ``Processed`` with the result ``{}``. Kept in the state store."""

    name: str
    seconds: int | None = None
    until: Fn | None = None
    when: Fn | None = None
    declared_at: str = field(default_factory=declared_at, compare=False)

    @property
    def kind(self) -> StepKindName:
        return "delay"

    def functions(self) -> tuple[str, ...]:
        return tuple(n for n in ("until", "when") if getattr(self, n) is not None)

    def check(self) -> None:
        at = f"{self.declared_at}: delay {self.name!r}"
        _check_name(self.name, at)
        if (self.seconds is None) == (self.until is None):
            raise DeclarationError(f"{at}: a Delay takes seconds=... or until=..., one of them")
        if self.seconds is not None:
            _check_wait(self.seconds, at, "seconds")
        _check_function(self.until, "until", at)
        _check_function(self.when, "when", at)


Leaf = StepSpec | Event | Delay


class Parallel:
    """Steps that run at once (``Parallel(a, b, ...)``, at least two, not nested): each
    has its own state record, deadline, retries and supervision."""

    def __init__(self, *steps: Leaf) -> None:
        self.steps: tuple[Leaf, ...] = tuple(steps)
        self.declared_at = declared_at()

    def __repr__(self) -> str:
        return f"Parallel({', '.join(s.name for s in self.steps if hasattr(s, 'name'))})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Parallel) and other.steps == self.steps

    def __hash__(self) -> int:
        return hash(self.steps)

    def check(self) -> None:
        at = f"{self.declared_at}: Parallel"
        for step in self.steps:
            if isinstance(step, Parallel):
                raise DeclarationError(
                    f"{step.declared_at}: a Parallel inside a Parallel; list its steps in the "
                    "outer one"
                )
            if not isinstance(step, StepSpec | Event | Delay):
                raise DeclarationError(
                    f"{at} holds {step!r}: a Parallel holds StepSpec, Event or Delay"
                )
        if len(self.steps) < 2:
            raise DeclarationError(f"{at} has {len(self.steps)} step(s); it needs at least two")


@dataclass(frozen=True)
class ForEach:
    """One step per item of ``items(ctx)`` (a list of JSON values, at most ``MAX_ITEMS``),
    decided once when the workflow reaches it (docs/contracts.md §3.16). Each item is a
    record of its own, named ``<name>[<i>]`` with the idempotency key
    ``<orderId>:<name>:<i>``: its own deadline, retries, supervision and doubt. ``step``
    says what each item does; its ``input`` and ``when`` (and its compensation's
    ``input``) see ``ctx.item`` and ``ctx.index``. At most ``max_concurrency`` items are in
    flight at once. The workflow goes on when every item succeeded or was skipped, with
    ``ctx.results[name]`` the list of their results; one failing for good ends it as in a
    ``Parallel`` (``step.on_failure``): undone, each applied item with its own result."""

    name: str
    items: Fn
    step: StepSpec
    max_concurrency: int = 10
    declared_at: str = field(default_factory=declared_at, compare=False)

    @property
    def kind(self) -> StepKindName:
        return "items"

    def functions(self) -> tuple[str, ...]:
        return ("items",)

    def template(self) -> StepSpec:
        """The step as a plan names it (``<name>[]``, its compensation ``<undo>[]``): what
        each item's record runs."""
        step = self.step
        comp = step.compensation
        return dataclasses.replace(
            step,
            name=f"{self.name}[]",
            path=step.remote_path,
            compensation=(
                dataclasses.replace(comp, step=f"{comp.step}[]", path=comp.remote_path)
                if comp is not None
                else None
            ),
        )

    def check(self) -> None:
        at = f"{self.declared_at}: ForEach {self.name!r}"
        _check_name(self.name, at)
        if len(self.name) > MAX_STEP_NAME - 4:
            raise DeclarationError(
                f"{at}: a ForEach's name is at most {MAX_STEP_NAME - 4} characters, so that "
                "its items' names (<name>[<i>]) fit"
            )
        if not callable(self.items):
            raise DeclarationError(
                f"{at}: items must be a function of one argument (ctx) that returns the list "
                "of items"
            )
        _check_function(self.items, "items", at)
        if not isinstance(self.step, StepSpec):
            raise DeclarationError(
                f"{at}: step must be a StepSpec (what each item does), got {self.step!r}"
            )
        self.step.check()
        if self.step.completes_on is not None:
            raise DeclarationError(
                f"{at}: its step completes_on={self.step.completes_on!r}; an item of a ForEach "
                "ends with its call (a callback names one event of the order, not one per "
                "item): use a Parallel of steps, or call back per order"
            )
        comp = self.step.compensation
        if comp is not None and len(comp.step) > MAX_STEP_NAME - 4:
            raise DeclarationError(
                f"{at}: compensation {comp.step!r} is at most {MAX_STEP_NAME - 4} characters "
                "in a ForEach, so that its items' names (<name>[<i>]) fit"
            )
        n = self.max_concurrency
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ITEM_CONCURRENCY:
            raise DeclarationError(
                f"{at}: max_concurrency={n!r}; it is a whole number 1-{MAX_ITEM_CONCURRENCY} "
                "(how many items are in flight at once)"
            )


Element = Leaf | Parallel | ForEach
#: What ``Workflow.leaves`` gives: a step, or the head of a ``ForEach`` (its ``items``).
Planned = Leaf | ForEach


@dataclass(frozen=True)
class Workflow:
    name: str
    steps: tuple[Element, ...]
    #: what operators search orders by (docs/contracts.md §3.14, §3.17): top-level fields of
    #: the order's data, or of a step's result (``"<step>.<field>"``); ``core.search`` says
    #: what they may be and what a search matches
    search: tuple[str, ...] = ()
    declared_at: str = field(default_factory=declared_at, compare=False)
    #: at most ``limit`` orders of one key running at once (docs/contracts.md §3.16)
    concurrency: Concurrency | None = None

    def __post_init__(self) -> None:
        where = f"{self.declared_at}: workflow {self.name!r}"
        if (
            not isinstance(self.name, str)
            or not STEP_NAME.fullmatch(self.name)
            or len(self.name) > 64
        ):
            raise DeclarationError(f"{where}: a name is 1-64 characters of a-z, 0-9, hyphens")
        object.__setattr__(self, "steps", tuple(self.steps))
        try:
            object.__setattr__(self, "search", check_fields(self.search))
        except SearchError as exc:
            raise DeclarationError(f"{where}: {exc}") from None
        if not self.steps:
            raise DeclarationError(f"{where} has no steps")
        for element in self.steps:
            if not isinstance(element, StepSpec | Event | Delay | Parallel | ForEach):
                raise DeclarationError(
                    f"{where} holds {element!r}: a workflow's steps are StepSpec, Event, "
                    "Delay, Parallel or ForEach"
                )
            element.check()
        leaves = list(self.leaves())
        names = [s.name for s, _ in leaves]
        names += [
            s.compensation.step for s, _ in leaves if isinstance(s, StepSpec) and s.compensation
        ]
        # a ForEach's template is its head's name; a compensation of its items is ``<undo>``
        names = [n.removesuffix("[]") for n in names if not _is_head(n, leaves)]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise DeclarationError(f"{where} repeats a step name: {', '.join(twice)}")
        try:
            check_sources(self.search, self.step_kinds())
        except SearchError as exc:
            raise DeclarationError(f"{where}: {exc}") from None
        events = [s.name for s, _ in leaves if isinstance(s, Event)]
        callbacks = [
            s.completes_on for s, _ in leaves if isinstance(s, StepSpec) and s.completes_on
        ]
        for name in callbacks:
            if name in names or callbacks.count(name) > 1 or name in events:
                raise DeclarationError(
                    f"{where}: completes_on={name!r} must name an event of its own (not a "
                    "step, an Event or another step's completes_on)"
                )
        if self.concurrency is not None and not isinstance(self.concurrency, Concurrency):
            raise DeclarationError(
                f"{where}: concurrency={self.concurrency!r}; it is Concurrency(key=fn, limit=n)"
            )

    def leaves(self) -> Iterator[tuple[Planned, int]]:
        """Every step (not Parallel) with the index of the element it belongs to: steps of
        one ``Parallel`` share it (its group). A ``ForEach`` gives two: itself (the head,
        whose ``items`` decides the list) and its step as each item runs it, named
        ``<name>[]`` (``ForEach.template``)."""
        for group, element in enumerate(self.steps):
            if isinstance(element, ForEach):
                yield element, group
                yield element.template(), group
                continue
            members = element.steps if isinstance(element, Parallel) else (element,)
            for leaf in members:
                yield leaf, group

    def step_kinds(self) -> dict[str, str]:
        """Every step name, with its kind (``task``, ``event``, ``delay``,
        ``compensation``): what a search of a step's result checks (``core.search``)."""
        kinds: dict[str, str] = {}
        for leaf, _ in self.leaves():
            if leaf.name.endswith("[]"):
                continue  # an item's own result is not searched (its ForEach's is a list)
            kinds[leaf.name] = leaf.kind
            if isinstance(leaf, StepSpec) and leaf.compensation is not None:
                kinds[leaf.compensation.step] = "compensation"
        return kinds

    def tasks(self) -> Iterator[StepSpec]:
        """The steps that call a remote (``StepSpec``)."""
        return (s for s, _ in self.leaves() if isinstance(s, StepSpec))

    def agents(self) -> set[str]:
        used = {s.agent for s in self.tasks()}
        used |= {
            s.compensation.agent for s in self.tasks() if s.compensation and s.compensation.agent
        }
        return used

    def person_events(self) -> tuple[str, ...]:
        """The events of this workflow a person decides (``Event(..., by="person")``)."""
        return tuple(s.name for s, _ in self.leaves() if isinstance(s, Event) and s.by == "person")

    def event_names(self) -> tuple[str, ...]:
        """The events an order of this workflow accepts (``Event`` steps, ``completes_on``)."""
        out = [s.name for s, _ in self.leaves() if isinstance(s, Event)]
        out += [s.completes_on for s in self.tasks() if s.completes_on]
        return tuple(out)

    def describe(self) -> dict[str, Any]:
        """For ``GET /api/workflows`` and ``python -m admin workflows``: each element in
        order, a ``Parallel`` as ``{"parallel": [...]}``, a ``ForEach`` as ``{"forEach":
        name, "items": fn, "maxConcurrency": n, "step": {...}}``."""

        def leaf(s: Leaf) -> dict[str, Any]:
            if isinstance(s, Event):
                out: dict[str, Any] = {"step": s.name, "kind": "event", "event": s.name}
                out["timeout"] = s.timeout_seconds
                out["by"] = s.by
            elif isinstance(s, Delay):
                out = {"step": s.name, "kind": "delay"}
                out["seconds" if s.seconds is not None else "until"] = (
                    s.seconds if s.seconds is not None else _name_of(s.until)
                )
            else:
                out = {
                    "step": s.name,
                    "kind": "task",
                    "agent": s.agent,
                    "path": s.remote_path,
                    "timeout": s.timeout_seconds,
                }
                if s.input is not None:
                    out["input"] = _name_of(s.input)
                if s.completes_on:
                    out["completesOn"] = s.completes_on
                if s.may_stand:
                    out["mayStand"] = True
                out["onFailure"] = s.on_failure
                if s.compensation:
                    c = s.compensation
                    out["compensation"] = {
                        "step": c.step,
                        "agent": c.agent or s.agent,
                        "path": c.remote_path,
                        "timeout": c.timeout_seconds,
                    }
                    if c.input is not None:
                        out["compensation"]["input"] = _name_of(c.input)
            if s.when is not None:
                out["when"] = _name_of(s.when)
            return out

        steps: list[dict[str, Any]] = []
        for element in self.steps:
            if isinstance(element, Parallel):
                steps.append({"parallel": [leaf(s) for s in element.steps]})
            elif isinstance(element, ForEach):
                shown = {
                    "forEach": element.name,
                    "kind": "items",
                    "items": _name_of(element.items),
                    "maxConcurrency": element.max_concurrency,
                    "step": leaf(element.step),
                }
                steps.append({**shown, "summary": for_each_summary(shown)})
            else:
                steps.append(leaf(element))
        return {
            "workflow": self.name,
            "steps": steps,
            "events": list(self.event_names()),
            "search": describe_search(self.search),
            **({"concurrency": self.concurrency.describe()} if self.concurrency else {}),
        }


def _is_head(name: str, leaves: list[tuple[Planned, int]]) -> bool:
    """``name`` (``<x>[]``) is a ForEach's template, not a compensation's: counted once,
    under the ForEach's own name."""
    return any(isinstance(s, ForEach) and f"{s.name}[]" == name for s, _ in leaves)


def _name_of(fn: object) -> str:
    module = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{name}" if module else str(name)


#: For ``core.concurrency`` (``Concurrency`` checks its key as a step's function).
check_function, name_of = _check_function, _name_of
