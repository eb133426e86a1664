"""Generated workflows: contract 3.13's vocabulary as small, printable specs.

A ``Flow`` is what the model generates and Hypothesis prints: a line of elements, each a
``Task`` (a ``StepSpec``: with or without a compensation, answered by a callback
``completes_on`` or not, its ``input`` reading an earlier step's result, a ``when``), a
``Wait`` (an ``Event``), a ``Sleep`` (a ``Delay``), a ``Group`` (a ``Parallel`` of 2-4
of those) or an ``Items`` (a ``ForEach`` over 0-8 items the order's data gives, 1-4 in
flight, its ``when`` skipping some; each item a task of its own to the model, ``<name>[<i>]``). Each spec's ``repr`` is the Python that builds it, so a printed failing
sequence can be run again (``python -m tests.model --replay FILE``).

``declarations(flow)`` turns a flow into a declarations module (``AGENTS``,
``WORKFLOWS``) and ``installed(flow)`` puts it to use for a block, as
``tests.support.declarations`` does for a module on disk. The strategy ``flows()`` is
biased towards 2-3 elements: most of the engine's edges need only a step before a
group, or a group alone.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from core import workflows
from core.item_names import item_name
from core.workflows import (
    Agent,
    Compensation,
    Concurrency,
    Context,
    Delay,
    Event,
    ForEach,
    Parallel,
    StepSpec,
    Workflow,
)

#: The workflow every generated order runs, and its one agent (every step's remote).
WORKFLOW = "model"
AGENT = "remote"
#: Where the generated declarations live while a flow is installed (``sys.modules``).
MODULE = "tests.model._declared"

When = Literal["never", "flag"] | None
#: What a task's failure for good means (``StepSpec.on_failure``, §3.17).
Fails = Literal["unwind", "hold", "continue"]


class _Printed:
    """Printed as the Python that builds it, also by Hypothesis's pretty-printer (which
    otherwise spells out every field of a dataclass)."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def _args(*parts: str | None) -> str:
    return ", ".join(p for p in parts if p)


def _when(when: When) -> str | None:
    return f"when={when!r}" if when else None


@dataclass(frozen=True, repr=False)
class Task(_Printed):
    """A remote call (``StepSpec``). ``comp``: it has a compensation ``undo-<name>``;
    ``callback``: it ``completes_on`` the event ``<name>-done`` (its 2xx is the remote's
    acceptance); ``reads``: its ``input`` carries that earlier step's result; ``when``:
    ``never`` (skipped) or ``flag`` (runs when the order's ``flag`` is true); ``fails``:
    its ``on_failure``."""

    name: str
    comp: bool = False
    callback: bool = False
    reads: str | None = None
    when: When = None
    fails: Fails = "unwind"

    def __repr__(self) -> str:
        return (
            "Task("
            + _args(
                repr(self.name),
                "comp=True" if self.comp else None,
                "callback=True" if self.callback else None,
                f"reads={self.reads!r}" if self.reads else None,
                _when(self.when),
                f"fails={self.fails!r}" if self.fails != "unwind" else None,
            )
            + ")"
        )

    @property
    def undo(self) -> str | None:
        return f"undo-{self.name}" if self.comp else None

    @property
    def event(self) -> str | None:
        return f"{self.name}-done" if self.callback else None


@dataclass(frozen=True, repr=False)
class Wait(_Printed):
    """An ``Event`` step: a person's decision, failing for good after ``timeout`` s."""

    name: str
    timeout: int = 60
    when: When = None

    def __repr__(self) -> str:
        return f"Wait({_args(repr(self.name), f'timeout={self.timeout}', _when(self.when))})"


@dataclass(frozen=True, repr=False)
class Sleep(_Printed):
    """A ``Delay`` of ``seconds``."""

    name: str
    seconds: int = 5
    when: When = None

    def __repr__(self) -> str:
        return f"Sleep({_args(repr(self.name), f'seconds={self.seconds}', _when(self.when))})"


Leaf = Task | Wait | Sleep


@dataclass(frozen=True, repr=False, init=False)
class Group(_Printed):
    """A ``Parallel`` of its members."""

    members: tuple[Leaf, ...]

    def __init__(self, *members: Leaf) -> None:
        object.__setattr__(self, "members", tuple(members))

    def __repr__(self) -> str:
        return f"Group({', '.join(map(repr, self.members))})"


