"""The chaos run: several devhost instances, hundreds of orders, faults everywhere.

- the simulator injects transient errors, hangs past the deadline and dropped
  connections at random, and some orders carry permanent failures;
- every few seconds a random devhost instance is SIGKILLed and restarted at
  once; some instances also carry failpoints that kill them inside the
  narrowest windows (right after a claim, after a reply's save, after the
  remote call);
- every instance runs the supervisor's timer, so several supervisors race;
- a meddler steals agent replies and puts each back twice, delayed, so replies
  arrive duplicated, out of order, and some after their step was reset;
- a storm redelivers agent requests: some are taken off their queue and put back three
  times (Storage queues), so agents run one attempt several times at once;
- one instance's clock runs ahead (``ORDERS_CLOCK_OFFSET_SECONDS``, within the skew the
  app allows, ``MAX_CLOCK_SKEW_SECONDS``): it expires and decides on its own time;
- some orders run the product's ``checkout`` (docs/contracts.md §3.13): stock and payment
  at once, a delay, a carrier that confirms by callback to whichever instance built the
  request (which may be dead by then), and for big ones a person's approval, which an
  approver sends over HTTP to a random live instance, sometimes before the order waits
  for it (kept), sometimes twice (the same event again);
- some orders pick their lines (``tests.fixtures.shop_items``' ``picking``: a ``ForEach``,
  docs/contracts.md §3.16), three at a time, each line a step of its own under its own
  key; in some one line is refused for good, in others the pack after them: every line
  that applied must then be undone with its own result, once, and none applied twice,
  whatever the kills did mid-items (``tests.chaos.item_effects``);
- some orders take turns (``tests.fixtures.chaos_shop``: per-key concurrency,
  docs/contracts.md §3.16): four of one account sent together, one or two running at
  a time, one of them refused for good; never more of a key running than its limit,
  each waiting order ran, and no slot is left held once the run has settled
  (``tests.chaos.turn_checks``);
- some orders' remote stalls for 2.5 step timeouts (every call held until then): they
  must complete with no alert, whatever else happens (docs/contracts.md §3.11, paced
  retries);
- a third of the way in, every remote service goes down (``LocalStack.outage``):
  503 to every call for a while, then connections refused, while all of the
  above goes on. Orders must ride it out (docs/contracts.md §3.11): same final statuses,
  and only a trickle of probe calls reaches the remote while it is down.

Then the chaos stops, every order gets time to finish, and only system-wide
invariants are checked (``demo.verify``), plus two bounds on how orders ended:
every order ended as its scenario expected or ran out of attempts, and running
out is rare (``exhausted_bound``) and, attempt by attempt, explained by the
faults this run injected (``explain_exhausted``).
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from config.settings import CLOCK_OFFSET, REPLY_HANDLER, disabled_setting
from core.attempts import Attempt
from core.messages import idempotency_key
from core.model import Order, StepRecord
from core.outcome import Outcome
from core.states import StepState
from core.timefmt import iso, parse_iso
from demo.stack import Devhost, LocalStack
from demo.verify import Verdict, drain_alerts, load_orders, verify
from simulator import load_ledger
from tests.chaos.item_effects import ItemsVerdict, check_items, has_items, merge, most_in_flight
from tests.chaos.turn_checks import check_turns, group_of, keyed, keyed_order
from tests.fixtures.shop_items import PICKING_CONCURRENCY

MAX_FAILURES = 8
STEP_TIMEOUT = 4
#: The most random faults the simulator injects on one idempotency key over the whole run
#: (``--max-random-faults-per-key``). Fewer than MAX_FAILURES: random remote faults alone
#: never make a step run out of attempts; at least MAX_FAILURES - 2 = 6 of an exhausted
#: step's failures must come from the other faults (process deaths, replies held back).
RANDOM_FAULTS_PER_KEY = 2
#: What the call log names a random fault (``simulator.faults.RandomFaults``); directives
#: give "permanent", the outage switch "outage" (which must cost no order a failure).
RANDOM_FAULTS = frozenset({"transient", "hang", "drop"})
#: A failpoint death is noticed by the chaos loop (every 0.5 s, plus a restart) after it
#: happened: a death noticed this long after an attempt ended may still have ended it.
DEATH_NOTICE_SLACK = timedelta(seconds=3)
#: How often the meddler looks at the reply queue (a share of the replies, not all of them).
MEDDLER_POLL_SECONDS = 0.2
#: One instance's clock runs this far ahead of the others'.
CLOCK_OFFSET_SECONDS = 1.5
#: The request storm: how often it looks, and how many copies of a request it puts back.
STORM_POLL_SECONDS = 0.2
STORM_COPIES = 3
#: The stalled orders' remote holds every call for this long after the key's first call.
STALL = {"fail": "stall", "seconds": 2.5 * STEP_TIMEOUT}
#: The declarations of the run: the suite's shop, ``picking`` over an order's lines, and
#: the keyed ``queued`` and ``queued-pair``.
DECLARATIONS = "tests.fixtures.chaos_shop"
#: How often every instance's supervisor runs (``SUPERVISOR_SCHEDULE``), in seconds.
SUPERVISOR_SECONDS = 1
#: One order in this many picks its lines (``picking_order``).
PICKING_EVERY = 10


def ahead_prefix(devhosts: int) -> str:
    """The instance-id prefix (every life of it: ``life``) of the devhost whose clock runs
    ``CLOCK_OFFSET_SECONDS`` ahead: the last one (``run_chaos``)."""
    return f"devhost-{devhosts - 1}-"


@dataclass(frozen=True)
class ChaosPlan:
    orders: int = 150
    devhosts: int = 3
    chaos_seconds: float = 45
    kill_every: tuple[float, float] = (2.0, 4.0)
    settle_seconds: float = 150
    seed: int = 20261122
    #: When the outage starts, as a fraction of ``chaos_seconds``; None: no outage.
    outage_at: float | None = 1 / 3
    keep_workdir: bool = False  # keep the stack's logs, table and ledger after the run
    #: The agent queues' transport: "storage" (Azurite) or "servicebus" (localbus).
    transport: str = "storage"

    def outage_phases(self) -> tuple[float, float]:
        """(seconds of 503, seconds unreachable): 8 + 6 s, scaled up for longer runs."""
        scale = max(1.0, self.chaos_seconds / 40)
        return round(8 * scale, 1), round(6 * scale, 1)


def make_orders(plan: ChaosPlan, rng: random.Random) -> dict[str, tuple[dict[str, Any], str]]:
    """order id -> (message, expected final status)."""
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for n in range(plan.orders):
        order_id = f"chaos-{plan.seed % 1000:03d}-{n:04d}"
        roll = rng.random()
        if keyed(n):  # (its draw unused: the others' stay as they were)
            out[f"{order_id}-key"] = keyed_order(f"{order_id}-key", n, plan.seed)
        elif n % PICKING_EVERY == PICKING_EVERY // 2:  # (the others' draws stay as they were)
            out[f"{order_id}-pick"] = picking_order(f"{order_id}-pick", n, roll)
        elif roll < 0.55 and n != 1:
            out[order_id] = ({"orderId": order_id, "amount": n}, "completed")
        elif roll < 0.60 or n == 1:  # (at least one in every run)
            order_id = f"{order_id}-stall"  # its remote only stalls: it must complete
            out[order_id] = ({"orderId": order_id, "simulate": {"process": STALL}}, "completed")
        elif roll < 0.68:
            out[order_id] = ({"orderId": order_id, "simulate": {"process": "permanent"}}, "error")
        elif roll < 0.73 or n == 2:  # (at least one in every run)
            # checkout: big ones wait for the approver (Approver below)
            amount = 2500 if rng.random() < 0.5 or n == 2 else 50
            out[order_id] = (
                {"orderId": order_id, "workflow": "checkout", "amount": amount},
                "completed",
            )
        elif roll < 0.86:
            out[order_id] = ({"orderId": order_id, "workflow": "fulfilment"}, "completed")
        elif roll < 0.93:
            out[order_id] = (
                {"orderId": order_id, "workflow": "fulfilment", "simulate": {"ship": "permanent"}},
                "compensated",
            )
        else:
            out[order_id] = (
                {
                    "orderId": order_id,
                    "workflow": "fulfilment",
                    "simulate": {"charge-payment": "permanent"},
                },
                "compensated",
            )
    return out


def waves(
    orders: dict[str, tuple[dict[str, Any], str]],
) -> list[list[tuple[str, tuple[dict[str, Any], str]]]]:
    """The orders in groups sent together: an account's keyed orders (in the order they
    were made), every other order alone."""
    groups: dict[str, list[tuple[str, tuple[dict[str, Any], str]]]] = {}
    for order_id, entry in orders.items():
        groups.setdefault(group_of(entry[0]) or order_id, []).append((order_id, entry))
    return list(groups.values())


def picking_order(order_id: str, n: int, roll: float) -> tuple[dict[str, Any], str]:
    """A ``picking`` order of 3-6 lines (message, expected final status): all picked
    (six in ten), one line refused for good (two in ten), or the pack after them refused
    (two in ten); the last two unwind every line that applied."""
    lines: list[dict[str, Any]] = [{"sku": f"S-{i}", "qty": 1 + i} for i in range(3 + n % 4)]
    message: dict[str, Any] = {"orderId": order_id, "workflow": "picking", "lines": lines}
    if roll < 0.6:
        return message, "completed"
    if roll < 0.8:
        lines[n % len(lines)]["simulate"] = {"pick-line": "permanent"}
    else:
        message["simulate"] = {"pack": "permanent"}
    return message, "compensated"


class ReplyMeddler(threading.Thread):
    """Steals some agent replies and returns each twice, delayed (duplicated, reordered,
    sometimes after the step's deadline has passed and the supervisor reset it)."""

    def __init__(self, stack: LocalStack, rng: random.Random, stop: threading.Event):
        super().__init__(name="reply-meddler", daemon=True)
        ctx = stack.context
        self._queue = ctx.queues.client(ctx.names.agent_replies)
        self._rng = rng
        self._halt = stop
        self.duplicated = 0
        #: (orderId, step, attempt) -> the smaller delay of its two copies, in seconds
        self.held: dict[tuple[str, str, int], float] = {}

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                for message in self._queue.receive_messages(max_messages=8, visibility_timeout=60):
                    delays = [self._rng.choice([0, 1, 3, STEP_TIMEOUT + 2]) for _ in range(2)]
                    for delay in delays:
                        self._queue.send_message(message.content, visibility_timeout=delay or None)
                    self._queue.delete_message(message)
                    self.duplicated += 1
                    self._note(message.content, min(delays))
            except Exception:
                pass
            # Often: the reply handlers of the other instances poll this queue every 0.1 s
            # while it is busy, and only the replies the meddler sees first are meddled with.
            self._halt.wait(MEDDLER_POLL_SECONDS)

    def _note(self, content: str, delay: float) -> None:
        """Remember which attempt's reply was held back (an explanation for its expiry)."""
        try:
            reply = json.loads(content)
            key = (str(reply["orderId"]), str(reply["step"]), int(reply["attempt"]))
        except (ValueError, KeyError, TypeError):
            return
        if delay > 0:
            self.held[key] = min(delay, self.held.get(key, delay))


class Approver(threading.Thread):
    """Approves the big checkout orders over HTTP (``POST /api/orders/{id}/events/approved``)
    at a random moment after each is submitted, to a random live instance: sometimes before
    the order waits for it (kept for its step), sometimes twice (the same event again).
    A call that fails (its instance killed) is sent again; each order counts as approved
    once an answer was 2xx."""

    def __init__(self, stack: LocalStack, rng: random.Random, stop: threading.Event):
        super().__init__(name="approver", daemon=True)
        self._stack = stack
        self._rng = rng
        self._halt = stop
        self._lock = threading.Lock()
        self._due: dict[str, float] = {}  # order id -> when to send (monotonic)
        self.approved: set[str] = set()
        self.repeated = 0
        self.answers: Counter[int] = Counter()

    def submitted(self, message: dict[str, Any]) -> None:
        if message.get("workflow") == "checkout" and float(message.get("amount", 0)) >= 1000:
            with self._lock:
                self._due[str(message["orderId"])] = time.monotonic() + self._rng.uniform(0, 6)

    def pending(self) -> list[str]:
        with self._lock:
            return sorted(self._due)

    def run(self) -> None:
        import httpx

        while not self._halt.is_set() or self.pending():
            now = time.monotonic()
            with self._lock:
                due = [o for o, at in self._due.items() if at <= now]
            for order_id in due:
                hosts = [h.http_url for h in self._stack.hosts if h.alive and h.http_url]
                if not hosts:
                    break
                body = {"result": {"by": "chaos-approver"}, "reason": "within limits"}
                try:
                    answer = httpx.post(
                        f"{self._rng.choice(hosts)}/api/orders/{order_id}/events/approved",
                        json=body,
                        timeout=10,
                    ).status_code
                except httpx.HTTPError:
                    answer = 0
                self.answers[answer] += 1
                with self._lock:
                    if 200 <= answer < 300 or answer == 409:
                        if answer == 409 or (order_id in self.approved or self._rng.random() > 0.3):
                            del self._due[order_id]  # done (409: finished or not waiting)
                        else:
                            self._due[order_id] = now + 1  # the same event again
                            self.repeated += 1
                        if answer != 409:
                            self.approved.add(order_id)
                    else:  # not accepted yet (404 before the order exists, a dead instance)
                        self._due[order_id] = now + 1
            if self._halt.wait(0.3) and not self.pending():
                break


class RequestStorm(threading.Thread):
    """Takes some agent requests off their queues and puts each back ``STORM_COPIES`` times
    (0, 1 and 2 s later): the same attempt delivered several times at once, as a host
    that lost its lease would. Storage queues only (the Service Bus queues detect
    duplicate message ids: a copy with the same id would be dropped by the broker)."""

    def __init__(self, stack: LocalStack, rng: random.Random, stop: threading.Event):
        super().__init__(name="request-storm", daemon=True)
        ctx = stack.context
        self._queues = [ctx.queues.client(q) for q in ctx.names.agent_queues()]
        self._rng = rng
        self._halt = stop
        self.copied = 0
        #: (orderId, step, attempt) of every request it copied
        self.attempts: set[tuple[str, str, int]] = set()

    def run(self) -> None:
        while not self._halt.is_set():
            queue = self._rng.choice(self._queues)
            try:
                for message in queue.receive_messages(max_messages=8, visibility_timeout=60):
                    for delay in range(STORM_COPIES):
                        queue.send_message(message.content, visibility_timeout=delay or None)
                    queue.delete_message(message)
                    self.copied += 1
                    self._note(message.content)
            except Exception:
                pass
            self._halt.wait(STORM_POLL_SECONDS)

    def _note(self, content: str) -> None:
        try:
            request = json.loads(content)
            self.attempts.add(
                (str(request["orderId"]), str(request["step"]), int(request["attempt"]))
            )
        except (ValueError, KeyError, TypeError):
            pass


class ServiceBusReplyMeddler(threading.Thread):
    """``ReplyMeddler`` for ``AGENT_TRANSPORT=servicebus``: takes some replies off the
    Service Bus reply queue (peek-lock, then complete) and sends each back twice, delayed.
    The copies get their own message ids (the queue's duplicate detection would drop
    same-id copies): to the app they are the same reply delivered twice."""

    def __init__(self, stack: LocalStack, rng: random.Random, stop: threading.Event):
        super().__init__(name="reply-meddler", daemon=True)
        self._connection = stack.service_bus_connection
        self._queue = stack.context.names.agent_replies
        self._rng = rng
        self._halt = stop
        self.duplicated = 0
        self.held: dict[tuple[str, str, int], float] = {}
        self._due: list[tuple[float, Any]] = []  # (monotonic time, message to send)

    def run(self) -> None:
        from azure.servicebus import ServiceBusClient

        assert self._connection is not None
        with ServiceBusClient.from_connection_string(self._connection, retry_total=1) as client:
            receiver = client.get_queue_receiver(self._queue, max_wait_time=1)
            sender = client.get_queue_sender(self._queue)
            with receiver, sender:
                while not self._halt.is_set():
                    try:
                        self._meddle(receiver)
                        self._send_due(sender)
                    except Exception:
                        pass
                    self._halt.wait(MEDDLER_POLL_SECONDS)
                self._send_due(sender, everything=True)

    def _meddle(self, receiver: Any) -> None:
        from azure.servicebus import ServiceBusMessage

        for message in receiver.receive_messages(max_message_count=8, max_wait_time=0.5):
            body = b"".join(message.body)
            props = {_text(k): _text(v) for k, v in (message.application_properties or {}).items()}
            delays = [self._rng.choice([0, 1, 3, STEP_TIMEOUT + 2]) for _ in range(2)]
            for n, delay in enumerate(delays):
                copy = ServiceBusMessage(
                    body,
                    message_id=f"{message.message_id}:copy{n}",
                    correlation_id=message.correlation_id,
                    content_type=message.content_type,
                    subject=message.subject,
                    application_properties=props,
                )
                self._due.append((time.monotonic() + delay, copy))
            receiver.complete_message(message)
            self.duplicated += 1
            ReplyMeddler._note(self, body.decode("utf-8", "replace"), min(delays))  # type: ignore[arg-type]  # same bookkeeping

    def _send_due(self, sender: Any, everything: bool = False) -> None:
        now = time.monotonic()
        due = [m for at, m in self._due if everything or at <= now]
        self._due = [] if everything else [(at, m) for at, m in self._due if at > now]
        for message in due:
            sender.send_messages(message)


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@dataclass(frozen=True)
class Outage:
    """The outage window of a run (every remote service down), and what the remote saw."""

    error_seconds: float  # every call answered 503
    unreachable_seconds: float  # then connections refused
    before: datetime  # wall clock just before the switch was asked
    after: datetime  # wall clock once the 503 phase was in force
    mono: float  # time.monotonic() at ``after``
    offset: float  # seconds into the chaos phase

    #: The first seconds of the 503 phase are left out of the rate: every instance's
    #: breakers are still tripping (3 orders must fail on an endpoint first).
    SETTLING = 3.0

    @classmethod
    def start(cls, stack: LocalStack, plan: ChaosPlan, chaos_started: float) -> Outage:
        error_seconds, unreachable_seconds = plan.outage_phases()
        before = datetime.now(UTC)
        stack.outage(
            {
                "phases": [
                    {"mode": "error", "status": 503, "seconds": error_seconds},
                    {"mode": "unreachable", "seconds": unreachable_seconds},
                ]
            }
        )
        mono = time.monotonic()
        return cls(
            error_seconds,
            unreachable_seconds,
            before,
            datetime.now(UTC),
            mono,
            round(mono - chaos_started, 1),
        )

    def call_bound(self, instances: int, starts: int) -> int:
        """The most calls the remote may receive in the 503 phase after ``SETTLING``.

        Contract 3.11: while the remote is down it sees a trickle of probes, not every
        order's retries. Every process has one breaker per endpoint path (``agents.health``)
        and there are E = 9 paths (process, reserve-stock, charge-payment, ship, and the
        compensations refund-payment, release-stock; the picking orders' pick-line,
        unpick-line and pack). In a window of W seconds:

        - probes: an open breaker lets one call through at a time, the next no sooner
          than 2 s after the last one failed (then 4, 8, 10 s): at most W / 2 per path
          per instance, so E * instances * W / 2 (9 calls/s for 3 instances);
        - slack for attempts admitted just before a breaker opened: a breaker opens
          once three different orders have failed on it; until then the attempts it
          admitted retry (full-jitter backoff from 0.2 s), and those in flight when it
          opens land just after. A devhost runs at most C = 24 attempts at once of each
          agent's function (batchSize 16 + newBatchThreshold 8, host.json, per function),
          and the remote's paths are spread over A = 4 agents' functions (orders,
          inventory, payments, carrier), each with its own breakers: allow C calls per
          agent for each process (re)started in the window (a fresh process starts with
          closed breakers), plus as many for breakers of the running processes that trip
          late (an endpoint with fewer than 3 failing orders on an instance has not
          opened: those 1-2 orders retry until their deadline). (Counted once per process
          before, as if every agent shared one function's 24 slots; one short run in
          several went past that by ten calls.) The probe term is itself generous (the interval
          grows 2, 4, 8, 10 s: about 3 probes per path in 12 s, not 6), and its unused
          part absorbs a fresh process whose trips cost more than C.

        bound = E * instances * W / 2 + C * A * (starts + 1). For the short run (W = 5 s,
        3 instances, 1 restart in the window): 67 + 192 = 259 calls, 52/s. Without the
        breakers, 3 instances each running C attempts of each of the A functions, each
        retrying with full-jitter backoff (0.2 s doubling, ~6 tries in the ~3.2 s before
        a 4 s deadline, then redispatched), would send about 3 * 4 * 24 * 2 = 576
        calls/s while the orders wait (100+/s with the ~60 in flight at the short run's
        outage): the bound is several times below that.
        """
        endpoints, concurrency, agents = 9, 24, 4
        window = self.error_seconds - self.SETTLING
        return int(endpoints * instances * window / 2 + concurrency * agents * (starts + 1))

    def summary(
        self, stack: LocalStack, starts: list[float], final: dict[str, Order | None]
    ) -> dict[str, Any]:
        calls = stack.remote_calls(self.before.isoformat())
        at = [(parse_iso(c["at"]), c) for c in calls]
        error_end = self.after + timedelta(seconds=self.error_seconds)
        end = error_end + timedelta(seconds=self.unreachable_seconds)
        settled = self.after + timedelta(seconds=self.SETTLING)
        during = [c for t, c in at if t < error_end]
        late = [c for t, c in at if settled <= t < error_end]
        window = self.error_seconds - self.SETTLING
        first_ok = next(
            (t for t, c in at if t >= end and c["answer"] == 200 and c["fault"] is None), None
        )
        active = {
            order.order_id
            for order in final.values()
            if order is not None
            for step in order.steps
            for h in step.history
            if self.before <= parse_iso(h["at"]) <= end
        }
        restarts = sum(
            1 for s in starts if self.mono + self.SETTLING <= s < self.mono + self.error_seconds
        )
        return {
            "startedAt": self.after.isoformat(timespec="milliseconds"),
            "startSecond": self.offset,
            "errorSeconds": self.error_seconds,
            "unreachableSeconds": self.unreachable_seconds,
            "ordersActive": len(active),
            "callsDuring503": len(during),
            "outageAnswered": sum(1 for c in calls if c["fault"] == "outage"),
            "callsAfterSettling": len(late),
            "callsPerSecondAfterSettling": round(len(late) / window, 2),
            "callsAfterSettlingByStep": dict(Counter(c["step"] for c in late)),
            "processStartsAfterSettling": restarts,
            "callBoundAfterSettling": self.call_bound(stack.devhosts, restarts),
            "callsWhileUnreachable": sum(1 for t, _ in at if error_end <= t < end),
            "firstSuccessAfterEndSeconds": (
                round((first_ok - end).total_seconds(), 1) if first_ok else None
            ),
        }


def items_summary(
    items: ItemsVerdict, orders: dict[str, Order | None], deaths: Deaths
) -> dict[str, Any]:
    """What the picking orders did: their verdict, and the most lines of one order in
    flight at once (from the records; at most ``PICKING_CONCURRENCY``). One instance's
    clock runs ``CLOCK_OFFSET_SECONDS`` ahead, and the records carry each writer's time:
    ``mostInFlight`` reads every end as early as that (an overlap shorter than the skew is
    not seen), ``mostInFlightAsWritten`` the times as they are (it may count one more).
    ``attemptsHitByDeaths``: the line attempts during which a process died."""
    skew = timedelta(seconds=CLOCK_OFFSET_SECONDS)
    ran = [o for o in orders.values() if o is not None]
    return {
        **items.as_json(),
        "mostInFlight": max((most_in_flight(o, "pick", skew) for o in ran), default=0),
        "mostInFlightAsWritten": max((most_in_flight(o, "pick") for o in ran), default=0),
        "maxConcurrency": PICKING_CONCURRENCY,
        # line attempts during which a process died (a kill or a failpoint): kills mid-items
        "attemptsHitByDeaths": sum(
            1
            for o in ran
            for record in o.steps
            if record.step.startswith("pick[")
            for a in record.attempts.items
            if any(a.claimed_at <= t <= (a.ended_at or a.deadline) for t, _ in deaths.log)
        ),
    }


def life(host: Devhost) -> str:
    """The instance id prefix of ``host``'s current process (``--instance-id``); a claim
    records it as ``<life>-<pid>``."""
    return f"devhost-{host.index}-{host.starts}"


@dataclass
class Deaths:
    """Every process death of the run: when it was caused or noticed, and which life."""

    log: list[tuple[datetime, str]] = field(default_factory=list)

    def add(self, host: Devhost) -> None:
        self.log.append((datetime.now(UTC), life(host)))

    def __len__(self) -> int:
        return len(self.log)


def bring_up(host: Devhost, deaths: Deaths) -> int:
    """Start ``host``; returns how many times its own failpoints killed it on the way up
    (each recorded in ``deaths``).

    A fresh process serves its triggers before it prints its HTTP address, and with
    failpoints armed it may SIGKILL itself in between (a batch of claims at 3% each):
    that is one more kill, not a failed run; start it again.
    """
    for kills in range(20):
        try:
            host.start()
            return kills
        except RuntimeError:
            if host.process is None or host.process.returncode != -signal.SIGKILL:
                raise
            deaths.add(host)
            host.kill()  # already dead: close its pipe and log
    raise RuntimeError(f"devhost {host.index} killed itself 20 times while starting")


def counted_failures(step: StepRecord) -> list[Attempt]:
    """The step's attempts that counted toward MAX_FAILURES (as ``demo.verify`` counts)."""
    return [
        a
        for a in step.attempts.items
        if a.counted and a.ending in (Outcome.EXPIRED, Outcome.TRANSIENT)
    ]


def exhausted_step(order: Order) -> StepRecord | None:
    failed = [
        s
        for s in order.steps
        if s.process_state is StepState.ERROR and len(counted_failures(s)) >= MAX_FAILURES
    ]
    return max(failed, key=lambda s: s.seq) if failed else None


def explain_exhausted(
    final: dict[str, Order | None],
    exhausted: Iterable[str],
    calls: list[dict[str, Any]],
    deaths: Deaths,
    held: dict[tuple[str, str, int], float],
    ahead: str = "",
) -> dict[str, dict[str, Any]]:
    """For each order that ran out of attempts: what this run injected into each failed
    attempt of its step, from the run's own bookkeeping (``ahead``: ``cause_of``).

    An attempt (claimed at C, counted as failed at F) is explained by, in this order: a
    random fault the simulator injected on the step's key between C and F (its call log);
    the meddler holding back that attempt's reply (``ReplyMeddler.held``); the death of the
    process that claimed it (``Deaths``, by instance id) after C; the death of any process
    between C and F + ``DEATH_NOTICE_SLACK`` (an agent holding the request or the reply
    may be any of them). The last is loose while the kills go on (one every 2-4 s, besides
    the failpoints); it is strict once the chaos stops: then only random faults explain a
    failure, and they are at most ``RANDOM_FAULTS_PER_KEY`` per key. Remote answers of the
    outage explain nothing: docs/contracts.md §3.11 says an outage costs no order a failure.
    """
    out: dict[str, dict[str, Any]] = {}
    for order_id in exhausted:
        order = final.get(order_id)
        step = exhausted_step(order) if order is not None else None
        if order is None or step is None:
            out[order_id] = {"unexplained": ["no step ran out of attempts"]}
            continue
        faults = faults_on(calls, idempotency_key(order_id, step.step))
        causes: Counter[str] = Counter()
        unexplained: list[int] = []
        for failure in counted_failures(step):
            cause = cause_of(failure, (order_id, step.step), faults, deaths, held, ahead)
            if cause is None:
                unexplained.append(failure.number)
            else:
                causes[cause] += 1
        out[order_id] = {
            "step": step.step,
            "failures": len(counted_failures(step)),
            "randomFaultsOnKey": len(faults),
            "causes": dict(causes),
            "unexplained": unexplained,
        }
    return out


def explain_doubted(
    final: dict[str, Order | None],
    doubted: Iterable[str],
    deaths: Deaths,
    copied: Collection[tuple[str, str, int]] = (),
    calls: list[dict[str, Any]] | None = None,
    held: dict[tuple[str, str, int], float] | None = None,
    ahead: str = "",
) -> dict[str, dict[str, Any]]:
    """For each order that ended ``error`` in doubt about a step its service never applied
    (``demo.verify``: told so): what explains each doubtful attempt. A request held by a
    process that died comes back, and a request the storm copied comes again; the agent
    that takes it again can only say "an earlier delivery may have called" (3.11:
    "maybe"). An attempt whose report never came in time is in doubt too (3.11: it may
    have applied). So a death between the attempt's claim and its end (plus
    ``DEATH_NOTICE_SLACK``), a copy of its request, a random fault the simulator injected
    on its key in that window, or the meddler holding its reply back explains its doubt;
    nothing else does (``ahead``: ``cause_of``). An attempt left unexplained is shown as
    its record says, with the random faults on its key, for the person who reads why."""
    out: dict[str, dict[str, Any]] = {}
    for order_id in doubted:
        order = final.get(order_id)
        steps = [s for s in order.steps if s.may_have_applied] if order is not None else []
        unexplained: list[str] = []
        shown: dict[str, Any] = {}
        for step in steps:
            faults = faults_on(calls or [], idempotency_key(order_id, step.step, step.key_round))
            for number in step.maybe_applied:
                attempt = step.attempts.get(number)
                explained = attempt is not None and (
                    (order_id, step.step, number) in copied
                    or cause_of(attempt, (order_id, step.step), faults, deaths, held or {}, ahead)
                    is not None
                )
                if not explained:
                    unexplained.append(f"{step.step}:{number}")
                    shown[f"{step.step}:{number}"] = {
                        "attempt": attempt.to_json() if attempt is not None else None,
                        "randomFaultsOnKey": [iso(t) for t in faults],
                    }
        out[order_id] = {
            "steps": [s.step for s in steps],
            "unexplained": unexplained if steps else ["no step in doubt"],
        }
        if shown:
            out[order_id]["attempts"] = shown
    return out


def records_of(order: Order | None) -> dict[str, Any] | None:
    """An order's history and every step's history and attempts, for a person reading a
    kept run (``--keep``) after the stack is gone."""
    if order is None:
        return None
    return {
        "status": str(order.status),
        "history": order.history,
        "steps": {
            s.step: {
                "state": str(s.process_state),
                "attempts": [a.to_json() for a in s.attempts.items],
                "history": s.history,
            }
            for s in order.steps
        },
    }


def faults_on(calls: list[dict[str, Any]], key: str) -> list[datetime]:
    """When the simulator injected a random fault on a call of ``key`` (its call log)."""
    return [
        parse_iso(c["at"])
        for c in calls
        if c.get("idempotencyKey") == key and c.get("fault") in RANDOM_FAULTS
    ]


def cause_of(
    attempt: Attempt,
    step: tuple[str, str],
    faults: list[datetime],
    deaths: Deaths,
    held: dict[tuple[str, str, int], float],
    ahead: str = "",
) -> str | None:
    """What this run injected into ``attempt`` of ``step`` (order id, step name), claimed
    at C and ended (or due) at E, in this order: a random fault on its key between C and
    E; its reply held back; the death of the process that claimed it after C; the death
    of any process between C and E + ``DEATH_NOTICE_SLACK``. None: nothing did.

    The faults and deaths are on this machine's clock (the simulator's call log, the
    chaos loop), C on its claimer's: an attempt claimed by an instance whose clock runs
    ahead (``ahead``, an instance-id prefix: ``ahead_prefix``) records C
    ``CLOCK_OFFSET_SECONDS`` late, after its own call reached the remote. So C is read
    back on this clock. (E needs no such care: an end read late only widens the window.)"""
    claimed, ended = attempt.claimed_at, attempt.ended_at or attempt.deadline
    if ahead and attempt.instance.startswith(ahead):
        claimed -= timedelta(seconds=CLOCK_OFFSET_SECONDS)
    if any(claimed <= t <= ended for t in faults):
        return "random fault"
    if (*step, attempt.number) in held:
        return "reply held back"
    if any(
        attempt.instance.startswith(f"{who}-") and claimed <= t <= ended + DEATH_NOTICE_SLACK
        for t, who in deaths.log
    ):
        return "claimer died"
    if any(claimed <= t <= ended + DEATH_NOTICE_SLACK for t, _ in deaths.log):
        return "a process died"
    return None


def exhausted_bound(orders: int) -> int:
    """The most orders a run may have run out of attempts (MAX_FAILURES on one step).

    Random faults are at most RANDOM_FAULTS_PER_KEY per key, so each such step lost at
    least 6 attempts to process deaths or held-back replies, one after the other, while
    each attempt gets a fresh deadline and the kills stop after ``chaos_seconds``. Three
    250-order runs (docs/local-development.md, "Tests") had none. One in 100 orders, and at least one, leaves
    room for chance; more means retries are not getting through the chaos.
    """
    return max(1, orders // 100)


def run_chaos(plan: ChaosPlan) -> tuple[Verdict, dict[str, Any]]:
    rng = random.Random(plan.seed)
    failpoints = ["", "after-claim:0.03,agent-after-call:0.03", "after-reply-save:0.03"]
    stack = LocalStack(
        devhosts=plan.devhosts,
        keep_workdir=plan.keep_workdir,
        transport=plan.transport,
        # A killed process's messages are back after 10 s, in either transport.
        bus_options={"lock-duration": "10"},
        # Every instance runs the sweeps, not one at a time as in Azure (devhost/singleton.py):
        # overlapping supervisors (a deployment's overlap) are part of what chaos exercises,
        # and a sweep must not wait out a killed holder's lease every few seconds.
        devhost_args=[["--timers", "every"] for _ in range(plan.devhosts)],
        settings={
            "STEP_TIMEOUT_SECONDS": str(STEP_TIMEOUT),
            "MAX_FAILURE_COUNT": str(MAX_FAILURES),
            "SUPERVISOR_SCHEDULE": f"*/{SUPERVISOR_SECONDS} * * * * *",
            "DEVHOST_LEASE_SECONDS": "10",
            "DEVHOST_RENEW_SECONDS": "3",
            "ORDERS_DECLARATIONS": DECLARATIONS,
        },
        devhost_env=[
            {
                "ORDERS_FAILPOINTS": failpoints[i % len(failpoints)],
                # One instance in three does not run the reply handler: its agents' replies
                # go through the reply queue (and the meddler); the others apply theirs in
                # process (messaging/inline.py). It is the one without failpoints, so that
                # replies keep reaching the queue between the kills.
                **({disabled_setting(REPLY_HANDLER): "true"} if i % 3 == 0 else {}),
                # The last instance's clock runs ahead of the others' (``ahead_prefix``).
                **({CLOCK_OFFSET: str(CLOCK_OFFSET_SECONDS)} if i == plan.devhosts - 1 else {}),
            }
            for i in range(plan.devhosts)
        ],
        simulator_args=[
            "--transient-rate",
            "0.08",
            "--hang-rate",
            "0.03",
            "--hang-seconds",
            str(STEP_TIMEOUT + 3),
            "--drop-rate",
            "0.04",
            "--latency-ms",
            "0-15",
            "--seed",
            str(plan.seed),
            "--max-random-faults-per-key",
            str(RANDOM_FAULTS_PER_KEY),
        ],
    )
    orders = make_orders(plan, rng)
    stop = threading.Event()
    kills = 0
    deaths = Deaths()  # every process death, by life (instance id prefix)
    starts: list[float] = []  # when a process was (re)started during the chaos (monotonic)
    outage: Outage | None = None
    timings: dict[str, Any] = {}
    with stack:
        meddler: ReplyMeddler | ServiceBusReplyMeddler = (
            ServiceBusReplyMeddler(stack, rng, stop)
            if plan.transport == "servicebus"
            else ReplyMeddler(stack, rng, stop)
        )
        meddler.start()
        storm = RequestStorm(stack, rng, stop) if plan.transport == "storage" else None
        if storm is not None:
            storm.start()
        settled = threading.Event()
        approver = Approver(stack, rng, settled)
        approver.start()
        began = datetime.now(UTC)
        started = time.monotonic()
        pending = waves(orders)
        rng.shuffle(pending)
        next_kill = started + rng.uniform(*plan.kill_every)
        while time.monotonic() - started < plan.chaos_seconds:
            # Submit in waves, so orders are in every stage when the kills land (an
            # account's keyed orders together, in one wave).
            sent = 0
            while pending and sent < 10:
                for _, (message, _) in pending.pop():
                    stack.submit(message)
                    approver.submitted(message)
                    sent += 1
            now = time.monotonic()
            outage_due = plan.outage_at is not None and (
                now - started >= plan.chaos_seconds * plan.outage_at
            )
            if outage is None and outage_due:
                outage = Outage.start(stack, plan, started)
            if now >= next_kill:
                victim = stack.hosts[rng.randrange(plan.devhosts)]
                deaths.add(victim)
                victim.kill()  # SIGKILL, then a fresh process at once
                again = bring_up(victim, deaths)
                kills += 1 + again
                starts += [time.monotonic()] * (1 + again)
                next_kill = now + rng.uniform(*plan.kill_every)
            for host in stack.hosts:  # failpoints kill too: bring them back
                if not host.alive:
                    deaths.add(host)
                    again = bring_up(host, deaths)
                    kills += 1 + again
                    starts += [time.monotonic()] * (1 + again)
            time.sleep(0.5)
        for group in pending:  # whatever is left, before the settle phase
            for _, (message, _) in group:
                stack.submit(message)
                approver.submitted(message)
        stop.set()
        meddler.join(timeout=10)
        if storm is not None:
            storm.join(timeout=10)
        timings["stormCopied"] = storm.copied if storm is not None else None
        timings["chaosSeconds"] = round(time.monotonic() - started, 1)
        # Settle: no more kills; failpoints off, so the last stragglers can finish.
        for host in stack.hosts:
            host.env.pop("ORDERS_FAILPOINTS", None)
            if not host.alive:
                deaths.add(host)
                host.start()
        ids = list(orders)
        deadline = time.monotonic() + plan.settle_seconds
        while time.monotonic() < deadline:
            final = load_orders(stack.context, ids)
            if all(v is not None and v.status.terminal for v in final.values()):
                break
            for host in stack.hosts:
                if not host.alive:
                    deaths.add(host)
                    host.start()
            time.sleep(1)
        timings["totalSeconds"] = round(time.monotonic() - started, 1)
        settled.set()  # the approver sends what it still owes, then stops
        approver.join(timeout=30)
        big = {o for o, (m, _) in orders.items() if m.get("workflow") == "checkout"}
        big = {o for o in big if float(orders[o][0].get("amount", 0)) >= 1000}
        timings["approvals"] = {
            "orders": len(big),
            "approved": len(approver.approved & big),
            "repeated": approver.repeated,
            "answers": {str(k): v for k, v in sorted(approver.answers.items())},
            "owed": approver.pending(),
        }
        # Notices committed by a process killed before it sent them wait in the outbox
        # for the sweep (30 s grace): "every Error alerted" holds once it is empty.
        far = datetime.now(UTC) + timedelta(days=1)
        deadline = time.monotonic() + 90
        while list(stack.context.store.stale_outbox(far)) and time.monotonic() < deadline:
            time.sleep(1)
        timings["outboxDrainedAfterSeconds"] = round(
            time.monotonic() - started - timings["totalSeconds"], 1
        )
        time.sleep(SUPERVISOR_SECONDS + 1)  # one supervisor period more: a lost release swept
        final = load_orders(stack.context, ids)
        turns = check_turns(
            final,
            {o: m for o, (m, _) in orders.items()},
            stack.context.store,
            timedelta(seconds=CLOCK_OFFSET_SECONDS),
        )
        timings["turns"] = turns.as_json()
        calls = stack.remote_calls(began.isoformat())
        alerts = drain_alerts(stack.context)
        ledger = load_ledger(stack.ledger_path)
        expected = {o: e for o, (_, e) in orders.items()}
        # orders with items are checked by their records and keys (tests.chaos.item_effects),
        # the others by demo.verify, each on its own orders' effects; one verdict of both
        picking: dict[str, Order | None] = {
            o: v for o, v in final.items() if v is not None and has_items(v)
        }
        picking |= {o: None for o in ids if final[o] is None and o.endswith("-pick")}
        skew = timedelta(seconds=CLOCK_OFFSET_SECONDS)
        verdict = verify(
            {o: v for o, v in final.items() if o not in picking},
            [e for e in ledger if e["orderId"] not in picking],
            alerts,
            expected=expected,
            max_failures=MAX_FAILURES,
            skew=skew,  # one instance's clock runs ahead: its turns' ends are read early
        )
        items = check_items(picking, ledger, alerts, expected, MAX_FAILURES, skew)
        merge(verdict, items)
        timings["items"] = items_summary(items, picking, deaths)
        rejected = stack.context.queues.client(stack.context.names.orders_rejected)
        ahead = ahead_prefix(plan.devhosts)
        exhausted = explain_exhausted(final, verdict.exhausted, calls, deaths, meddler.held, ahead)
        doubted = explain_doubted(
            final,
            verdict.doubted,
            deaths,
            storm.attempts if storm is not None else set(),
            calls,
            meddler.held,
            ahead,
        )
        timings.update(
            kills=kills,
            deaths=len(deaths),
            duplicatedReplies=meddler.duplicated,
            repliesHeldBack=len(meddler.held),
            rejected=len(rejected.peek_messages(max_messages=32)),
            randomFaults=sum(1 for c in calls if c.get("fault") in RANDOM_FAULTS),
            mostFailuresOfAStep=max(
                (len(counted_failures(s)) for o in final.values() if o for s in o.steps),
                default=0,
            ),
            exhaustedBound=exhausted_bound(plan.orders),
            exhausted=exhausted,
            exhaustedUnexplained=sorted(o for o, e in exhausted.items() if e["unexplained"]),
            doubted=doubted,
            doubtedUnexplained=sorted(o for o, e in doubted.items() if e["unexplained"]),
            stalled=sum(1 for o in ids if o.endswith("-stall")),
            # docs/contracts.md §3.11: an order whose remote only stalled ends completed,
            # with no alert (not even as "ran out of attempts")
            stalledWrong=sorted(
                o
                for o in ids
                if o.endswith("-stall")
                and (final[o] is None or str(final[o].status) != "completed")  # type: ignore[union-attr]
            ),
            stalledAlerted=sorted(
                {
                    a["orderId"]
                    for a in alerts
                    # an agent's outage alert (contract 3.14) names no order
                    if a.get("kind", "order") == "order" and a["orderId"].endswith("-stall")
                }
            ),
        )
        if plan.keep_workdir:
            timings["workdir"] = str(stack.workdir)
            timings["doubtedRecords"] = {o: records_of(final.get(o)) for o in doubted}
        if outage is not None:
            timings["outage"] = outage.summary(stack, starts, final)
    return verdict, timings


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.chaos.runner")
    parser.add_argument("--orders", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--no-outage", action="store_true", help="run without the outage window")
    parser.add_argument("--keep", action="store_true", help="keep the stack's workdir (logs)")
    parser.add_argument(
        "--transport", choices=("storage", "servicebus"), default="storage", help="agent queues"
    )
    args = parser.parse_args()
    report, timings = run_chaos(
        ChaosPlan(
            orders=args.orders,
            chaos_seconds=args.seconds,
            seed=args.seed,
            outage_at=None if args.no_outage else ChaosPlan.outage_at,
            keep_workdir=args.keep,
            transport=args.transport,
        )
    )
    print(json.dumps({**report.as_json(), **timings, "seed": args.seed}, indent=2))
    for name, items in report.violations().items():
        print(f"{name}: {items[:10]}")
    return 1 if report.violations() else 0


if __name__ == "__main__":
    raise SystemExit(main())
