"""No test asserts on wall time: how long something took depends on the machine (a busy
laptop, a shared CI runner), so a test asserts the behaviour the bound stood for and the
figures live in ``bench/``.

The check is static and narrow: an ``assert`` whose test compares (``<``, ``<=``, ``>``,
``>=``) a wall-clock reading (``time.monotonic()``, ``time.perf_counter()``,
``time.time()``), arithmetic on one (``time.monotonic() - started``, a ratio), or a name
assigned from either: in the function, in a function it is nested in, or returned to it
by a function nested in it (``took, n = asyncio.run(scenario())``). A fake clock's
readings are not wall time and pass; waiting with a deadline is fine as long as the pass
is not decided by an ``assert`` on the clock (``tests.support.wait_for`` raises with what
was still missing).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
#: The readings of the wall clock, by their name in ``time``.
WALL_CLOCKS = frozenset(
    {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}
)
#: Calls that keep a wall-time value wall time (``abs(time.time() - expires)``).
PASS_THROUGH = frozenset({"abs", "int", "float", "round", "min", "max"})
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


#: What a function returns that is wall time: the whole value (None), or tuple positions.
Returns = dict[str, set[int | None]]


class _Scope:
    """What names a module's ``time`` readings go by, and which local names hold one."""

    def __init__(self, tree: ast.Module):
        self.modules: set[str] = set()  # `import time` / `import time as t`
        self.functions: set[str] = set()  # `from time import monotonic`
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.modules |= {a.asname or a.name for a in node.names if a.name == "time"}
            elif isinstance(node, ast.ImportFrom) and node.module == "time":
                self.functions |= {a.asname or a.name for a in node.names if a.name in WALL_CLOCKS}

    def is_wall(self, node: ast.expr, names: set[str]) -> bool:
        match node:
            case ast.Call(func=ast.Attribute(value=ast.Name(id=module), attr=attr)):
                return module in self.modules and attr in WALL_CLOCKS
            case ast.Call(func=ast.Name(id=name), args=args):
                if name in PASS_THROUGH:
                    return any(self.is_wall(a, names) for a in args)
                return name in self.functions
            case ast.Name(id=name):
                return name in names
            case ast.BinOp(left=left, right=right):  # a duration, a deadline, a ratio
                return self.is_wall(left, names) or self.is_wall(right, names)
            case ast.UnaryOp(operand=operand):
                return self.is_wall(operand, names)
        return False

    def wall_names(self, nodes: list[ast.AST], inherited: set[str], returning: Returns) -> set[str]:
        """The names assigned from a wall-time expression among ``nodes``, to a fixed point
        (``took = time.monotonic() - started`` after ``started = time.monotonic()``), and
        from a nested function that returns one (``took, n = asyncio.run(scenario())``)."""
        pairs: list[tuple[ast.expr, ast.expr]] = []
        for node in nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs.extend(_unpacked(target, node.value))
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                pairs.extend(_unpacked(node.target, node.value))
            elif isinstance(node, ast.NamedExpr):
                pairs.append((node.target, node.value))
        names = set(inherited)
        for target, value in pairs:
            names |= _returned(target, value, returning)
        while True:
            found = {
                t.id
                for t, v in pairs
                if isinstance(t, ast.Name) and t.id not in names and self.is_wall(v, names)
            }
            if not found:
                return names
            names |= found

    def returns(
        self, function: ast.FunctionDef | ast.AsyncFunctionDef, inherited: set[str]
    ) -> set[int | None]:
        own = _own_nodes(function)
        names = self.wall_names(own, inherited, {})
        found: set[int | None] = set()
        for node in own:
            if isinstance(node, ast.Return) and node.value is not None:
                if self.is_wall(node.value, names):
                    found.add(None)
                elif isinstance(node.value, ast.Tuple):
                    found |= {i for i, e in enumerate(node.value.elts) if self.is_wall(e, names)}
        return found


def _unpacked(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """``a, b = x, y`` as ``a = x`` and ``b = y``; anything else as it is."""
    if (
        isinstance(target, ast.Tuple)
        and isinstance(value, ast.Tuple)
        and len(target.elts) == len(value.elts)
    ):
        return list(zip(target.elts, value.elts, strict=True))
    return [(target, value)]


def _returned(target: ast.expr, value: ast.expr, returning: Returns) -> set[str]:
    """The names ``target`` takes from a call in ``value`` of a function returning wall time."""
    called = {
        n.func.id
        for n in ast.walk(value)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    positions = set().union(*(returning.get(name, set()) for name in called))
    if isinstance(target, ast.Name) and None in positions:
        return {target.id}
    if isinstance(target, ast.Tuple):
        return {
            e.id for i, e in enumerate(target.elts) if i in positions and isinstance(e, ast.Name)
        }
    return set()


def wall_time_asserts(source: str) -> list[int]:
    """The lines of ``source`` whose ``assert`` orders a wall-time value."""
    tree = ast.parse(source)
    scope = _Scope(tree)
    lines: list[int] = []

    def visit(owner: ast.AST, inherited: set[str]) -> None:
        # a function sees the names of the functions (and the module) it is nested in
        own = _own_nodes(owner)
        nested = [n for n in own if isinstance(n, _FUNCTIONS)]
        first = scope.wall_names(own, inherited, {})
        returning = {
            n.name: scope.returns(n, first) for n in nested if not isinstance(n, ast.Lambda)
        }
        names = scope.wall_names(own, inherited, returning)
        for node in own:
            if isinstance(node, ast.Assert) and _orders_wall(scope, node.test, names):
                lines.append(node.lineno)
        for function in nested:
            visit(function, names)

    visit(tree, set())
    return sorted(lines)


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(owner: ast.AST) -> list[ast.AST]:
    """The nodes of ``owner``, down to (and with) the functions nested in it, not into them."""
    found: list[ast.AST] = []
    pending = list(ast.iter_child_nodes(owner))
    while pending:
        node = pending.pop()
        found.append(node)
        if not isinstance(node, _FUNCTIONS):
            pending.extend(ast.iter_child_nodes(node))
    return found


def _orders_wall(scope: _Scope, test: ast.expr, names: set[str]) -> bool:
    for node in ast.walk(test):
        if (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ORDERING) for op in node.ops)
            and any(scope.is_wall(operand, names) for operand in [node.left, *node.comparators])
        ):
            return True
    return False