@dataclass(frozen=True, repr=False)
class Items(_Printed):
    """A ``ForEach`` over ``count`` items (the order's field ``<name>`` lists them), at most
    ``cap`` in flight; its step has a compensation ``undo-<name>`` (``comp``), reads an
    earlier step's result (``reads``), skips the items at ``skip`` (a ``when``, declared
    only if some are skipped) and fails as ``fails`` says. To the model each item is a
    ``Task`` named ``<name>[<i>]`` (``tasks``), its compensation ``undo-<name>[<i>]``."""

    name: str
    count: int = 3
    cap: int = 2
    comp: bool = False
    reads: str | None = None
    skip: tuple[int, ...] = ()
    fails: Fails = "unwind"

    def __repr__(self) -> str:
        return (
            "Items("
            + _args(
                repr(self.name),
                f"count={self.count}",
                f"cap={self.cap}",
                "comp=True" if self.comp else None,
                f"reads={self.reads!r}" if self.reads else None,
                f"skip={self.skip!r}" if self.skip else None,
                f"fails={self.fails!r}" if self.fails != "unwind" else None,
            )
            + ")"
        )

    @property
    def undo(self) -> str | None:
        return f"undo-{self.name}" if self.comp else None

    def data(self) -> list[dict[str, Any]]:
        """The order's field ``<name>``: what ``items`` returns."""
        return [{"n": i, "skip": i in self.skip} for i in range(self.count)]

    def tasks(self) -> list[Task]:
        """Each item as the model sees it: a task of its own, skipped ones too (they are
        never requested)."""
        return [
            Task(item_name(self.name, i), comp=self.comp, fails=self.fails)
            for i in range(self.count)
        ]

    def runs(self) -> list[int]:
        """The indexes of the items its ``when`` does not skip."""
        return [i for i in range(self.count) if i not in self.skip]


Element = Leaf | Group | Items


@dataclass(frozen=True, repr=False)
class Turns(_Printed):
    """Per-key concurrency (§3.16): the workflow's ``Concurrency(key=account, limit,
    hold_on_error=hold)``, and ``orders`` orders of it (2-3: the model's own ``m-1`` and
    its companions ``m-2``, ``m-3``) accepted one second apart, ``m-1`` the ``first``-th
    (0-based). They share the key ``k1``; with ``keys=2`` the last companion has ``k2``."""

    limit: int = 1
    hold: bool = False
    orders: int = 2
    keys: int = 1
    first: int = 0

    def __repr__(self) -> str:
        return (
            f"Turns(limit={self.limit}, hold={self.hold}, orders={self.orders}, "
            f"keys={self.keys}, first={self.first})"
        )

    def accepted(self, own: str) -> list[str]:
        """The order ids in the order they are submitted (``own``: the model's)."""
        others = [f"m-{n}" for n in range(2, self.orders + 1)]
        return [*others[: self.first], own, *others[self.first :]]

    def key(self, order_id: str) -> str:
        """The order's ``account``: its key."""
        last = f"m-{self.orders}"
        return "k2" if self.keys == 2 and order_id == last and order_id != "m-1" else "k1"


@dataclass(frozen=True, repr=False, init=False)
class Flow(_Printed):
    """A workflow: its elements in order; ``flag``: the order's ``flag`` field;
    ``turns``: its per-key concurrency and the orders that share a key (None: one
    order, no limit)."""

    elements: tuple[Element, ...]
    flag: bool = True
    turns: Turns | None = None

    def __init__(self, *elements: Element, flag: bool = True, turns: Turns | None = None) -> None:
        object.__setattr__(self, "elements", tuple(elements))
        object.__setattr__(self, "flag", flag)
        object.__setattr__(self, "turns", turns)

    def __repr__(self) -> str:
        inner = ", ".join(map(repr, self.elements))
        tail = "" if self.flag else ", flag=False"
        tail += f", turns={self.turns!r}" if self.turns is not None else ""
        return f"Flow({inner}{tail})"

    def leaves(self) -> list[Leaf]:
        """Its steps but the ``ForEach``'s (``items``)."""
        out: list[Leaf] = []
        for element in self.elements:
            if isinstance(element, Group):
                out += list(element.members)
            elif not isinstance(element, Items):
                out.append(element)
        return out

    def items(self) -> list[Items]:
        """Its ``ForEach`` elements."""
        return [e for e in self.elements if isinstance(e, Items)]

    def tasks(self) -> list[Task]:
        """Its remote calls: each task, and each item of each ``ForEach``."""
        out = [leaf for leaf in self.leaves() if isinstance(leaf, Task)]
        for each in self.items():
            out += each.tasks()
        return out

    def order_data(self, order_id: str = "m-1") -> dict[str, Any]:
        """The order's data: its ``flag``, each ``ForEach``'s items, and its ``account``
        (its key) if the flow takes turns."""
        data = {"flag": self.flag, "note": 0, **{e.name: e.data() for e in self.items()}}
        if self.turns is not None:
            data["account"] = self.turns.key(order_id)
        return data

    def task(self, name: str) -> Task | None:
        return next((t for t in self.tasks() if t.name == name), None)

    def compensated(self, undo: str) -> Task | None:
        """The task that ``undo`` compensates."""
        return next((t for t in self.tasks() if t.undo == undo), None)

    def events(self) -> list[str]:
        """The names of its ``Event`` steps (a person's decisions)."""
        return [leaf.name for leaf in self.leaves() if isinstance(leaf, Wait)]


