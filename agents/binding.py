"""What an agent request may do, read from the state it claims to belong to.

Anyone who can put a message on an agent's queue could otherwise make the agent call its
remote, with the agent's credentials, for an order that does not exist, with a body of
their choosing, on a path of another agent (a confused deputy). So before any call the
agent binds the request to its claim (docs/contracts.md §3.3): the order exists, the
step is one of its steps that runs on this agent, and the request carries the token of
an attempt that was claimed (``core.model.Order.bound_step``). What is then sent comes
from the state, not from the message: the remote path and the idempotency key the
order's plan gives that step, and the body the step was given.

The order as this process last wrote it (``StateStore.recent``) is tried first: the
claim that sent the request was most often made here, and reading it back would return
the same rows. A cached copy that does not know the attempt (another instance claimed it
since) is no verdict: the order is read.

On Storage queues, which detect no duplicates, one attempt's request can arrive in
several copies (a redelivered order message sends attempt 1's request again, in case the
first delivery died before its send; ``Order.resendable``). With ``copies`` the binding
records which copy took such an attempt (``Order.take``: its message id, a conditional
write before any call, with the order it has just read): any other copy calls nothing
(``DuplicateRequest``). The copy that took it, redelivered after a crash, may call again
(its doubt is reported, as before). Requests that are never sent twice write nothing.
"""

from __future__ import annotations

from dataclasses import replace

from core.errors import ConcurrencyConflict, DuplicateRequest, UnboundMessage
from core.messages import AgentRequest
from core.model import Order, StepRecord
from core.ports import StateStore
from observability.metrics import METRICS

#: How often a take is tried again when another writer moved the order first.
TAKE_ATTEMPTS = 5


class RequestBinding:
    """Binds the requests of one agent (``agent``) to the claims they speak for.
    ``copies``: the transport detects no duplicates (Storage queues): copies of a request
    that may be sent twice (``Order.resendable``) are told apart by their message ids."""

    def __init__(self, store: StateStore, agent: str, *, copies: bool = False):
        self._store = store
        self._agent = agent
        self._copies = copies

    def __call__(self, request: AgentRequest, copy: str | None = None) -> AgentRequest:
        """``request`` as its claim says it: path, key and body from the state; raises
        ``UnboundMessage`` for a request no claim speaks for, ``DuplicateRequest`` for a
        copy (``copy``: its message id) whose attempt another copy took (StorageUnavailable
        when the state cannot be read or written: the host retries it)."""
        order = self._store.recent(request.order_id)
        if order is not None:
            try:
                bound = self._bound(order, request)
            except UnboundMessage:
                order = None  # stale: another instance may have claimed since; read it
        for _ in range(TAKE_ATTEMPTS):
            if order is None:
                order = self._load(request)
                bound = self._bound(order, request)
            if (
                not self._copies
                or copy is None
                or not order.resendable(request.step, request.attempt)
            ):
                return bound
            taken = order.take(request.step, request.attempt, copy)
            if taken == "held":
                return bound
            if taken == "other":
                METRICS.inc("agent_duplicate_requests", agent=self._agent)
                raise DuplicateRequest(
                    f"attempt {request.attempt} of {request.step} was taken by another copy "
                    f"of its request; this copy ({copy}) calls nothing",
                    order_id=request.order_id,
                    step=request.step,
                )
            try:
                self._store.save(order)  # before any call: the other copies see it
            except ConcurrencyConflict:
                order = None  # another writer came first: read it again, decide again
                continue
            return bound
        raise ConcurrencyConflict(
            f"order {request.order_id} kept changing while an agent took its request",
            order_id=request.order_id,
        )

    def at_hand(self, request: AgentRequest, copy: str | None = None) -> AgentRequest | None:
        """``request`` as its claim says it, when what this process last wrote decides it
        with no request to the store: the order is at hand and speaks for the request, and
        no copy must take it. None otherwise: call the binding (on a thread; it reads, and
        may write). Pure work, so the agent asks it on its event loop."""
        order = self._store.recent(request.order_id)
        if order is None:
            return None
        try:
            bound = self._bound(order, request)
        except UnboundMessage:
            return None  # maybe stale: the binding reads the order
        if self._copies and copy is not None and order.resendable(request.step, request.attempt):
            return None  # a copy must take it: a write
        return bound

    def _load(self, request: AgentRequest) -> Order:
        order = self._store.load(request.order_id)
        if order is None:
            raise UnboundMessage(
                f"a request for order {request.order_id}, which does not exist: no claim "
                "speaks for it",
                order_id=request.order_id,
                step=request.step,
            )
        return order

    def _bound(self, order: Order, request: AgentRequest) -> AgentRequest:
        step = order.bound_step(request.step, request.attempt, request.token)
        agent = _agent_of(order, step)
        if agent != self._agent:
            raise UnboundMessage(
                f"step {step.step} of order {order.order_id} runs on agent {agent!r}, not on "
                f"{self._agent!r}: this agent does not run it",
                order_id=order.order_id,
                step=step.step,
            )
        return replace(
            request,
            path=step.path,
            key_round=step.key_round,
            # what the step's input decided when it started (docs/contracts.md §3.13)
            order=step.input if step.input is not None else order.body,
        )


def _agent_of(order: Order, step: StepRecord) -> str:
    try:
        return order.plan.agent_of(step.step)
    except KeyError:
        return ""
