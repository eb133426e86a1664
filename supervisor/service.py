"""The supervisor's sweep (timer trigger).

Reads the ``processing|`` index up to now (cost grows with the work in
flight, not with history), and for each expired step, with If-Match:
``FailureCount`` + 1, then back to ``Pending`` with the earliest time it may
run again and a re-dispatch, or ``Error`` with an operator alert (and, for
multi-step workflows, compensation). It never calls remote services and
knows nothing of the business. Several supervisors may run at once: each
write is conditional, so exactly one wins each step. Each run also repairs the slots of
per-key concurrency (``core.turn_keeper``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from core.errors import ConcurrencyConflict, TransitionRefused
from core.model import Order
from core.policy import RetryPolicy
from core.ports import Clock, StateStore
from core.states import StepState
from core.timefmt import iso
from core.turn_keeper import TurnKeeper
from core.turns import SweepReport as TurnSweep
from core.unit_of_work import Dispatcher, OrderChanges
from messaging.outbox import NoticeSender
from observability import telemetry
from observability.logs import get_logger, order_context
from observability.metrics import METRICS, order_ended

log = get_logger(__name__)

#: Clock skew allowance between instances (see ``Order.expire``). Agents stop 0.5-5 s
#: before a deadline, so a skew of up to about 1 s costs nothing; a larger one costs a
#: retry, never correctness (docs/design.md, "Deadline fencing and skew"). Short, because every
#: expired step waits this long, on top of the supervisor's period, for its retry.
SKEW_GRACE = timedelta(seconds=0.5)


@dataclass
class SupervisionReport:
    examined: int = 0
    retried: int = 0
    failed: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    #: what the slots' sweep did (per-key concurrency; None: not run)
    turns: TurnSweep | None = None


class Supervisor:
    def __init__(
        self,
        store: StateStore,
        notices: NoticeSender,
        dispatch: Dispatcher,
        policy: RetryPolicy,
        clock: Clock,
        grace: timedelta = SKEW_GRACE,
        *,
        turns: TurnKeeper | None = None,
    ):
        """``dispatch`` queues an order whose step is Pending again (a retry after its
        backoff, a compensation to run) for the time it may run: the scheduler claims it.
        ``turns``: the slots of per-key concurrency, released as orders end and swept
        each run (docs/contracts.md §3.16)."""
        self._store = store
        self._notices = notices
        self._turns = turns
        release = turns.release if turns is not None else None
        self._changes = OrderChanges(store, notices, dispatch, ended=order_ended, released=release)
        self._policy = policy
        self._clock = clock
        self._grace = grace

    def run(self) -> SupervisionReport:
        """Recover every expired step. One bad order never ends the run: its error is
        counted in ``report.errors`` and logged with the order id; an order that cannot be
        handled at all (records that cannot be read, a bug) also gets ONE operator alert per
        process (not one per run), and the run goes on with the next row."""
        report = SupervisionReport()
        now = self._clock()
        for entry in self._store.expired_processing(now - self._grace):
            report.examined += 1
            try:
                self.recover(entry.order_id, report, entry.step)
            except Exception as exc:  # noqa: BLE001 - one bad order must not stop the rest
                report.errors.append(f"{entry.order_id}: {type(exc).__name__}: {exc}")
                METRICS.inc("supervisor_errors")
                self._notices.contain_failure(
                    entry.order_id, entry.step, exc, now, who="supervisor"
                )
        self._sweep_turns(report)
        if report.examined:
            log.info(
                "supervisor: %d expired, %d retried, %d failed for good, %d conflicts",
                report.examined,
                report.retried,
                report.failed,
                report.conflicts,
            )
        return report

    def _sweep_turns(self, report: SupervisionReport) -> None:
        """The slots' repair (``core.turn_keeper``): a holder whose order ended while the
        instance that would wake the next died is released, a lost wake sent again."""
        if self._turns is None:
            return
        try:
            report.turns = self._turns.sweep()
        except Exception as exc:  # the expiries above are done; the next run tries again
            report.errors.append(f"turns: {type(exc).__name__}: {exc}")
            log.error("supervisor: the slots' sweep failed: %s", exc, exc_info=exc)

    def recover(self, order_id: str, report: SupervisionReport, step: str | None = None) -> None:
        """Expire ``step`` of the order (default: its first Processing step past its time)."""
        with order_context(order_id=order_id):
            order = self._store.load(order_id)
            if order is None:
                return
            with telemetry.span("order.supervise", order.trace, orderId=order_id):
                self._recover(order, report, step)

    def _recover(self, order: Order, report: SupervisionReport, step: str | None) -> None:
        now = self._clock()
        try:
            changed = self._changes.change(
                order.order_id,
                lambda o: o.expire(now, self._policy, self._grace, step),
                attempts=1,  # a reply or another supervisor moved it: theirs is the decision
                loaded=order,
            )
        except TransitionRefused:
            return  # a reply or another supervisor got there first
        except ConcurrencyConflict:
            report.conflicts += 1
            METRICS.inc("supervisor_conflicts")
            return
        if changed is None:
            return
        expired = changed.result
        with order_context(step=expired.step, attempt=expired.attempt):
            if changed.order.waits(expired):
                METRICS.inc("waits_ended", state=str(expired.process_state))
                log.info("%s ended at its time: %s", expired.step, expired.process_state)
            elif expired.process_state is StepState.PENDING:
                report.retried += 1
                METRICS.inc("retries")
                log.warning(
                    "deadline passed (failure %d of %d); retry at %s",
                    expired.failure_count,
                    self._policy.max_failure_count,
                    iso(expired.not_before),
                )
            else:
                report.failed += 1
                METRICS.inc("steps_failed")