# --- declarations ------------------------------------------------------------------------


def _when_fn(when: When) -> Any:
    if when == "never":
        return lambda ctx: False
    if when == "flag":
        return lambda ctx: bool(ctx.order.get("flag"))
    return None


def _reader(name: str) -> Any:
    def read(ctx: Context) -> dict[str, Any]:
        return {**ctx.order, "from": name, "got": ctx.results.get(name, {})}

    return read


def _undo_input(name: str) -> Any:
    def undo(ctx: Context) -> dict[str, Any]:
        return {"undo": name, "result": ctx.results.get(name, {})}

    return undo


def _item_input(each: Items) -> Any:
    def read(ctx: Context) -> dict[str, Any]:
        got = ctx.results.get(each.reads, {}) if each.reads else None
        return {"item": ctx.item, "index": ctx.index, "got": got}

    return read


def _not_skipped(ctx: Context) -> bool:
    return not ctx.item["skip"]


def _items_of(name: str) -> Any:
    def items(ctx: Context) -> Any:
        return ctx.order[name]

    return items


def _item_undo_input(name: str) -> Any:
    def undo(ctx: Context) -> dict[str, Any]:
        own = item_name(name, ctx.index or 0)
        return {"undo": own, "result": ctx.results.get(own, {})}

    return undo


def _for_each(each: Items) -> ForEach:
    undo = each.undo
    step = StepSpec(
        f"{each.name}-item",
        agent=AGENT,
        input=_item_input(each),
        when=_not_skipped if each.skip else None,
        compensation=Compensation(undo, input=_item_undo_input(each.name)) if undo else None,
        on_failure=each.fails,
    )
    return ForEach(each.name, items=_items_of(each.name), step=step, max_concurrency=each.cap)


def _leaf(leaf: Leaf) -> StepSpec | Event | Delay:
    if isinstance(leaf, Wait):
        return Event(leaf.name, timeout_seconds=leaf.timeout, when=_when_fn(leaf.when))
    if isinstance(leaf, Sleep):
        return Delay(leaf.name, seconds=leaf.seconds, when=_when_fn(leaf.when))
    undo = leaf.undo
    return StepSpec(
        leaf.name,
        agent=AGENT,
        input=_reader(leaf.reads) if leaf.reads else None,
        when=_when_fn(leaf.when),
        completes_on=leaf.event,
        compensation=Compensation(undo, input=_undo_input(leaf.name)) if undo else None,
        on_failure=leaf.fails,
    )


def _account(ctx: Context) -> Any:
    return ctx.order.get("account")


def workflow_of(flow: Flow) -> Workflow:
    steps: list[StepSpec | Event | Delay | Parallel | ForEach] = []
    for element in flow.elements:
        if isinstance(element, Group):
            steps.append(Parallel(*(_leaf(m) for m in element.members)))
        elif isinstance(element, Items):
            steps.append(_for_each(element))
        else:
            steps.append(_leaf(element))
    turns = flow.turns
    if turns is None:
        return Workflow(WORKFLOW, tuple(steps))
    limit = Concurrency(key=_account, limit=turns.limit, hold_on_error=turns.hold)
    return Workflow(WORKFLOW, tuple(steps), concurrency=limit)


