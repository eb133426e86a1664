"""The browser layer's harness: the running app, its orders, and Chromium.

``running_console()``: a ``LocalStack`` (Azurite, the simulator, two devhosts) and the
orders the tests look at, made once and settled before the first test runs:

- devhost 0 runs every function with ``CONSOLE_READ_ONLY=false``: the console the tests
  drive, and the one instance that processes orders. Each devhost signs the browser in
  as its development principal (the OS user, ``Orders.Operator``: config/principals.py);
  ``Browser.signed_in_as`` makes every request say another (``X-Dev-Principal``);
- devhost 1 runs only the HTTP functions (the others are ``--exclude``d, so it never
  competes for work) with ``CONSOLE_READ_ONLY=true``: the read-only console.

The orders (``Orders``) end in known states: completed ones, failing ones in ``error``,
one that fails twice and then succeeds (it completes when resubmitted), one carrying
hostile markup in its body and in its error, and a bulk group created alone in its own
whole-second window, so that a ``from``/``to`` filter selects exactly that group. The
app runs the tests' declarations (``tests/fixtures/flows.py``: the product's two
workflows and one per kind of contract 3.13), so that orders of those kinds settle too:
a parallel one (completed) and approvals waiting for their event, or (too small to need
one) skipped past it into a ten-minute delay, and a delivery waiting for an event a
machine sends (no person's decision).

``chromium()``: headless Chromium from the Debian packages (``make browser-deps``), with
both paths given so that Selenium Manager never downloads anything. ``Browser`` wraps it
with bounded waits (``WebDriverWait``) and failures that say what the page showed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chromium.webdriver import ChromiumDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from core.model import Order
from demo.stack import ROOT, LocalStack
from tests.support import declarations, wait_for

T = TypeVar("T")

FLOWS = "tests.fixtures.flows"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: Pages are server-rendered: once loaded, what the contract names is there or never is.
PAGE_TIMEOUT = 5.0
SETTLE_TIMEOUT = 60.0

SETTINGS = {
    # 6 s, not less: on a busy 2-core machine an agent may pick its request up late, and
    # with too little time left before the deadline it does not call at all (a deferral).
    "STEP_TIMEOUT_SECONDS": "6",
    "MAX_FAILURE_COUNT": "2",
    "SUPERVISOR_SCHEDULE": "*/1 * * * * *",
    # A failure with no evidence that the remote serves others is deferred, not counted
    # (agents/health.py), until the deferrals have lasted this long (default 30 min):
    # 3 s is less than the time between two attempts, so a failing order reaches `error`
    # at its second attempt, and a healthy one that was deferred once still completes.
    "DEFERRAL_WINDOW_SECONDS": "3",
    # A superset of the product's declarations (the same `order` and `fulfilment`, the
    # same four agents) with a workflow per kind of contract 3.13; the test process puts
    # the same module to use while the app runs (running_console).
    "ORDERS_DECLARATIONS": FLOWS,
}
#: Fails the `process` step at every call (HTTP 503): the order ends in `error`.
DEAD = {"fail": "transient", "times": 100000, "status": 503}
#: The remote refuses the order (HTTP 422): `error` after one attempt.
DECLINED = {"fail": "permanent", "status": 422, "error": "payment declined"}
#: The first two calls hang (each attempt makes one call, given up after its timeout):
#: two failed attempts put the order in `error`; the third call, after a resubmit, succeeds.
TWICE_THEN_OK = {"fail": "hang", "times": 2, "seconds": 10}


def hostile(n: int) -> str:
    """Markup that sets ``window.__pwned = n`` (or ``n + 1``) if a page ever runs it."""
    return f"<script>window.__pwned={n}</script><img src=x onerror=window.__pwned={n + 1}>"


@dataclass(frozen=True)
class Orders:
    """The orders the tests look at, and the state each must be in before they start.

    At most two orders fail *transiently* (dead-1, retry-1): three different orders
    failing on one endpoint with no success between is an outage to the agents' circuit
    breaker (agents/health.py), which then holds back every order on that endpoint,
    healthy ones included. The other `error` orders are refused (a 422 is an answer, and
    the endpoint counts as up).
    """

    completed: tuple[str, ...] = ("ok-1", "ok-2", "ok-3")  # ok-3 is a fulfilment
    #: `error`: dead-1 after attempts that got HTTP 503 (the detail, the screenshots);
    #: declined-1 refused (422) at its first attempt.
    failed: tuple[str, ...] = ("dead-1", "declined-1")
    retry: str = "retry-1"  # `error` after two timeouts; completes when resubmitted
    guard: str = "guard-1"  # `error` (refused): the target of refused POSTs
    fix: str = "fix-1"  # `error` (refused for its data): fixed in the editor, then completes
    hostile: str = "xss-1"  # fulfilment refused at its first step: `compensated`
    bulk: tuple[str, ...] = ("bulk-1", "bulk-2", "bulk-3")  # refused, own time window
    #: contract 3.13 (tests/fixtures/flows.py): a `trip`, two bookings at once, completed
    parallel: str = "trip-1"
    #: `approval` orders waiting for the event `approved` (their Event step's timeout is an
    #: hour): one to approve, one to refuse, and two nobody touches (the inbox)
    approve: str = "approve-1"
    refuse: str = "refuse-1"
    inbox: tuple[str, ...] = ("inbox-1", "inbox-2")
    #: an `approval` too small to need one: `approved` skipped, then the `hold` delay
    #: (ten minutes: longer than the whole suite)
    small: str = "small-1"
    #: a `delivery` waiting (an hour) for `delivered`, an event a machine sends: no
    #: person's decision, offered to no one
    machine: str = "delivery-1"
    #: contract 3.16 (tests/fixtures/flows.py): a `lines` order, a ForEach over its three
    #: lines (each picked by a Python agent), completed
    lines: str = "lines-1"

    def bodies(self) -> dict[str, dict[str, Any]]:
        """What is submitted for each order except the bulk group."""
        dead, declined = self.failed
        bodies: dict[str, dict[str, Any]] = {
            # customerId: what the search box finds (contract 3.14)
            "ok-1": {"orderId": "ok-1", "amount": 1, "customerId": "c-7"},
            "ok-2": {"orderId": "ok-2", "amount": 2, "customerId": "c-8"},
            "ok-3": {"orderId": "ok-3", "workflow": "fulfilment"},
            dead: {
                "orderId": dead,
                "amount": 3,
                "customerId": "c-7",
                "simulate": {"process": DEAD},
            },
            declined: {"orderId": declined, "simulate": {"process": DECLINED}},
            self.guard: {"orderId": self.guard, "simulate": {"process": DECLINED}},
            self.fix: {"orderId": self.fix, "amount": 4, "simulate": {"process": DECLINED}},
            self.retry: {"orderId": self.retry, "simulate": {"process": TWICE_THEN_OK}},
            self.hostile: {
                "orderId": self.hostile,
                "workflow": "fulfilment",
                "note": hostile(1),  # a field no workflow reads
                "customer": {"name": hostile(3)},
                "simulate": {
                    "reserve-stock": {"fail": "permanent", "status": 422, "error": hostile(5)}
                },
            },
            self.parallel: {"orderId": self.parallel, "workflow": "trip", "amount": 700},
            self.small: {"orderId": self.small, "workflow": "approval", "amount": 50},
            self.machine: {"orderId": self.machine, "workflow": "delivery"},
            self.lines: {
                "orderId": self.lines,
                "workflow": "lines",
                "lines": [{"sku": s, "qty": n} for n, s in enumerate("ABC", 1)],
            },
        }
        for order_id in (self.approve, self.refuse, *self.inbox):
            bodies[order_id] = {"orderId": order_id, "workflow": "approval", "amount": 5000}
        # data longer than a page shows at once: cut, the whole of it one click away
        bodies[self.inbox[1]]["items"] = [{"sku": f"sku-{n}", "qty": n + 1} for n in range(12)]
        return bodies

    def bulk_bodies(self) -> dict[str, dict[str, Any]]:
        return {o: {"orderId": o, "simulate": {"process": DECLINED}} for o in self.bulk}

    def expected(self) -> dict[str, str]:
        return {
            **dict.fromkeys((*self.completed, self.parallel, self.lines), "completed"),
            **dict.fromkeys((*self.failed, self.retry, self.guard, self.fix, *self.bulk), "error"),
            self.hostile: "compensated",
        }

    def waiting(self) -> dict[str, str]:
        """The orders that settle waiting, not finished: order id -> the step that waits."""
        return {
            **dict.fromkeys((self.approve, self.refuse, *self.inbox), "approved"),
            self.small: "hold",
            self.machine: "delivered",
        }


@dataclass
class Console:
    """The running app as the tests see it."""

    stack: LocalStack
    base: str  # devhost 0, e.g. http://127.0.0.1:PORT
    read_only_base: str  # devhost 1 (CONSOLE_READ_ONLY=true)
    orders: Orders
    bodies: dict[str, dict[str, Any]]
    bulk_from: str  # ISO datetimes (UTC, whole seconds): from inclusive, to exclusive
    bulk_to: str

    @property
    def url(self) -> str:
        return f"{self.base}/api/console"

    @property
    def read_only_url(self) -> str:
        return f"{self.read_only_base}/api/console"

    @property
    def api(self) -> str:
        return f"{self.base}/api"

    def page(
        self,
        path: str = "",
        *,
        read_only: bool = False,
        query: Mapping[str, str] | None = None,
        **params: str,
    ) -> str:
        """A console URL: ``page("/orders/x")``, ``page(status="error", refresh="off")``;
        ``query`` for names that are not identifiers (``from``)."""
        base = self.read_only_url if read_only else self.url
        params = {**(query or {}), **params}
        return f"{base}{path}" + (f"?{urlencode(params)}" if params else "")

    def load(self, order_id: str) -> Order:
        order = self.stack.context.store.load(order_id)
        assert order is not None, f"order {order_id} is not in the table"
        return order

    def api_ids(self, status: str, *, workflow: str | None = None) -> set[str]:
        """The ids the JSON operator API lists for ``status`` (one page of 100)."""
        params = {"status": status, "pageSize": "100"}
        response = httpx.get(f"{self.api}/orders", params=params, timeout=10)
        assert response.status_code == 200, (response.status_code, response.text[:300])
        listed = response.json()["orders"]
        return {o["orderId"] for o in listed if workflow is None or o["workflow"] == workflow}

    def api_waiting(self, event: str) -> list[str]:
        """The ids the JSON operator API lists as waiting for ``event``, in its order."""
        params = {"waiting": event, "pageSize": "100"}
        response = httpx.get(f"{self.api}/orders", params=params, timeout=10)
        assert response.status_code == 200, (response.status_code, response.text[:300])
        return [o["orderId"] for o in response.json()["orders"]]

    def api_order(self, order_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.api}/orders/{order_id}", timeout=10)
        assert response.status_code == 200, (response.status_code, response.text[:300])
        return response.json()  # type: ignore[no-any-return]

    def log_tail(self, lines: int = 20) -> str:
        assert self.stack.workdir is not None
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text().splitlines()[-lines:])
            for p in sorted(self.stack.workdir.glob("devhost-*.log"))
        )


def snapshot(order: Order) -> tuple[Any, ...]:
    """What any change to an order changes (for "this request changed nothing")."""
    return (
        order.status,
        order.updated_at,
        len(order.history),
        tuple((s.step, s.attempt, len(s.history)) for s in order.steps),
    )


def events(order: Order, name: str) -> list[dict[str, Any]]:
    """The order's own history entries called ``name`` (e.g. "resubmitted")."""
    return [h for h in order.history if h.get("event") == name]