def test_no_test_under_tests_asserts_on_wall_time() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for line in wall_time_asserts(path.read_text(encoding="utf-8"))
    ]
    assert not found, (
        "these asserts decide a pass on the wall clock; assert the behaviour the bound "
        "stood for (an order of events, a count, a state) and keep figures in bench/: "
        + ", ".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        # a duration against a bound, inline (test_remote_client, test_devhost_servicebus...)
        """
        import time
        def test():
            started = time.monotonic()
            act()
            assert time.monotonic() - started < 2
        """,
        # a name assigned from the duration, and a chained bound (test_remote_client)
        """
        import time
        def test():
            started = time.monotonic()
            act()
            elapsed = time.monotonic() - started
            assert 0.38 <= elapsed < 1.2
        """,
        # a duration returned by the scenario it was measured in (test_agent_threads)
        """
        import time
        def test():
            async def scenario():
                started = time.monotonic()
                await act()
                took = time.monotonic() - started
                return took, 8
            took, done = asyncio.run(scenario())
            assert took < 0.4, f"waited {took:.2f} s"
        """,
        # perf_counter, with a message (test_orders_decoder)
        """
        import time
        def test():
            for raw in inputs:
                start = time.perf_counter()
                decode(raw)
                assert time.perf_counter() - start < 1.0, raw[:30]
        """,
        # a lower bound (test_storage_outage, tests/localbus/test_contract)
        """
        import time
        def test():
            started = time.monotonic()
            act()
            took = time.monotonic() - started
            assert took >= 10
        """,
        # the bound on the right, in a larger expression (tests/e2e/test_workflow_kinds)
        """
        import time
        def test():
            started = time.monotonic()
            act()
            assert done and 1.5 <= time.monotonic() - started
        """,
        # a ratio of durations (the e2e slow-carrier test the issue names)
        """
        import time
        def test():
            t0 = time.monotonic()
            quick()
            fast = time.monotonic() - t0
            t1 = time.monotonic()
            slow()
            assert (time.monotonic() - t1) / fast < 2.0
        """,
        # wall time near a value (test_simulator_identity)
        """
        import time
        def test():
            assert abs(int(body["expires_on"]) - (time.time() + 86400)) < 5
        """,
        # imported by name, and aliased
        """
        from time import monotonic as now
        def test():
            t0 = now()
            assert now() - t0 < 1
        """,
        # read in a with-block or a loop, asserted at module level of a nested helper
        """
        import time as t
        def test():
            with client() as c:
                started = t.monotonic()
                c.call()
            def check():
                assert t.monotonic() - started < 1
            check()
        """,
    ],
)
def test_the_check_flags_each_form_of_wall_time_assert(source: str) -> None:
    assert wall_time_asserts(textwrap.dedent(source)), source


@pytest.mark.parametrize(
    "source",
    [
        # a fake clock's readings are not wall time
        """
        from tests.support import FakeClock
        def test():
            clock = FakeClock()
            started = clock()
            clock.advance(5)
            assert clock() - started >= timedelta(seconds=5)
        """,
        # waiting on the wall clock is fine; the pass is decided by the state reached
        """
        import time
        def test():
            deadline = time.monotonic() + 30
            while not done() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert done(), "the order never ended"
        """,
        # a timestamp only in the failure message
        """
        import time
        def test():
            started = time.monotonic()
            act()
            assert calls < 3, f"{time.monotonic() - started:.1f} s"
        """,
        # equality, a count, and a name shadowed by something else in another function
        """
        import time
        def first():
            took = time.monotonic()
        def test():
            took = len(calls)
            assert took <= 2
            assert sleeps == [1.0, 2.0]
        """,
        # another module's `time` attribute
        """
        import time
        def test():
            assert record.time < 5 and clock.monotonic() > 0
        """,
    ],
)
def test_the_check_passes_what_is_not_wall_time(source: str) -> None:
    assert wall_time_asserts(textwrap.dedent(source)) == []