def declarations(flow: Flow) -> types.ModuleType:
    """A declarations module for ``flow`` (and the default workflow ``order``)."""
    module = types.ModuleType(MODULE)
    module.AGENTS = [Agent(AGENT)]  # type: ignore[attr-defined]
    module.WORKFLOWS = [  # type: ignore[attr-defined]
        Workflow("order", (StepSpec("process", agent=AGENT),)),
        workflow_of(flow),
    ]
    return module


@contextlib.contextmanager
def installed(flow: Flow) -> Iterator[str]:
    """``flow``'s declarations in use for the block (their module's name); then the ones
    in use before."""
    before = workflows.in_use()
    if before == MODULE:
        raise RuntimeError("a flow is installed already: close the machine that installed it")
    sys.modules[MODULE] = declarations(flow)
    workflows.use(MODULE)
    workflows.reload()
    try:
        yield MODULE
    finally:
        sys.modules.pop(MODULE, None)
        workflows.use(before)
        workflows.reload()


# --- the strategy --------------------------------------------------------------------------

_WHEN: st.SearchStrategy[When] = st.sampled_from([None, None, None, None, None, "flag", "never"])
#: A ``ForEach``'s items: 0-8, mostly a few (an empty list, and more than its cap, both come).
_COUNT = st.sampled_from([0, 1, 2, 2, 3, 3, 4, 5, 8])
#: Whether its ``when`` skips an item: one in five (and most ``ForEach`` skip none).
_SKIPPED = st.sampled_from([False, False, False, False, False, False, False, False, False, True])


@st.composite
def flows(draw: st.DrawFn) -> Flow:
    """A small workflow: 1-4 elements (mostly 2-3); groups of 2-4 (mostly 2); one element
    in five a ``ForEach``."""
    count = draw(st.sampled_from([2, 2, 2, 3, 3, 3, 1, 4]))
    names = iter(range(1, 100))
    done: list[str] = []  # tasks of earlier elements (what an input may read)

    def leaf() -> Leaf:
        n = next(names)
        kind = draw(st.sampled_from(["task"] * 4 + ["wait", "sleep"]))
        when = draw(_WHEN)
        if kind == "wait":
            return Wait(f"e{n}", timeout=draw(st.sampled_from([60, 20])), when=when)
        if kind == "sleep":
            return Sleep(f"d{n}", seconds=draw(st.sampled_from([5, 40])), when=when)
        reads = draw(st.sampled_from([None, None, *done[-1:]])) if done else None
        return Task(
            f"t{n}",
            comp=draw(st.sampled_from([True, True, False])),
            callback=draw(st.sampled_from([False, False, True])),
            reads=reads,
            when=when,
            fails=draw(st.sampled_from(["unwind", "unwind", "hold", "continue"])),
        )

    def each() -> Items:
        n = next(names)
        size = draw(_COUNT)
        return Items(
            f"f{n}",
            count=size,
            cap=draw(st.integers(min_value=1, max_value=4)),
            comp=draw(st.sampled_from([True, True, False])),
            reads=draw(st.sampled_from([None, None, *done[-1:]])) if done else None,
            skip=tuple(i for i in range(size) if draw(_SKIPPED)),
            fails=draw(st.sampled_from(["unwind", "unwind", "hold", "continue"])),
        )

    elements: list[Element] = []
    for _ in range(count):
        shape = draw(st.sampled_from(["leaf", "leaf", "group", "group", "items"]))
        if shape == "items":
            many = each()
            elements.append(many)
            done.append(many.name)
        elif shape == "group":
            size = draw(st.sampled_from([2, 2, 2, 3, 4]))
            group = Group(*(leaf() for _ in range(size)))
            elements.append(group)
            done += [m.name for m in group.members if isinstance(m, Task)]
        else:
            single = leaf()
            elements.append(single)
            if isinstance(single, Task):
                done.append(single.name)
    flag = draw(st.sampled_from([True, True, False]))
    return Flow(*elements, flag=flag, turns=draw(_TURNS))


@st.composite
def _turns(draw: st.DrawFn) -> Turns:
    orders = draw(st.sampled_from([2, 3, 3]))
    return Turns(
        limit=draw(st.sampled_from([1, 1, 2])),
        hold=draw(st.booleans()),
        orders=orders,
        keys=draw(st.sampled_from([1, 1, 2])) if orders == 3 else 1,
        first=draw(st.integers(min_value=0, max_value=orders - 1)),
    )


#: One flow in four runs 2-3 orders that take turns by key.
_TURNS: st.SearchStrategy[Turns | None] = st.one_of(st.none(), st.none(), st.none(), _turns())