# --- the app ------------------------------------------------------------------------

_LIST_BACKGROUND_FUNCTIONS = """
import json
import function_app
print(json.dumps(sorted(
    str(fn.get_function_name())
    for fn in function_app.app.get_functions()
    if fn.get_trigger() is None or fn.get_trigger().get_binding_name() != "httpTrigger"
)))
"""


def background_functions(env: dict[str, str]) -> list[str]:
    """The app's non-HTTP functions (queue and timer triggers), as the devhost names them."""
    done = subprocess.run(
        [sys.executable, "-c", _LIST_BACKGROUND_FUNCTIONS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"listing the app's functions failed:\n{done.stderr[-2000:]}")
    names = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(names, list) and names, f"no background functions?! {done.stdout!r}"
    return [str(n) for n in names]


def _whole_second(at: datetime) -> datetime:
    return at.replace(microsecond=0)


def _iso_seconds(at: datetime) -> str:
    return f"{at.astimezone(UTC):%Y-%m-%dT%H:%M:%S}Z"


def _created(stack: LocalStack, order_ids: list[str], timeout: float) -> dict[str, Order]:
    def all_there() -> dict[str, Order]:  # empty (falsy) until every one is there
        loaded = {o: stack.context.store.load(o) for o in order_ids}
        return {k: v for k, v in loaded.items() if v is not None} if all(loaded.values()) else {}

    return wait_for(all_there, timeout, interval=0.2, what=f"orders {order_ids} to be created")


def _waits(order: Order | None, step: str) -> bool:
    record = order.find(step) if order is not None else None
    return record is not None and record.is_active and record.waiting_for is not None


def _settle(
    stack: LocalStack, expected: dict[str, str], waiting: dict[str, str], timeout: float
) -> None:
    def done() -> bool:
        loaded = {o: stack.context.store.load(o) for o in expected}
        finished = all(v is not None and v.status.terminal for v in loaded.values())
        return finished and all(
            _waits(stack.context.store.load(o), step) for o, step in waiting.items()
        )

    with contextlib.suppress(AssertionError):  # reported below, with what each order did
        wait_for(done, timeout, interval=0.5, what="the browser-test orders to settle")
    loaded = {o: stack.context.store.load(o) for o in (*expected, *waiting)}
    actual = {o: v.status.value if v is not None else None for o, v in loaded.items()}
    wrong = {o: (actual[o], want) for o, want in expected.items() if actual[o] != want}
    wrong |= {
        o: (actual[o], f"processing, {step} waiting")
        for o, step in waiting.items()
        if not _waits(loaded[o], step)
    }
    why = {
        o: [
            {k: h[k] for k in ("event", "attempt", "reason", "error") if k in h}
            for s in order.steps
            for h in s.history
            if h.get("event") not in ("created", "claimed")
        ]
        for o, order in loaded.items()
        if o in wrong and order is not None
    }
    assert not wrong, (
        f"orders not in the state the tests need, (actual, wanted): {wrong}; "
        f"what their steps recorded: {json.dumps(why, indent=1)}"
    )


@contextlib.contextmanager
def running_console() -> Iterator[Console]:
    """The app with its orders settled (see the module docstring); stopped on exit."""
    orders = Orders()
    with (
        declarations(FLOWS),
        LocalStack(
            devhosts=2,
            settings=SETTINGS,
            devhost_env=[{"CONSOLE_READ_ONLY": "false"}, {"CONSOLE_READ_ONLY": "true"}],
            autostart=False,
        ) as stack,
    ):
        stack.hosts[1].args = [
            "--exclude",
            ",".join(background_functions(stack.env)),
            "--http-port",
            "0",
        ]
        for host in stack.hosts:
            host.start()
        base, read_only_base = stack.hosts[0].http_url, stack.hosts[1].http_url
        assert base and read_only_base, "a devhost did not report its HTTP address"
        bodies = orders.bodies()
        for body in bodies.values():
            stack.submit(body)
        # The bulk group alone in its own whole seconds: after the others' last creation
        # time, wait for the next whole second, so `from` (the group's first whole second)
        # is later than every other order and `to` (after its last) earlier than none.
        others = _created(stack, list(bodies), 30)
        last = max(o.created_at for o in others.values())
        next_second = _whole_second(last) + timedelta(seconds=1)
        time.sleep(max(0.0, (next_second - datetime.now(UTC)).total_seconds()) + 0.05)
        bulk_bodies = orders.bulk_bodies()
        for body in bulk_bodies.values():
            stack.submit(body)
        group = _created(stack, list(bulk_bodies), 30)
        first = _whole_second(min(o.created_at for o in group.values()))
        end = _whole_second(max(o.created_at for o in group.values())) + timedelta(seconds=1)
        intruders = [o for o, v in others.items() if first <= v.created_at < end]
        assert not intruders, f"orders created inside the bulk window: {intruders}"
        _settle(stack, orders.expected(), orders.waiting(), SETTLE_TIMEOUT)
        yield Console(
            stack=stack,
            base=base,
            read_only_base=read_only_base,
            orders=orders,
            bodies={**bodies, **bulk_bodies},
            bulk_from=_iso_seconds(first),
            bulk_to=_iso_seconds(end),
        )


# --- the browser ----------------------------------------------------------------------


def chromium() -> WebDriver:
    """Headless Chromium from the Debian packages; nothing is ever downloaded."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} missing: run `make browser-deps` (apt-get install "
            "chromium chromium-driver) first",
            pytrace=False,
        )
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never look anything up
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    chrome.set_page_load_timeout(30)
    return chrome


def _gone(page: WebElement) -> Callable[[WebDriver], bool]:
    """``ec.staleness_of``, also for the other way Chromium says the page was replaced:
    asked about the old page's node mid-navigation, it may answer "Node with given id
    does not belong to the document" (an "unknown error", not a stale reference)."""
    stale = ec.staleness_of(page)

    def check(driver: WebDriver) -> bool:
        try:
            return bool(stale(driver))
        except WebDriverException as error:
            if "does not belong to the document" in str(error.msg or ""):
                return True
            raise

    return check


class Browser:
    """The session's Chromium with bounded waits and readable failures."""

    def __init__(self, driver: WebDriver, artifacts: Path) -> None:
        self.driver = driver
        self.artifacts = artifacts

    # navigation

    def open(self, url: str, ready: str, timeout: float = PAGE_TIMEOUT) -> WebElement:
        """Load ``url`` and wait for ``ready`` (a CSS selector) to be on the page."""
        self.driver.get(url)
        return self.wait_for(ready, timeout, f"GET {url}")

    def click_through(self, css: str, ready: str, timeout: float = PAGE_TIMEOUT) -> WebElement:
        """Click ``css``, wait for the next page to replace this one, then for ``ready``."""
        self.leave(lambda: self.one(css).click(), f"clicking {css}", timeout)
        return self.wait_for(ready, timeout, f"after clicking {css}")

    def back(self, ready: str, timeout: float = PAGE_TIMEOUT) -> WebElement:
        self.leave(self.driver.back, "going back", timeout)
        return self.wait_for(ready, timeout, "after going back")

    def reload(self, ready: str, timeout: float = PAGE_TIMEOUT) -> WebElement:
        self.leave(self.driver.refresh, "reloading", timeout)
        return self.wait_for(ready, timeout, "after reloading")

    def leave(self, action: Callable[[], object], what: str, timeout: float) -> None:
        page = self.driver.find_element(By.TAG_NAME, "html")
        action()
        try:
            WebDriverWait(self.driver, timeout).until(_gone(page))
        except TimeoutException:
            raise AssertionError(
                f"{what}: still on {self.driver.current_url} after {timeout:.0f} s"
            ) from None

    # who the browser is

    @contextlib.contextmanager
    def signed_in_as(self, principal: str) -> Iterator[None]:
        """Every request the browser makes says ``X-Dev-Principal: <principal>`` (devhost's
        stand-in for sign-in, e.g. ``"rita; roles=Orders.Reader"``) for the block; then
        the devhost's own development principal again (an operator)."""
        assert isinstance(self.driver, ChromiumDriver), "the header is set through CDP"
        self.driver.execute_cdp_cmd("Network.enable", {})
        self.driver.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"X-Dev-Principal": principal}}
        )
        try:
            yield
        finally:
            self.driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})

    # reading

    def wait_for(self, css: str, timeout: float = PAGE_TIMEOUT, after: str = "") -> WebElement:
        try:
            return WebDriverWait(self.driver, timeout).until(
                ec.presence_of_element_located((By.CSS_SELECTOR, css))
            )
        except TimeoutException:
            raise AssertionError(
                f"{after or 'waiting'}: no `{css}` within {timeout:.0f} s on "
                f"{self.driver.current_url} (title {self.driver.title!r}); the page says: "
                f"{self.body_text()[:400]!r}"
            ) from None

    def until(self, condition: Callable[[WebDriver], T], timeout: float, what: str) -> T:
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.5).until(condition)
        except TimeoutException:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what} on "
                f"{self.driver.current_url}; the page says: {self.body_text()[:400]!r}"
            ) from None

    def all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def one(self, css: str) -> WebElement:
        found = self.all(css)
        assert found, (
            f"no `{css}` on {self.driver.current_url}; the page says: {self.body_text()[:400]!r}"
        )
        return found[0]

    def has(self, css: str) -> bool:
        return bool(self.all(css))

    def text(self, css: str) -> str:
        """The element's rendered text, whitespace collapsed."""
        return squash(self.one(css).text)

    def body_text(self) -> str:
        try:
            return squash(self.driver.find_element(By.TAG_NAME, "body").text)
        except WebDriverException:
            return "(no body)"

    def js(self, script: str) -> Any:
        return self.driver.execute_script(script)

    # evidence

    def save_artifacts(self, name: str = "failure") -> list[Path]:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        saved: list[Path] = []
        shot = self.artifacts / f"{name}.png"
        try:
            if self.driver.save_screenshot(str(shot)):
                saved.append(shot)
            source = self.artifacts / f"{name}.html"
            source.write_text(
                f"<!-- {self.driver.current_url} -->\n{self.driver.page_source}",
                encoding="utf-8",
            )
            saved.append(source)
            log = self.artifacts / f"{name}.browser-log.json"
            get_log = getattr(self.driver, "get_log", None)  # Chromium's drivers have it
            log.write_text(json.dumps(get_log("browser") if get_log else [], indent=2))
            saved.append(log)
        except WebDriverException as exc:  # the browser itself broke: say so, keep going
            note = self.artifacts / f"{name}.error.txt"
            note.write_text(f"saving the page failed: {exc}")
            saved.append(note)
        return saved


