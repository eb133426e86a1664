"""Names of the queues and the table: shared by the code, host bindings and infra/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

ORDERS: Final = "orders"
ORDERS_REJECTED: Final = "orders-rejected"
OPERATOR_ALERTS: Final = "operator-alerts"
ORDER_DISPATCH: Final = "order-dispatch"
AGENT_REQUESTS: Final = "agent-requests"
AGENT_REPLIES: Final = "agent-replies"
#: An order's wake-ups at a time (a delay's end, a retry after its backoff), as Service
#: Bus scheduled messages when the agent queues are on Service Bus (messaging/dispatch.py).
ORDER_WAKEUPS: Final = "order-wakeups"
STATE_TABLE: Final = "OrderState"
#: The Blob container of archived orders (docs/contracts.md §3.12).
ORDERS_ARCHIVE: Final = "orders-archive"


@dataclass(frozen=True)
class Names:
    """Where state and messages live. Tests use ``Names.unique()`` to stay apart."""

    orders: str = ORDERS
    orders_rejected: str = ORDERS_REJECTED
    operator_alerts: str = OPERATOR_ALERTS
    order_dispatch: str = ORDER_DISPATCH
    agent_requests: str = AGENT_REQUESTS
    agent_replies: str = AGENT_REPLIES
    order_wakeups: str = ORDER_WAKEUPS
    state_table: str = STATE_TABLE
    orders_archive: str = ORDERS_ARCHIVE

    @classmethod
    def unique(cls, tag: str) -> Names:
        """Names with a suffix (lowercase letters and digits), for isolated tests."""
        return cls(
            orders=f"{ORDERS}-{tag}",
            orders_rejected=f"{ORDERS_REJECTED}-{tag}",
            operator_alerts=f"{OPERATOR_ALERTS}-{tag}",
            order_dispatch=f"{ORDER_DISPATCH}-{tag}",
            agent_requests=f"{AGENT_REQUESTS}-{tag}",
            agent_replies=f"{AGENT_REPLIES}-{tag}",
            order_wakeups=f"{ORDER_WAKEUPS}-{tag}",
            state_table=f"{STATE_TABLE}{tag}",
            orders_archive=f"{ORDERS_ARCHIVE}-{tag}",
        )

    def agent_queue(self, agent: str) -> str:
        """An agent's request queue, ``agent-requests-<agent>``."""
        if not agent:
            raise ValueError("a request names no agent: every plan names one for each step")
        return f"{self.agent_requests}-{agent}"

    @property
    def legacy_requests(self) -> str:
        """The shared request queue of versions before per-agent queues: no function reads
        it; ``python -m admin drain-legacy-requests`` moves what waits there to each
        request's own agent queue (the upgrade: docs/operating.md, "Upgrading")."""
        return self.agent_requests

    def agent_queues(self) -> tuple[str, ...]:
        """Every declared agent's request queue (the declarations are read on first use)."""
        from core.workflows import AGENTS  # core: the registry, loaded when first needed

        return tuple(self.agent_queue(name) for name in sorted(AGENTS))

    def service_bus_queues(self) -> tuple[str, ...]:
        """The queues that live on Service Bus with ``AGENT_TRANSPORT=servicebus`` (as
        deployed): every agent's request queue, the replies and the order wake-ups."""
        return (*self.agent_queues(), self.agent_replies, self.order_wakeups)

    def poisoned(self) -> tuple[str, ...]:
        """The queues whose failed messages go to ``<queue>-poison`` (Storage queues; the
        agent queues too, since malformed agent messages are quarantined there)."""
        return (
            self.orders,
            self.order_dispatch,
            *self.agent_queues(),
            self.agent_replies,
        )

    def holds_orders(self, queue: str) -> bool:
        """Whether ``queue`` (or a kept copy from it) holds order messages as submitted: the
        orders queue, its poison queue and ``orders-rejected``. Their text is quoted
        unchanged (docs/contracts.md §3.1); every other queue's is quoted without tokens
        (``core/redact.py``)."""
        return queue in (self.orders, poison(self.orders), self.orders_rejected)

    def poison_queues(self) -> tuple[str, ...]:
        return tuple(poison(q) for q in self.poisoned())

    def storage_queues(self) -> tuple[str, ...]:
        return (
            self.orders,
            self.orders_rejected,
            self.operator_alerts,
            self.order_dispatch,
            *self.agent_queues(),
            self.agent_replies,
            *self.poison_queues(),
        )

    def own_queues(self) -> frozenset[str]:
        """Every queue of this app as declared now (``is_own_queue`` says more)."""
        return frozenset(self.storage_queues())

    def is_own_queue(self, queue: str) -> bool:
        """Whether ``queue`` is, or may become, one of this app's queues, which a
        ``replyTo`` may never name: the fixed queues, the shared request queue of earlier
        versions, every agent's request queue (declared or not yet: ``agent-requests-*``)
        and the poison queue of each."""
        base = queue.removesuffix("-poison")
        fixed = {
            self.orders,
            self.orders_rejected,
            self.operator_alerts,
            self.order_dispatch,
            self.agent_requests,
            self.agent_replies,
            self.order_wakeups,
        }
        return base in fixed or base.startswith(f"{self.agent_requests}-")


def poison(queue: str) -> str:
    """Where the Functions host (and quarantine) puts a queue's failed messages."""
    return f"{queue}-poison"