def squash(text: str) -> str:
    return " ".join(text.split())


def first_number(text: str) -> int:
    """The first whole number in ``text`` ("3", "3 orders"); an AssertionError if none."""
    found = re.search(r"\d+", text)
    assert found, f"no number in {text!r}"
    return int(found.group())


# --- plain HTTP, for what a browser would never send ------------------------------------


class _CsrfField(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.value: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "input" and named.get("name") == "csrf" and self.value is None:
            self.value = named.get("value") or ""


def csrf_pair(console_url: str, order_id: str) -> tuple[str, str] | None:
    """A CSRF cookie and form field as a confirm page hands them out, or None if it does not."""
    response = httpx.get(
        f"{console_url}/orders/{order_id}/confirm",
        params={"action": "resubmit", "reason": "csrf probe"},
        timeout=10,
    )
    cookie = response.cookies.get("console_csrf")
    parser = _CsrfField()
    parser.feed(response.text)
    if response.status_code != 200 or not cookie or not parser.value:
        return None
    return cookie, parser.value


def console_post(
    url: str, data: dict[str, str], *, cookie: str | None, headers: dict[str, str]
) -> httpx.Response:
    """A form POST as a script (not a browser) sends it, with or without the CSRF cookie."""
    with httpx.Client(cookies={"console_csrf": cookie} if cookie else {}, timeout=10) as client:
        return client.post(url, data=data, headers=headers, follow_redirects=False)
